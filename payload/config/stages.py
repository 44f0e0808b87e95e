"""Training stages of one run (runbook 003): SFT -> DPO -> GRPO, each from the previous stage's adapter.

A profile's `stages:` is a list of stage blocks. Each names its `kind` (sft, dpo, grpo), may bring
its own data recipe (`data:`, else the run's `data:` is used) and overrides of `train:` (learning
rate, steps or epochs, batch, ...), plus the `dpo:` or `grpo:` settings of its kind. Without
`stages:` a run is one SFT stage, exactly as before.

The stage schema (`StageConfig`, `DpoConfig`, `GrpoConfig`) lives in payload/config/runconfig.py beside the
rest of the run config; this module derives the RunConfig one stage trains with (`stage_run_config`).
Like payload/config/runconfig.py it imports only pydantic (no torch): the launcher plans stages with it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from pydantic import PrivateAttr

from payload.config.runconfig import STAGES_DIR, RunConfig, StageConfig, stage_train


class StageRunConfig(RunConfig):
    """The RunConfig one stage trains with: its directory `{run_dir}/stages/<i>-<name>/`, its kind
    and settings, the adapter it starts from, and its place in the chain (for status.json)."""

    _stage_dir: Optional[str] = PrivateAttr(default=None)
    _parent_dir: Optional[str] = PrivateAttr(default=None)
    _stage: Optional[StageConfig] = PrivateAttr(default=None)
    _index: int = PrivateAttr(default=0)
    _of: int = PrivateAttr(default=1)
    _init_adapter: Optional[str] = PrivateAttr(default=None)

    @property
    def run_dir(self) -> Path:
        return Path(self._stage_dir) if self._stage_dir else super().run_dir

    @property
    def stage(self) -> Optional[StageConfig]:
        return self._stage

    @property
    def parent_dir(self) -> Path:
        return Path(self._parent_dir)

    @property
    def init_adapter(self) -> Optional[Path]:
        return Path(self._init_adapter) if self._init_adapter else None

    def stage_info(self) -> dict:
        """status.json's `stage`: name, index (1-based) and how many."""
        return {"name": self._stage.label, "kind": self._stage.kind, "index": self._index + 1, "of": self._of}

    def config_hash(self) -> str:
        import hashlib
        import json

        body = {"run": super().config_hash(), "stage": self._stage.model_dump(mode="json"), "index": self._index,
                "from": self._init_adapter is not None}
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:12]


def stage_dir_name(index: int, stage: StageConfig) -> str:
    return f"{index + 1}-{stage.label}"


def stage_run_config(cfg: RunConfig, index: int, init_adapter: Optional[Path] = None) -> StageRunConfig:
    """The config stage `index` of `cfg.stages` trains with."""
    stage = cfg.stages[index]
    body = cfg.model_dump(mode="json", include=set(RunConfig.model_fields))  # a launcher Profile has more
    body["stages"] = []
    body["train"] = stage_train(cfg.train, stage).model_dump(mode="json")
    if stage.data is not None:
        body["data"] = stage.data.model_dump(mode="json")
    out = StageRunConfig.model_validate(body)
    out._parent_dir = str(cfg.run_dir)
    out._stage_dir = str(cfg.run_dir / STAGES_DIR / stage_dir_name(index, stage))
    out._stage, out._index, out._of = stage, index, len(cfg.stages)
    out._init_adapter = str(init_adapter) if init_adapter else None
    return out
