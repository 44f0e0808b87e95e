"""Evaluation stage: `python -m payload eval --config RUN.yaml [--split test] [--adapter DIR]`, or
`payload.outputs.evaluate.main(cfg, split, adapter)`; and the in-training evaluation (`GenerationEval`).

The model answers each held-out record with its chat template, greedily (payload/outputs/infer.py), and the
answers are scored against the record's last assistant turn: CER and WER by jiwer (corpus-level:
edits over reference characters/words), exact match after stripping whitespace. Greedy decoding of
the same adapter on the same records gives the same text, so a re-run gives the same numbers.

Outputs: `outputs/eval_<split>.json` (scores, and every sample's reference, prediction and own
scores), a `<split>_<metric>` line in metrics.jsonl (replacing an earlier one of the same split),
`evaluation.<split>` in the training summary, and W&B (payload/outputs/tracking.py) when it is on. Given an
`out_dir` (`launch eval` re-scoring a run elsewhere), only `out_dir/eval_<split>.json` (and W&B): the
run's files, which its MANIFEST describes, are never changed by scoring.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Optional

from payload import layout
from payload.volume.control import Callback
from payload.errors import PayloadError

log = logging.getLogger("payload.eval")


def eval_file(split: str) -> str:
    return f"{layout.OUTPUTS_DIR}/eval_{split}.json"


# ------------------------------------------------------------------------------------------ scores


def score(references: list[str], predictions: list[str], metrics) -> dict:
    """Corpus scores: `cer`/`wer` by jiwer (None when every reference is empty), `exact_match` as
    a fraction. Empty references are left out of CER/WER (jiwer cannot divide by zero characters)."""
    import jiwer

    pairs = [(r, p) for r, p in zip(references, predictions) if r.strip()]
    refs, hyps = [r for r, _ in pairs], [p for _, p in pairs]
    out = {}
    for m in metrics:
        if m == "exact_match":
            out[m] = sum(r.strip() == p.strip() for r, p in zip(references, predictions)) / max(len(references), 1)
        elif not refs:
            out[m] = None
        elif m == "cer":
            out[m] = float(jiwer.cer(refs, hyps))
        elif m == "wer":
            out[m] = float(jiwer.wer(refs, hyps))
    return {k: None if v is None else round(v, 6) for k, v in out.items()}


def generate_and_score(model, processing, records: list[dict], ecfg, batch_size: int = 8) -> tuple[dict, list[dict]]:
    """(corpus scores, per-sample rows) for canonical records."""
    from payload.outputs.infer import answer, images_of, split_record

    prompts, refs = zip(*(split_record(r) for r in records)) if records else ((), ())
    preds = answer(model, processing, list(prompts), ecfg.max_new_tokens, batch_size)
    rows = []
    for i, (rec, ref, pred) in enumerate(zip(records, refs, preds)):
        rows.append({"index": i, "source": rec.get("source"), "reference": ref, "prediction": pred,
                     **score([ref], [pred], ecfg.metrics), "images": images_of(rec["messages"])})
    return score(list(refs), preds, ecfg.metrics), rows


# -------------------------------------------------------------------------------------------- stage


def main(cfg, split: Optional[str] = None, adapter: Optional[str] = None, out_dir: Optional[Path] = None) -> dict:
    """Score the adapter (default: the run's exported best adapter) on `split` (default:
    `evaluation.final_split`); write the eval file, metrics line, summary entry and W&B."""
    from payload.outputs import infer
    from payload.volume import observe
    from payload.data import trainset

    ecfg = eval_settings(cfg)
    split = split or ecfg.final_split or "test"
    rd = cfg.run_dir
    adapter_dir = Path(adapter) if adapter else rd / layout.ADAPTER_DIR
    if not adapter_dir.is_dir():
        raise PayloadError(f"eval: no adapter at {adapter_dir}; train first or pass --adapter DIR")
    records = _split_records(cfg, split, trainset)
    if ecfg.max_test_samples:
        records = records[:ecfg.max_test_samples]
    observe.setup_logging()
    model, processing = infer.load(cfg, adapter_dir)
    scores, rows = generate_and_score(model, processing, records, ecfg, cfg.train.per_device_eval_batch_size)
    result = {"split": split, "n": len(rows), "adapter": str(adapter_dir), "model": cfg.model.name_or_path,
              "config_hash": cfg.config_hash(), "max_new_tokens": ecfg.max_new_tokens, "decoding": "greedy",
              "metrics": scores, "samples": rows}
    if out_dir is None:  # the run's own evaluation (`post`, before its MANIFEST is written)
        path = rd / eval_file(split)
        observe.atomic_write_json(path, result)
        _replace_metrics_line(rd / layout.METRICS, split, {"step": _trained_steps(rd), "split": split,
                                                            **{f"{split}_{k}": v for k, v in scores.items()}})
        _add_to_summary(rd / layout.SUMMARY, split, scores, len(rows))
    else:  # a re-score elsewhere (`launch eval`): its own file, never one the run's MANIFEST describes
        path = Path(out_dir) / f"eval_{split}.json"
        observe.atomic_write_json(path, result)
    from payload.outputs import tracking

    tracking.log_eval(cfg, split, scores, rows)
    log.info("eval %s: %d samples, %s", split, len(rows),
             ", ".join(f"{k} {v:.4f}" for k, v in scores.items() if v is not None))
    return {"stage": "eval", "split": split, "n": len(rows), **scores, "file": str(path)}


def eval_settings(cfg):
    from payload.config.evaluation import EvalConfig

    return cfg.evaluation or EvalConfig()


def _split_records(cfg, split: str, trainset) -> list[dict]:
    """The split's canonical records, running the data stage first when they are missing."""
    data_dir = cfg.run_dir / layout.DATA_DIR
    path = data_dir / f"{'val' if split == 'val' else split}.jsonl"
    if not (data_dir / "train.jsonl").is_file():
        import payload.data as data_stage

        log.info("no prepared data in %s: running the data stage", data_dir)
        data_stage.main(cfg)
    records = trainset.read_jsonl(path) if path.is_file() else []
    if not records:
        raise PayloadError(f"eval: the {split} split is empty ({path}); give a data source `split: {split}` "
                           "(or ratios with a `" + split + "` share) or evaluate another split with --split")
    return records


def _trained_steps(run_dir: Path) -> Optional[int]:
    try:
        return json.loads((run_dir / layout.SUMMARY).read_text()).get("steps")
    except (OSError, ValueError):
        return None


def _replace_metrics_line(path: Path, split: str, rec: dict) -> None:
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    keep = [ln for ln in lines if ln.strip() and json.loads(ln).get("split") != split]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(ln + "\n" for ln in keep + [json.dumps(rec)]), encoding="utf-8")
    tmp.replace(path)


def _add_to_summary(path: Path, split: str, scores: dict, n: int) -> None:
    from payload.volume.observe import atomic_write_json

    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    summary.setdefault("evaluation", {})[split] = {**scores, "n": n}
    atomic_write_json(path, summary)


# ------------------------------------------------------------------------------ during training


class GenerationEval(Callback):
    """At every evaluation: generate for the first `evaluation.max_samples` val records with the
    model being trained and add `eval_cer`/`eval_wer`/`eval_exact_match` to the Trainer's metrics
    (before the best-checkpoint bookkeeping and early stopping read them) and to the logs
    (metrics.jsonl, W&B, the checkpoint's marker). Every rank computes the same numbers on the same
    records (greedy), so early stopping decides alike on all of them."""

    def __init__(self, run, records: list[dict]):
        self.run = run
        self.ecfg = eval_settings(run.cfg)
        self.records = records[:self.ecfg.max_samples]

    def on_evaluate(self, args, state, control, metrics=None, model=None, processing_class=None, **kwargs):
        if metrics is None or model is None or not self.records:
            return
        was_training = model.training
        model.eval()
        try:
            scores, _ = generate_and_score(model, processing_class, self.records, self.ecfg,
                                           args.per_device_eval_batch_size)
        finally:
            model.train(was_training)
        logged = {f"eval_{k}": v for k, v in scores.items() if v is not None}
        metrics.update(logged)
        if self.run.trainer is not None and logged:
            self.run.trainer.log(dict(logged))
