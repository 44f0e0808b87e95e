"""Tokenizer/processor and model for training: Auto classes, dtype, attention fallback, LoRA/QLoRA/full.

One idea at ~470 lines: the model and its tokenizer as training gets them, from `from_pretrained`
to the parameters that train: dtype, attention, fused kernels, quantization, LoRA targets, the frozen
vision tower, DeepSpeed's config. Each decision reads the same cfg and model; merge and inference load
through the same functions.

Everything goes through `from_pretrained`, also for the tiny demo model (materialized once into
`{run_dir}/base_model/` by `payload.model.tiny`), so the code path on CPU is the one a GPU run takes.
The LoRA adapter itself is created by TRL's SFTTrainer from `lora_config()`; `check_vision_frozen`
asserts afterwards that nothing under a vision tower trains.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re

from payload.errors import PayloadError

log = logging.getLogger("payload.train")

VISION_PREFIXES = ("visual", "vision_tower", "vision_model", "vision_encoder")
_VISION_RE = r"(^|\.)(" + "|".join(VISION_PREFIXES) + r")\."


def on_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def resolve_dtype(model_cfg):
    """`auto`: bf16 on a GPU that supports it, fp16 on one that does not (T4), fp32 on CPU;
    otherwise what the config says."""
    import torch

    named = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
    if model_cfg.dtype in named:
        return named[model_cfg.dtype]
    if on_gpu():
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.float32


def gpu_memory_gb() -> float | None:
    """Memory of this process's GPU in GiB (None on CPU)."""
    import torch

    if not on_gpu():
        return None
    return torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory / 2**30


def gradient_checkpointing(cfg) -> bool:
    """`train.gradient_checkpointing` resolved (see `checkpointing_decision`); logged once."""
    return checkpointing_decision(cfg)[0] > 0


def checkpointing_decision(cfg) -> tuple[int, str]:
    """(every_n_layers, why): 0 off, 1 every decoder layer, n every n-th. A bool as set; `auto` off on
    CPU, and on a GPU the least checkpointing the memory estimate fits this GPU with
    (payload.model.memory.choose_checkpointing, for WORLD_SIZE GPUs)."""
    from payload.model.memory import choose_checkpointing
    from payload.model.dims import model_dims

    setting = cfg.train.gradient_checkpointing
    if isinstance(setting, bool):
        return int(setting), "set in train.gradient_checkpointing"
    key = cfg.config_hash()
    if key not in _CKPT_DECISIONS:
        if not on_gpu():
            decision = (0, "auto: off on CPU")
        else:
            world = int(os.environ.get("WORLD_SIZE") or 1)
            decision = choose_checkpointing(cfg, gpu_memory_gb(), world, model_dims(cfg))
        log.info("gradient checkpointing: %s", decision[1])
        _CKPT_DECISIONS[key] = decision
    return _CKPT_DECISIONS[key]


_CKPT_DECISIONS: dict[str, tuple[int, str]] = {}


def use_liger(cfg, model=None) -> bool:
    """`train.liger`: `auto` is on with a CUDA GPU, the optional liger-kernel package, and a Liger patch
    for this model type that imports and applies (`liger_probe`); otherwise off, with one log line
    saying why. `true` fails with the reason instead. Decided once per config when the model is given
    (train.setup, before the trainer applies Liger); later calls without it return that decision."""
    setting = cfg.train.liger
    key = cfg.config_hash()
    if model is None and key in _LIGER_DECISIONS:
        return _LIGER_DECISIONS[key]
    installed = importlib.util.find_spec("liger_kernel") is not None
    if setting is True and not installed:
        raise PayloadError("train.liger is true but the liger-kernel package is not installed; "
                           "pip install liger-kernel, or set train.liger: auto")
    if setting is True and not on_gpu():
        raise PayloadError("train.liger needs a CUDA GPU (Triton kernels); set train.liger: auto")
    wanted = bool(setting) and installed and on_gpu()
    if model is None or not wanted:
        return wanted
    model_type = getattr(getattr(model, "config", None), "model_type", None) or type(model).__name__
    why = liger_probe(model_type)
    if why and setting is True:
        raise PayloadError(f"train.liger is true but {why}; set train.liger: auto (off where it fails) or false")
    if why:
        log.info("liger: off (train.liger auto): %s", why)
    _LIGER_DECISIONS[key] = why is None
    return why is None


_LIGER_DECISIONS: dict[str, bool] = {}
# What the trainer applies: TRL 1.16 turns Liger's fused linear cross-entropy off (it has its own fused LM head)
LIGER_CONFIG = {"fused_linear_cross_entropy": False}


def liger_probe(model_type: str) -> str | None:
    """Why Liger cannot patch `model_type` here (None: its patch imports and applies). Applies the
    class-level patch with the trainer's kernel config, which the trainer then applies to the
    instance anyway; any exception (liger-kernel 0.8.5 with transformers 5.23 fails to import its
    Qwen3-VL output class) becomes the reason."""
    import inspect

    try:
        from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN

        apply = MODEL_TYPE_TO_APPLY_LIGER_FN.get(model_type)
        if apply is None:
            return f"liger-kernel has no patch for model type {model_type}"
        params = inspect.signature(apply).parameters
        apply(**{k: v for k, v in LIGER_CONFIG.items() if k in params})
    except Exception as e:  # noqa: BLE001 - whatever breaks, `auto` must not turn it into a crashed run
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return f"liger-kernel's {model_type} patch failed ({type(e).__name__}: {first[:200]})"
    return None


def base_model_path(cfg) -> str:
    """Where the base model loads from: the hub id / local path, or the materialized tiny model."""
    if cfg.model.tiny is not None:
        from payload.model.tiny import BASE_MODEL_DIR, materialize_tiny

        return str(materialize_tiny(cfg, cfg.run_dir / BASE_MODEL_DIR))
    return cfg.model.name_or_path


# ------------------------------------------------------------------------------ tokenizer/processor


def load_processing_class(path: str, kind: str, trust_remote_code: bool = False, revision=None):
    """AutoTokenizer for causal LMs; AutoProcessor for image-text-to-text (image-only fallback)."""
    from transformers import AutoTokenizer, ProcessorMixin

    kw = dict(trust_remote_code=trust_remote_code, revision=revision)
    if kind == "causal_lm":
        tok = AutoTokenizer.from_pretrained(path, **kw)
        _ensure_pad(tok)
        return tok
    proc = None
    try:
        from transformers import AutoProcessor

        proc = AutoProcessor.from_pretrained(path, **kw)
    except (ImportError, ValueError, OSError, AttributeError, TypeError) as e:
        log.info("AutoProcessor failed (%s); using the image-only processor", str(e).strip().splitlines()[0])
    if not isinstance(proc, ProcessorMixin):
        proc = _image_only_processor(path, kw)
    _ensure_pad(proc.tokenizer)
    return proc


def tiny_tokenizer(cfg):
    """The tiny model's tokenizer, built in memory exactly as `payload.model.tiny` saves it beside the
    weights: for a caller that needs no model (`launch data preview`), so nothing is written."""
    from payload.model.tiny import build_tiny_tokenizer

    tok = build_tiny_tokenizer(None, vocab_size=cfg.model.tiny.vocab_size)
    _ensure_pad(tok)
    return tok


def _image_only_processor(path: str, kw: dict):
    """Qwen-VL processor without the video processor (that one needs torchvision, missing on CPU)."""
    from transformers import AutoImageProcessor, AutoTokenizer

    from payload.model.tiny import image_only_processor

    tok = AutoTokenizer.from_pretrained(path, **kw)
    return image_only_processor(AutoImageProcessor.from_pretrained(path, **kw), tok)


def _ensure_pad(tok) -> None:
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token


# -------------------------------------------------------------------------------------------- model


def auto_class(kind: str):
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    return AutoModelForCausalLM if kind == "causal_lm" else AutoModelForImageTextToText


def load_model(cfg, path: str, dtype=None, batch: str = "padded"):
    """Load the base model with the attention implementation for `batch` (payload/model/attention.py);
    returns (model, attn_implementation)."""
    model, impl, _why = load_model_for(cfg, path, dtype, batch)
    return model, impl


def load_model_for(cfg, path: str, dtype, batch: str):
    """Load the base model, trying `attention.candidates(cfg, batch)` in order; logs the winner and
    why. Returns (model, attn_implementation, why)."""
    from payload.model import attention

    dtype = dtype or resolve_dtype(cfg.model)
    kwargs = dict(dtype=dtype, trust_remote_code=cfg.model.trust_remote_code, revision=cfg.model.revision)
    if cfg.train.method == "qlora":
        kwargs["quantization_config"] = quantization_config(cfg.train.quantization)
    cls = auto_class(cfg.model.kind)
    machine = attention.this_machine()
    errors = []
    for impl, why in attention.candidates(cfg, batch, machine):
        skip = attention.unavailable(impl, machine)
        if skip:
            errors.append(f"{impl}: {skip}")
            log.info("attention %s skipped: %s", impl, skip)
            continue
        try:
            model = _hub_retry(f"loading model {cfg.model.name_or_path}", path,
                               lambda: cls.from_pretrained(path, attn_implementation=impl, **kwargs))
        except (ImportError, ValueError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            errors.append(f"{impl}: {first}")
            log.info("attention %s failed: %s", impl, first)
            continue
        if errors:
            why = f"{why} ({'; '.join(errors)})"
        log.info("model %s loaded: %s, dtype %s, attention %s (%s)", cfg.model.name_or_path,
                 type(model).__name__, str(dtype).replace("torch.", ""), impl, why)
        return model, impl, why
    raise PayloadError(
        f"no attention implementation in model.attn_implementation {cfg.model.attn_implementation} "
        f"could load the model ({'; '.join(errors)}); add `sdpa` or `eager` to the list, or set it to `auto`"
    )


def _hub_retry(what: str, path: str, fn):
    """Hub downloads get 3 tries with backoff (payload/retry.py); a local directory loads once."""
    if os.path.isdir(path):
        return fn()
    from payload.retry import with_retries

    return with_retries(what, fn, retry_on=(OSError,))


def quantization_config(q):
    """BitsAndBytesConfig for QLoRA; clear errors where it cannot run (CPU, no bitsandbytes)."""
    import torch

    if not on_gpu():
        raise PayloadError("train.method qlora needs a CUDA GPU (bitsandbytes 4-bit); on CPU use method: lora")
    if importlib.util.find_spec("bitsandbytes") is None:
        raise PayloadError("train.method qlora needs the bitsandbytes package; pip install bitsandbytes")
    from transformers import BitsAndBytesConfig

    compute = torch.bfloat16 if q.compute_dtype == "bfloat16" else torch.float16
    if q.bits == 8:
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=q.quant_type,
        bnb_4bit_use_double_quant=q.double_quant,
        bnb_4bit_compute_dtype=compute,
        bnb_4bit_quant_storage=compute,
    )


# ------------------------------------------------------------------------------------- LoRA / full


def is_vision_param(name: str) -> bool:
    return re.search(_VISION_RE, name) is not None


def _linear_leaf_names(model) -> set[str]:
    """Last name components of the Linear layers outside any vision tower, lm_head excluded."""
    import torch

    names = set()
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and not is_vision_param(name + "."):
            leaf = name.rsplit(".", 1)[-1]
            if leaf != "lm_head":
                names.add(leaf)
    return names


def lora_target_modules(cfg, model):
    """`target_modules` for peft. For VL models with `language_only`: a regex that excludes the
    vision tower (peft full-matches a string against module names)."""
    lc = cfg.train.lora
    vl = cfg.model.kind == "image_text_to_text"
    if not (vl and lc.language_only):
        return lc.target_modules
    leaves = sorted(_linear_leaf_names(model)) if lc.target_modules == "all-linear" else list(lc.target_modules)
    alternatives = "|".join(re.escape(x) for x in leaves)
    prefixes = "|".join(VISION_PREFIXES)
    return rf"^(?!(.*\.)?({prefixes})\.).*\.({alternatives})$"


def lora_config(cfg, model):
    """peft.LoraConfig from `train.lora` (handed to SFTTrainer, which wraps the model)."""
    from peft import LoraConfig

    lc = cfg.train.lora
    return LoraConfig(
        r=lc.r,
        lora_alpha=lc.alpha,
        lora_dropout=lc.dropout,
        target_modules=lora_target_modules(cfg, model),
        task_type="CAUSAL_LM",
        bias="none",
    )


def freeze_vision(model) -> int:
    """Set requires_grad=False on every vision-tower parameter; returns how many tensors."""
    n = 0
    for name, p in model.named_parameters():
        if is_vision_param(name):
            p.requires_grad_(False)
            n += 1
    return n


def check_vision_frozen(cfg, model) -> dict:
    """Assert nothing under the vision tower trains (VL + language_only). Returns param counts."""
    def numel(p) -> int:  # under ZeRO-3 a parameter is a 0-element shard; ds_numel is its size
        return getattr(p, "ds_numel", p.numel())

    trainable = sum(numel(p) for p in model.parameters() if p.requires_grad)
    total = sum(numel(p) for p in model.parameters())
    vision_trainable = sum(numel(p) for n, p in model.named_parameters() if p.requires_grad and is_vision_param(n))
    counts = {"trainable_params": trainable, "total_params": total, "vision_trainable_params": vision_trainable}
    if cfg.model.kind == "image_text_to_text" and cfg.train.lora.language_only and vision_trainable:
        raise RuntimeError(f"vision tower must be frozen but {vision_trainable} of its parameters are trainable")
    if trainable == 0:
        raise PayloadError("no trainable parameters: check train.lora.target_modules against the model's layer names")
    log.info("trainable parameters: %d of %d (%.3f%%); vision tower trainable: %d",
             trainable, total, 100.0 * trainable / max(total, 1), vision_trainable)
    return counts


def prepare_for_method(cfg, model):
    """Method-specific preparation before the trainer: returns (model, peft_config or None).

    QLoRA: nothing is upcast (see `dtype_plan`). peft's `prepare_model_for_kbit_training`, which the
    payload called until 2026-11-26, cast the embeddings, norms and LM head to fp32, and the
    activations followed in fp32: the H200 gpu-check measured 96.3 GiB for QLoRA against 83.4 for bf16
    LoRA at the same shape (bench/results/nvidia-h200-2026-11-26.json#qlora-4bit). TRL 1.16 no longer
    calls it either: gradient checkpointing and input gradients come from the Trainer's arguments
    (TRL calls `enable_input_require_grads` for a PEFT model with checkpointing), the base is frozen
    by peft, and the adapters get their dtype after the trainer is built (`cast_adapters`)."""
    method = cfg.train.method
    vl_language_only = cfg.model.kind == "image_text_to_text" and cfg.train.lora.language_only
    if method == "full":
        if vl_language_only:
            log.info("full fine-tuning: froze %d vision-tower tensors", freeze_vision(model))
        return model, None
    if method == "qlora":
        plan = dtype_plan(method, compute_dtype_name(cfg))
        log.info("qlora dtypes: %s", ", ".join(f"{k} {v}" for k, v in plan.items()))
    return model, lora_config(cfg, model)


KBIT_PREPARATION = "compute-dtype"  # before 2026-11-26: "fp32-upcast" (peft's prepare_model_for_kbit_training)


def compute_dtype_name(cfg) -> str:
    """The dtype of the unquantized weights and of mixed precision: `model.dtype` resolved (`auto`:
    bf16 where the GPU has it, fp16 on a T4, fp32 on CPU). It decides the adapters' dtype (fp16
    mixed precision needs fp32 adapters) whatever `train.quantization.compute_dtype` says."""
    return str(resolve_dtype(cfg.model)).replace("torch.", "")


def dtype_plan(method: str, compute: str, zero3: bool = False) -> dict[str, str]:
    """Which parts of the model hold which dtype while training (a plain table, no torch).

    - block linears: NF4/int8 for qlora (bitsandbytes dequantizes to `compute` per matmul), else `compute`;
    - embeddings, norms, LM head, vision tower: `compute` (never upcast: fp32 norms make every
      activation after them fp32, the memory the H200 row measured);
    - adapters: qlora under bf16 in bf16, as TRL 1.16 casts them for a quantized model (QLoRA paper
      section 3); under fp16 in fp32, because AMP's GradScaler refuses to unscale fp16 gradients;
      lora: peft's default fp32 (`autocast_adapter_dtype`), bf16 under ZeRO-3 (TRL's choice there:
      ZeRO-3 gathers parameters of one dtype).
    """
    if method == "full":
        return {"all": compute}
    plan = {"block_linears": "nf4" if method == "qlora" else compute, "embeddings": compute,
            "norms": compute, "lm_head": compute, "vision": compute}
    if method == "qlora":
        plan["adapters"] = "float32" if compute == "float16" else compute
    else:
        plan["adapters"] = compute if zero3 and compute != "float16" else "float32"
    return plan


def cast_adapters(cfg, model) -> None:
    """Give the trainable adapter tensors their `dtype_plan` dtype (after the trainer is built: TRL
    casts a quantized model's adapters to bf16 whatever the compute dtype). Only QLoRA is cast."""
    import torch

    if cfg.train.method != "qlora":
        return
    want = getattr(torch, dtype_plan("qlora", compute_dtype_name(cfg))["adapters"])
    for name, p in model.named_parameters():
        if p.requires_grad and "lora_magnitude_vector" not in name and p.dtype != want:
            p.data = p.data.to(want)


def deepspeed_config(ds) -> dict:
    """A ZeRO config dict for transformers' `deepspeed=` argument ("auto" values filled by the Trainer)."""
    zero = {
        "stage": ds.zero_stage,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": "auto",
    }
    if ds.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if ds.zero_stage == 3:
        zero.update({
            "stage3_prefetch_bucket_size": "auto",
            "stage3_param_persistence_threshold": "auto",
            "stage3_max_live_parameters": 1e9,
            "stage3_max_reuse_distance": 1e9,
            "stage3_gather_16bit_weights_on_model_save": True,
        })
        if ds.offload_params:
            zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    return {
        "bf16": {"enabled": "auto"},
        "fp16": {"enabled": "auto"},
        "zero_optimization": zero,
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def check_deepspeed_available(cfg) -> None:
    if cfg.train.deepspeed is None:
        return
    if importlib.util.find_spec("deepspeed") is None:
        raise PayloadError("train.deepspeed is set but the deepspeed package is not installed; pip install deepspeed")


def deepspeed_on_cpu() -> None:
    """DeepSpeed without CUDA runs on its CPU accelerator, gloo between the ranks (slow, but the same
    ZeRO sharding, checkpoints and 16-bit save: what the tests and the emulated clouds run). Called before
    the TrainingArguments, which then use this process state (`use_configured_state`): the state they
    would make themselves for DeepSpeed has no backend (transformers training_args.py:1887 passes none),
    and accelerate counts such a state as one process (accelerate/state.py:288), so on CPU every rank
    trained alone and DeepSpeed's batch check failed ("4 != 4 * 1 * 2")."""
    import os

    from accelerate import PartialState

    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"  # read by PartialState: start DeepSpeed's comm
    try:
        PartialState(backend="gloo")
    finally:
        del os.environ["ACCELERATE_USE_DEEPSPEED"]
