"""The run's control while training: when to save and when to stop.

The save-time policy (an explicit interval, else Young's formula on spot), SIGTERM/SIGINT as a flag
read at step boundaries, the save-time estimate that decides whether a SIGTERM's save fits its
deadline, the ranks' agreement (`all_reduce_max`, `gather_objects`), the trainer callbacks' base
(`Callback`) and `RunControl`, the callback that makes saves and stops happen.

It stands apart from `checkpoints.py` (what a save leaves on the volume: markers, checksums,
retention, the index) because it reads clocks, signals and the other ranks, not files. It imports
nothing of `checkpoints.py`; that one uses `gather_objects` to share a save's hashing over the ranks.

Decisions that depend on clocks or signals (time-based save, SIGTERM, budget, a lost lease) are
all-reduced across ranks every step, so every process saves and stops at the same step (no DDP
deadlock).
"""

from __future__ import annotations

import logging
import math
import signal
import time
from typing import Optional

from payload.errors import EXIT_INTERRUPTED, PayloadError

log = logging.getLogger("payload.train")

SIGTERM_SAVE_BUDGET_S = 2.5
"""RunPod sends SIGKILL 5 s after SIGTERM: save on SIGTERM only when a save should take less than this."""
INITIAL_SAVE_ESTIMATE_S = 60.0
"""Save time assumed by Young's formula until the first save has been timed."""
ASSUMED_WRITE_MB_S = 200.0
"""Before the first save was timed, a SIGTERM save is estimated at this rate (the slow end of a RunPod
network volume, FIELD-NOTES), plus hashing at ASSUMED_HASH_MB_S, plus SAVE_OVERHEAD_S."""
ASSUMED_HASH_MB_S = 1000.0  # sha256 measured 1.2-1.6 GB/s on 2 cores (bench/bench_checkpoint.py)
SAVE_OVERHEAD_S = 0.5


class TrainingInterrupted(PayloadError):
    """SIGTERM/SIGINT (spot preemption, `launch down`): stopped at a step boundary; restart resumes."""

    exit_code = EXIT_INTERRUPTED


class TrainingFinished(Exception):
    """Raised at train begin when the resumed checkpoint is already at max_steps: nothing to train
    (training on would add a step the uninterrupted run never took)."""


# ------------------------------------------------------------------------------- save-time policy


def young_interval_s(save_seconds: float, mtbf_hours: float) -> float:
    """Young's optimal checkpoint interval sqrt(2 * save_time * MTBF), in seconds."""
    return math.sqrt(2.0 * max(save_seconds, 1e-3) * mtbf_hours * 3600.0)


def save_interval_s(ck_cfg, measured_save_s: Optional[float]) -> Optional[float]:
    """Seconds between time-based saves: explicit minutes, else Young's formula (spot), else None."""
    if ck_cfg.save_every_minutes:
        return ck_cfg.save_every_minutes * 60.0
    if ck_cfg.expected_preemption_hours:
        est = measured_save_s if measured_save_s is not None else INITIAL_SAVE_ESTIMATE_S
        return young_interval_s(est, ck_cfg.expected_preemption_hours)
    return None


class StopSignal:
    """SIGTERM/SIGINT set a flag; the training loop stops at the next step boundary."""

    def __init__(self):
        self.signum: Optional[int] = None
        self._previous = {}

    def install(self) -> "StopSignal":
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not in the main thread: leave signals alone
                pass
        return self

    def _handle(self, signum, frame):
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # second Ctrl-C: stop now
        self.signum = signum
        log.warning("received %s: stopping at the next step boundary", signal.Signals(signum).name)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


def _distributed():
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1 else None


def all_reduce_max(values: list[float], device=None) -> list[float]:
    """Element-wise max over all ranks (identity in a single process)."""
    dist = _distributed()
    if dist is None:
        return list(values)
    import torch

    t = torch.tensor(values, dtype=torch.float64, device=device or "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def gather_objects(obj) -> list:
    """`obj` of every rank, in rank order, on every rank ([obj] in a single process)."""
    if "torch" not in __import__("sys").modules:  # nothing distributed can be running without torch
        return [obj]
    dist = _distributed()
    if dist is None:
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def estimate_save_s(model) -> float:
    """Seconds a first save should take: trainable weights plus two AdamW moments (fp32) written at
    ASSUMED_WRITE_MB_S and hashed at ASSUMED_HASH_MB_S (ZeRO-3 partitions report their full size as
    `ds_numel`)."""
    total = 0
    for p in model.parameters() if model is not None else ():
        if p.requires_grad:
            total += getattr(p, "ds_numel", p.numel()) * (p.element_size() + 8)
    return SAVE_OVERHEAD_S + total / 1e6 * (1 / ASSUMED_WRITE_MB_S + 1 / ASSUMED_HASH_MB_S)


# ------------------------------------------------------------------------------- trainer callback


def _noop(*args, **kwargs):
    return None


class Callback:
    """A transformers TrainerCallback by duck typing: every `on_*` event not defined is a no-op.

    Subclassing the real `TrainerCallback` would import transformers when this module loads, before
    the payload has set HF_HOME; the Trainer only ever calls `getattr(callback, event)(...)`.
    """

    def __getattr__(self, name):
        if name.startswith("on_"):
            return _noop
        raise AttributeError(name)


class RunControl(Callback):
    """Per-step decisions the step schedule cannot make: time-based saves (snapped to the next
    logging boundary, so logged loss windows stay identical across restarts), a save + eval at the
    last step, stop + save on budget exhaustion, stop on SIGTERM (saving only if a save is fast:
    measured, or estimated from the trainable size before the first save), stop at once without
    saving when the run's lease was taken over (another trainer owns the run directory)."""

    def __init__(self, ck_cfg, stop: StopSignal, tracker=None, logging_steps: int = 1, has_eval: bool = False,
                 lease=None):
        self.ck = ck_cfg
        self.stop = stop
        self.tracker = tracker
        self.lease = lease
        self.logging_steps = max(int(logging_steps), 1)
        self.has_eval = has_eval
        self.measured_save_s: Optional[float] = None
        self.estimated_save_s: float = 1e9
        self.save_history: list[float] = []  # seconds of every save of this session
        self.last_save_t = time.monotonic()
        self.pending_time_save = False
        self.reason: Optional[str] = None  # "stopped" | "budget_exhausted" | "lease_lost"
        self.stop_saved: Optional[bool] = None  # on a signal: whether the stop saved a checkpoint
        self.stop_by: Optional[str] = None  # on a stop request: who asked (rank 0 reads it)
        self.stop_save_s: Optional[float] = None
        self.device = None

    def note_save(self, seconds: float) -> None:
        self.measured_save_s = seconds
        self.save_history.append(seconds)
        self.last_save_t = time.monotonic()

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if state.max_steps and state.global_step >= state.max_steps:
            raise TrainingFinished(f"the resumed checkpoint is at step {state.global_step} of {state.max_steps}")
        self.last_save_t = time.monotonic()
        self.device = args.device if args.device.type == "cuda" else None
        self.estimated_save_s = estimate_save_s(model)

    def on_step_end(self, args, state, control, **kwargs):
        interval = save_interval_s(self.ck, self.measured_save_s)
        due = interval is not None and time.monotonic() - self.last_save_t >= interval
        over = bool(self.tracker and self.tracker.exhausted())
        sig = self.stop.signum is not None
        lost = bool(self.lease is not None and self.lease.lost)
        save_s = self.measured_save_s if self.measured_save_s is not None else self.estimated_save_s
        sig, over, due, save_s, lost = all_reduce_max(
            [float(sig), float(over), float(due), save_s, float(lost)], self.device)
        step = state.global_step
        if due and not self.pending_time_save:
            self.pending_time_save = True
            log.info("time-based save due (every %.0f s): at the next logging boundary", interval or 0)
        if self.pending_time_save and step % self.logging_steps == 0:
            control.should_save, self.pending_time_save = True, False
        if step >= state.max_steps:
            control.should_save = True
            control.should_evaluate = control.should_evaluate or self.has_eval
        if lost:
            self.reason = "lease_lost"
            control.should_training_stop = True
            control.should_save = control.should_evaluate = False
            log.error("stopping at step %d without saving: another trainer took over this run's lease", step)
        elif sig:
            self.reason = "stopped"
            control.should_training_stop = True
            control.should_save = control.should_save or save_s < SIGTERM_SAVE_BUDGET_S
            self.stop_saved, self.stop_save_s = bool(control.should_save), save_s
            log.warning("stopping at step %d (%s)", step, "saving first" if control.should_save else
                        f"no save: a save takes {save_s:.1f}s, more than the {SIGTERM_SAVE_BUDGET_S}s allowed")
        elif over:
            self.reason = "budget_exhausted"
            control.should_training_stop = True
            control.should_save = True
        return control
