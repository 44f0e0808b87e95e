"""The whole run configuration: `RunConfig` (data recipe, model, method, training, outputs, runtime,
evaluation) and the training stages' schema (`StageConfig`, `DpoConfig`, `GrpoConfig`).

The sections themselves live in payload/config/schema.py and `evaluation:`/`wandb:` in
payload/config/evaluation.py; this module adds the training stages and the whole `RunConfig`, with
its runtime helpers (environment overrides, run dir, config hash). Loading and dumping with errors
that name the file, line and key are payload/config/load.py's. Every field's docstring is its help
text. Cross-field rules live in `model_validator`s and name the keys involved, so a user sees which
line of which file to change. pydantic only, never torch.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Literal, Optional

from pydantic import Field, field_validator, model_validator

from payload.config.evaluation import EvalConfig, WandbConfig
from payload.config.schema import (
    DataConfig,
    ModelConfig,
    NAME_RE,
    OutputsConfig,
    RuntimeConfig,
    Strict,
    TrainConfig,
    check_name,
    safe_id,
)


# --- training stages (runbook 003: SFT -> DPO -> GRPO; payload/config/stages.py derives each stage's config)

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


class RunConfig(Strict):
    """Everything the payload needs. A profile is this plus `cluster:` and `budget:`."""

    name: str = "run"
    """Lowercase letters, digits and `-`, at most 63 characters: it names files, runs and clusters."""
    description: Optional[str] = None
    data: DataConfig
    model: ModelConfig
    train: TrainConfig = Field(default_factory=TrainConfig)
    outputs: OutputsConfig = Field(default_factory=OutputsConfig)
    stages: list["StageConfig"] = Field(default_factory=list)
    """Training stages in order (payload/config/stages.py), e.g. sft -> dpo -> grpo, each starting from
    the previous stage's adapter. Empty: one SFT stage on `data:` with `train:` (as without stages)."""
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    evaluation: Optional[EvalConfig] = None
    """Generation metrics (CER/WER/exact match) during training and on the test split (config/evaluation.py)."""
    wandb: Optional[WandbConfig] = None
    """Weights & Biases project/entity/name/tags (config/evaluation.py); off without WANDB_API_KEY."""

    @field_validator("name")
    @classmethod
    def _name_is_a_slug(cls, v: str) -> str:
        return check_name(v)

    @model_validator(mode="after")
    def _cross(self):
        if self.train.method == "full" and self.outputs.merge:
            raise ValueError("`outputs.merge` needs an adapter; method `full` already produces full weights")
        if self.outputs.export_gguf and self.train.method != "full" and not self.outputs.merge:
            raise ValueError("`outputs.export_gguf` converts the merged model: set `outputs.merge: true`")
        if self.train.method == "full" and self.model.dtype == "float16" and self.train.deepspeed is None:
            raise ValueError("full fine-tuning in `model.dtype: float16` needs fp32 master weights: add "
                             "`train.deepspeed` or use `model.dtype: float32`")
        if self.stages:
            check_stages(self.stages, self.train)
        return self

    # --- runtime helpers (no torch) -------------------------------------------------------------

    def with_env(self, env: Optional[dict] = None) -> "RunConfig":
        """Apply LAUNCH_* / SKYPILOT_* environment overrides; returns a new config."""
        env = os.environ if env is None else env
        rt = self.runtime.model_copy()
        if env.get("LAUNCH_VOLUME"):
            if rt.hf_home == f"{rt.volume}/.hf":  # the volume's model cache moves with it (launcher/profiles/render.py)
                rt.hf_home = f"{env['LAUNCH_VOLUME']}/.hf"
            rt.volume = env["LAUNCH_VOLUME"]
        if env.get("LAUNCH_RUN_ID"):
            rt.run_id = safe_id(env["LAUNCH_RUN_ID"])
        elif not rt.run_id and env.get("SKYPILOT_TASK_ID"):
            rt.run_id = safe_id(env["SKYPILOT_TASK_ID"])
        if env.get("LAUNCH_PRICE_PER_HOUR"):
            rt.price_per_hour = float(env["LAUNCH_PRICE_PER_HOUR"])
        if env.get("LAUNCH_BUDGET_USD"):
            rt.budget_usd = float(env["LAUNCH_BUDGET_USD"])
        if not rt.run_id:
            rt.run_id = safe_id(self.name)
        return self.model_copy(update={"runtime": rt})

    @property
    def run_dir(self) -> Path:
        return Path(self.runtime.volume) / "runs" / (self.runtime.run_id or safe_id(self.name))

    def config_hash(self) -> str:
        """Hash of what determines the result (runtime excluded): same hash, same training."""
        body = self.model_dump(mode="json", exclude={"runtime", "description", "wandb"})
        for section in ("evaluation", "stages"):  # a config without the section hashes as before it existed
            if not body.get(section):
                body.pop(section, None)
        if not body["outputs"].get("export_gguf"):  # as before the key existed
            body["outputs"].pop("export_gguf", None)
        return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:12]
