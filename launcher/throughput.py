"""Expected training throughput (tokens/second/GPU) for `launch plan`, with where each figure comes from.

Figures are for a 32B-parameter reference model and scale as 32 / model size in billions (compute per
token is ~6 x params for full fine-tuning and ~4 x params for LoRA, both linear in size). They are
planning figures, +-30%: the plan says "estimate" and the payload measures the real tokens/s
(metrics.jsonl), which the next plan can use via `budget.price_per_hour`/this table.

Sources:
- A100-80GB qlora 760: runbook 001 measured 1.4 steps/min for Qwen2.5-32B QLoRA on one A100 80GB,
  16 packed sequences x 2048 tokens per step = 32,768 tokens/step -> 1.4 x 32,768 / 60 = 765 tok/s.
- H100-SXM lora 1100: runbook 000 reports 2-4 h for 2 epochs of ~10,600 chat records on 2 H100 SXM
  (bf16 LoRA, Qwen3-VL-32B, gradient checkpointing); ~19M tokens / 3 h / 2 GPUs = 880 tok/s,
  rounded up for flash-attention 2 being available in this stack (prebuilt wheel).
- A100-80GB full 550: Qwen3-32B full fine-tuning under ZeRO-3 costs ~6 x 32e9 = 1.9e11 FLOP/token;
  A100 bf16 dense peak 312 TFLOP/s at ~35% MFU (typical for ZeRO-3 across nodes with gradient
  checkpointing, whose recompute adds ~1/3) -> ~550 tok/s/GPU. Runbook 004's own figure (1.5-2.5
  samples/s per 4-GPU node) is consistent with ~2k-token samples.
- Ratios between GPUs follow dense bf16 peak: H100 SXM ~3.2x A100 on paper, ~2x in practice for
  fine-tuning at these sizes; H100 PCIe ~0.75x H100 SXM; L40S ~0.7x A100.
- Method ratios: LoRA ~1.45x full (no weight gradients / optimizer for the base); QLoRA ~0.7x LoRA
  (dequantisation overhead).
- cpu: measured on the 2-core CI machine with the tiny local-demo model (FIELD-NOTES: 50 steps of
  4 x 256 tokens in ~2 s).
"""

from __future__ import annotations

import re
from typing import Optional

REFERENCE_B = 32.0

# tokens/s/GPU for a 32B model
TABLE = {
    ("H100-SXM", "lora"): 1100, ("H100-SXM", "qlora"): 770, ("H100-SXM", "full"): 1100 / 1.45,
    ("H100", "lora"): 825, ("H100", "qlora"): 580, ("H100", "full"): 570,
    ("H200", "lora"): 1250, ("H200", "qlora"): 875, ("H200", "full"): 860,
    ("A100-80GB", "lora"): 1090, ("A100-80GB", "qlora"): 760, ("A100-80GB", "full"): 550,
    ("A100-80GB-SXM", "lora"): 1150, ("A100-80GB-SXM", "qlora"): 800, ("A100-80GB-SXM", "full"): 580,
    ("L40S", "lora"): 760, ("L40S", "qlora"): 530, ("L40S", "full"): 385,
}
CPU_TINY_TOKENS_PER_S = 25000.0

# Figures measured by `make gpu-check` (bench/gpu_check.py), preferred over TABLE. One entry per
# (accelerator, method): (payload tokens/s/GPU, size of the model measured in billions, citation
# "bench/results/<gpu>-<date>.json#<mode>"). None measured yet (no GPU run committed); e.g.
#   ("H100-SXM", "lora"): (3100.0, 8.19, "bench/results/nvidia-h100-80gb-hbm3-2026-12-01.json#lora-bf16-sdpa"),
MEASURED: dict[tuple[str, str], tuple[float, float, str]] = {}


def model_size_b(name: str, tiny: bool = False) -> Optional[float]:
    """Parameter count in billions from a model id like `Qwen/Qwen3-32B` or `...-VL-2B-...`."""
    if tiny:
        return None
    m = re.search(r"(\d+(?:\.\d+)?)\s*[bB](?![a-zA-Z])", name.split("/")[-1])
    return float(m.group(1)) if m else None


def tokens_per_second_per_gpu(accelerator: Optional[str], method: str, size_b: Optional[float]) -> tuple[float, str]:
    """(tokens/s/GPU, how it was derived)."""
    if not accelerator:
        return CPU_TINY_TOKENS_PER_S, "measured: tiny model on 2 CPU cores"
    if (accelerator, method) in MEASURED:
        rate, measured_b, cite = MEASURED[(accelerator, method)]
        if size_b:
            return rate * measured_b / size_b, f"measured {cite} ({measured_b:g}B), scaled to {size_b:g}B"
        return rate, f"measured {cite} ({measured_b:g}B)"
    base = TABLE.get((accelerator, method))
    if base is None:
        base = TABLE[("A100-80GB", method)]
        src = f"no figure for {accelerator}; A100-80GB {method} used"
    else:
        src = f"{accelerator} {method}, 32B reference"
    if size_b:
        base *= REFERENCE_B / size_b
        src += f", scaled to {size_b:g}B"
    return base, src
