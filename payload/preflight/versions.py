"""The payload's minimum package versions, declared once and checked (preflight, `make gpu-check`).

Torch-free: reads installed versions from package metadata (importlib.metadata), imports nothing
heavy, so the launcher and the GPU check can call it before anything is loaded.

`payload/requirements-gpu.txt` pins what a rented machine installs; these minimums are what the
payload's code needs, so a machine that already has newer (or these) versions installs nothing:
- torch 2.8: the oldest the GPU machines run (requirements-gpu.txt); TRL's fused LM head
  accumulates its vocabulary tiles in fp32 with `addmm(out_dtype=)` from 2.8 on.
- transformers 5.17: the whole text path (LoRA, packing padding-free, resume) passes
  tests/payload/train/test_train.py with 5.17.0 (checked with 5.17.0 + huggingface-hub 1.33 on CPU).
  Vision-language data with assistant-only loss needs 5.18 (TRL 1.16 refuses older).
- trl 1.16: padding-free best-fit-decreasing packing and the fused (chunked) LM-head loss.
- peft 0.21, accelerate 1.15, datasets 4.7 (TRL 1.16's own floor), pydantic 2.5 (payload.config).
Optional, needed only by the modes that use them: bitsandbytes (qlora), deepspeed
(train.deepspeed), liger-kernel (train.liger), flash-attn (attn_implementation flash_attention_2).
"""

from __future__ import annotations

from importlib import metadata
from typing import Optional

REQUIRED = {
    "torch": "2.8",
    "transformers": "5.17",
    "trl": "1.16",
    "peft": "0.21",
    "accelerate": "1.15",
    "datasets": "4.7",
    "pydantic": "2.5",
}
OPTIONAL = {
    "bitsandbytes": "0.45",
    "deepspeed": "0.16",
    "liger-kernel": "0.5",
    "flash-attn": "2.6",
}
VL_ASSISTANT_ONLY_TRANSFORMERS = "5.18"


def installed(name: str) -> Optional[str]:
    """Installed version of a distribution (None when it is not installed)."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def older(have: str, need: str) -> bool:
    from packaging.version import Version

    return Version(have).release < Version(need).release  # 2.11.0+cu130 vs 2.8: compare releases


def _problem(name: str, need: str, why: str = "") -> Optional[str]:
    have = installed(name)
    if have is None:
        return f"{name} is not installed (needs >= {need}{why}); pip install '{name}>={need}'"
    if older(have, need):
        return f"{name} {have} is too old (needs >= {need}{why}); pip install -U '{name}>={need}'"
    return None


def problems(cfg=None) -> list[str]:
    """One line per missing or too-old package: every REQUIRED one, and, given a run config, the
    optional ones it uses (qlora, deepspeed, liger: true, vision-language assistant-only loss)."""
    needs = [(name, v, "") for name, v in REQUIRED.items()]
    if cfg is not None:
        t = cfg.train
        if t.method == "qlora":
            needs.append(("bitsandbytes", OPTIONAL["bitsandbytes"], " for method qlora"))
        if t.deepspeed is not None:
            needs.append(("deepspeed", OPTIONAL["deepspeed"], " for train.deepspeed"))
        if t.liger is True:
            needs.append(("liger-kernel", OPTIONAL["liger-kernel"], " for train.liger"))
        if cfg.model.kind == "image_text_to_text" and t.assistant_only_loss:
            needs.append(("transformers", VL_ASSISTANT_ONLY_TRANSFORMERS,
                          " for assistant-only loss on a vision-language model"))
    return [p for name, v, why in needs if (p := _problem(name, v, why))]


def report() -> dict[str, Optional[str]]:
    """Installed versions of every required and optional package (None: not installed)."""
    return {name: installed(name) for name in (*REQUIRED, *OPTIONAL)}
