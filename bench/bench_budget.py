"""Budget overshoot: how far past `runtime.budget_usd` a run gets before it has stopped, on CPU.

    .venv/bin/python bench/bench_budget.py [--logging-steps 5] [--budget-s 8]

Trains the local-demo tiny Qwen3 LoRA with a price of $3600/h ($1 per second, so dollars read as
seconds) and a budget of `--budget-s` dollars. The payload checks the budget after every optimizer
step (payload.volume.control.RunControl -> CostTracker.exhausted), saves a checkpoint and stops, so the
overshoot should stay under one logging interval's cost (logging_steps x step time x price), the
bound the launcher promises. Prints the figures as JSON; exit 1 if the bound is broken.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
PRICE_PER_HOUR = 3600.0  # $1 per second


def run_until_budget(work: Path, budget_usd: float, logging_steps: int) -> dict:
    import yaml

    import payload.train.recipe as train
    from payload.config import RunConfig

    sys.path.insert(0, str(REPO / "tests"))
    from train_fixtures import write_text_data

    data = yaml.safe_load((REPO / "clusters" / "local-demo.yaml").read_text())
    for k in ("cluster", "budget"):
        data.pop(k)
    data["train"].update(max_steps=100000, logging_steps=logging_steps, eval_steps=100000)
    data["train"]["checkpoints"] = {"save_steps": 100000, "keep_best": 1, "keep_recent": 1}
    data["runtime"] = {"volume": str(work), "run_id": "bench", "price_per_hour": PRICE_PER_HOUR,
                       "budget_usd": budget_usd}
    cfg = RunConfig.model_validate(data)
    write_text_data(cfg.run_dir, n_train=256, n_val=0)
    (cfg.run_dir / "data" / "val.jsonl").unlink()
    train.observe.setup_logging()
    run = train.Run(cfg=cfg, run_dir=cfg.run_dir)
    timer = StepTimer()
    try:
        train.setup(run)
        run.trainer.add_callback(timer)
        train.load_checkpoint(run)
        train.train(run)
        spent, steps = run.tracker.usd(), run.trainer.state.global_step
    finally:
        train.cleanup(run)
    step_times = [b - a for a, b in zip(timer.ends, timer.ends[1:])]
    step_s = statistics.median(step_times) if step_times else float("nan")
    interval_usd = logging_steps * step_s * PRICE_PER_HOUR / 3600
    return {"budget_usd": budget_usd, "spent_usd": round(spent, 4), "overshoot_usd": round(spent - budget_usd, 4),
            "state": run.control.reason, "steps": steps,
            "median_step_s": round(step_s, 4), "logging_steps": logging_steps,
            "one_logging_interval_usd": round(interval_usd, 4),
            "save_s": run.control.save_history, "bound_held": spent - budget_usd <= interval_usd}


class StepTimer:
    """Wall-clock end of every optimizer step (a duck-typed Trainer callback)."""

    def __init__(self):
        self.ends: list[float] = []

    def __getattr__(self, name):
        if name.startswith("on_"):
            return lambda *a, **k: None
        raise AttributeError(name)

    def on_step_end(self, args, state, control, **kwargs):
        import time

        self.ends.append(time.monotonic())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--logging-steps", type=int, default=5)
    ap.add_argument("--budget-s", type=float, default=20.0,
                    help="budget in dollars = seconds at $3600/h (model loading counts: ~8 s here)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-budget-") as tmp:
        result = run_until_budget(Path(tmp), args.budget_s, args.logging_steps)
    print(json.dumps(result, indent=2))
    return 0 if result["bound_held"] and result["state"] == "budget_exhausted" else 1


if __name__ == "__main__":
    sys.exit(main())
