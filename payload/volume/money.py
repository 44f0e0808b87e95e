"""What the run costs: elapsed wall time x price, accumulated across restarts in `{run_dir}/cost.json`.

The price is the whole cluster's dollars per hour (`runtime.price_per_hour`). Every session adds
its own wall time (model loading and evaluation included: the machine is billed for them too), so
a job that was preempted and resumed shows the money of all its attempts. At 90% (the profile's
`budget.warn_fraction`, runtime.budget_warn_fraction) of `runtime.budget_usd` a warning is logged
once and written to status.json (`budget_warning`: `launch status` shows it, payload/outputs/tracking.py
puts it in W&B); at 100% `exhausted()` turns true and the training
loop saves a checkpoint and stops (state `budget_exhausted`, exit code `BudgetExhausted.exit_code`).
The check runs after every optimizer step, so the overshoot is about one step plus that save
(bench/bench_budget.py), within one logging interval's cost.

What runs before `train` (install, model download, data) is not counted here: the launcher counts
every billed second, setup included (registry billed_s), so it reaches the budget first: `launch status`
then asks the trainer for a final checkpoint (stop_request.json, as `launch down` does), waits a bounded
time, and tears the run down; where it cannot ask, it does so once a checkpoint exists
(`checkpoint_step` in status.json tells it).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Callable, Optional

from payload import layout
from payload.volume.control import Callback
from payload.volume.observe import atomic_write_json, now_iso, write_status  # observe owns status.json

log = logging.getLogger("payload.train")

WARN_FRACTION = 0.9


def usd(x: Optional[float]) -> str:
    """Dollars as `launch` writes them everywhere (launcher/units.money is this one): cents, with
    thousands separators; an amount under a cent to four places (`$0.0042`, never `$0.00` for money
    that was spent), under a hundredth of a cent `<$0.0001`; `-` when unknown."""
    if x is None:
        return "-"
    if 0 < abs(x) < 0.0001:
        return f"{'-' if x < 0 else ''}<$0.0001"
    return f"${x:,.4f}" if 0 < abs(x) < 0.01 else f"${x:,.2f}"


def resume_hint(profile: str) -> str:
    """The user's fix for a spent budget: resume the run with a larger one (stored with the run)."""
    return f"`launch up {profile} --resume --set budget.max_usd=N` with a larger N"


class CostTracker:
    """Seconds and dollars of this run so far; `clock` is injectable for tests of the arithmetic."""

    def __init__(self, run_dir: Path, price_per_hour: float, budget_usd: Optional[float],
                 clock: Callable[[], float] = time.monotonic, write: bool = True,
                 warn_fraction: float = WARN_FRACTION):
        self.path = Path(run_dir) / layout.COST
        self.price = float(price_per_hour)
        self.budget = budget_usd
        self.clock = clock
        self.write = write
        prior = _read(self.path)
        self.prior_seconds = float(prior.get("seconds", 0.0))
        self.prior_usd = float(prior.get("usd", 0.0))
        self.sessions = int(prior.get("sessions", 0)) + 1
        self.start = clock()
        self.warning: Optional[str] = None  # the budget warning, once spend passed warn_fraction
        self.warn_fraction = warn_fraction
        self._last_write = -1e9

    # ------------------------------------------------------------------------------- arithmetic

    def session_seconds(self) -> float:
        return max(self.clock() - self.start, 0.0)

    def seconds(self) -> float:
        return self.prior_seconds + self.session_seconds()

    def usd(self) -> float:
        return self.prior_usd + self.session_seconds() * self.price / 3600.0

    def fraction(self) -> Optional[float]:
        return None if not self.budget else self.usd() / self.budget

    def exhausted(self) -> bool:
        """True at or past 100% of the budget; warns once on the way, at `warn_fraction` (the log,
        and status.json `budget_warning` from the writing rank)."""
        frac = self.fraction()
        if frac is None:
            return False
        if frac >= self.warn_fraction and self.warning is None:
            self.warning = (f"cost {usd(self.usd())} is {100 * frac:.0f}% of the {usd(self.budget)} budget "
                            f"(warning at {100 * self.warn_fraction:.0f}%)")
            log.warning(self.warning)
            if self.write:
                write_status(self.path.parent, budget_warning=self.warning)
        return frac >= 1.0

    def eta_s(self, step: int, max_steps: int, session_steps: int, session_train_s: float) -> Optional[float]:
        """Remaining seconds at this session's pace (None until a step was timed)."""
        if session_steps <= 0 or session_train_s <= 0:
            return None
        return max(max_steps - step, 0) * session_train_s / session_steps

    def projected_usd(self, eta_s: Optional[float]) -> Optional[float]:
        return None if eta_s is None else self.usd() + eta_s * self.price / 3600.0

    # ---------------------------------------------------------------------------------- persist

    def snapshot(self) -> dict:
        return {
            "seconds": round(self.seconds(), 3),
            "usd": round(self.usd(), 6),
            "price_per_hour": self.price,
            "budget_usd": self.budget,
            "sessions": self.sessions,
            "updated_at": now_iso(),
        }

    def save(self, min_interval_s: float = 0.0) -> None:
        """Persist to cost.json (rank 0 only; throttled by `min_interval_s`)."""
        if not self.write:
            return
        t = self.clock()
        if t - self._last_write < min_interval_s:
            return
        self._last_write = t
        atomic_write_json(self.path, self.snapshot())


def _read(path: Path) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}


class CostCallback(Callback):
    """Keeps cost.json current (every step, at most every 5 s) and at the end of training, and tells
    status.json the newest complete checkpoint (`checkpoint_step`): the launcher tears a run down for
    its budget only once one exists, so a stop does not throw the work away."""

    def __init__(self, tracker: CostTracker):
        self.tracker = tracker

    def on_step_end(self, args, state, control, **kwargs):
        self.tracker.save(min_interval_s=5.0)

    def on_log(self, args, state, control, **kwargs):
        self.tracker.save()

    def on_save(self, args, state, control, **kwargs):
        # The Trainer calls on_save after _save_checkpoint, which finalizes it (COMPLETE marker).
        self.tracker.save()
        if self.tracker.write:
            write_status(self.tracker.path.parent, checkpoint_step=state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        self.tracker.save()
