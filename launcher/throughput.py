"""Training speed for `launch plan`: compute-bound tokens/s/GPU, and how the network between nodes caps it.

Every figure names its source; they are planning figures (+-30%), and the payload measures the real
tokens/s (metrics.jsonl).

Compute-bound figures (TABLE) are for a 32B-parameter reference model on ONE node and scale as
32 / model size (compute per token is ~6 x params for full fine-tuning, ~4 x params for LoRA):
- A100-80GB qlora 760: runbook 001 measured 1.4 steps/min for Qwen2.5-32B QLoRA on one A100 80GB,
  16 packed sequences x 2048 tokens per step -> 1.4 x 32,768 / 60 = 765 tok/s.
- H100-SXM lora 1100: runbook 000 reports 2-4 h for 2 epochs of ~10,600 chat records on 2 H100 SXM
  (bf16 LoRA, Qwen3-VL-32B, gradient checkpointing); ~19M tokens / 3 h / 2 GPUs = 880 tok/s,
  rounded up for flash-attention 2 being available in this stack (prebuilt wheel).
- A100-80GB full 550: 6 x 32e9 = 1.9e11 FLOP/token at 312 TFLOP/s bf16 and ~35% MFU (the recompute of
  gradient checkpointing not counted as useful work). Runbook 004's 1.5-2.5 samples/s per 4-GPU node
  (sample length not stated) equals 550 tok/s/GPU for samples of ~0.9-1.5k tokens.
- Ratios between GPUs: H100 SXM ~2x A100 in practice for fine-tuning at these sizes, H100 PCIe ~0.75x
  H100 SXM, L40S ~0.7x A100; other GPUs scale from A100 by dense bf16 peak (GPUS below).
- Method ratios: LoRA ~1.45x full (no weight gradients / optimizer for the base); QLoRA ~0.7x LoRA.

Between nodes (communication_s): ZeRO-3 gathers every parameter for the forward and again for the
backward pass and reduce-scatters the gradients, every micro-step: ~3 x the bf16 parameter bytes
through each node's network link (2 x for LoRA, whose frozen base is gathered but gets no gradient).
Without ZeRO-3 (DDP, ZeRO-2) only the trainable gradients are all-reduced, once per optimizer step.
DeepSpeed prefetches the next gather while computing, so a micro-step takes max(compute, network):
a lower bound (NCCL over TCP reaches 60-90% of line rate).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Optional

REFERENCE_B = 32.0
BF16_BYTES = 2

# tokens/s/GPU for a 32B model, one node
TABLE = {
    ("H100-SXM", "lora"): 1100, ("H100-SXM", "qlora"): 770, ("H100-SXM", "full"): 1100 / 1.45,
    ("H100", "lora"): 825, ("H100", "qlora"): 580, ("H100", "full"): 570,
    ("H200", "lora"): 1250, ("H200", "qlora"): 875, ("H200", "full"): 860,
    ("A100-80GB", "lora"): 1090, ("A100-80GB", "qlora"): 760, ("A100-80GB", "full"): 550,
    ("A100-80GB-SXM", "lora"): 1150, ("A100-80GB-SXM", "qlora"): 800, ("A100-80GB-SXM", "full"): 580,
    ("L40S", "lora"): 760, ("L40S", "qlora"): 530, ("L40S", "full"): 385,
    # runbook 003 (Qwen3-VL-2B on a Colab T4, fp16, LoRA r16, seq 2048, gradient checkpointing): SFT
    # of 1,000 records in ~4 h = ~2.05M tokens / 14,400 s = 142 tok/s at 2B, i.e. 8.9 at the 32B
    # reference. Far below the T4's fp16 peak: no flash-attention on Turing, eager image processing.
    ("T4", "lora"): 8.9, ("T4", "qlora"): 8.9 * 0.7,
}

# Stage cost factors (launcher/plan.py, per record of each kind; runbook 003's table checks them):
# DPO trains chosen + rejected (2 sequences) and runs the reference forward on both (~1/3 of a
# forward+backward): 2 x 4/3 sequence-equivalents per pair. GRPO trains num_generations sequences
# of prompt + completion per prompt, plus the reference forward (x 4/3), and first decodes the
# completions: max_completion_length decode steps per prompt (the generations run as one batch).
DPO_FACTOR = 2 * 4 / 3
GRPO_TRAIN_FACTOR = 4 / 3
# Decode steps/s of HF generate for a 2B model on a T4 (memory-bound, small batch, no vLLM): ~20;
# other GPUs scale by compute peak, other models by size.
DECODE_STEPS_PER_S_T4_2B = 20.0


def decode_steps_per_s(accelerator: Optional[str], size_b: Optional[float]) -> float:
    gpu = GPUS.get(accelerator or "")
    rate = DECODE_STEPS_PER_S_T4_2B * (gpu.bf16_tflops / GPUS["T4"].bf16_tflops if gpu else 1.0)
    return rate * (2.0 / size_b if size_b else 1.0)
CPU_TINY_TOKENS_PER_S = 25000.0

# Figures measured by `make gpu-check` (bench/gpu_check.py), preferred over TABLE. One entry per
# (accelerator, method): (payload tokens/s/GPU, size of the model measured in billions, citation
# "bench/results/<gpu>-<date>.json#<mode>"). None measured yet (no GPU run committed); e.g.
#   ("H100-SXM", "lora"): (3100.0, 8.19, "bench/results/nvidia-h100-80gb-hbm3-2026-12-01.json#lora-bf16-sdpa"),
MEASURED: dict[tuple[str, str], tuple[float, float, str]] = {}


@dataclass(frozen=True)
class GPU:
    memory_gib: float  # what torch reports as total_memory, in GiB
    bf16_tflops: float  # dense, vendor datasheet


# Vendor datasheets (memory as the driver reports it: e.g. 81920 MiB for an A100 80GB).
GPUS = {
    "A100-80GB": GPU(80.0, 312), "A100-80GB-SXM": GPU(80.0, 312), "A100": GPU(40.0, 312),
    "H100": GPU(79.6, 756), "H100-SXM": GPU(79.6, 989), "H100-NVL": GPU(93.0, 835), "H200": GPU(139.8, 989),
    "H200-SXM": GPU(139.8, 989), "L40S": GPU(44.5, 362), "L40": GPU(44.5, 181), "L4": GPU(22.5, 121),
    "RTX4090": GPU(23.99, 165), "RTX3090": GPU(24.0, 71), "RTXA5000": GPU(24.0, 111), "RTXA6000": GPU(48.0, 155),
    "A10": GPU(22.5, 125), "A10G": GPU(22.5, 70), "T4": GPU(15.0, 65), "V100": GPU(16.0, 125),
    "V100-32GB": GPU(32.0, 125), "A40": GPU(44.5, 150),
}


@dataclass(frozen=True)
class Link:
    kind: str  # "InfiniBand", "Ethernet", "Ethernet (assumed)"
    gbps: float  # per node, all NICs together
    source: str

    @property
    def bytes_per_s(self) -> float:
        return self.gbps / 8 * 1e9


# Per-node network of the multi-node instance types in the catalog snapshot.
LINKS = {
    "Standard_NC96ads_A100_v4": Link("Ethernet", 80, "Azure NC A100 v4 docs: 80 Gb/s, no InfiniBand"),
    "Standard_NC48ads_A100_v4": Link("Ethernet", 40, "Azure NC A100 v4 docs: 40 Gb/s"),
    "Standard_NC24ads_A100_v4": Link("Ethernet", 20, "Azure NC A100 v4 docs: 20 Gb/s"),
    "Standard_ND96amsr_A100_v4": Link("InfiniBand", 1600, "Azure ND A100 v4 docs: 8 x 200 Gb/s HDR InfiniBand"),
}
DEFAULT_LINK = Link("Ethernet (assumed)", 25, "unknown instance: 25 Gb/s assumed")


def model_size_b(name: str, tiny: bool = False) -> Optional[float]:
    """Parameter count in billions from a model id like `Qwen/Qwen3-32B` or `...-VL-2B-...`."""
    if tiny:
        return None
    m = re.search(r"(\d+(?:\.\d+)?)\s*[bB](?![a-zA-Z])", name.split("/")[-1])
    return float(m.group(1)) if m else None


def tokens_per_second_per_gpu(accelerator: Optional[str], method: str, size_b: Optional[float]) -> tuple[float, str]:
    """(compute-bound tokens/s/GPU on one node, how it was derived)."""
    if not accelerator:
        return CPU_TINY_TOKENS_PER_S, "measured: tiny model on 2 CPU cores"
    if (accelerator, method) in MEASURED:
        rate, measured_b, cite = MEASURED[(accelerator, method)]
        if size_b:
            return rate * measured_b / size_b, f"measured {cite} ({measured_b:g}B), scaled to {size_b:g}B"
        return rate, f"measured {cite} ({measured_b:g}B)"
    base = TABLE.get((accelerator, method))
    if base is not None:
        src = f"{accelerator} {method}, 32B reference"
    elif accelerator in GPUS:
        base = TABLE[("A100-80GB", method)] * GPUS[accelerator].bf16_tflops / GPUS["A100-80GB"].bf16_tflops
        src = f"A100-80GB {method} x {accelerator}/A100 bf16 peak"
    else:
        base = TABLE[("A100-80GB", method)]
        src = f"no figure for {accelerator}; A100-80GB {method} used"
    if size_b:
        base *= REFERENCE_B / size_b
        src += f", scaled to {size_b:g}B"
    return base, src


def link_for(instance_type: Optional[str]) -> Link:
    return LINKS.get(instance_type or "", DEFAULT_LINK)


def cross_node_bytes_per_microstep(method: str, zero_stage: Optional[int], params: float, trainable: float,
                                   grad_accum: int) -> float:
    """Bytes through each node's link per micro-step (see the module docstring)."""
    if zero_stage == 3:
        return (3 if method == "full" else 2) * BF16_BYTES * params
    grad_bytes = BF16_BYTES * params if method == "full" else 4 * trainable  # LoRA grads stay fp32
    return 2 * grad_bytes / max(grad_accum, 1)  # ring all-reduce moves ~2x the data, once per step


@dataclass
class Speed:
    tokens_per_s_per_gpu: float  # effective, network included
    compute_tokens_per_s_per_gpu: float
    compute_s: float  # per micro-step
    network_s: float  # per micro-step (0 on one node)
    bound: str  # "compute" | "network"
    link: Optional[dict] = None

    def to_dict(self) -> dict:
        return asdict(self)


def effective_speed(compute_tps: float, tokens_per_microstep: float, num_nodes: int, link: Link,
                    cross_bytes: float) -> Speed:
    """Per-GPU tokens/s once the network between nodes is counted: max(compute, network) per micro-step."""
    compute_s = tokens_per_microstep / compute_tps if compute_tps else 0.0
    network_s = cross_bytes / link.bytes_per_s if num_nodes > 1 else 0.0
    step_s = max(compute_s, network_s)
    tps = tokens_per_microstep / step_s if step_s else compute_tps
    return Speed(tokens_per_s_per_gpu=tps, compute_tokens_per_s_per_gpu=compute_tps, compute_s=compute_s,
                 network_s=network_s, bound="network" if network_s > compute_s else "compute",
                 link=asdict(link) if num_nodes > 1 else None)
