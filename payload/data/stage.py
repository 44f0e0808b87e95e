"""The data stage: `python -m payload data --config RUN.yaml`, or `payload.data.main(cfg)` from Python.

Reads every source of `cfg.data` (local JSONL/JSON/CSV/Parquet files or Hugging Face dataset ids),
turns each record into one canonical chat record

    {"messages": [{"role": "system"|"user"|"assistant", "content": str | [parts]}], "source": NAME}

applies the per-source transforms (strip `<think>`, inject a system prompt, drop empty turns), drops
duplicates across all sources, splits per source with the seed, and writes `train.jsonl`,
`val.jsonl`, `test.jsonl` and `data_stats.json` to `{run_dir}/data/`. A `.complete` marker makes
the stage idempotent: a resumed job with the same config and inputs returns the cached stats.

The work is `pipeline.prepare`; this module is the stage around it: where the splits go, the
tokenizer the `data.max_tokens` filter needs, and the stage's summary.
"""

from __future__ import annotations

from payload import layout

from .pipeline import prepare


def main(cfg, tokenizer=None) -> dict:
    """Run the data stage for a RunConfig; return a small summary (split sizes, cached or not).

    With `data.max_tokens` set and no `tokenizer` given (the stand-alone `python -m payload data`),
    the model's own tokenizer is loaded the way training loads it, so the filter applies here."""
    if tokenizer is None and cfg.data.max_tokens:
        tokenizer = load_tokenizer(cfg)
    out = cfg.run_dir / layout.DATA_DIR
    stats = prepare(cfg.data, out, tokenizer=tokenizer)
    totals = stats["totals"]
    return {
        "stage": "data",
        "data_dir": str(out),
        "cached": stats["cached"],
        **{k: totals[k] for k in ("train", "val", "test", "in", "dropped", "duplicates")},
    }


def load_tokenizer(cfg):
    """The tokenizer (or processor) training will use: the hub/local model's, or the tiny model's."""
    import os
    from pathlib import Path

    from payload.model import modeling
    from payload.errors import PayloadError

    os.environ.setdefault("HF_HOME", cfg.runtime.hf_home or str(Path(cfg.runtime.volume) / ".hf"))
    m = cfg.model
    try:
        return modeling.load_processing_class(modeling.base_model_path(cfg), m.kind, m.trust_remote_code,
                                              m.revision)
    except (OSError, ValueError, ImportError) as e:
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise PayloadError(f"data: data.max_tokens needs the tokenizer of {m.name_or_path}, which did not load "
                           f"({type(e).__name__}: {first}); check model.name_or_path, HF_TOKEN for gated models "
                           "and network access, or unset data.max_tokens") from None
