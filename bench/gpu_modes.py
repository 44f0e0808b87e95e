"""What `make gpu-check` runs: model shapes, the training modes the profiles use, and the run config
each mode gives the payload (torch-free, so the parent process never touches the GPU).

Every mode is a payload run (payload.train's phases with a resolved RunConfig) and is compared with a
plain transformers `Trainer` baseline on the same model, data, batch and sequence length (no packing,
no Liger, checkpointing on as the usual recipe has it). `baseline_of` lets modes that differ only in
the attention kernel share one baseline (plain Trainer with sdpa), so a device call runs fewer processes.
"""

from __future__ import annotations

from typing import Optional

# name -> arch, kind, shape (a payload.memory.KNOWN_QWEN key or an explicit ModelDims tuple), vision tower
SHAPES = {
    "qwen3-8b": {"arch": "qwen3", "kind": "causal_lm", "known": "qwen3/8"},
    "qwen3-vl-2b": {"arch": "qwen3_vl", "kind": "image_text_to_text", "known": "qwen3-vl/2", "vision": "qwen3-vl-2b"},
    # --smoke: the same code at tiny shapes (hidden, layers, intermediate, heads, kv, head_dim, vocab, tied)
    "tiny-qwen3": {"arch": "qwen3", "kind": "causal_lm", "dims": (64, 2, 128, 4, 2, 16, 1024, True)},
    "tiny-qwen3-vl": {"arch": "qwen3_vl", "kind": "image_text_to_text", "dims": (64, 2, 128, 4, 2, 16, 1024, True)},
}
SMOKE_SHAPE = {"qwen3-8b": "tiny-qwen3", "qwen3-vl-2b": "tiny-qwen3-vl"}

# The modes the profiles use. `needs`: optional packages; `cuda`: needs a GPU (everything but the
# two bf16 LoRA modes, which run in fp32 on CPU under --smoke).
MODES = [
    {"name": "lora-bf16-sdpa", "shape": "qwen3-8b", "method": "lora", "attn": "sdpa", "dtype": "bfloat16",
     "packing": True, "cuda": False},
    {"name": "lora-bf16-flash", "shape": "qwen3-8b", "method": "lora", "attn": "flash_attention_2",
     "dtype": "bfloat16", "packing": True, "cuda": True, "needs": ["flash-attn"], "baseline_of": "lora-bf16-sdpa"},
    {"name": "lora-bf16-flex", "shape": "qwen3-8b", "method": "lora", "attn": "flex_attention",
     "dtype": "bfloat16", "packing": True, "cuda": True, "baseline_of": "lora-bf16-sdpa"},
    {"name": "qlora-4bit", "shape": "qwen3-8b", "method": "qlora", "attn": "sdpa", "dtype": "bfloat16",
     "packing": True, "cuda": True, "needs": ["bitsandbytes"]},
    # Sonia's path: a vision-language model, LoRA on the language layers; TRL packs no VL dataset
    {"name": "lora-bf16-vl", "shape": "qwen3-vl-2b", "method": "lora", "attn": "sdpa", "dtype": "bfloat16",
     "packing": False, "cuda": False},
    {"name": "full-zero3", "shape": "qwen3-vl-2b", "method": "full", "attn": "sdpa", "dtype": "bfloat16",
     "packing": False, "cuda": True, "needs": ["deepspeed"], "deepspeed": True},
    # the small-GPU path (T4: no bf16): fp16 weights, fp16 mixed precision, fp32 adapters
    {"name": "lora-fp16", "shape": "qwen3-vl-2b", "method": "lora", "attn": "sdpa", "dtype": "float16",
     "packing": False, "cuda": True},
]
MODE_NAMES = [m["name"] for m in MODES]
SMOKE_MODES = ["lora-bf16-sdpa", "lora-bf16-vl"]


def mode(name: str) -> dict:
    for m in MODES:
        if m["name"] == name:
            return dict(m)
    raise KeyError(f"unknown mode {name!r}; known: {', '.join(MODE_NAMES)}")


def shape_dims(shape: str):
    """payload.memory.ModelDims of a shape name."""
    from payload.memory import KNOWN_QWEN, ModelDims

    s = SHAPES[shape]
    return ModelDims(*KNOWN_QWEN[s["known"]]) if "known" in s else ModelDims(*s["dims"])


def vision_of(shape: str) -> Optional[dict]:
    from payload.tiny import QWEN3_VL_2B_VISION

    return QWEN3_VL_2B_VISION if SHAPES[shape].get("vision") == "qwen3-vl-2b" else None


def skip_reason(m: dict, cuda: bool, have) -> Optional[str]:
    """Why a mode cannot run here (None if it can). `have(name)` tells whether a package is importable."""
    if m.get("cuda") and not cuda:
        return "needs a CUDA GPU"
    missing = [p for p in m.get("needs", []) if not have(p)]
    if missing:
        return f"{', '.join(missing)} not installed (optional; see bench/README.md for wheels)"
    return None


def run_config_dict(m: dict, *, model_dir: str, kind: str, data_path: str, volume: str, run_id: str,
                    steps: int, batch: int, seq: int, smoke: bool, offload: bool = False) -> dict:
    """The payload RunConfig (as a dict) of a mode: what a profile would say for this run."""
    train = {
        "method": m["method"], "max_seq_length": seq, "per_device_batch_size": batch,
        "gradient_accumulation_steps": 1, "max_steps": steps, "learning_rate": 1e-4, "warmup_ratio": 0.0,
        "lr_scheduler": "constant", "packing": m["packing"], "gradient_checkpointing": "auto",
        "liger": "auto", "logging_steps": steps, "eval_steps": 10**6, "high_loss_samples": 0,
        "lora": {"r": 16, "alpha": 32, "dropout": 0.05},
        "checkpoints": {"save_steps": 10**6, "keep_best": 0, "keep_recent": 1},
    }
    if m["method"] == "qlora":
        train["quantization"] = {"bits": 4, "quant_type": "nf4", "double_quant": True, "compute_dtype": "bfloat16"}
    if m.get("deepspeed"):
        train["deepspeed"] = {"zero_stage": 3, "offload_optimizer": offload, "offload_params": False}
    return {
        "name": m["name"],
        "data": {"sources": [{"name": "mix", "path": data_path, "format": "messages"}], "dedup": False},
        "model": {"name_or_path": model_dir, "kind": kind, "attn_implementation": [m["attn"]],
                  "dtype": "auto" if smoke else m["dtype"]},
        "train": train,
        "runtime": {"volume": volume, "run_id": run_id, "price_per_hour": 0.0},
    }
