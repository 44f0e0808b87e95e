"""Save and exit on request: `launch down` asks the trainer for a final checkpoint through a file.

Why a file and not SIGTERM: the signal comes with a deadline the trainer cannot stretch. SkyPilot's
`sky.cancel` SIGKILLs the job's process tree 30 s after its SIGTERM (sky/skylet/subprocess_daemon.py,
armed in sky/skylet/log_lib.py), a RunPod spot pod 5 s after; a ZeRO-3 save of a 32B model takes
minutes. So `launch down` writes `{run_dir}/stop_request.json` first (over SSH, the RunPod volume's S3
API, or directly: every backend), waits until status.json says the run ended and the checkpoint it
names has its COMPLETE marker, and only then cancels.

The trainer checks for the file at every step end (rank 0 stats it, the answer is all-reduced so
every rank stops at the same step), saves a checkpoint whatever it costs, writes the MANIFEST of what
the run has (payload/outputs/manifest.py `at_end`, called by train/: no `post` follows this end, and a
fetch after it verifies sha256), records `state: stopped`, `exit_code: 5` and `final_checkpoint`
(run-dir relative) in status.json, and exits with
EXIT_STOP_REQUESTED (5): outside `recover_on_exit_codes` (75, 143) and with `max_restarts_on_errors: 0`
SkyPilot neither recovers nor restarts it. A request left over from an earlier session is removed
when training starts, so a resumed run is not stopped by it.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Optional

from payload import layout
from payload.errors import EXIT_STOP_REQUESTED, PayloadError

log = logging.getLogger("payload.train")

REQUEST = "stop_request.json"  # in the run's top-level directory ({volume}/runs/{run_id}/)
REASON = "stop_requested"  # RunControl.reason once a request was honoured


class StopRequested(PayloadError):
    """`launch down` asked for a final checkpoint: saved, the run stops (resumable)."""

    exit_code = EXIT_STOP_REQUESTED


def top_run_dir(cfg) -> Path:
    """The run's own directory (a stage trains in a subdirectory; the request is the run's)."""
    rt = cfg.runtime
    return layout.run_dir(rt.volume, rt.run_id) if rt.volume and rt.run_id else Path(cfg.run_dir)


def clear(cfg) -> None:
    """Remove a request left by an earlier session (rank 0, at the start of training)."""
    try:
        (top_run_dir(cfg) / REQUEST).unlink()
        log.info("removed an old stop request (%s): this session trains on", REQUEST)
    except FileNotFoundError:
        pass


def _main_rank() -> bool:
    return os.environ.get("RANK", "0") == "0"


class SaveAndExit:
    """Trainer callback after RunControl: a request turns this step's end into save + stop."""

    def __init__(self, cfg, control):
        self.path = top_run_dir(cfg) / REQUEST
        self.control = control

    def __getattr__(self, name):  # every other TrainerCallback event is a no-op
        if name.startswith("on_"):
            return lambda *a, **k: None
        raise AttributeError(name)

    def on_step_end(self, args, state, control, **kwargs):
        from payload.volume.control import all_reduce_max

        asked = float(_main_rank() and self.path.exists())
        (asked,) = all_reduce_max([asked], self.control.device)
        if asked and self.control.reason != "lease_lost":
            self.control.reason = REASON
            self.control.stop_by = asked_by(self.path) if _main_rank() else None
            control.should_training_stop = control.should_save = True
            if _main_rank():  # rank 0 speaks for the run (the others end quietly: payload.train.torchrun)
                log.warning("stop requested (%s) at step %d: saving a final checkpoint, then exiting with %d",
                            REQUEST, state.global_step, EXIT_STOP_REQUESTED)
        return control


def asked_by(path: Path) -> Optional[str]:
    """Who asked (the request's `by`: `launch down`, or the launcher's budget check), one printable line."""
    try:
        by = json.loads(path.read_text()).get("by")
    except (OSError, ValueError, AttributeError):
        return None
    return by[:120] if isinstance(by, str) and by.isprintable() and by.strip() else None


def end_reason(step: int, total: Optional[int], by: Optional[str] = None) -> str:
    return f"stopped by {by or 'launch down'} at step {step} of {total}; checkpoint-{step} saved (final)"


def honoured(control) -> bool:
    return control is not None and control.reason == REASON


def exit_code(control, default: int) -> int:
    return EXIT_STOP_REQUESTED if honoured(control) else default


def final_fields(cfg, control, step: int) -> dict:
    """For status.json: the final checkpoint's directory, relative to the run's own directory (a
    stage's checkpoints are under stages/), which `launch down` checks for its COMPLETE marker."""
    if not honoured(control):
        return {}
    path = Path(cfg.run_dir) / layout.CHECKPOINTS_DIR / f"checkpoint-{step}"
    try:
        return {"final_checkpoint": path.relative_to(top_run_dir(cfg)).as_posix()}
    except ValueError:
        return {"final_checkpoint": f"{layout.CHECKPOINTS_DIR}/checkpoint-{step}"}
