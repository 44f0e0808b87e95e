"""A training run's state, shared by the recipe's phases and the trainer (payload/train/recipe.py sets it
up and passes it along; payload/train/trainer.py reads its config, stop signal and resume point at each
save). Its own module so both can import it: the recipe imports the trainer, never the other way."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from payload.volume.control import RunControl, StopSignal
from payload.volume import lease
from payload.volume import observe
from payload.volume.money import CostTracker


@dataclass
class Run:
    """Everything the phases share."""

    cfg: Any
    run_dir: Path
    t0: float = field(default_factory=time.monotonic)
    stop: StopSignal = field(default_factory=StopSignal)
    tracker: Optional[CostTracker] = None
    control: Optional[RunControl] = None
    trainer: Any = None
    attn: Optional[str] = None
    attn_reason: Optional[str] = None
    padding_free: bool = False
    counts: dict = field(default_factory=dict)
    val_records: list = field(default_factory=list)
    resume: Optional[Path] = None
    state: str = "starting"
    reason: Optional[str] = None
    lease: Optional[lease.Lease] = None
    # What a stop leaves for `launch down --fetch-artifacts` (rank 0; no `post` follows a stop): the
    # MANIFEST of the run's outputs, called with the end state. A stage's is its run's (train/stages.py).
    at_stop: Optional[Callable[[str], Any]] = None

    @property
    def main(self) -> bool:
        return observe.rank() == 0
