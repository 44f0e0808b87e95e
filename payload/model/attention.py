"""The attention kernel for the batch the trainer builds: which ones to try, in what order, and why.

A batch is one of three kinds (`batch_kind`):
- `packed`: several records per row (`train.packing`), one row without padding;
- `padding_free`: a batch's records flattened into one row, position ids restarting per record
  (the default: the same records per step as a padded batch, so the same math);
- `padded`: records side by side, padded to the longest (vision-language records with images,
  which TRL pads; generation; `train.padding_free: false`).

What transformers 5 does with each (transformers/masking_utils.py): a packed or padding-free row
has no attention mask, only position ids; flash_attention_2 runs it as variable-length sequences
(no mask at all), flex_attention builds a block mask and skips the blocks across records, while
sdpa and eager get a materialized block-diagonal (B x 1 x S x S) mask, with which sdpa cannot use
its flash kernel (measured on an H200: packed text at 13.8% MFU through sdpa, 31.4% through
flex_attention). A padded batch gives sdpa a padding mask (its memory-efficient kernel; a batch
without padding keeps the flash path through `is_causal`), and flash_attention_2 unpads it.

`order(batch, machine)` is the plain decision, (implementation, why) best first; `candidates(cfg,
batch)` applies it where `model.attn_implementation` is `auto` and honours an explicit list.
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from typing import Optional

log = logging.getLogger("payload.train")

PACKED, PADDING_FREE, PADDED = "packed", "padding_free", "padded"
BATCH_LABEL = {PACKED: "packed batch", PADDING_FREE: "padding-free batch", PADDED: "padded batch"}
MIN_CAPABILITY = (8, 0)  # flash-attn 2 needs Ampere or newer; flex_attention is used only there (measured: sm90)


@dataclass(frozen=True)
class Machine:
    """What the choice depends on: a CUDA GPU and its compute capability, flash-attn importable."""

    cuda: bool
    capability: Optional[tuple[int, int]] = None
    flash_attn: bool = False


def cpu_build_of_torch() -> bool:
    """The installed torch is a CPU build (`2.13.0+cpu`, the local and test lock): it can use no CUDA
    GPU, whatever the host has, and saying so needs no `import torch` (~1.5 s of CPU)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torch").endswith("+cpu")
    except PackageNotFoundError:
        return False


def this_machine() -> Machine:
    flash = importlib.util.find_spec("flash_attn") is not None
    if cpu_build_of_torch():
        return Machine(False, None, flash)
    import torch

    cuda = torch.cuda.is_available()
    capability = tuple(torch.cuda.get_device_capability()) if cuda else None
    return Machine(cuda, capability, flash)


def batch_kind(packing: bool, padding_free: bool) -> str:
    return PACKED if packing else PADDING_FREE if padding_free else PADDED


def _gpu_missing(m: Machine) -> Optional[str]:
    """Why no GPU kernel (flash-attn, flex) can run here, or None."""
    if not m.cuda:
        return "no CUDA GPU"
    if m.capability is not None and tuple(m.capability) < MIN_CAPABILITY:
        return f"compute capability {m.capability[0]}.{m.capability[1]} is below 8.0"
    return None


def unavailable(impl: str, m: Machine) -> Optional[str]:
    """Why `impl` cannot run on `m` (None if it may)."""
    if impl in ("flash_attention_2", "flex_attention"):
        gpu = _gpu_missing(m)
        if gpu:
            return f"needs a CUDA GPU of compute capability 8.0+ ({gpu})"
        if impl == "flash_attention_2" and not m.flash_attn:
            return "flash-attn not installed"
    return None


def order(batch: str, m: Machine) -> list[tuple[str, str]]:
    """(implementation, why) to try, best first, for a `batch` of this kind on machine `m`."""
    label = BATCH_LABEL[batch]
    gpu, flash_no = _gpu_missing(m), unavailable("flash_attention_2", m)
    out = []
    if flash_no is None:
        out.append(("flash_attention_2", f"{label}: flash-attn " + (
            "runs its records as variable-length sequences" if batch != PADDED else "unpads it")))
    if batch == PADDED:
        out.append(("sdpa", f"{label}" + (f", {flash_no}" if flash_no else "") + ": sdpa with a padding mask"))
    else:
        if gpu is None:
            out.append(("flex_attention", f"{label}, {flash_no or 'flash_attention_2 did not load'}: "
                                          "flex_attention skips the masked blocks"))
        out.append(("sdpa", f"{label}, {gpu or 'no variable-length kernel loaded'}: sdpa attends through a "
                            "block-diagonal mask"))
    out.append(("eager", f"{label}: eager, the last resort"))
    return out


def listed(cfg) -> list[str]:
    """The explicit `model.attn_implementation` list ([] for `auto`)."""
    setting = cfg.model.attn_implementation
    return [] if setting == "auto" else list(setting)


def candidates(cfg, batch: str, m: Optional[Machine] = None) -> list[tuple[str, str]]:
    """What `load_model` tries: `order(...)` for `auto`; an explicit list as given, in its order (a
    warning when it puts a dense-mask kernel first for a packed or padding-free batch)."""
    m = m or this_machine()
    best = order(batch, m)
    explicit = listed(cfg)
    if not explicit:
        return best
    label = BATCH_LABEL[batch]
    runnable = [i for i in explicit if unavailable(i, m) is None]
    if batch != PADDED and runnable and runnable[0] in ("sdpa", "eager") and best[0][0] not in ("sdpa", "eager"):
        log.warning("model.attn_implementation %s puts %s first for a %s: it attends through a block-diagonal "
                    "mask (2.3x slower than flex_attention on an H200); `auto` would pick %s", explicit, runnable[0],
                    label, best[0][0])
    return [(i, f"{label}: set in model.attn_implementation {explicit}") for i in explicit]
