"""Model FLOPs per trained token and the GPUs' dense peaks, for MFU (torch-free).

MFU = real tokens/s x model FLOPs per token / the GPU's dense peak (vendor figure, no sparsity).
Model FLOPs count the useful work only: no gradient-checkpointing recompute, no padding, no
dequantization; the vision tower is not counted (the data is text).

  matmul params  M = L x (linear weights of a block) + V x H (the LM head; the embedding lookup
                 costs no FLOPs).
  full           6 M + attention: forward 2 M, backward 4 M (input and weight gradients).
  lora / qlora   4 M + 6 A + attention: the frozen base needs input gradients only (2 M forward +
                 2 M backward); A = LoRA parameters, trained like a full model.
  attention      causal, over each record's real length l: QK^T and AV cost 2 x 2 x l^2/2 x Q per
                 layer forward (Q = heads x head_dim), x 3 with the backward: 6 x L x Q x l per
                 token, averaged as 6 x L x Q x sum(l^2)/sum(l) over the records trained on. PaLM's
                 12 x L x Q x S counts the masked half too; this counts what a causal kernel computes.
"""

from __future__ import annotations

from typing import Optional

# Dense tensor-core peaks in TFLOP/s for bf16 (fp16 where the GPU has no bf16), from the vendors'
# data sheets (the "with sparsity" figures halved). The figure used is named in every result.
PEAK_TFLOPS = {
    "H200": (989.0, "H200 SXM bf16 dense 989 TFLOP/s (NVIDIA data sheet)"),
    "H100 SXM": (989.0, "H100 SXM bf16 dense 989 TFLOP/s (NVIDIA data sheet)"),
    "H100 PCIe": (756.0, "H100 PCIe bf16 dense 756 TFLOP/s (NVIDIA data sheet)"),
    "A100": (312.0, "A100 bf16 dense 312 TFLOP/s (NVIDIA data sheet)"),
    "L40S": (362.0, "L40S bf16 dense 362 TFLOP/s (NVIDIA data sheet)"),
    "L4": (121.0, "L4 bf16 dense 121 TFLOP/s (NVIDIA data sheet)"),
    "A10G": (125.0, "A10G bf16 dense 125 TFLOP/s (NVIDIA data sheet)"),
    "T4": (65.0, "T4 fp16 dense 65 TFLOP/s (NVIDIA data sheet; no bf16)"),
}


def gpu_key(device_name: str) -> Optional[str]:
    """Table key from torch.cuda.get_device_name(): 'NVIDIA H100 80GB HBM3' -> 'H100 SXM'."""
    n = device_name.upper()
    if "H200" in n:
        return "H200"
    if "H100" in n:
        return "H100 PCIe" if "PCIE" in n else "H100 SXM"
    for key in ("A100", "L40S", "A10G", "T4"):
        if key in n:
            return key
    if "L4" in n.split():
        return "L4"
    return None


def peak_tflops(device_name: Optional[str]) -> tuple[Optional[float], str]:
    """(dense peak TFLOP/s, which figure) for a device name; (None, why) when unknown or CPU."""
    if not device_name:
        return None, "no GPU: MFU not computed"
    key = gpu_key(device_name)
    if key is None:
        return None, f"no peak figure for {device_name}: MFU not computed"
    return PEAK_TFLOPS[key]


def matmul_params(dims) -> int:
    """Parameters that take part in a matmul per token: decoder-block linears + the LM head."""
    return dims.linear_params + dims.vocab * dims.hidden


def flops_per_token(dims, method: str, lora_params: int = 0, context: float = 0.0) -> float:
    """Model FLOPs per trained token (see the module doc). `context` = sum(l^2)/sum(l) of the records."""
    m = matmul_params(dims)
    attention = 6 * dims.layers * dims.heads * dims.head_dim * context
    if method == "full":
        return 6 * m + attention
    return 4 * m + 6 * lora_params + attention


def mfu(tokens_per_s: Optional[float], per_token: float, peak: Optional[float]) -> Optional[float]:
    if not tokens_per_s or not peak:
        return None
    return tokens_per_s * per_token / (peak * 1e12)
