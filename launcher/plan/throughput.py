"""Network between nodes, GPU datasheet figures and stage factors for `launch plan`.

The compute-bound tokens/s/GPU range (peak x MFU carried from measured anchors, the user's own runs
first) is launcher/plan/speed.py's; this module holds the GPUs' peaks and memory, the `make
gpu-check` measurements (MEASURED, speed_model's first anchors) and how the network caps a
multi-node run.

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

BF16_BYTES = 2

# Stage cost factors (launcher/plan/estimate.py, per record of each kind; runbook 003's table checks them):
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

# Figures measured by `make gpu-check` (bench/gpu/gpu_check.py), speed_model's first anchors. Key: (accelerator,
# method[, mode]) -> (payload tokens/s/GPU, size of the model measured in billions, citation
# "bench/results/<gpu>-<date>.json#<mode>"); the mode in the key lets one method have several sizes.
# A mode named *fp16* ran in fp16 mixed precision (the T4 path): it anchors GPUs without bf16
# (NO_BF16), the others anchor the rest. tests/payload/model/test_memory_measured.py checks each against its file.
H200_2026_11_26 = "bench/results/nvidia-h200-2026-11-26.json"
MEASURED: dict[tuple, tuple[float, float, str]] = {
    # Qwen3-8B, batch 2 x 4096 packed, sdpa (the attention today's profiles list first), Liger on
    ("H200", "lora", "lora-bf16-sdpa"): (4290.1, 8.19, f"{H200_2026_11_26}#lora-bf16-sdpa"),
    # the same with peft's fp32 upcast (the payload no longer upcasts: expect it faster and smaller)
    ("H200", "qlora", "qlora-4bit"): (5274.4, 8.19, f"{H200_2026_11_26}#qlora-4bit"),
    # Qwen3-VL-2B on text records, padded batches of 2, Liger off
    ("H200", "lora", "lora-bf16-vl"): (2635.0, 2.02, f"{H200_2026_11_26}#lora-bf16-vl"),
    ("H200", "lora", "lora-fp16"): (2417.4, 2.02, f"{H200_2026_11_26}#lora-fp16"),
}
NO_BF16 = {"T4", "V100", "V100-32GB"}  # fp16 mixed precision with loss scaling


def measured_precision(citation: str) -> str:
    """"fp16" for a gpu-check mode that trained in fp16 (its name says so), else "bf16"."""
    return "fp16" if "fp16" in citation.rsplit("#", 1)[-1] else "bf16"


def precision_of(accelerator: Optional[str]) -> str:
    return "fp16" if accelerator in NO_BF16 else "bf16"


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


def slurm_link(slurm) -> Link:
    """A Slurm cluster's network, as its profile states it (cluster.slurm): no catalog knows it."""
    return Link("InfiniBand" if slurm.infiniband else "Ethernet", slurm.network_gbps,
                "the profile's cluster.slurm.network_gbps")


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
