"""RunPod's own word on a managed job's pods, where SkyPilot 0.14.1 cannot read it.

RunPod keeps an interrupted spot pod listed with `desiredStatus: EXITED`. SkyPilot's RunPod status
query has no EXITED (sky/provision/runpod/instance.py:259 `status_map[inst['status']]` raises
KeyError), backend_utils.py:2446 wraps that as ClusterStatusFetchingError, and the jobs controller
retries it as a transient API error (sky/jobs/controller.py:1217-1250) until sky/jobs/utils.py:114-115
(60 s, 5 retries) gives up and recovers the job. Meanwhile `sky jobs queue` says RUNNING on a dead pod
(3 min 40 s on the emulated RunPod), and a run read from SkyPilot alone would show running and bill.

So for a managed job on RunPod that SkyPilot calls RUNNING, STARTING or RECOVERING, `check` asks
RunPod (one GraphQL query, `myself { pods { name desiredStatus lastStatusChange } }`, with a short
timeout) which pods of the job's cluster exist. The pods are SkyPilot's: named
`<cluster name on cloud>-head` / `-worker` (sky/provision/runpod/instance.py `_filter_instances`), the
cluster named from the job's name and id (sky/jobs/utils.py `generate_managed_job_cluster_name`) plus
the user hash on the cloud. A pod EXITED (or TERMINATED) that no newer live pod replaced means the job
was interrupted at its lastStatusChange; no pod at all, where one was seen before, means it is gone.
No key, no answer, another cloud: None, and the run reads as SkyPilot says (never an error here).
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Optional

from launcher.store.handle import Handle
from ... import sky_internals
from .sdk import record_field

TIMEOUT_S = 5.0  # a refresh waits no longer for RunPod (the SDK's own timeout is 30 s)
ASKED = ("RUNNING", "STARTING", "RECOVERING")  # SkyPilot states in which a pod of the job may bill
DEAD = ("EXITED", "TERMINATED")
QUERY = "query myselfPods { myself { pods { id name desiredStatus lastStatusChange } } }"
SKY_LINE = "sky/provision/runpod/instance.py:259"


@dataclass
class Verdict:
    """What RunPod's pod list says of the job, where it differs from SkyPilot's queue."""

    billing: bool  # a pod of the job is listed alive (it bills)
    cluster: str  # the job's cluster as RunPod names its pods (without -head/-worker)
    interrupted_at: Optional[float] = None  # when its pod was interrupted (None: alive, or not known)
    notice: Optional[str] = None  # the `!` line for `launch status` / `launch cost`
    dead: bool = False  # RunPod shows the job's pod dead (EXITED/TERMINATED) or gone
    listed: bool = True  # RunPod listed a pod of the job (remembered in run.handle.runpod_pods_seen)

    @property
    def keep(self) -> Handle:
        """What the run's handle keeps of it: that RunPod listed a pod of this cluster."""
        return Handle(runpod_pods_seen=self.cluster) if self.listed else Handle()


def check(handle: Handle, record, status: str) -> Optional[Verdict]:
    """RunPod's view of the managed job of `record` (its queue record, in SkyPilot state `status`;
    `handle`: the run's), or None where launch does not ask (not RunPod, no key) or RunPod did not
    answer in TIMEOUT_S."""
    if status not in ASKED or not on_runpod(handle, record):
        return None
    from .runpod_volumes import api_key

    key = api_key()
    if not key:
        return None
    try:
        match, cluster = pod_matcher(record, handle.job_name, handle.job_id)
        if match is None:
            return None
        pods = [p for p in list_pods(key) if isinstance(p, dict) and match(str(p.get("name") or ""))]
    except Exception:  # noqa: BLE001 - no answer: the run reads as SkyPilot says, as before
        return None
    return judge(pods, cluster, status, handle.runpod_pods_seen == cluster)


def on_runpod(handle: Handle, record) -> bool:
    """The job's cluster is on RunPod: its queue record says so, else every infra of the profile is."""
    cloud = record_field(record, "cloud")
    if cloud:
        return str(cloud).lower() == "runpod"
    infra = handle.infra or []
    return bool(infra) and all(str(i).split("/")[0].lower() == "runpod" for i in infra)


def pod_matcher(record, job_name: Optional[str], job_id):
    """(a test of a RunPod pod name, the cluster's name on RunPod): the exact names when the queue
    record carries `cluster_name_on_cloud`, else SkyPilot's cluster name for the job followed by any
    user hash. (None, "") when neither is known."""
    on_cloud = record_field(record, "cluster_name_on_cloud")
    if on_cloud:
        names = {f"{on_cloud}-head", f"{on_cloud}-worker"}
        return names.__contains__, str(on_cloud)
    if not job_name or job_id is None:
        return None, ""
    cluster = sky_internals.generate_managed_job_cluster_name(str(job_name), int(job_id))
    pattern = re.compile(rf"{re.escape(cluster)}-[0-9a-z]+-(head|worker)")
    return (lambda name: pattern.fullmatch(name) is not None), cluster


def list_pods(key: str, timeout: Optional[float] = None) -> list:
    """The account's pods (one GraphQL query through the runpod SDK), in at most `timeout` seconds:
    the query runs in a daemon thread, left behind if RunPod is slow (the SDK waits 30 s)."""
    from runpod.api.graphql import run_graphql_query

    box: dict = {}

    def ask():
        try:
            box["answer"] = run_graphql_query(QUERY, api_key=key)
        except BaseException as e:  # noqa: BLE001 - handed to the caller
            box["error"] = e

    worker = threading.Thread(target=ask, name="runpod-pods", daemon=True)
    worker.start()
    worker.join(TIMEOUT_S if timeout is None else timeout)
    if "answer" not in box:
        raise box.get("error") or TimeoutError(f"RunPod did not answer in {TIMEOUT_S:g} s")
    return ((box["answer"].get("data") or {}).get("myself") or {}).get("pods") or []


def judge(pods: list[dict], cluster: str, status: str, seen_before: bool, now: Optional[float] = None) -> Verdict:
    """The verdict on the job's pods as RunPod lists them (module docstring)."""
    now = time.time() if now is None else now
    dead = [p for p in pods if p.get("desiredStatus") in DEAD]
    alive = [p for p in pods if p.get("desiredStatus") not in DEAD]
    # A live pod replaces the dead ones it is newer than (SkyPilot relaunches under the same name);
    # one whose time is unreadable replaces them all (say nothing rather than something wrong).
    newest = max((changed_at(p) or float("inf") for p in alive), default=None)
    cut = [p for p in dead if newest is None or (changed_at(p) or now) > newest]
    if cut:
        at = min(min(changed_at(p) or now, now) for p in cut)  # never later than now (clocks differ)
        names = ", ".join(sorted({str(p.get("name")) for p in cut}))
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))
        notice = (f"RunPod reports spot pod {names} interrupted at {when} ({cut[0].get('desiredStatus')}); "
                  f"SkyPilot's jobs controller is recovering it (SkyPilot's status query cannot read "
                  f"EXITED: {SKY_LINE}, so `sky jobs queue` may say RUNNING for minutes); not billed since "
                  f"{when}, until a new pod runs")
        return Verdict(False, cluster, at, notice, dead=True)
    if alive:
        return Verdict(True, cluster)
    if not seen_before:  # never seen listed: perhaps not created yet, or another RunPod account's
        return None
    if status == "RUNNING":
        notice = (f"RunPod lists no pod of cluster {cluster} while SkyPilot says RUNNING: the pod is gone "
                  "(its host lost, or preempted); SkyPilot's jobs controller recovers the job once it sees "
                  "that; not billed from now, until a new pod runs")
        return Verdict(False, cluster, None, notice, dead=True, listed=False)
    return Verdict(False, cluster, listed=False)  # provisioning again after a recovery: no pod yet, nothing bills


_STAMP = re.compile(r"([A-Z][a-z]{2}) (\d{1,2}) (\d{4}) (\d{2}:\d{2}:\d{2}) GMT([+-]\d{4})")


def changed_at(pod: dict) -> Optional[float]:
    """Epoch seconds of a pod's lastStatusChange (RunPod writes e.g. "Exited by RunPod: Fri Nov 28 2026
    10:00:00 GMT+0000 (Coordinated Universal Time)"); None when unreadable."""
    found = _STAMP.search(str(pod.get("lastStatusChange") or ""))
    if not found:
        return None
    try:
        return datetime.strptime(" ".join(found.groups()), "%b %d %Y %H:%M:%S %z").timestamp()
    except ValueError:
        return None
