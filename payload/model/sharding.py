"""DeepSpeed ZeRO sharding for transformers' Trainer: the config dict (`deepspeed_config`), the check
that the package is there, and DeepSpeed on CPU (its CPU accelerator, gloo between the ranks).

Apart from `modeling` because it never touches the model: it reads `train.deepspeed` and sets the
process state the TrainingArguments use.
"""

from __future__ import annotations

import importlib.util

from payload.errors import PayloadError


def deepspeed_config(ds) -> dict:
    """A ZeRO config dict for transformers' `deepspeed=` argument ("auto" values filled by the Trainer)."""
    zero = {
        "stage": ds.zero_stage,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": "auto",
    }
    if ds.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if ds.zero_stage == 3:
        zero.update({
            "stage3_prefetch_bucket_size": "auto",
            "stage3_param_persistence_threshold": "auto",
            "stage3_max_live_parameters": 1e9,
            "stage3_max_reuse_distance": 1e9,
            "stage3_gather_16bit_weights_on_model_save": True,
        })
        if ds.offload_params:
            zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    return {
        "bf16": {"enabled": "auto"},
        "fp16": {"enabled": "auto"},
        "zero_optimization": zero,
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def check_deepspeed_available(cfg) -> None:
    if cfg.train.deepspeed is None:
        return
    if importlib.util.find_spec("deepspeed") is None:
        raise PayloadError("train.deepspeed is set but the deepspeed package is not installed; pip install deepspeed")


def deepspeed_on_cpu() -> None:
    """DeepSpeed without CUDA runs on its CPU accelerator, gloo between the ranks (slow, but the same
    ZeRO sharding, checkpoints and 16-bit save: what the tests and the emulated clouds run). Called before
    the TrainingArguments, which then use this process state (`use_configured_state`): the state they
    would make themselves for DeepSpeed has no backend (transformers training_args.py:1887 passes none),
    and accelerate counts such a state as one process (accelerate/state.py:288), so on CPU every rank
    trained alone and DeepSpeed's batch check failed ("4 != 4 * 1 * 2")."""
    import os

    from accelerate import PartialState

    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"  # read by PartialState: start DeepSpeed's comm
    try:
        PartialState(backend="gloo")
    finally:
        del os.environ["ACCELERATE_USE_DEEPSPEED"]
