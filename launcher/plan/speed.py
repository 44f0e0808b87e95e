"""Training throughput for `launch plan`: tokens/s/GPU as a low-mid-high range, each with its source.

The model (one formula, every input named):

    tokens/s/GPU = peak x MFU / FLOPs per token

- FLOPs per token: 6 N for full fine-tuning, 4 N for LoRA and QLoRA (forward 2N, backward through the
  activations 2N, no weight gradients for the frozen base), N = parameters from the model name.
- peak: the GPU's dense bf16 (fp16 on Turing) TFLOP/s from the vendor datasheet (throughput.GPUS).
- MFU (model FLOPs utilisation) is not a constant: it is read from the nearest ANCHOR, a measured run,
  and carried to the planned run:
  - to another GPU: MFU kept, so speed follows the peak ratio; spread x1.5 (MFU does not carry exactly
    between chips: memory bandwidth, flash-attention support);
  - to another method: QLoRA = 0.7 x LoRA's MFU (bitsandbytes dequantises every matmul; assumption),
    full = LoRA's (same matmuls, 6N counted instead of 4N); spread x1.3;
  - to another model size: MFU x (N / N_anchor)^0.9, spread x1.5. The exponent is what the runbooks'
    own figures say: runbook 003 (Qwen3-VL-2B with images, T4) runs at ~1.7% MFU, the 32B anchors at
    11% (000) and 31% (001, QLoRA: ~45% LoRA-equivalent); (2/32)^0.9 = 0.08 is their ratio at the
    geometric mean. Small models (short matmuls, per-token overheads that do not shrink) and
    vision-language batches (image preprocessing, the vision tower) do not speed up as 1/N: a 16x
    smaller model trains ~1.3x more tokens/s, not 16x.
- Anchors, in order of preference (SOURCES: what each range is made from):
  1. the user's own finished runs on the same GPU, method and model (launcher/plan/calibration.py):
     median, range = the runs' min-max widened x/÷1.1 ("calibrated from N runs");
  2. `make gpu-check` results (throughput.MEASURED, cited as bench/results/<file>.json#<mode>): spread
     x/÷1.15 (one steady-state measurement); one of the same method, at the same size (within x1.5)
     and precision (fp16 rows for GPUs without bf16) is used before any runbook figure, carried to
     the planned GPU;
  3. runbook measurements (RUNBOOK_ANCHORS): spread x/÷1.41, the spread runbook 000's own "2-4 h" states;
  4. nothing near: peak x 35% MFU (a typical bf16 fine-tune on a datacenter GPU; assumption), x/÷2.
  Otherwise the anchor needing the fewest carries wins (GPU 1, method 1, size 2).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Optional

from launcher.plan.throughput import CPU_TINY_TOKENS_PER_S, GPUS, MEASURED, measured_precision, precision_of

SIZE_EXPONENT = 0.9
QLORA_MFU_RATIO = 0.7
MAX_MFU = 0.55
ASSUMED_MFU = 0.35
SPREAD = {"runs": 1.1, "gpu-check": 1.15, "runbook": 1.41, "assumption": 2.0}
CARRY_SPREAD = {"gpu": 1.5, "method": 1.3, "size": 1.5}
CARRY_COST = {"gpu": 1, "method": 1, "size": 2}
SAME_CHIP = {"A100-80GB-SXM": "A100-80GB", "A100": "A100-80GB", "H200-SXM": "H200"}  # same peak and chip


@dataclass(frozen=True)
class Anchor:
    gpu: str
    method: str
    size_b: float
    tokens_per_s: float
    source: str
    kind: str = "runbook"  # "runs" | "gpu-check" | "runbook"
    precision: str = "bf16"  # "fp16": measured in fp16 mixed precision (GPUs without bf16)


# Runbook measurements, tokens/s/GPU at the model size they were measured at.
RUNBOOK_ANCHORS = (
    # 000: 2 epochs of ~10,600 chat records (19.1M tokens) in 2-4 h on 2 H100 SXM, bf16 LoRA, 32B VL:
    # 660-1,320 tok/s/GPU, 880 at 3 h.
    Anchor("H100-SXM", "lora", 32.0, 880.0, "runbook 000: 19M tokens in 2-4 h on 2x H100 SXM"),
    # 001: 1.4 steps/min x 16 packed sequences x 2,048 tokens on one A100 80GB, Qwen2.5-32B QLoRA.
    Anchor("A100-80GB", "qlora", 32.0, 765.0, "runbook 001: 1.4 steps/min x 16 x 2,048 tokens on an A100"),
    # 003: SFT of 1,000 image records (~2,048 tokens each) in ~4 h on a Colab T4, fp16 LoRA, Qwen3-VL-2B.
    Anchor("T4", "lora", 2.0, 142.0, "runbook 003: 1,000 VL records x ~2k tokens in ~4 h on a T4"),
)


@dataclass
class Throughput:
    """tokens/s/GPU, compute-bound (the network between nodes is applied after: throughput.py)."""
    low: float
    mid: float
    high: float
    source: str
    kind: str  # "runs" | "gpu-check" | "runbook" | "assumption" | "cpu"
    mfu: Optional[float] = None

    def to_dict(self) -> dict:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def flops_per_token(method: str, size_b: float) -> float:
    return (6.0 if method == "full" else 4.0) * size_b * 1e9


def mfu_of(a: Anchor) -> float:
    peak = GPUS[a.gpu].bf16_tflops * 1e12
    return a.tokens_per_s * flops_per_token(a.method, a.size_b) / peak


def _chip(gpu: str) -> str:
    return SAME_CHIP.get(gpu, gpu)


def _carries(a: Anchor, gpu: str, method: str, size_b: float) -> list[str]:
    out = []
    if _chip(a.gpu) != _chip(gpu):
        out.append("gpu")
    if a.method != method:
        out.append("method")
    if max(size_b, a.size_b) / min(size_b, a.size_b) > 1.5:
        out.append("size")
    return out


def _method_ratio(src: str, dst: str) -> float:
    r = {"qlora": QLORA_MFU_RATIO, "lora": 1.0, "full": 1.0}
    return r[dst] / r[src]


def carry(a: Anchor, gpu: str, method: str, size_b: float) -> Throughput:
    """The anchor's MFU carried to (gpu, method, size) (module docstring)."""
    carries = _carries(a, gpu, method, size_b)
    mfu = mfu_of(a) * _method_ratio(a.method, method) * (size_b / a.size_b) ** SIZE_EXPONENT
    mfu = min(mfu, MAX_MFU)
    mid = GPUS[gpu].bf16_tflops * 1e12 * mfu / flops_per_token(method, size_b)
    spread = SPREAD[a.kind] * math.prod(CARRY_SPREAD[c] for c in carries)
    how = "" if not carries else " carried to " + ", ".join(
        {"gpu": gpu, "method": method, "size": f"{size_b:g}B"}[c] for c in carries)
    src = f"{a.source} ({a.gpu} {a.method} {a.size_b:g}B){how}, MFU {mfu:.1%}"
    return Throughput(mid / spread, mid, mid * spread, src, a.kind, mfu)


def anchors() -> list[Anchor]:
    """gpu-check measurements first (throughput.MEASURED), then the runbooks."""
    measured = [Anchor(key[0], key[1], size, rate, f"measured {cite}", "gpu-check", measured_precision(cite))
                for key, (rate, size, cite) in MEASURED.items() if key[0] in GPUS]
    return measured + list(RUNBOOK_ANCHORS)


def estimate(gpu: Optional[str], method: str, size_b: Optional[float], calibrated=None) -> Throughput:
    """Compute-bound tokens/s/GPU range for one node. `calibrated`: the user's own runs
    (launcher/plan/calibration.py), preferred when given."""
    if calibrated is not None:
        return calibrated
    if not gpu:
        return Throughput(CPU_TINY_TOKENS_PER_S / 2, CPU_TINY_TOKENS_PER_S, CPU_TINY_TOKENS_PER_S * 2,
                          "measured: tiny model on 2 CPU cores (x/÷2: other CPUs)", "cpu")
    known = gpu in GPUS
    if not size_b:
        return _assumed(gpu if known else "A100-80GB", method, 8.0, known)
    if not known:
        t = estimate("A100-80GB", method, size_b)
        return Throughput(t.low / 2, t.mid, t.high * 2, f"no figure for {gpu}; A100-80GB used: {t.source}",
                          "assumption", t.mfu)
    rank = {"runbook": 0, "gpu-check": 1}  # at equal carries the runbook's real workload (images, real data)

    def cost(a: Anchor) -> tuple:
        carries = sum(CARRY_COST[c] for c in _carries(a, gpu, method, size_b))
        return carries, rank[a.kind], abs(math.log(size_b / a.size_b))

    # a gpu-check measurement of this method at this size (within x1.5) and precision, carried to this
    # GPU, comes before any runbook figure; otherwise the anchor needing the fewest carries
    measured = [a for a in anchors() if a.kind == "gpu-check" and a.method == method
                and a.precision == precision_of(gpu) and "size" not in _carries(a, gpu, method, size_b)]
    return carry(min(measured or anchors(), key=cost), gpu, method, size_b)


def _assumed(gpu: str, method: str, size_b: float, known: bool) -> Throughput:
    mid = GPUS[gpu].bf16_tflops * 1e12 * ASSUMED_MFU / flops_per_token(method, size_b)
    f = SPREAD["assumption"]
    return Throughput(mid / f, mid, mid * f, f"assumption: {gpu} peak x {ASSUMED_MFU:.0%} MFU, model size "
                      f"unknown ({size_b:g}B assumed)", "assumption", ASSUMED_MFU)
