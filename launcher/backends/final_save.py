"""`launch down`'s final checkpoint, the same way on every backend, before anything is signalled.

A signal is no way to ask for a checkpoint that takes minutes: SkyPilot's `sky.cancel` SIGKILLs the
job's process tree 30 s after its SIGTERM (sky/skylet/subprocess_daemon.py; SKY_KILL_AFTER_S in
skypilot/control.py), a RunPod spot pod gets 5 s, and the payload saves on SIGTERM only when a save
fits (payload/volume/control.py SIGTERM_SAVE_BUDGET_S). So while the run's status.json says `training`,
`launch down` writes `stop_request.json` into the run directory (Backend.write_run_file: a local
file, SSH, or the RunPod volume's S3 API), waits until status.json says the trainer ended, checks that
the checkpoint it names (`final_checkpoint`) has its COMPLETE marker, and only then lets the backend
stop the machine. Every outcome is one line for the user: the checkpoint saved, or why the run keeps
its last periodic checkpoint instead; and `left` names the checkpoint a stopped run leaves for
`--resume` (step, size), which `down` says with where it is and what to run next.
"""

from __future__ import annotations

import json
import time
from typing import NamedTuple, Optional

from payload import layout
from payload.errors import END_STATES
from payload.volume.stop_request import REQUEST

from launcher.term.units import human_size

FINAL_SAVE_TIMEOUT_S = 1800.0  # a ZeRO-3 save of a 32B model onto a network volume: minutes, not seconds
POLL_S = 5.0
UNREACHABLE_S = 120.0  # the machine not answering this long while asked: waiting on would see nothing
_ENDED = (*END_STATES, "interrupted")


class FinalSave(NamedTuple):
    saved: bool
    line: str
    checkpoint: Optional[str] = None  # the final checkpoint, run-dir relative, once saved


def status_json(be, run) -> dict:
    """The run's status.json as the payload last wrote it ({} when missing, unreadable or not an object)."""
    try:
        text = be.read_run_file(run, layout.STATUS)
        value = json.loads(text) if text else {}
    except (ValueError, OSError):
        return {}
    return value if isinstance(value, dict) else {}


def _complete(be, run) -> list[dict]:
    """The rows of the run's checkpoint listing that are complete, oldest first (a `step` each)."""
    try:
        rows = json.loads(be.read_run_file(run, layout.CHECKPOINT_LISTING) or "[]")
    except (ValueError, OSError):
        rows = []
    return [r for r in rows if isinstance(r, dict) and r.get("complete") and isinstance(r.get("step"), int)
            and not isinstance(r.get("step"), bool)] if isinstance(rows, list) else []


def _runs_there(run) -> bool:
    """A run ended here (`launch down --forget`: its machine was not reached) whose backend, asked now,
    says its processes run: its trainer trains on, and answers a request like a live run's."""
    remote = run.remote
    return remote is not None and remote.state == "running"


def _state_here(be, run) -> Optional[str]:
    """The run's state as its backend sees it (`unreachable`: its machine does not answer; None: the
    backend cannot say now)."""
    try:
        return be.status(run).state
    except Exception:  # noqa: BLE001 - a backend that cannot say now: keep waiting for status.json
        return None


def _kept(be, run) -> str:
    """The newest checkpoint the run's listing says is complete (what a resume starts from)."""
    done = _complete(be, run)
    return f"checkpoint-{done[-1]['step']}" if done else "no complete checkpoint listed yet (a resume starts from step 0)"


def left(be, run, saved: Optional[FinalSave]) -> Optional[str]:
    """The checkpoint a stopped run leaves for `--resume`, as `launch down` says it (`checkpoint step 71
    (checkpoint-71, 1.2 GB)`): the final one `request` got, else the newest complete one the run
    lists. None for a run that completed training (its adapter is the result), one without a
    complete checkpoint, or one whose machine does not answer."""
    remote = run.remote
    if run.state == "completed" or (remote is not None and remote.state in ("unreachable", "unknown")):
        return None
    if status_json(be, run).get("state") == "completed":
        return None
    rows = {f"checkpoint-{r['step']}": r for r in _complete(be, run)}
    final = saved.checkpoint if saved is not None and saved.saved else None
    name = final.rsplit("/", 1)[-1] if final else next(reversed(rows), None)
    if name is None or not name.removeprefix("checkpoint-").isdigit():
        return None
    size = rows.get(name, {}).get("bytes")
    size = f", {human_size(size)}" if isinstance(size, int) and not isinstance(size, bool) else ""
    return f"checkpoint step {name.removeprefix('checkpoint-')} ({name}{size})"


def request(be, run, timeout_s: Optional[float] = None, poll_s: Optional[float] = None,
            by: str = "launch down", report: Optional[dict] = None) -> Optional[FinalSave]:
    """Ask a training run for a final checkpoint and wait for it (None: no trainer is training); `by`
    is who asks, which the trainer's end line says; `report` the run's status.json as the caller has
    just read it (`status_json`), so it is not read again before the question."""
    timeout_s = FINAL_SAVE_TIMEOUT_S if timeout_s is None else timeout_s
    if not run.active and not _runs_there(run):  # ended (preempted, failed...): its status.json may still say
        return None  # "training", but no trainer is left to answer; asking would wait FINAL_SAVE_TIMEOUT_S for nothing
    said = (status_json(be, run) if report is None else report).get("state")
    if said is None and run.state == "running":
        return FinalSave(False, f"no status.json from the run yet ({be.name}: still setting up, or not readable), "
                                f"so no final checkpoint was asked for; the run keeps {_kept(be, run)}")
    if said != "training":
        return None
    body = json.dumps({"by": by, "at": time.time()})
    if not be.write_run_file(run, REQUEST, body):
        return FinalSave(False, f"could not ask for a final checkpoint ({be.name}: {REQUEST} not writable); "
                                f"the run keeps {_kept(be, run)}")
    deadline = time.monotonic() + timeout_s
    st = status_json(be, run)
    gone, lost_since = False, None
    while st.get("state") not in _ENDED and time.monotonic() < deadline:
        time.sleep(min(POLL_S if poll_s is None else poll_s, max(0.0, deadline - time.monotonic())))
        st = status_json(be, run)
        here = None if st.get("state") in _ENDED else _state_here(be, run)
        if here in END_STATES:
            st = status_json(be, run)  # it may have ended by saving in between: status.json says so then
            gone = st.get("state") not in _ENDED  # else its processes ended without an end (killed, lost)
            break
        lost_since = (lost_since or time.monotonic()) if here == "unreachable" else None
        if lost_since is not None and time.monotonic() - lost_since >= UNREACHABLE_S:  # not 30 min for nothing
            return FinalSave(False, f"no final checkpoint seen: the machine stopped answering while the run was "
                                    f"asked for one ({UNREACHABLE_S:g} s); it may still save it there, and the run "
                                    "keeps its newest complete checkpoint on that machine")
    if gone:
        return FinalSave(False, f"no final checkpoint: the run's processes ended while it was asked for one; "
                                f"the run keeps {_kept(be, run)}")
    if st.get("state") not in _ENDED:
        return FinalSave(False, f"no final checkpoint: the trainer did not finish saving within {timeout_s:g} s; "
                                f"the run keeps {_kept(be, run)}")
    final = st.get("final_checkpoint")
    if final and be.read_run_file(run, f"{final}/{layout.COMPLETE_MARKER}") is not None:
        return FinalSave(True, f"final checkpoint {final} saved (its COMPLETE marker checked)", final)
    why = st.get("reason") or f"state {st.get('state')}"
    return FinalSave(False, f"the trainer ended without a final checkpoint ({why}); the run keeps {_kept(be, run)}")
