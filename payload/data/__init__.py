"""Data stage: `python -m payload data --config RUN.yaml`, or `payload.data.main(cfg)` from Python.

Reads every source of `cfg.data` (local files or Hugging Face dataset ids), turns each record into
one canonical chat record, applies the per-source transforms, drops duplicates, splits per source
with the seed, and writes the splits and `data_stats.json` to `{run_dir}/data/` (`stage` is the
stage itself; its docstring has the details).

The group: `stage` (the stage: `main(cfg)`), `sources` (opened, checked) -> `readers` (per format)
-> `records` -> `transforms` -> `pipeline` -> `writer`, with `images` and `problems`; `preview` (what
the trainer sees) and `trainset` (canonical records as the datasets TRL reads). It may import config/,
model/ (the tokenizer) and the base; outputs/ and train/ read it.
"""

from __future__ import annotations

from .pipeline import prepare
from .records import RecordError
from .stage import main

__all__ = ["main", "prepare", "RecordError"]
