"""Measured phase durations of a run, for `launch plan`'s calibration (launcher/plan/calibration.py).

Every `python -m payload STAGE` adds its wall seconds to `{run}/phase_seconds.json` (rank 0; a
stage run twice, e.g. after a preemption, adds up). Before the manifest, `post` folds them into
`training_summary.json` as `phase_seconds` (setup and download are not payload stages: setup is
the shell's uv install, the model download happens inside `train` and is counted there), beside
the measured `tokens_per_s_per_gpu`.
"""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

from payload import layout

FILE = "phase_seconds.json"
PHASES = {"preflight": "setup", "data": "data", "train": "training", "eval": "eval", "merge": "merge",
          "export": "export"}


def read(run_dir: Path) -> dict:
    try:
        data = json.loads((Path(run_dir) / FILE).read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def add(run_dir: Path, phase: str, seconds: float) -> dict:
    """Add `seconds` to `phase` in the run's phase file (atomic rewrite)."""
    data = read(run_dir)
    data[phase] = round(float(data.get(phase, 0.0)) + seconds, 3)
    path = Path(run_dir) / FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, sort_keys=True))
    os.replace(tmp, path)
    return data


@contextmanager
def timed(run_dir: Optional[Path], stage: str):
    """Time one payload stage into the run's phase file (only the stages in PHASES, rank 0)."""
    t0 = time.monotonic()
    try:
        yield
    finally:
        phase = PHASES.get(stage)
        if phase and run_dir is not None and os.environ.get("RANK", "0") == "0":
            try:
                add(run_dir, phase, time.monotonic() - t0)
            except OSError:
                pass  # a read-only or vanished volume must not fail the stage


def fold_into_summary(run_dir: Path) -> Optional[dict]:
    """Copy the phase durations into training_summary.json (before the manifest hashes it)."""
    path = Path(run_dir) / layout.SUMMARY
    phases = read(run_dir)
    if not phases or not path.exists():
        return None
    summary = json.loads(path.read_text())
    summary["phase_seconds"] = phases
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(summary, indent=2, default=str))
    os.replace(tmp, path)
    return summary


def rates(records: list[dict]) -> dict:
    """Mean tokens/s of the logged intervals (all ranks together, as TRL counts them) and per GPU."""
    rates_ = [r["tokens_per_s"] for r in records if r.get("tokens_per_s")]
    if not rates_:
        return {"tokens_per_s": None, "tokens_per_s_per_gpu": None, "gpus": _world()}
    mean = sum(rates_) / len(rates_)
    return {"tokens_per_s": round(mean, 1), "tokens_per_s_per_gpu": round(mean / _world(), 1), "gpus": _world()}


def _world() -> int:
    try:
        return max(1, int(os.environ.get("WORLD_SIZE", "1")))
    except ValueError:
        return 1
