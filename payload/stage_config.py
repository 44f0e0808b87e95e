"""Training stages of one run (runbook 003): SFT -> DPO -> GRPO, each from the previous stage's adapter.

A profile's `stages:` is a list of stage blocks. Each names its `kind` (sft, dpo, grpo), may bring
its own data recipe (`data:`, else the run's `data:` is used) and overrides of `train:` (learning
rate, steps or epochs, batch, ...), plus the `dpo:` or `grpo:` settings of its kind. Without
`stages:` a run is one SFT stage, exactly as before.

Like payload/config.py this imports only pydantic (no torch): the launcher validates, plans and
renders profiles with it. `stage_run_config` derives the RunConfig one stage trains with.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal, Optional

from pydantic import Field, PrivateAttr, field_validator, model_validator

from payload.config import NAME_RE, DataConfig, RunConfig, Strict, TrainConfig

BUILTIN_REWARDS = ("exact_match", "number_match", "format")
# A user reward: `FILE.py:FUNCTION` (relative to the workdir) or `package.module:FUNCTION`.
USER_REWARD_RE = re.compile(r"(?:[\w./-]+\.py|[A-Za-z_][\w.]*):[A-Za-z_]\w*")
STAGES_DIR = "stages"


class DpoConfig(Strict):
    """Direct preference optimization (TRL DPOTrainer)."""

    beta: float = Field(default=0.1, gt=0)
    """Strength of the pull towards the reference (the previous stage's adapter)."""
    loss_type: Literal["sigmoid", "hinge", "ipo", "robust", "bco_pair", "apo_zero", "apo_down"] = "sigmoid"
    """TRL's DPO loss; `sigmoid` is the original DPO."""


class GrpoConfig(Strict):
    """Group relative policy optimization (TRL GRPOTrainer)."""

    num_generations: int = Field(default=4, ge=2)
    """Completions sampled per prompt; the batch of prompts x generations must divide by it."""
    max_completion_length: int = Field(default=256, gt=0)
    """Longest sampled completion in tokens."""
    beta: float = Field(default=0.04, ge=0)
    """KL coefficient against the reference (the previous stage's adapter); 0 drops the reference."""
    temperature: float = Field(default=1.0, gt=0)
    rewards: list[str] = Field(default_factory=lambda: ["number_match", "format"], min_length=1)
    """Reward functions, summed: built-in `exact_match` (answer equals the completion's answer),
    `number_match` (the last number in each equals), `format` (`<think>...</think>` then an answer,
    or `format_regex`), or a user function `FILE.py:FUNCTION` / `package.module:FUNCTION` called as
    TRL calls rewards: `f(prompts, completions, answer=..., **kwargs) -> list[float]`."""
    reward_weights: Optional[list[float]] = None
    """One weight per reward (default: all 1)."""
    format_regex: Optional[str] = None
    """Regex the whole completion must match for the `format` reward (default: think tags + answer)."""
    use_vllm: bool = False
    """Generate with vLLM (needs the package and GPU memory to spare: off on 16 GB GPUs)."""

    @field_validator("rewards")
    @classmethod
    def _known_rewards(cls, v: list[str]) -> list[str]:
        for name in v:
            if name not in BUILTIN_REWARDS and not USER_REWARD_RE.fullmatch(name):
                raise ValueError(f"unknown reward {name!r}: use one of {', '.join(BUILTIN_REWARDS)} or a user "
                                 "function as `FILE.py:FUNCTION` or `package.module:FUNCTION`")
        return v

    @field_validator("format_regex")
    @classmethod
    def _regex_compiles(cls, v: Optional[str]) -> Optional[str]:
        if v is not None:
            try:
                re.compile(v)
            except re.error as e:
                raise ValueError(f"format_regex does not compile ({e}); fix the pattern") from None
        return v

    @model_validator(mode="after")
    def _weights(self):
        if self.reward_weights is not None and len(self.reward_weights) != len(self.rewards):
            raise ValueError(f"reward_weights has {len(self.reward_weights)} entries for {len(self.rewards)} "
                             "rewards; give one weight per reward or remove it")
        return self


class StageConfig(Strict):
    """One stage: its kind, its data and its overrides of `train:`."""

    kind: Literal["sft", "dpo", "grpo"]
    name: Optional[str] = None
    """Directory name part `stages/<i>-<name>/` (default: the kind)."""
    data: Optional[DataConfig] = None
    """This stage's data recipe (default: the run's `data:`). DPO reads preference records
    (`format: preference`, RLHF-V's shape included); GRPO reads prompts with answers
    (`format: prompt_answer`)."""
    train: dict = Field(default_factory=dict)
    """Overrides of the run's `train:` for this stage, e.g. `{learning_rate: 5e-6, max_steps: 200}`."""
    dpo: Optional[DpoConfig] = None
    grpo: Optional[GrpoConfig] = None

    @field_validator("name")
    @classmethod
    def _slug(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not NAME_RE.fullmatch(v):
            raise ValueError(f"stage name {v!r} must be lowercase letters, digits and `-`")
        return v

    @model_validator(mode="after")
    def _kind_blocks(self):
        for other in ("dpo", "grpo"):
            if getattr(self, other) is not None and self.kind != other:
                raise ValueError(f"`{other}:` only applies to `kind: {other}` (this stage is `{self.kind}`); "
                                 f"remove it or set kind: {other}")
        if self.kind == "dpo" and self.dpo is None:
            self.dpo = DpoConfig()
        if self.kind == "grpo" and self.grpo is None:
            self.grpo = GrpoConfig()
        bad = set(self.train) - set(TrainConfig.model_fields)
        if bad:
            raise ValueError(f"train override(s) {sorted(bad)} are not `train:` keys; valid: "
                             f"{', '.join(TrainConfig.model_fields)}")
        if "method" in self.train:
            raise ValueError("`train.method` is the run's (stages chain one adapter); set it in the run's train:")
        return self

    @property
    def label(self) -> str:
        return self.name or self.kind


def check_stages(stages: list[StageConfig], train: TrainConfig) -> None:
    """Cross-stage rules: unique names, later stages need an adapter, overrides validate."""
    labels = [s.label for s in stages]
    dupes = sorted({n for n in labels if labels.count(n) > 1})
    if dupes:
        raise ValueError(f"stage names must be unique, repeated: {dupes}; give each a `name:`")
    if len(stages) > 1 and train.method == "full":
        raise ValueError("chained stages pass a LoRA adapter on: use train.method lora or qlora")
    for i, s in enumerate(stages):
        merged = stage_train(train, s)
        if s.kind == "grpo":
            g = s.grpo
            batch = merged.per_device_batch_size * merged.gradient_accumulation_steps
            if batch % g.num_generations:
                raise ValueError(f"stages[{i}] ({s.label}): per_device_batch_size x gradient_accumulation_steps "
                                 f"= {batch} must be a multiple of grpo.num_generations {g.num_generations}; "
                                 "change one of them")


def stage_train(train: TrainConfig, stage: StageConfig) -> TrainConfig:
    """The run's train config with the stage's overrides (validated as a whole)."""
    body = train.model_dump(mode="json")
    for k, v in stage.train.items():
        body[k] = {**body[k], **v} if isinstance(v, dict) and isinstance(body.get(k), dict) else v
    if "epochs" in stage.train and "max_steps" not in stage.train:
        body["max_steps"] = None  # a stage that sets its epochs is not cut by the run's max_steps
    return TrainConfig.model_validate(body)


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
