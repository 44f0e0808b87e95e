"""What `make gpu-check` runs: model shapes, the training modes the profiles use, and the run config
each mode gives the payload (torch-free, so the parent process never touches the GPU).

Every mode is a payload run (payload.train.recipe's phases with a resolved RunConfig) and is compared with a
plain transformers `Trainer` baseline on the same model, data, batch and sequence length (no packing,
no Liger, checkpointing on as the usual recipe has it). `baseline_of` lets modes that differ only in
the attention kernel share one baseline (plain Trainer with sdpa), so a device call runs fewer processes.
"""

from __future__ import annotations

from typing import Optional

# name -> arch, kind, shape (a payload.model.memory.KNOWN_QWEN key or an explicit ModelDims tuple), vision tower
SHAPES = {
    "qwen3-8b": {"arch": "qwen3", "kind": "causal_lm", "known": "qwen3/8"},
    "qwen3-vl-2b": {"arch": "qwen3_vl", "kind": "image_text_to_text", "known": "qwen3-vl/2", "vision": "qwen3-vl-2b"},
    # --smoke: the same code at tiny shapes (hidden, layers, intermediate, heads, kv, head_dim, vocab, tied)
    "tiny-qwen3": {"arch": "qwen3", "kind": "causal_lm", "dims": (64, 2, 128, 4, 2, 16, 1024, True)},
    "tiny-qwen3-vl": {"arch": "qwen3_vl", "kind": "image_text_to_text", "dims": (64, 2, 128, 4, 2, 16, 1024, True)},
}
SMOKE_SHAPE = {"qwen3-8b": "tiny-qwen3", "qwen3-vl-2b": "tiny-qwen3-vl"}

# Runbook 002's images (well-log headers): ~800 vision tokens each (the profile's estimate; Qwen3-VL
# merges 32x32 pixels into one token: 1024x800 px = 32x25 tokens) + a ~100-token transcription, seq 2048,
# batch 2. --smoke: 320x256 px (80 tokens), the smallest Qwen3-VL's processor keeps as is.
IMAGES = {"size": (1024, 800), "smoke_size": (320, 256), "seq": 2048, "text_tokens": 100, "records": 200,
          "distinct": 16, "instruction": "Transcribe all text in this well-log header image."}
# Qwen3-VL-2B's own image processor limits (its preprocessor_config: shortest_edge / longest_edge pixels)
VL_PIXELS = {"min_pixels": 65536, "max_pixels": 16777216}

# The modes the profiles use. `needs`: optional packages; `cuda`: needs a GPU (everything but the
# two bf16 LoRA modes and the images mode, which run in fp32 on CPU under --smoke). `attn`: None is
# the payload's own choice (model.attn_implementation's default list); `liger`: train.liger (auto).
MODES = [
    {"name": "lora-bf16-sdpa", "shape": "qwen3-8b", "method": "lora", "attn": "sdpa", "dtype": "bfloat16",
     "packing": True, "cuda": False},
    # the default text path: the attention kernel is the payload's choice, not the harness's
    {"name": "lora-bf16", "shape": "qwen3-8b", "method": "lora", "attn": None, "dtype": "bfloat16",
     "packing": True, "cuda": True, "baseline_of": "lora-bf16-sdpa"},
    # the same with Liger off: Liger on/off measured in one mode (train.liger: auto keeps the winner)
    {"name": "lora-bf16-noliger", "shape": "qwen3-8b", "method": "lora", "attn": None, "dtype": "bfloat16",
     "packing": True, "cuda": True, "liger": False, "baseline_of": "lora-bf16-sdpa"},
    {"name": "lora-bf16-flash", "shape": "qwen3-8b", "method": "lora", "attn": "flash_attention_2",
     "dtype": "bfloat16", "packing": True, "cuda": True, "needs": ["flash-attn"], "baseline_of": "lora-bf16-sdpa"},
    {"name": "lora-bf16-flex", "shape": "qwen3-8b", "method": "lora", "attn": "flex_attention",
     "dtype": "bfloat16", "packing": True, "cuda": True, "baseline_of": "lora-bf16-sdpa"},
    {"name": "qlora-4bit", "shape": "qwen3-8b", "method": "qlora", "attn": "sdpa", "dtype": "bfloat16",
     "packing": True, "cuda": True, "needs": ["bitsandbytes"]},
    # Sonia's path: a vision-language model, LoRA on the language layers, text records: padding-free
    # by default, the attention kernel the payload's choice (as the profile's `auto`)
    {"name": "lora-bf16-vl", "shape": "qwen3-vl-2b", "method": "lora", "attn": None, "dtype": "bfloat16",
     "packing": False, "cuda": False},
    {"name": "full-zero3", "shape": "qwen3-vl-2b", "method": "full", "attn": "sdpa", "dtype": "bfloat16",
     "packing": False, "cuda": True, "needs": ["deepspeed"], "deepspeed": True},
    # runbook 002's shape of data: one image per record at its sizes (IMAGES), seq 2048 (no baseline:
    # the plain-Trainer baseline tokenizes text records only)
    {"name": "lora-bf16-images", "shape": "qwen3-vl-2b", "method": "lora", "attn": "sdpa", "dtype": "bfloat16",
     "packing": False, "cuda": False, "images": True, "baseline": False},
    # the small-GPU path (T4: no bf16): fp16 weights, fp16 mixed precision, fp32 adapters
    {"name": "lora-fp16", "shape": "qwen3-vl-2b", "method": "lora", "attn": "sdpa", "dtype": "float16",
     "packing": False, "cuda": True},
]
MODE_NAMES = [m["name"] for m in MODES]
SMOKE_MODES = ["lora-bf16-sdpa", "lora-bf16-vl", "lora-bf16-images"]


def mode(name: str) -> dict:
    for m in MODES:
        if m["name"] == name:
            return dict(m)
    raise KeyError(f"unknown mode {name!r}; known: {', '.join(MODE_NAMES)}")


def shape_dims(shape: str):
    """payload.model.memory.ModelDims of a shape name."""
    from payload.model.memory import KNOWN_QWEN, ModelDims

    s = SHAPES[shape]
    return ModelDims(*KNOWN_QWEN[s["known"]]) if "known" in s else ModelDims(*s["dims"])


def vision_of(shape: str) -> Optional[dict]:
    from payload.model.tiny import QWEN3_VL_2B_VISION

    return QWEN3_VL_2B_VISION if SHAPES[shape].get("vision") == "qwen3-vl-2b" else None


def skip_reason(m: dict, cuda: bool, have) -> Optional[str]:
    """Why a mode cannot run here (None if it can). `have(name)` tells whether a package is importable."""
    if m.get("cuda") and not cuda:
        return "needs a CUDA GPU"
    missing = [p for p in m.get("needs", []) if not have(p)]
    if missing:
        return f"{', '.join(missing)} not installed (optional; see bench/README.md for wheels)"
    return None


def logging_steps(steps: int) -> int:
    """Log the loss at >= 4 points of a run (15 steps: every 3rd), so the rows show it falling."""
    return max(1, steps // 4)


def learning_rate(m: dict, smoke: bool) -> float:
    """LoRA: 2e-4 (runbooks 001-003); full: 2e-5. --smoke takes 10x larger steps so that 4 CPU steps on
    a tiny model show the fall. Speed and memory do not depend on it."""
    return (2e-5 if m["method"] == "full" else 2e-4) * (10 if smoke else 1)


def seq_of(m: dict, seq: int) -> int:
    return IMAGES["seq"] if m.get("images") else seq


def run_config_dict(m: dict, *, model_dir: str, kind: str, data_path: str, volume: str, run_id: str,
                    steps: int, batch: int, seq: int, smoke: bool, offload: bool = False) -> dict:
    """The payload RunConfig (as a dict) of a mode: what a profile would say for this run."""
    train = {
        "method": m["method"], "max_seq_length": seq_of(m, seq), "per_device_batch_size": batch,
        "gradient_accumulation_steps": 1, "max_steps": steps, "learning_rate": learning_rate(m, smoke),
        "warmup_ratio": 0.0, "lr_scheduler": "constant", "packing": m["packing"], "gradient_checkpointing": "auto",
        "liger": m.get("liger", "auto"), "logging_steps": logging_steps(steps), "eval_steps": 10**6,
        "high_loss_samples": 0,
        "lora": {"r": 16, "alpha": 32, "dropout": 0.05},
        "checkpoints": {"save_steps": 10**6, "keep_best": 0, "keep_recent": 1},
    }
    if m["method"] == "qlora":
        train["quantization"] = {"bits": 4, "quant_type": "nf4", "double_quant": True, "compute_dtype": "bfloat16"}
    if m.get("deepspeed"):
        train["deepspeed"] = {"zero_stage": 3, "offload_optimizer": offload, "offload_params": False}
    source = {"name": "mix", "path": data_path, "format": "messages"}
    if m.get("images"):  # runbook 002's source: format image_text, its instruction as the user turn
        source = {"name": "images", "path": images_path(data_path), "format": "image_text",
                  "instruction": IMAGES["instruction"]}
    model = {"name_or_path": model_dir, "kind": kind, "dtype": "auto" if smoke else m["dtype"]}
    if m["attn"]:
        model["attn_implementation"] = [m["attn"]]
    return {
        "name": m["name"],
        "data": {"sources": [source], "dedup": False},
        "model": model,
        "train": train,
        "runtime": {"volume": volume, "run_id": run_id, "price_per_hour": 0.0},
    }


def images_path(data_path: str) -> str:
    """The images mode's records (image_text JSONL), beside the text records."""
    from pathlib import Path

    return str(Path(data_path).with_name("images.jsonl"))
