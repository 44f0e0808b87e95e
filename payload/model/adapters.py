"""Which parameters train, and in which dtype: the LoRA/QLoRA adapters (target modules, `lora_config`,
their cast), full fine-tuning with the vision tower frozen, the dtype plan, the trainable counts.

Apart from `modeling`, which loads the model: this starts where loading ends, from a loaded model to
the parameters that train. The LoRA adapter itself is created by TRL's SFTTrainer from
`lora_config()`; `check_vision_frozen` asserts afterwards that nothing under a vision tower trains.
"""

from __future__ import annotations

import logging
import re

from payload.errors import PayloadError
from payload.model import modeling

log = logging.getLogger("payload.train")

VISION_PREFIXES = ("visual", "vision_tower", "vision_model", "vision_encoder")
_VISION_RE = r"(^|\.)(" + "|".join(VISION_PREFIXES) + r")\."


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
    return str(modeling.resolve_dtype(cfg.model)).replace("torch.", "")


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
