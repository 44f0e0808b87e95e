"""What state a SkyPilot run is in: SkyPilot's word (a cluster's status and job queue, the jobs
controller's queue, RunPod's on a managed job's pod) merged with the run's own status.json, read over
SSH while its cluster is up, else from the volume (S3) or the Slurm login node.

It stands apart from backend.py, which starts and stops runs: reading a run's state changes nothing
and bills nothing, and `status`, `read_run_file`, the fetch's route and `down` (what to cancel, and
when the trainer or the controller has ended) all ask it.
"""

from __future__ import annotations

import json
import time
from typing import Optional

from payload import layout

from launcher.store.handle import Handle
from launcher.store.registry import ACTIVE_STATES, STATES, Run
from ..base import RemoteStatus, remote_path
from . import control, runpod_pods, slurm_login
from .files import S3Volume, cluster_ssh, s3_ready
from .sdk import controller_gone, enum_name, job_statuses, managed_records, map_sky_error, record_field, sdk

_JOB_STATES = {"INIT": "starting", "PENDING": "starting", "SETTING_UP": "starting", "RUNNING": "running",
               "SUCCEEDED": "completed", "CANCELLED": "stopped"}
_MANAGED_STATES = {"PENDING": "starting", "SUBMITTED": "starting", "STARTING": "starting",
                   "RECOVERING": "starting", "RUNNING": "running", "WINDING_DOWN": "running",
                   "CANCELLING": "stopped", "CANCELLED": "stopped", "SUCCEEDED": "completed"}


def remote_status(*, sky, run: Run) -> RemoteStatus:
    """SkyPilotBackend.status: the cluster's or the managed job's state, merged with the run's
    status.json, what bills, and when the bill ended."""
    h, said = run.handle, None
    try:
        if h.kind == "managed_job":
            state, reason, billing, said = managed_state(sky=sky, run=run)
        else:
            state, reason, billing = cluster_state(sky=sky, run=run)
    except Exception as e:  # noqa: BLE001 - never raises: the state says what is known
        if h.kind == "managed_job" and controller_gone(e):
            return settled(run=run)
        return RemoteStatus(state=run.state, reason=f"SkyPilot not reachable: {map_sky_error(e)}")
    reported = status_json(run=run, up=state in ("running", "completed", "failed"))
    st = merge_status(state, reason, reported, run.state)
    st.billing = billing
    if said:  # RunPod's word on the job's pod: the bill stops at its interruption (runpod_pods.py)
        st.ended_at, st.notice, st.handle = said.interrupted_at, said.notice, said.keep
    if state is None:
        # its machine is gone: it billed until the run ended (or was seen ended), + autostop idle
        end = control.epoch((reported or {}).get("ended_at")) or (None if run.active else run.ended_at)
        idle = 0 if h.kind == "managed_job" else h.autostop_minutes
        idle = control.CLUSTER_IDLE_MIN if idle is None else idle
        st.ended_at = min(end + 60 * idle, time.time()) if end else None  # not past now: torn down sooner
    return st


def cluster_state(*, sky, run: Run) -> tuple[Optional[str], Optional[str], bool]:
    """(state, reason, billing) of a cluster run; None: the cluster is gone."""
    records = sky.get(sky.status(cluster_names=[run.cluster]))
    if not records:
        return None, f"cluster {run.cluster} is gone (autostopped after the job, or torn down)", False
    cluster = enum_name(record_field(records[0], "status"))
    if cluster == "INIT":
        return "starting", "provisioning or setting up", True
    if cluster == "STOPPED":
        return "stopped", f"cluster {run.cluster} is stopped", False
    job_id = run.handle.job_id
    jobs = job_statuses(sky, run.cluster, job_id)
    job = enum_name(jobs.get(job_id, jobs.get(str(job_id))) if job_id is not None else
                    next(iter(jobs.values()), None))
    if job.startswith("FAILED"):
        return "failed", f"job {job}: see `launch logs`", True
    return _JOB_STATES.get(job, "starting"), None, True  # up: bills until autostop takes it down


def cluster_up(*, run: Run) -> bool:
    """Whether the run's cluster is up (UP or AUTOSTOPPING): its files are reached over SSH then."""
    sky = sdk()
    try:
        records = sky.get(sky.status(cluster_names=[run.cluster]))
    except Exception as e:  # noqa: BLE001
        raise map_sky_error(e) from None
    return bool(records) and enum_name(record_field(records[0], "status")) in ("UP", "AUTOSTOPPING")


def managed_record(*, sky, handle: Handle):
    """The jobs controller's queue record of the run's managed job (None: unknown to it)."""
    match = managed_records(sky, handle.job_id, handle.job_name)
    return match[-1] if match else None


def managed_state(*, sky, run: Run) -> tuple:
    """(state, reason, billing, RunPod's runpod_pods.Verdict on its pod or None) of a managed job;
    state None: the controller forgot it."""
    rec = managed_record(sky=sky, handle=run.handle)
    if rec is None:
        return None, "the jobs controller does not know this managed job any more", False, None
    status, recoveries = enum_name(record_field(rec, "status")), record_field(rec, "recovery_count", 0)
    billing = control.managed_job_billing(status, rec)
    if status.startswith("FAILED"):
        why = record_field(rec, "failure_reason") or record_field(rec, "details") or "see `launch logs`"
        return "failed", f"{status}: {why}", billing, None
    # RunPod's word on the pod (SkyPilot may say RUNNING)
    said = runpod_pods.check(run.handle, rec, status)
    billing = said.billing if said else billing
    if status == "RECOVERING" or (said and said.dead):
        return ("starting", f"preempted; SkyPilot is recovering it (recovery {recoveries + 1})", billing,
                said)
    return (_MANAGED_STATES.get(status, "starting"), f"recovered {recoveries}x" if recoveries else None,
            billing, said)


def settled(*, run: Run) -> RemoteStatus:
    """The jobs controller is gone: it autostops only once none of its jobs is active, so the run
    has ended, nothing of it bills, and how and when it ended is the run's own status.json's to
    say (read from the volume)."""
    reported = status_json(run=run, up=False)
    why = "the jobs controller is gone (torn down after its jobs ended)"
    if reported is None:
        why += "; the run's status.json is not readable from here (RUNPOD_S3_ACCESS_KEY/_SECRET_KEY)"
    st = merge_status(None, why, reported, run.state)
    st.billing = False
    st.ended_at = control.epoch((reported or {}).get("ended_at") or (reported or {}).get("updated_at"))
    return st


def status_json(*, run: Run, up: bool) -> Optional[dict]:
    """The run's own status.json: over SSH while the cluster is up, else from the volume (S3)."""
    text = run_text(run=run, rel=layout.STATUS, up=up)
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def run_text(*, run: Run, rel: str, up: bool) -> Optional[str]:
    """A run-dir-relative file of the run: over SSH while the cluster is up, else from the volume (S3)."""
    h = run.handle
    if h.kind == "cluster" and up:
        return cluster_ssh(run.cluster, f"cat {remote_path(h.run_dir + '/' + rel)}", check=False)
    if slurm_login.login_host(h):
        return slurm_login.read(slurm_login.login_host(h), f"{h.run_dir}/{rel}")
    if s3_ready(h):
        try:
            return S3Volume(h.volume).read(f"{h.volume['key_prefix']}/{run.id}/{rel}")
        except Exception:  # noqa: BLE001
            return None
    return None


def merge_status(state: Optional[str], reason: Optional[str], reported: Optional[dict],
                 previous: str) -> RemoteStatus:
    """SkyPilot's view (None: the machine is gone) merged with the run's own status.json."""
    rs = reported or {}
    said = rs.get("state") if rs.get("state") in STATES else None
    if state is None:
        if said and said not in ACTIVE_STATES:
            state = said
        else:
            state = previous if previous not in ACTIVE_STATES else "stopped"
    elif state in ("completed", "failed", "stopped") and said in ("completed", "failed", "budget_exhausted",
                                                                  "stopped"):
        # The run knows why it ended (budget, its own failure reason, a stop it was asked for). A stop
        # `launch down` asked for ends the job with the payload's exit 5, which SkyPilot records as
        # FAILED (any non-zero exit): the run's own `stopped` is the truth (seen on the emulated RunPod).
        state = said
    reason = rs.get("reason") if state == said and rs.get("reason") else reason
    return RemoteStatus.from_report(state, rs, reason)
