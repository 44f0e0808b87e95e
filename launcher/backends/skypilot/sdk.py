"""The SkyPilot SDK as the SkyPilot backend's modules use it: the guarded `sky` import, the readers of
its responses, and its exceptions as one line each. One owner, so `__init__.py` (lifecycle),
`control.py` (what bills) and `files.py` (moving bytes) share public names.

What the responses really hold (SkyPilot 0.14.1, read in its server code and run through its own
decoders, `sky.server.requests.serializers`; tests/sky_edge.py builds the fakes the same way):
- `sky.jobs.queue(..., version=2)` asks for `sky.jobs.constants.DEFAULT_MANAGED_JOB_FIELDS` only, and
  the server drops every other field (`sky/jobs/server/core.py` queue_v2_api), so
  `cluster_name_on_cloud` and `failure_reason` come back None. `managed_records` asks `queue_v2`
  for MANAGED_JOB_FIELDS, which names them.
- Once the jobs controller has autostopped (`down: true`), `jobs.queue_v2` and `jobs.cancel` raise
  ClusterNotUpError (with refresh=False; refresh=True would start a new, billed controller).
- `sky.job_status(cluster, job_ids=None)` on a cluster without a job answers `{None: None}`, which
  the client's own decoder turns into `ValueError: int("None")` (`job_statuses`).
- `enabled_clouds()` returns the server's cached list, empty on a fresh API server until a
  credential check has run (`sky.client.sdk.check`).
"""

from __future__ import annotations

import logging
import os
import re
import sys
from typing import Optional

from ... import sky_internals
from ...catalog import offline_runtime_dir
from ...errors import BackendError

_CREDENTIALS_HINT = {  # SkyPilot 0.14 reads RunPod's key from ~/.runpod/config.toml only, not RUNPOD_API_KEY
    "runpod": "run `runpod config` (it writes ~/.runpod/config.toml), then `sky check runpod`",
    "azure": "run `az login`, then `sky check azure`",
    "kubernetes": "point ~/.kube/config at your cluster, then `sky check kubernetes`",
}

# `sky.jobs.queue_v2` fields the backend reads (DEFAULT_MANAGED_JOB_FIELDS lacks the last four).
MANAGED_JOB_FIELDS = ("job_id", "task_id", "job_name", "task_name", "submitted_at", "end_at", "recovery_count",
                      "status", "cluster_name_on_cloud", "cloud", "failure_reason", "details")


def sdk():
    """`sky` for SDK calls: never with launch's offline runtime dir (fake enabled clouds, and a local
    API server started from this process would keep its state there)."""
    if "sky" in sys.modules and os.environ.get("SKY_RUNTIME_DIR") == str(offline_runtime_dir()):
        raise BackendError("internal: this process imported SkyPilot for offline planning "
                           "(launcher.catalog.import_sky_offline); run SDK calls in a fresh process")
    os.environ.setdefault("SKYPILOT_DISABLE_USAGE_COLLECTION", "1")
    import sky
    import sky.jobs  # sky.jobs.* and sky.volumes.* are used as attributes
    import sky.volumes

    _logs_to_stderr()
    return sky


def _logs_to_stderr() -> None:
    """SkyPilot's client logs to stdout ("Failed to connect to SkyPilot API server ... Starting a local
    server.", "✓ SkyPilot API server started."): stdout is launch's own answer (`status --json | jq`
    read those lines as JSON), so SkyPilot's lines go to stderr, where progress belongs."""
    for h in logging.getLogger("sky").handlers:
        if isinstance(h, logging.StreamHandler) and getattr(h, "stream", None) is sys.stdout:
            h.setStream(sys.stderr)


def record_field(record, key, default=None):
    """A field of an SDK response record (pydantic response models and dicts both have .get)."""
    value = record.get(key, default) if hasattr(record, "get") else getattr(record, key, default)
    return default if value is None else value


def first_line(e: BaseException) -> str:
    """An exception's first non-empty line, ANSI colours removed, at most 300 characters."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip()
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(e).__name__)
    return line if len(line) <= 300 else line[:297] + "..."


def skypilot_volume_names(name: str) -> "re.Pattern":
    """The names SkyPilot gives the cloud volume it creates for volume `name`:
    `<name>-<user hash, 8 hex>-<uuid4, 6 hex>` (sky/volumes/server/core.py volume_apply:
    make_cluster_name_on_cloud(name) + '-' + uuid4()[:6]; `.`/`_` become `-`, lower case)."""
    base = re.sub(r"[._]", "-", name).lower()
    return re.compile(rf"^{re.escape(base)}-[0-9a-f]{{8}}-[0-9a-f]{{6}}$")


def volume_record(sky, name: str):
    """SkyPilot's record of the volume `name`, else of one adopted earlier under its cloud name
    (runpod_volumes.volume_config), or None."""
    records, alias = sky.get(sky.volumes.ls()) or [], skypilot_volume_names(name)
    exact = [r for r in records if record_field(r, "name") == name]
    return (exact or [r for r in records if alias.match(record_field(r, "name", ""))] or [None])[0]


def enum_name(value) -> str:
    """An SDK enum (or its string) as its upper-case value: ClusterStatus.UP -> 'UP'."""
    return str(getattr(value, "value", value) or "").upper()


def job_statuses(sky, cluster: str, job_id) -> dict:
    """{job id: JobStatus} of a cluster's job (`job_id` None: its latest); {} when the cluster has
    no job yet (the server answers {None: None}, which SkyPilot's own decoder cannot parse)."""
    try:
        return sky.get(sky.job_status(cluster, job_ids=None if job_id is None else [job_id])) or {}
    except ValueError:
        if job_id is None:
            return {}
        raise


def managed_records(sky, job_id, job_name: str) -> list:
    """The jobs controller's queue records of one managed job, with the fields MANAGED_JOB_FIELDS
    names. Raises ClusterNotUpError once the controller is gone (refresh=False never starts one)."""
    result = sky.get(sky.jobs.queue_v2(refresh=False, job_ids=None if job_id is None else [job_id],
                                       fields=list(MANAGED_JOB_FIELDS)))
    records = result[0] if isinstance(result, tuple) else result
    return [r for r in records or [] if (record_field(r, "job_id") == job_id if job_id is not None
                                         else record_field(r, "job_name") == job_name)]


def controller_gone(e: BaseException) -> bool:
    """The jobs controller is not up (autostopped and torn down), as opposed to SkyPilot unreachable."""
    from sky import exceptions as ex

    status = enum_name(getattr(e, "cluster_status", None))
    return isinstance(e, ex.ClusterNotUpError) and status != "INIT"


def credentials_message(clouds, reasons: Optional[dict] = None) -> str:
    """One line: no credentials for `clouds`, SkyPilot's reason for each where known, and the fix."""
    reasons = reasons or {}
    hints = "; ".join(f"{c}: {reasons[c] + '. Fix: ' if reasons.get(c) else ''}"
                      f"{_CREDENTIALS_HINT.get(c, f'run `sky check {c}`')}" for c in clouds)
    return (f"SkyPilot has no usable credentials for {', '.join(clouds)} ({hints}); "
            "or run without SkyPilot: `launch up PROFILE --backend local|ssh`")


def profile_clouds(p) -> list[str]:
    """The clouds a profile may run on, as SkyPilot names them (`k8s` is `kubernetes`)."""
    wanted = [i.split("/")[0].lower() for i in p.cluster.infra_list]
    return list(dict.fromkeys("kubernetes" if w == "k8s" else w for w in wanted))


def check_credentials_here(p) -> None:
    """Before `launch up` plans and starts a local SkyPilot API server (seconds, ~1.2 GB) for a user
    with no credentials: SkyPilot's own credential check of the profile's clouds, in this process.
    Only where the API server is local, not running yet and may be started (SkyPilot's
    SKYPILOT_DISABLE_LOCAL_API_SERVER unset): the server this command would start inherits this HOME
    and environment and runs the same check. Raises BackendError (the credentials line with
    SkyPilot's reason) when none of the clouds is usable; passes when one is or when the check itself
    cannot run here (the server's check then decides, as before)."""
    from . import control

    try:
        import sky

        compute = sky_internals.cloud_capability().COMPUTE
        if sky_internals.local_api_server_disabled() or control.local_api_server_pids() != []:
            return  # no server would be started, a remote endpoint, or a running server: its view counts
        reasons = {}
        for name in profile_clouds(p):
            ok, reason = sky.CLOUD_REGISTRY.from_str(name).check_credentials(compute)
            if ok:
                return
            text = reason if isinstance(reason, str) else "; ".join(f"{k}: {v}" for k, v in (reason or {}).items())
            reasons[name] = _reason(text)
    except Exception:  # noqa: BLE001 - the check could not run here; the API server's check decides
        return
    raise BackendError(credentials_message(list(reasons), reasons))


def _reason(text: str) -> str:
    """SkyPilot's reason in a clause: its first line, less a closing "Run the following commands:"
    (the hint says what to run) and a requests error's "(Caused by ...)" chain."""
    line = re.sub(r"\s*\(Caused by .*$", "", first_line(Exception(text or "not enabled")))
    line = re.sub(r"(?<=\.)\s[^.]*:$", "", line)
    return line if line.endswith("...") else line.rstrip(".")


# (SkyPilot exception class names, message; {what} is the exception's first line)
_ERRORS = (
    (("ApiServerAuthenticationError",),
     "the SkyPilot API server needs a login: {what} (`sky api login -e URL`)"),
    (("VolumeTopologyConflictError",), "the network volume lives in another zone than the task may run: "
     "{what}; drop cluster.region, or name a new volume (created where the GPUs are)"),
    (("VolumeNotFoundError", "VolumeNotReadyError"),
     "network volume problem: {what}; see `sky volumes ls -r`"),
    (("ClusterDoesNotExist",), "the cluster is gone: {what} (autostopped after the job, or torn down)"),
    (("ClusterNotUpError",), "the cluster is not up: {what}; see `sky status`"),
    (("ManagedJobReachedMaxRetriesError",),
     "the managed job gave up after its retries: {what}; see `launch logs`"),
    (("CommandError",),
     "a command failed on the cluster ({what}): see the log above, fix, then `launch up` again"),
    (("RequestCancelled",), "the SkyPilot request was cancelled: {what}"),
)


def map_sky_error(e: BaseException, profile=None) -> BackendError:
    """One line for a SkyPilot exception: what happened and the next step."""
    from sky import exceptions as ex

    what = first_line(e)
    low = " ".join([str(e)] + [str(f) for f in getattr(e, "failover_history", [])]).lower()
    c = getattr(profile, "cluster", None)
    spec = f"{c.accelerators_label} x{c.num_nodes} on {', '.join(c.infra_list)}" if c else "the request"
    if isinstance(e, (ex.NoCloudAccessError, ex.InvalidCloudCredentials, ex.CloudUserIdentityError)):
        return BackendError(credentials_message(profile_clouds(profile) if c else ["runpod"]))
    if isinstance(e, ex.ApiServerConnectionError) or "no skypilot api server" in low:
        return BackendError("cannot reach a SkyPilot API server: start one with `sky api start` (or "
                            "`sky api login -e URL`) and retry; `--backend local|ssh` need none")
    if isinstance(e, ex.ResourcesUnavailableError):
        if "quota" in low or "spend limit" in low or "balance" in low:
            return BackendError(f"quota or spend limit reached for {spec}: {what}; raise it (RunPod: "
                                "Settings > spend limit / add credit; clouds: request GPU quota) and retry")
        return BackendError(f"no capacity for {spec} right now: {what}; retry later, or change "
                            "cluster.region / cluster.accelerators / use_spot")
    if isinstance(e, ex.ProvisionPrechecksError):
        return BackendError(f"SkyPilot prechecks failed: {'; '.join(map(first_line, e.reasons)) or what}")
    for names, message in _ERRORS:
        if isinstance(e, tuple(getattr(ex, n) for n in names)):
            return BackendError(message.format(what=what))
    if "no value available for secret" in low:
        return BackendError(f"{what} (export the variable before `launch up`)")
    return BackendError(f"SkyPilot {type(e).__name__}: {what}")


def nothing_launched(e: BaseException) -> bool:
    """Failures after which SkyPilot leaves no cluster behind (nothing to tear down)."""
    from sky import exceptions as ex

    return isinstance(e, (ex.ResourcesUnavailableError, ex.NoCloudAccessError, ex.InvalidCloudCredentials,
                          ex.ApiServerConnectionError, ex.ApiServerAuthenticationError,
                          ex.VolumeTopologyConflictError, ex.VolumeNotFoundError))
