"""The sections of a run configuration: data recipe, model, method, training, outputs, runtime.

One idea at ~360 lines: the sections of a run configuration as pydantic models, one class per
section with its fields' help text and rules; cut by section they would only be read together.

The shared vocabulary of payload/config/runconfig.py (which adds the stages and the whole `RunConfig`;
payload/config/__init__.py re-exports these names: import them from there). pydantic and PyYAML only,
never torch. Every field's docstring is its help text; cross-field rules name the keys involved.
"""

from __future__ import annotations

import re
from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

ROLES = ("system", "user", "assistant")

# A profile name becomes file names (sky/<name>.yaml), run ids, cluster names and YAML values.
NAME_RE = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
# A run id becomes one directory name under {volume}/runs/: no separator, never `.` or `..`.
RUN_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def slugify(value: str) -> str:
    """The nearest valid profile name: accents dropped (`ök` -> `ok`), lowercase, runs of other
    characters as `-`, at most 63."""
    import unicodedata

    plain = unicodedata.normalize("NFKD", str(value)).encode("ascii", "ignore").decode()
    return re.sub(r"[^a-z0-9]+", "-", plain.lower())[:63].strip("-") or "run"


def check_name(value: str) -> str:
    """A profile name, or ValueError with the fix (used by the schema and by the CLI)."""
    if not NAME_RE.fullmatch(value):
        raise ValueError(f"{shown(value)} is not a valid name: use lowercase letters, digits and `-` (at most "
                         f"63 characters, a letter or digit at each end), e.g. `{slugify(value)}`")
    return value


def shown(value: str) -> str:
    """A user value inside a one-line message: quoted, escapes visible, cut to 60 characters."""
    text = repr(str(value))
    return text if len(text) <= 62 else text[:58] + "...'"


class Strict(BaseModel):
    """Base: unknown keys are errors (typos must never be silently ignored), so is a number that is
    not finite (`.inf`, `.nan`, `1e400`): no key of a run (a budget, a price, a rate, a ratio, a weight)
    means anything at infinity, and JSON cannot carry one; and so is a boolean where a number belongs
    (`max_steps: true` would be 1: pydantic takes a bool as an int)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, v, info):
        if isinstance(v, bool) and info.field_name and _numeric(cls.model_fields[info.field_name].annotation):
            raise ValueError(f"`{str(v).lower()}` is a boolean where a number is expected; write the number")
        return v


def _numeric(annotation) -> bool:
    """int or float (also inside Optional/Union), and not bool itself."""
    from typing import get_args

    kinds = set(get_args(annotation)) or {annotation}
    return bool(kinds & {int, float}) and bool not in kinds


# --------------------------------------------------------------------------------------------- data


class SourceConfig(Strict):
    """One raw dataset. Exactly one of `path` or `hf_dataset`."""

    name: str
    """Short name used in stats and error messages."""
    path: Optional[str] = None
    """Local file (JSONL, JSON, CSV or Parquet; by extension). Relative paths resolve against the
    directory the payload runs in (the uploaded workdir)."""
    hf_dataset: Optional[str] = None
    """Hugging Face dataset id, loaded with `datasets.load_dataset` (streaming)."""
    hf_split: str = "train"
    """Split of `hf_dataset` to read."""
    hf_config: Optional[str] = None
    """Config (subset) name of `hf_dataset`."""
    format: Literal["auto", "messages", "alpaca", "prompt_response", "image_text", "preference",
                    "prompt_answer"] = "auto"
    """Record shape: chat `messages`; alpaca `instruction/input/output`; `prompt/question/response`
    (runbook 004 CSV); `image_text`: an `image` and its target `text` (OCR, runbook 002: the user
    turn is the image plus `instruction`, the assistant turn the text). `auto` decides per record
    from its keys. For DPO stages `preference`: `prompt` (or `question`), `chosen`, `rejected`,
    optional `image`/`images` (RLHF-V's `text` JSON column with question/chosen/rejected is read
    too); for GRPO stages `prompt_answer`: `prompt` (or `question`), `answer`, optional
    `image`/`images`. `auto` picks none of these three."""
    columns: dict[str, str] = Field(default_factory=dict)
    """Rename raw columns before parsing, e.g. `{text_in: instruction}`."""
    instruction: str = "Transcribe all text in this image."
    """format image_text: the user's text beside the image."""
    instruction_as: Literal["user", "system"] = "user"
    """format alpaca: `user` puts instruction + input in the user turn; `system` makes the instruction
    the system turn and the input the user turn (runbook 001, LLaMA-Factory `template: qwen`)."""
    image_root: Optional[str] = None
    """Directory that relative image paths in vision-language records resolve against."""
    strip_think: bool = False
    """Remove `<think>...</think>` blocks from assistant turns (runbook 000, glm data)."""
    system_prompt: Optional[str] = None
    """Name of an entry in `data.system_prompts` to inject where the system turn is missing/empty."""
    split: Union[Literal["train", "val", "test"], dict[str, float]] = Field(
        default_factory=lambda: {"train": 1.0}
    )
    """Either one split name (the whole source goes there) or ratios, e.g. `{train: 0.95, val: 0.05}`."""
    max_records: Optional[int] = Field(default=None, gt=0)
    """Read at most this many records (quick validation runs)."""

    @model_validator(mode="after")
    def _one_location(self):
        if bool(self.path) == bool(self.hf_dataset):
            raise ValueError("set exactly one of `path` or `hf_dataset`")
        if isinstance(self.split, dict):
            bad = set(self.split) - {"train", "val", "test"}
            if bad:
                raise ValueError(f"`split` keys must be train/val/test, got {sorted(bad)}")
            total = sum(self.split.values())
            if abs(total - 1.0) > 1e-6 or any(v < 0 for v in self.split.values()):
                raise ValueError(f"`split` ratios must be >= 0 and sum to 1 (they sum to {total:g})")
        return self


class DataConfig(Strict):
    """The data recipe: raw sources -> train/val/test JSONL of canonical chat records."""

    sources: list[SourceConfig] = Field(min_length=1)
    """Raw datasets, combined in order."""
    system_prompts: dict[str, str] = Field(default_factory=dict)
    """Named system prompts that sources inject with `system_prompt: NAME`."""
    seed: int = 42
    """Seed of the per-source split (same inputs + seed give byte-identical outputs)."""
    dedup: bool = True
    """Drop records whose content hash (after transforms) was already seen in any source."""
    max_tokens: Optional[int] = Field(default=None, gt=0)
    """Drop records longer than this many tokens of the model's tokenizer (chat template applied), at
    the data stage; drops are counted as `too many tokens`. Defaults to no filter."""
    max_invalid_fraction: float = Field(default=0.01, ge=0, le=1)
    """Fail the stage when more than this fraction of a source's records are invalid."""
    strict: bool = False
    """Fail on the first invalid record instead of skipping and counting it."""
    report_first: int = Field(default=20, ge=0)
    """How many dropped records (with reason and file:line) `data_stats.json` lists per source."""
    max_image_pixels: int = Field(default=50_000_000, gt=0)
    """Largest accepted image (width x height); larger ones are dropped as `bad image` at the data
    stage (every image is opened and decoded there, once per distinct file)."""
    max_record_bytes: int = Field(default=16 * 1024 * 1024, gt=0)
    """Longest accepted line (JSONL/CSV) or JSON-array element in bytes; longer ones are skipped
    and reported as invalid without being held in memory."""

    @model_validator(mode="after")
    def _refs(self):
        names = [s.name for s in self.sources]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"source names must be unique, repeated: {dupes}")
        for s in self.sources:
            if s.system_prompt and s.system_prompt not in self.system_prompts:
                known = ", ".join(sorted(self.system_prompts)) or "none defined"
                raise ValueError(
                    f"source `{s.name}` uses system_prompt `{s.system_prompt}`, which is not in "
                    f"`data.system_prompts` ({known})"
                )
        return self


# -------------------------------------------------------------------------------------------- model


class TinyModel(Strict):
    """Build a tiny model and tokenizer from config instead of downloading (local demo, tests)."""

    arch: Literal["qwen3", "qwen3_vl"] = "qwen3"
    hidden_size: int = 64
    num_layers: int = 2
    vocab_size: int = Field(default=1024, ge=265)
    """At least the tiny tokenizer's 256 byte tokens and Qwen's 9 special ones."""


class ModelConfig(Strict):
    name_or_path: str
    """Hub id or local path of the base model."""
    kind: Literal["causal_lm", "image_text_to_text"] = "causal_lm"
    """Auto class: AutoModelForCausalLM, or AutoModelForImageTextToText for Qwen3-VL."""
    attn_implementation: Union[Literal["auto"], list[Literal["flash_attention_2", "flex_attention", "sdpa",
                                                              "eager"]]] = "auto"
    """`auto`: the kernel for the batch the trainer builds (payload/model/attention.py). A padding-free or
    packed batch (one row, position ids restarting per record) goes to flash_attention_2 where
    flash-attn is installed, else flex_attention on a CUDA GPU (compute capability 8.0+), else sdpa
    (exact too, but through a block-diagonal mask: 2.3x slower on an H200); a padded batch (images)
    to flash_attention_2, else sdpa. A list is tried in its order instead. The one that loaded, and
    why, is logged and in `launch status` and the summary."""
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    """`auto`: bf16 on a GPU that has it, fp16 (mixed precision) on one that does not (T4, V100),
    fp32 on CPU."""
    trust_remote_code: bool = False
    revision: Optional[str] = None
    tiny: Optional[TinyModel] = None
    """Set to build a tiny random model from config (no download); `name_or_path` is then a label."""


class LoraConfig(Strict):
    r: int = Field(default=16, gt=0)
    alpha: int = Field(default=32, gt=0)
    dropout: float = Field(default=0.05, ge=0, lt=1)
    target_modules: Union[Literal["all-linear"], list[str]] = "all-linear"
    """Module names (`q_proj`, ...) or `all-linear`."""
    language_only: bool = True
    """For vision-language models: adapt only the language layers; the vision tower stays frozen."""


class QuantizationConfig(Strict):
    bits: Literal[4, 8] = 4
    quant_type: Literal["nf4", "fp4"] = "nf4"
    double_quant: bool = True
    compute_dtype: Literal["bfloat16", "float16"] = "bfloat16"


class DeepSpeedConfig(Strict):
    zero_stage: Literal[2, 3] = 3
    offload_optimizer: bool = False
    """ZeRO-Offload the optimizer state to CPU RAM."""
    offload_params: bool = False
    """Offload parameters to CPU RAM (ZeRO-3 only)."""


class CheckpointConfig(Strict):
    save_steps: int = Field(default=200, gt=0)
    save_every_minutes: Optional[float] = Field(default=None, gt=0)
    """Time-based saving. Unset: derived from Young's formula sqrt(2 * save_time * MTBF) once the
    first save has been timed, using `expected_preemption_hours` (spot) - or off for on-demand."""
    expected_preemption_hours: Optional[float] = Field(default=None, gt=0)
    """Mean time between preemptions you expect (spot). Feeds the Young's-formula default."""
    keep_best: int = Field(default=2, ge=0)
    """Keep this many checkpoints with the lowest eval loss."""
    keep_recent: int = Field(default=2, ge=1)
    """Keep this many newest checkpoints (resume needs at least one)."""


class TrainConfig(Strict):
    method: Literal["lora", "qlora", "full"] = "lora"
    lora: LoraConfig = Field(default_factory=LoraConfig)
    quantization: Optional[QuantizationConfig] = None
    """Required for `qlora`, forbidden otherwise."""
    deepspeed: Optional[DeepSpeedConfig] = None
    """ZeRO config generated for the run (full fine-tuning across many GPUs)."""
    max_seq_length: int = Field(default=2048, gt=0)
    per_device_batch_size: int = Field(default=1, gt=0)
    gradient_accumulation_steps: int = Field(default=1, gt=0)
    effective_batch_size: Optional[int] = Field(default=None, gt=0)
    """Optional check: must equal per_device x accumulation x total GPUs of the cluster."""
    epochs: float = Field(default=1.0, gt=0)
    max_steps: Optional[int] = Field(default=None, gt=0)
    """Stop after this many optimizer steps (overrides epochs)."""
    learning_rate: float = Field(default=2e-4, gt=0)
    lr_scheduler: Literal["cosine", "linear", "constant", "constant_with_warmup"] = "cosine"
    warmup_ratio: float = Field(default=0.03, ge=0, lt=1)
    weight_decay: float = Field(default=0.0, ge=0)
    optimizer: Literal["adamw_torch", "adamw_torch_fused", "paged_adamw_32bit", "paged_adamw_8bit"] = (
        "adamw_torch"
    )
    max_grad_norm: float = Field(default=1.0, gt=0)
    gradient_checkpointing: Union[bool, Literal["auto"]] = "auto"
    """Recompute activations in the backward pass (~1/3 more compute, far less memory). `auto`: off
    when the memory estimate (payload/model/memory.py) without it fits the GPU with 15% to spare, else on;
    off on CPU."""
    liger: Union[bool, Literal["auto"]] = "auto"
    """Liger's Triton kernels (RMSNorm, SwiGLU, RoPE) on the model. `auto`: on when the optional
    `liger-kernel` package is installed and a CUDA GPU is present; `true` fails when it is missing.
    The loss needs no kernel: TRL's SFTTrainer computes it in chunks without the full logits."""
    packing: bool = False
    """Pack several records per sequence (padding-free, boundaries kept). Changes which records share
    a step (the math of the run), so it is a choice; `launch plan` says what it would save."""
    padding_free: Union[bool, Literal["auto"]] = "auto"
    """Flatten each batch's records into one row without padding (position ids restart per record):
    the same records per step as a padded batch, the same loss and gradients, no compute on padding.
    `auto`: on wherever TRL allows it, vision-language models on records without images included;
    off (padded, one line in the log) when records carry images. `false`: padded batches."""
    assistant_only_loss: bool = True
    """Compute the loss only on assistant tokens."""
    seed: int = 42
    logging_steps: int = Field(default=10, gt=0)
    eval_steps: int = Field(default=200, gt=0)
    per_device_eval_batch_size: int = Field(default=1, gt=0)
    early_stopping_patience: Optional[int] = Field(default=None, gt=0)
    """Stop after this many evaluations without eval-loss improvement."""
    high_loss_samples: int = Field(default=10, ge=0)
    """Write the N highest-loss eval samples out after training."""
    report_to: list[Literal["wandb", "tensorboard"]] = Field(default_factory=list)
    checkpoints: CheckpointConfig = Field(default_factory=CheckpointConfig)

    @model_validator(mode="after")
    def _method_rules(self):
        if self.method == "qlora" and self.quantization is None:
            self.quantization = QuantizationConfig()
        if self.method != "qlora" and self.quantization is not None:
            raise ValueError(
                f"`train.quantization` only applies to `method: qlora` (method is `{self.method}`); "
                "remove it or set method: qlora"
            )
        if self.method == "qlora" and self.deepspeed is not None:
            raise ValueError("QLoRA cannot be combined with `train.deepspeed`; drop one of them")
        if self.deepspeed and self.deepspeed.offload_params and self.deepspeed.zero_stage != 3:
            raise ValueError("`train.deepspeed.offload_params` needs zero_stage: 3")
        return self


# GGUF types as llama.cpp names them (its converter's --outtype, its quantizer's types in lower case).
GGUF_CONVERTED = ("f32", "f16", "bf16", "q8_0")
GGUF_QUANTIZED = ("q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k_s", "q3_k_m", "q3_k_l", "q4_k_s", "q4_k_m",
                  "q5_k_s", "q5_k_m", "q6_k", "iq4_nl", "iq4_xs")
# llama-quantize refuses these without an importance matrix (llama-imatrix over sample text), which launch
# does not compute.
GGUF_NEEDS_IMATRIX = ("iq1_s", "iq1_m", "iq2_xxs", "iq2_xs", "iq2_s", "iq2_m", "q2_k_s")


def gguf_type(name: str) -> str:
    """A GGUF type name (lower case), or ValueError naming the choices and the nearest one."""
    import difflib

    choices = GGUF_CONVERTED + GGUF_QUANTIZED
    if name in choices:
        return name
    if name in GGUF_NEEDS_IMATRIX:
        raise ValueError(f"{shown(name)} needs an importance matrix (llama-imatrix), which launch does not compute; "
                         "use q2_k, q3_k_m or q4_k_m, or quantize the f16 file yourself")
    near = difflib.get_close_matches(name, choices, n=1)
    hint = f"did you mean `{near[0]}`? " if near else ""
    raise ValueError(f"{shown(name)} is not a GGUF type launch exports; {hint}choose from {', '.join(choices)}")


class OutputsConfig(Strict):
    merge: bool = False
    """Merge the best adapter into the base model after training (LoRA/QLoRA)."""
    smoke_prompt: Optional[str] = "Say hello in one sentence."
    """Generate from the merged model once as a smoke test (null to skip)."""
    push_to_hub: Optional[str] = None
    """Hub repo id to push the merged model (or adapter) to. Needs HF_TOKEN at launch."""
    export_mlx: bool = False
    """Also write an MLX adapter (runbook 001)."""
    export_gguf: list[str] = Field(default_factory=list)
    """GGUF files of the merged model for llama.cpp, Ollama and LM Studio, one per type, named as
    llama.cpp names them: `f32`, `f16`, `bf16`, `q8_0` (its converter writes these) or `q4_k_m`,
    `q5_k_m`, `q6_k`, ... (its quantizer makes these from the f16 file), e.g. `[f16, q4_k_m]`."""

    @field_validator("export_gguf", mode="before")
    @classmethod
    def _gguf_types(cls, v):
        names = [v] if isinstance(v, str) else v
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            return v  # pydantic says what is wrong with the shape
        return [gguf_type(n) for n in dict.fromkeys(n.strip().lower() for n in names)]


class RuntimeConfig(Strict):
    """Filled by the launcher (render/up) and by environment variables on the machine."""

    volume: str = "/workspace"
    """Persistent directory; the run lives in `{volume}/runs/{run_id}/`. Env: LAUNCH_VOLUME."""
    run_id: Optional[str] = None
    """Env LAUNCH_RUN_ID, else SKYPILOT_TASK_ID, else the profile name."""
    profile: str = "run"
    price_per_hour: float = Field(default=0.0, ge=0)
    """Dollars per hour for the whole cluster. Env: LAUNCH_PRICE_PER_HOUR."""
    budget_usd: Optional[float] = Field(default=None, gt=0)
    """Stop (after a checkpoint) when spend reaches this. Env: LAUNCH_BUDGET_USD."""
    budget_warn_fraction: float = Field(default=0.9, gt=0, le=1)
    """Warn (log, status.json, W&B) once spend reaches this fraction of `budget_usd` (profile
    `budget.warn_fraction`)."""
    hf_home: Optional[str] = None
    """HF cache location; defaults to `{volume}/.hf` so restarts re-download nothing."""

    @field_validator("run_id")
    @classmethod
    def _run_id_is_one_directory(cls, v: Optional[str]) -> Optional[str]:
        if v is not None and not RUN_ID_RE.fullmatch(v):
            raise ValueError(f"{shown(v)} is not a valid run id: letters, digits, `.`, `_` and `-` only, starting "
                             f"with a letter or digit (it names one directory under runs/), e.g. `{safe_id(v)}`")
        return v


def safe_id(value: str) -> str:
    """A run id usable as one directory name: never empty, `.`/`..`, or containing a separator."""
    safe = "".join(c if (c.isascii() and c.isalnum()) or c in "-_." else "-" for c in value)
    return safe.lstrip("-_.")[:96] or "run"
