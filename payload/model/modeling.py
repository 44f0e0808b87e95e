"""Tokenizer/processor and model for training: Auto classes, dtype, attention fallback, quantization.

One idea: the model and its tokenizer as training gets them, from `from_pretrained` to a loaded model:
dtype, gradient checkpointing, attention, fused kernels (Liger), QLoRA's quantization. Each decision
reads the same cfg; merge and inference load through the same functions. Which of the loaded model's
parameters train (LoRA, the frozen vision tower, the dtype plan) is `payload.model.adapters`;
DeepSpeed's ZeRO config and its CPU set-up are `payload.model.sharding`.

Everything goes through `from_pretrained`, also for the tiny demo model (materialized once into
`{run_dir}/base_model/` by `payload.model.tiny`), so the code path on CPU is the one a GPU run takes.
"""

from __future__ import annotations

import importlib.util
import logging
import os

from payload.errors import PayloadError

log = logging.getLogger("payload.train")


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
