"""Every SkyPilot name launch uses from outside SkyPilot's public SDK, one accessor each, with why launch
needs it and where SkyPilot 0.14.1 defines it (AUDITED). The only module in launcher/ that imports one.

The public SDK is what `sky/__init__.py` exports (`sky.__all__`: sky.launch, sky.down, sky.status,
sky.get, sky.stream_and_get, sky.Task, sky.Resources, sky.Config, sky.CLOUD_REGISTRY, ...), the
`sky.jobs` and `sky.volumes` packages' `__all__` (sky.jobs.launch, sky.jobs.queue_v2, sky.volumes.ls,
...), and `sky.exceptions`, the classes the SDK's docstrings say it raises (PUBLIC_MODULES). Those are
imported where they are used. Anything else is SkyPilot's own business and may move in any release:
it is reached only through an accessor here, so one SkyPilot upgrade is one re-audit of one file.
tests/launcher/test_sky_internals.py imports every AUDITED name (failing with "re-audit for SkyPilot
X.Y" when one moved) and walks launcher/ for a non-public `sky` import or `sky.` attribute anywhere
else.

Why here and not in launcher/backends/skypilot/: the names belong to the SkyPilot backend in idea,
but catalog/ (below backends/, launcher/__init__.py GROUPS) seeds SkyPilot's offline state with five
of them for `launch plan`, and a group may not import one above it. So the module is a group of its
own at the bottom, as launcher/doors.py is, and catalog/ and backends/ both import it. It imports
nothing of launch, and nothing of SkyPilot at module level: importing `sky` takes 1-2 s and `launch
--help` must stay light, so each accessor imports inside itself. Functions pass their arguments
through unchanged; SkyPilot's module attributes are looked up on each call (tests patch them there).
"""

from __future__ import annotations

AUDITED_FOR = "0.14.1"

# The SkyPilot modules whose public names may be imported anywhere (sky/__init__.py and the packages'
# __all__; `sky.exceptions`: every class, the SDK's documented errors).
PUBLIC_MODULES = ("sky", "sky.jobs", "sky.volumes", "sky.exceptions")

# Each name this module reaches -> where SkyPilot AUDITED_FOR defines it.
AUDITED: dict[str, str] = {
    "sky.client.cli.command._get_cluster_records_and_set_ssh_config": "sky/client/cli/command.py:253",
    "sky.client.sdk.enabled_clouds": "sky/client/sdk.py:272",
    "sky.client.sdk.check": "sky/client/sdk.py:225",
    "sky.adaptors.runpod.rest_request": "sky/adaptors/runpod.py:34",
    "sky.provision.runpod.utils.GPU_NAME_MAP": "sky/provision/runpod/utils.py:16",
    "sky.jobs.utils.generate_managed_job_cluster_name": "sky/jobs/utils.py:1492",
    "sky.skypilot_config.to_dict": "sky/skypilot_config.py:590",
    "sky.skypilot_config.overlay_skypilot_config": "sky/skypilot_config.py:686",
    "sky.skypilot_config.replace_skypilot_config_in_process": "sky/skypilot_config.py:1010",
    "sky.skypilot_config.get_active_workspace": "sky/skypilot_config.py:546",
    "sky.server.common.is_api_server_local": "sky/server/common.py:589",
    "sky.server.common.get_local_api_server_port": "sky/server/common.py:67",
    "sky.server.common.API_SERVER_CMD": "sky/server/common.py:121",
    "sky.server.common.DEFAULT_SERVER_PORT": "sky/server/common.py:64",
    "sky.utils.subprocess_utils.kill_children_processes": "sky/utils/subprocess_utils.py:284",
    "sky.utils.env_options.Options.DISABLE_LOCAL_API_SERVER": "sky/utils/env_options.py:41",
    "sky.clouds.CloudCapability": "sky/clouds/cloud.py:67",
    "sky.check._get_workspace_allowed_clouds": "sky/check.py:100",
    "sky.global_user_state.set_allowed_clouds": "sky/global_user_state.py:3191",
    "sky.global_user_state.set_enabled_clouds": "sky/global_user_state.py:3025",
}


# --- SkyPilot's client: what its CLI does and the SDK leaves out ---------------------------------------

def get_cluster_records_and_set_ssh_config(*args, **kwargs):
    """Write a cluster's SSH config here as `sky status CLUSTER` does; the SDK never writes it (files.py
    ensure_ssh_config). sky/client/cli/command.py:253"""
    from sky.client.cli import command

    return command._get_cluster_records_and_set_ssh_config(*args, **kwargs)  # noqa: SLF001 - `sky status`'s own


def sdk_enabled_clouds(*args, **kwargs):
    """The API server's enabled clouds (a request id), which `sky` does not re-export: the backend's
    credential check before launching (backend.py _check_clouds). sky/client/sdk.py:272"""
    from sky.client import sdk

    return sdk.enabled_clouds(*args, **kwargs)


def sdk_check(*args, **kwargs):
    """`sky check CLOUD` as a request (not re-exported by `sky`): refreshes the server's cached enabled
    list on a fresh API server (backend.py _check_clouds). sky/client/sdk.py:225"""
    from sky.client import sdk

    return sdk.check(*args, **kwargs)


# --- RunPod, through SkyPilot's adaptor and tables -----------------------------------------------------

def runpod_rest_request(*args, **kwargs):
    """RunPod's REST API with the key SkyPilot reads (~/.runpod/config.toml): network volumes, their ids
    (files.py, runpod_volumes.py). sky/adaptors/runpod.py:34"""
    from sky.adaptors import runpod

    return runpod.rest_request(*args, **kwargs)


def runpod_gpu_name_map() -> dict:
    """SkyPilot's accelerator name -> RunPod GPU type id, to ask RunPod the price and stock of the GPU
    SkyPilot would rent (price.py, runpod_volumes.py). sky/provision/runpod/utils.py:16"""
    from sky.provision.runpod.utils import GPU_NAME_MAP

    return GPU_NAME_MAP


def generate_managed_job_cluster_name(*args, **kwargs) -> str:
    """The cluster name SkyPilot gives a managed job's pods, to find them on RunPod when the queue
    record lacks `cluster_name_on_cloud` (runpod_pods.py pod_matcher). sky/jobs/utils.py:1492"""
    from sky.jobs import utils

    return utils.generate_managed_job_cluster_name(*args, **kwargs)


# --- The client's SkyPilot config ----------------------------------------------------------------------

def skypilot_config_to_dict():
    """The client's SkyPilot config, to fill in the jobs controller's autostop unless the user set it
    (control.py controller_autostop). sky/skypilot_config.py:590"""
    from sky import skypilot_config

    return skypilot_config.to_dict()


def overlay_skypilot_config(*args, **kwargs):
    """SkyPilot's own merge of two configs, the user's winning (control.py controller_autostop).
    sky/skypilot_config.py:686"""
    from sky import skypilot_config

    return skypilot_config.overlay_skypilot_config(*args, **kwargs)


def replace_skypilot_config_in_process(*args, **kwargs):
    """The merged config for the requests made inside (a context manager), which carry it to the API
    server (control.py controller_autostop). sky/skypilot_config.py:1010"""
    from sky import skypilot_config

    return skypilot_config.replace_skypilot_config_in_process(*args, **kwargs)


def get_active_workspace(*args, **kwargs) -> str:
    """The workspace the offline clouds are seeded for (catalog/snapshot.py _import_sky_offline).
    sky/skypilot_config.py:546"""
    from sky import skypilot_config

    return skypilot_config.get_active_workspace(*args, **kwargs)


# --- The local API server (what bills on this machine) ------------------------------------------------

def is_api_server_local(*args, **kwargs) -> bool:
    """Whether this client's API server endpoint is on this machine, so launch may look for (and stop)
    the server it started (control.py local_api_server_pids). sky/server/common.py:589"""
    from sky.server import common

    return common.is_api_server_local(*args, **kwargs)


def get_local_api_server_port() -> int:
    """The port a local API server listens on (SKYPILOT_API_SERVER_LOCAL_PORT), to tell this client's
    server from another (control.py local_api_server_pids). sky/server/common.py:67"""
    from sky.server import common

    return common.get_local_api_server_port()


def api_server_cmd() -> str:
    """The API server's command line marker, to find its processes as `sky api stop` does (control.py
    local_api_server_pids). sky/server/common.py:121"""
    from sky.server import common

    return common.API_SERVER_CMD


def default_server_port() -> int:
    """The port of a server started without `--port` (control.py local_api_server_pids).
    sky/server/common.py:64"""
    from sky.server import common

    return common.DEFAULT_SERVER_PORT


def kill_children_processes(*args, **kwargs):
    """Stop only the API server this command started when another one started meanwhile (`sky api stop`
    would stop both; control.py stop_api_server_we_started). sky/utils/subprocess_utils.py:284"""
    from sky.utils import subprocess_utils

    return subprocess_utils.kill_children_processes(*args, **kwargs)


def local_api_server_disabled() -> bool:
    """SKYPILOT_DISABLE_LOCAL_API_SERVER as SkyPilot reads it: no local server would start, so the
    credential check here is skipped (backends/skypilot/sdk.py check_credentials_here).
    sky/utils/env_options.py:41"""
    from sky.utils import env_options

    return env_options.Options.DISABLE_LOCAL_API_SERVER.get()


# --- Clouds and credentials (offline planning, the credential check) ----------------------------------

def cloud_capability():
    """SkyPilot's CloudCapability enum (COMPUTE), which `sky` does not re-export: credential checks
    (backends/skypilot/sdk.py) and the offline enabled clouds (catalog/snapshot.py).
    sky/clouds/cloud.py:67"""
    from sky import clouds

    return clouds.CloudCapability


def workspace_allowed_clouds(*args, **kwargs) -> list:
    """The clouds a workspace allows, as `sky check` computes them before recording them, to seed the
    offline runtime dir (catalog/snapshot.py _import_sky_offline). sky/check.py:100"""
    from sky import check

    return check._get_workspace_allowed_clouds(*args, **kwargs)  # noqa: SLF001 - as `sky check` does


def set_allowed_clouds(*args, **kwargs) -> None:
    """Record the allowed clouds in the offline runtime dir's state, as `sky check` does, so the optimizer
    plans without credentials (catalog/snapshot.py). sky/global_user_state.py:3191"""
    from sky import global_user_state

    return global_user_state.set_allowed_clouds(*args, **kwargs)


def set_enabled_clouds(*args, **kwargs) -> None:
    """Record the offline clouds as enabled in the offline runtime dir's state, as `sky check` does
    (catalog/snapshot.py). sky/global_user_state.py:3025"""
    from sky import global_user_state

    return global_user_state.set_enabled_clouds(*args, **kwargs)
