"""Data stage: `python -m payload data --config RUN.yaml`, or `payload.data.main(cfg)` from Python.

Reads every source of `cfg.data` (local JSONL/JSON/CSV/Parquet files or Hugging Face dataset ids),
turns each record into one canonical chat record

    {"messages": [{"role": "system"|"user"|"assistant", "content": str | [parts]}], "source": NAME}

applies the per-source transforms (strip `<think>`, inject a system prompt, drop empty turns), drops
duplicates across all sources, splits per source with the seed, and writes `train.jsonl`,
`val.jsonl`, `test.jsonl` and `data_stats.json` to `{run_dir}/data/`. A `.complete` marker makes
the stage idempotent: a resumed job with the same config and inputs returns the cached stats.
"""

from __future__ import annotations

from payload import layout

from .pipeline import prepare
from .records import RecordError

__all__ = ["main", "prepare", "RecordError"]


def main(cfg, tokenizer=None) -> dict:
    """Run the data stage for a RunConfig; return a small summary (split sizes, cached or not)."""
    out = cfg.run_dir / layout.DATA_DIR
    stats = prepare(cfg.data, out, tokenizer=tokenizer)
    totals = stats["totals"]
    return {
        "stage": "data",
        "data_dir": str(out),
        "cached": stats["cached"],
        **{k: totals[k] for k in ("train", "val", "test", "in", "dropped", "duplicates")},
    }
