"""The user's own finished runs as `launch plan`'s throughput source ("calibrated from N runs").

A finished run's `training_summary.json` (payload/train/recipe.py, payload/volume/timings.py) records its measured
tokens/s per GPU, the GPU count and the wall seconds of each phase. It is read from the fetched
artifacts (`launch down --fetch-artifacts`: the registry's `artifacts` path) or, for a local run,
from the run directory on its local volume. A run counts for a plan when its profile's GPU
(the registry's profile, as it is now), its method and its model are the plan's.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from payload import layout

from launcher.plan.speed import SPREAD, Throughput
from launcher.store.registry import all_runs
from launcher.store.state import state_dir


@dataclass
class Measured:
    run_id: str
    accelerator: Optional[str]
    method: str
    model: str
    tokens_per_s_per_gpu: float
    phase_seconds: dict = field(default_factory=dict)


def summary_paths(run) -> list[Path]:
    """Where a run's training_summary.json may be: fetched artifacts, then a local run's volume."""
    out = []
    if run.handle.run_dir:  # local and ssh runs record where their run directory is
        out.append(Path(run.handle.run_dir) / layout.SUMMARY)
    if run.artifacts:
        out.append(Path(run.artifacts) / "training_summary.json")
    if run.backend == "local":
        volume = Path(run.handle.volume or state_dir() / "volumes" / run.profile)
        out.append(layout.run_dir(volume, run.id) / layout.SUMMARY)
    return out


def read_summary(run) -> Optional[dict]:
    for path in summary_paths(run):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data, dict):
            return data
    return None


def measured_runs() -> list[Measured]:
    """Every completed run whose summary holds a measured tokens/s/GPU."""
    from launcher.profiles.profile import ProfileError, load_profile

    out, accel = [], {}
    for run in all_runs():
        if run.state != "completed":
            continue
        s = read_summary(run)
        if not s or s.get("state") != "completed":
            continue
        rate = s.get("tokens_per_s_per_gpu")
        if rate is None and s.get("tokens_per_s"):
            rate = s["tokens_per_s"] / max(int(s.get("gpus") or 1), 1)
        if not rate:
            continue
        if run.profile not in accel:
            try:
                accel[run.profile] = load_profile(run.profile).cluster.accelerator_name
            except (ProfileError, OSError, ValueError):
                accel[run.profile] = "?"
        out.append(Measured(run.id, accel[run.profile], s.get("method") or "", s.get("model") or "", float(rate),
                            s.get("phase_seconds") or {}))
    return out


def calibrated(accelerator: Optional[str], method: str, model: str,
               runs: Optional[list[Measured]] = None) -> Optional[Throughput]:
    """The plan's throughput from the user's runs on the same GPU, method and model, else None."""
    try:
        runs = measured_runs() if runs is None else runs
    except Exception:  # noqa: BLE001 - a damaged registry must not stop a plan; the model's figure is used
        return None
    same = [r for r in runs if r.accelerator == accelerator and r.method == method and r.model == model]
    if not same:
        return None
    rates = [r.tokens_per_s_per_gpu for r in same]
    f = SPREAD["runs"]
    n = len(same)
    return Throughput(min(rates) / f, statistics.median(rates), max(rates) * f,
                      f"calibrated from {n} run{'s' if n > 1 else ''} of yours ({', '.join(r.run_id for r in same[-3:])})",
                      "runs")


def measured_phases(accelerator: Optional[str], method: str, model: str) -> dict:
    """Median measured seconds per phase of the matching runs ({} when none)."""
    try:
        same = [r for r in measured_runs() if (r.accelerator, r.method, r.model) == (accelerator, method, model)]
    except Exception:  # noqa: BLE001
        return {}
    names = {k for r in same for k in r.phase_seconds}
    return {k: statistics.median(r.phase_seconds[k] for r in same if k in r.phase_seconds) for k in names}
