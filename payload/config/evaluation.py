"""Schema of the `evaluation:` and `wandb:` sections of a run config (runbook 002).

Kept apart from payload/config/runconfig.py, which only names these classes in `RunConfig`. Imports pydantic
only (the launcher validates profiles with it).

    evaluation:
      metrics: [cer, wer, exact_match]   # generation metrics (jiwer), besides the eval loss
      max_samples: 32                    # during training: the first N val records, every eval_steps
      max_new_tokens: 256
      final_split: test                  # `python -m payload eval` (and `post`) on this split
      metric_for_best: cer               # best-k checkpoints and early stopping by this (lower wins)
    wandb:
      project: well-log-ocr
      tags: [qwen3-vl, qlora]
"""

from __future__ import annotations

from typing import Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, model_validator

Metric = Literal["cer", "wer", "exact_match"]
# Higher is better only for exact match; the loss and error rates are lower-is-better.
HIGHER_IS_BETTER = {"exact_match"}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EvalConfig(_Strict):
    """Generation-based evaluation: the model answers held-out records with its chat template
    (greedy, so a re-run gives the same numbers) and the answers are scored against the targets."""

    metrics: list[Metric] = Field(default_factory=lambda: ["cer", "wer", "exact_match"], min_length=1)
    """Scores computed on the generated text: `cer` and `wer` (jiwer), `exact_match` (after
    stripping surrounding whitespace)."""
    during_training: bool = True
    """Also score generations at every evaluation (`train.eval_steps`) on `max_samples` val records."""
    max_samples: int = Field(default=32, gt=0, le=10_000)
    """How many val records the in-training evaluation generates for (the first N: same ones every time)."""
    max_new_tokens: int = Field(default=256, gt=0, le=8192)
    """Longest generated answer, in tokens."""
    final_split: Optional[Literal["val", "test"]] = "test"
    """Split that `python -m payload eval` (and the `post` stage) scores in full; null: none."""
    max_test_samples: Optional[int] = Field(default=None, gt=0)
    """Score at most this many records of the final split (default: all)."""
    metric_for_best: Literal["eval_loss", "cer", "wer", "exact_match"] = "eval_loss"
    """What `train.checkpoints.keep_best`, the exported best adapter and early stopping compare:
    the eval loss or one of `metrics` (exact_match: higher is better; the others lower)."""

    @model_validator(mode="after")
    def _best_is_computed(self):
        if self.metric_for_best != "eval_loss" and self.metric_for_best not in self.metrics:
            raise ValueError(f"metric_for_best `{self.metric_for_best}` is not in evaluation.metrics "
                             f"{self.metrics}; add it there or use eval_loss")
        if self.metric_for_best != "eval_loss" and not self.during_training:
            raise ValueError(f"metric_for_best `{self.metric_for_best}` needs evaluation.during_training: true")
        return self

    @property
    def greater_is_better(self) -> bool:
        return self.metric_for_best in HIGHER_IS_BETTER

    @property
    def best_key(self) -> str:
        """The Trainer's metric name (`eval_cer`, `eval_loss`)."""
        return self.metric_for_best if self.metric_for_best.startswith("eval_") else f"eval_{self.metric_for_best}"


class WandbConfig(_Strict):
    """Weights & Biases tracking. Off (one log line says so) without WANDB_API_KEY, unless
    WANDB_MODE=offline; `report_to: [wandb]` is implied by this section."""

    project: str = Field(default="launch", min_length=1, max_length=128)
    entity: Optional[str] = None
    """Team or user; default: the key's default entity."""
    run_name: Optional[str] = None
    """Display name; default: the run id."""
    tags: list[str] = Field(default_factory=list)
    high_loss_table: bool = True
    """Log the highest-loss eval samples (with their images) as a `wandb.Table` after training."""
    gpu_stats: bool = True
    """Log GPU utilisation and memory with every training log line (CUDA only)."""


def wandb_wanted(cfg) -> bool:
    """Whether the run reports to W&B: a `wandb:` section, or `wandb` in train.report_to."""
    return cfg.wandb is not None or "wandb" in cfg.train.report_to


def best_metric(cfg) -> tuple[str, bool]:
    """(marker/Trainer key, greater is better) that ranks a run's checkpoints."""
    ev = getattr(cfg, "evaluation", None)
    return (ev.best_key, ev.greater_is_better) if ev is not None else ("eval_loss", False)


def export_choice(cfg) -> tuple[str, str, bool]:
    """(prefer, metric key, greater is better): which checkpoint becomes the run's adapter (and its
    merge/MLX export) or full weights. `latest` for full fine-tuning (no metric ranks full weights
    here), else `best` by the profile's metric. payload.train.recipe.save picks by it; `exported_checkpoint`
    says it, so the choice is never silent and has one owner."""
    key, greater = best_metric(cfg)
    return ("latest" if cfg.train.method == "full" else "best"), key, greater


def exported_checkpoint(cfg) -> str:
    """`export_choice` in words, for `launch validate`."""
    prefer, key, greater = export_choice(cfg)
    if prefer == "latest":
        return "the last complete checkpoint (full fine-tuning)"
    return (f"the best checkpoint by {key.removeprefix('eval_').replace('loss', 'eval loss')} "
            f"({'higher' if greater else 'lower'} wins; the newest when none was evaluated)")
