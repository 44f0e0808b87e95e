"""What keeps a SkyPilot run from billing silently (SkyPilot 0.14.1, read against its source):

- the managed-jobs controller is a machine of its own (on RunPod a pod that cannot stop): its
  autostop is SkyPilot config `jobs.controller.resources.autostop`, which a task's `config:` block
  cannot set, but the client config sent with the launch request can (`controller_autostop`);
- `sky.down` and `sky.jobs.cancel` do not wait for the trainer: `sky.cancel` sends SIGTERM to the job,
  marks it CANCELLED at once and SIGKILLs it SKY_KILL_AFTER_S (30 s) later, so a down waits for the
  run's own status.json (`wait_until`) no longer than that; the final checkpoint is asked for before
  any signal, through the run dir (launcher/backends/final_save.py);
- which managed-job states have a machine billing (`managed_job_billing`);
- a failed `launch up` whose first SDK call started the local API server (and its executors,
  ~1.2 GB) stops it again (`stop_api_server_we_started`).
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from datetime import datetime, timezone
from typing import Callable, Iterator, Optional

from launcher.profiles.render import CONTROLLER_AUTOSTOP

from ... import sky_internals

DOWN_GRACE_S = 300  # bound on MOUNT_CACHED uploads (graceful down/cancel) and on a managed job's cancel
SKY_KILL_AFTER_S = 30.0
"""`sky.cancel` SIGTERMs the job's process group and SIGKILLs its process tree 30 s later
(sky/skylet/subprocess_daemon.py, armed in sky/skylet/log_lib.py): no trainer gets longer after
SIGTERM, whatever DOWN_GRACE_S says. A final checkpoint is asked for before (final_save.py)."""
POLL_S = 5.0
CLUSTER_IDLE_MIN = 10  # a cluster run recorded before its autostop was: the profiles' default
# Managed-job states in which no machine of the job exists (or none is known to exist yet).
_NO_MACHINE = {"PENDING", "SUBMITTED", "DEPRECATED_SUBMITTED"}
_MAYBE_MACHINE = {"STARTING", "RECOVERING"}  # provisioning; a machine bills once it is there
MANAGED_TERMINAL = ("SUCCEEDED", "CANCELLED", "FAILED")  # FAILED_* too (prefix)
ORIGIN_ENV = "LAUNCH_SDK_ORIGIN"


@contextlib.contextmanager
def controller_autostop() -> Iterator[dict]:
    """The client SkyPilot config, in this process, with the controller's autostop filled in (unless
    the user's own config sets it): the launch request made inside carries it to the API server."""
    import sky

    current = sky_internals.skypilot_config_to_dict()
    if current.get_nested(("jobs", "controller", "autostop"), None) is not None:  # legacy key wins
        yield current
        return
    ours = sky.Config({"jobs": {"controller": {"resources": {"autostop": dict(CONTROLLER_AUTOSTOP)}}}})
    merged = sky_internals.overlay_skypilot_config(original_config=ours, override_configs=current)
    with sky_internals.replace_skypilot_config_in_process(merged):
        yield merged


def managed_job_billing(status: str, record) -> bool:
    """Whether a machine of the managed job bills in this queue state. STARTING/RECOVERING bill
    only once the controller reports the job's cluster (provisioning has begun)."""
    if status in _NO_MACHINE or status.startswith(MANAGED_TERMINAL):
        return False
    if status in _MAYBE_MACHINE:
        get = record.get if hasattr(record, "get") else (lambda k, d=None: getattr(record, k, d))
        return bool(get("cluster_name_on_cloud", None))
    return True  # RUNNING, WINDING_DOWN, CANCELLING: the machine is up until it is torn down


def wait_until(done: Callable[[], bool], timeout: float, poll: Optional[float] = None) -> bool:
    """Call `done` until it is true (True) or `timeout` seconds passed (False)."""
    deadline = time.monotonic() + timeout
    while True:
        if done():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(min(POLL_S if poll is None else poll, max(0.0, deadline - time.monotonic())))


@contextlib.contextmanager
def marked_process() -> Iterator[str]:
    """Tag this process's environment while the block runs: a local API server that the SDK starts
    meanwhile inherits the tag (SkyPilot spawns it with a copy of os.environ), which tells it apart
    from anyone else's."""
    token = f"{os.getpid()}-{time.time_ns()}"
    os.environ[ORIGIN_ENV] = token
    try:
        yield token
    finally:
        os.environ.pop(ORIGIN_ENV, None)


def local_api_server_pids(origin: Optional[str] = None) -> Optional[list[int]]:
    """Pids of this machine's SkyPilot API server processes on the port this client uses (SkyPilot's
    SKYPILOT_API_SERVER_LOCAL_PORT, default 46580; only those started inside `marked_process` with
    tag `origin`, if given); None when the endpoint is remote or unknown."""
    try:
        import psutil

        if not sky_internals.is_api_server_local():
            return None
        port, pids = sky_internals.get_local_api_server_port(), []
        server_cmd, default_port = sky_internals.api_server_cmd(), sky_internals.default_server_port()
        for proc in psutil.process_iter(["pid", "cmdline"]):
            cmdline = " ".join(proc.info.get("cmdline") or [])
            if server_cmd not in cmdline:
                continue
            given = re.search(r"--port[= ](\d+)", cmdline)  # as SkyPilot's own `sky api stop` reads it
            if (int(given.group(1)) if given else default_port) != port:
                continue
            try:
                if origin is None or proc.environ().get(ORIGIN_ENV) == origin:
                    pids.append(proc.info["pid"])
            except (psutil.AccessDenied, psutil.NoSuchProcess):
                continue
        return pids
    except Exception:  # noqa: BLE001 - never let this bookkeeping fail a launch
        return None


def stop_api_server_we_started(sky, before: Optional[list[int]], origin: str) -> str:
    """After a failed `launch up`: stop the local API server if this command started it (`before`:
    the servers running when it began; `origin`: this process's mark). Returns what to add to the
    error line ('' when there is nothing to say)."""
    if before is None:
        return ""  # remote: not ours to stop
    ours = [pid for pid in local_api_server_pids(origin) or [] if pid not in before]
    if not ours:
        return ""  # the one running before this command served it
    try:
        if before:  # another command's server was starting meanwhile and this one started its own too
            # (seen with two `launch up` at once): stop ours only, `sky api stop` would stop both
            sky_internals.kill_children_processes(parent_pids=ours, force=True)
        else:
            sky.api_stop()
    except Exception:  # noqa: BLE001
        return ("; the local SkyPilot API server this command started still runs (~1.2 GB, pid "
                f"{ours[0]}): stop it with `sky api stop`")
    return "; stopped the local SkyPilot API server this command started"


def epoch(iso: Optional[str]) -> Optional[float]:
    """Seconds since the epoch of the payload's `now_iso()` stamps (None when absent or unreadable)."""
    try:
        return datetime.strptime(iso, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()
    except (TypeError, ValueError):
        return None
