"""What a GPU-check run measures and how, shared by both roles (bench/gpu/gpu_child.py runs the payload,
bench/gpu/gpu_baseline.py the plain Trainer): step timing, memory peaks, the preflight estimate for the
same config, FLOPs/MFU, and tokenizing records the way the baseline does. A leaf: it imports neither
role, so the two can be read and changed apart."""

from __future__ import annotations

import json
import resource
import time
from pathlib import Path

import gpu_flops
import gpu_modes

GIB = 2**30

def cuda() -> bool:
    import torch

    return torch.cuda.is_available()

def sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()

def step_meter(warmup: int):
    """A TrainerCallback timing every optimizer step (GPU synchronized) with the real tokens seen
    (Trainer's `include_num_input_tokens_seen="non_padding"`); the first `warmup` steps are excluded."""
    from transformers import TrainerCallback

    class StepMeter(TrainerCallback):
        def __init__(self):
            self.marks: list[tuple[int, float, int]] = []

        def on_train_begin(self, args, state, control, **kwargs):
            sync()
            self.marks = [(state.global_step, time.perf_counter(), state.num_input_tokens_seen)]

        def on_step_end(self, args, state, control, **kwargs):
            sync()
            self.marks.append((state.global_step, time.perf_counter(), state.num_input_tokens_seen))

        def figures(self) -> dict:
            window = self.marks[min(warmup, len(self.marks) - 1):]
            (s0, t0, n0), (s1, t1, n1) = window[0], window[-1]
            if s1 <= s0 or t1 <= t0:
                return {"measured_steps": 0, "tokens_per_s": None, "step_s": None}
            return {"measured_steps": s1 - s0, "tokens_per_s": round((n1 - n0) / (t1 - t0), 1),
                    "step_s": round((t1 - t0) / (s1 - s0), 4), "tokens_per_step": round((n1 - n0) / (s1 - s0), 1)}

    return StepMeter()

def track_longest(trainer, result: dict) -> None:
    """`longest_row_tokens`: the longest batch row any step trained (a padded batch's peak memory is at
    its longest; a padding-free one is a single row of the batch's tokens), seen where the batch
    reaches the model, so also when dataloader workers collate."""
    step = trainer.training_step

    def measured(model, inputs, *args, **kwargs):
        ids = inputs.get("input_ids")
        if ids is not None:
            result["longest_row_tokens"] = max(result.get("longest_row_tokens", 0), int(ids.shape[-1]))
        return step(model, inputs, *args, **kwargs)

    trainer.training_step = measured


def context_length(lengths) -> float:
    """sum(l^2)/sum(l): the mean attention context of a trained token (causal, per record)."""
    total = sum(lengths)
    return sum(x * x for x in lengths) / total if total else 0.0

def memory(result: dict) -> None:
    """Peaks of this process: torch's allocator on the GPU, plus what CUDA holds outside it."""
    result["peak_rss_gb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)
    if not cuda():
        result["gpu_memory_note"] = "no CUDA device: GPU columns empty; peak_rss_gb is host memory"
        return
    import torch

    free, total = torch.cuda.mem_get_info()
    reserved_now = torch.cuda.memory_reserved()
    result.update({
        "peak_allocated_gb": round(torch.cuda.max_memory_allocated() / GIB, 2),
        "peak_reserved_gb": round(torch.cuda.max_memory_reserved() / GIB, 2),
        # CUDA context, cuBLAS/NCCL workspaces: device memory in use that torch's allocator does not hold
        "cuda_nontorch_gb": round(max(0, total - free - reserved_now) / GIB, 2),
    })
    result["measured_peak_gb"] = round(result["peak_reserved_gb"] + result["cuda_nontorch_gb"], 2)

def estimate(cfg, fused_lm_head: bool, kernels=None) -> dict:
    """payload/model/memory.py's estimate for this run, with checkpointing as the payload decides it; with
    `kernels` (payload/model/memory.py Kernels), for the kernels and batch rows the run actually used."""
    from payload.model import modeling
    from payload.model.memory import estimate_gpu_memory_gb
    from payload.model.dims import model_dims

    every, why = modeling.checkpointing_decision(cfg)
    if not modeling.on_gpu():  # the estimate for this run as the payload decided it (off on CPU)
        cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"gradient_checkpointing": every > 0})})
    est = estimate_gpu_memory_gb(cfg, modeling.gpu_memory_gb(), 1, dims=model_dims(cfg), fused_lm_head=fused_lm_head,
                                kernels=kernels)
    return {"estimate_gb": est.get("total_gb"), "estimate_components_gb": est.get("components_gb"),
            "gradient_checkpointing": every > 0, "checkpoint_every_n_layers": every,
            "gradient_checkpointing_reason": why}

def load_cfg(spec: dict, offload: bool = False):
    from payload.config import RunConfig

    m = gpu_modes.mode(spec["mode"])
    body = gpu_modes.run_config_dict(
        m, model_dir=spec["model_dir"], kind=gpu_modes.SHAPES[spec["shape"]]["kind"], data_path=spec["data_path"],
        volume=spec["volume"], run_id=spec.get("run_id") or f"{spec['mode']}-{spec['role']}", steps=spec["steps"], batch=spec["batch"],
        seq=spec["seq"], smoke=spec["smoke"], offload=offload)
    return RunConfig.model_validate(body)

def full_offload(spec: dict) -> bool:
    """ZeRO-3 on one GPU: offload the optimizer to CPU only when the estimate says it does not fit."""
    from payload.model import modeling

    cfg = load_cfg(spec)
    mem = modeling.gpu_memory_gb()
    return bool(cfg.train.deepspeed and mem and estimate(cfg, True)["estimate_gb"] > 0.9 * mem)

def flops(result: dict, cfg, lengths, trainable: int, device: str | None) -> None:
    from payload.model.dims import model_dims

    dims = model_dims(cfg)
    ctx = context_length(lengths)
    lora = trainable if cfg.train.method != "full" else 0
    per_token = gpu_flops.flops_per_token(dims, cfg.train.method, lora, ctx)
    peak, peak_src = gpu_flops.peak_tflops(device)
    rate = result.get("tokens_per_s")
    result.update({"params_b": round(dims.params / 1e9, 2), "context_tokens": round(ctx, 1), "flops_per_token_g": round(per_token / 1e9, 3),
                   "peak_tflops": peak, "peak_source": peak_src,
                   "model_tflops": round(rate * per_token / 1e12, 2) if rate else None,
                   "mfu": None if gpu_flops.mfu(rate, per_token, peak) is None
                   else round(gpu_flops.mfu(rate, per_token, peak), 4)})

def tokenize(tokenizer, data_path: str, max_length: int) -> list[dict]:
    rows = []
    for line in Path(data_path).read_text(encoding="utf-8").splitlines():
        msgs = json.loads(line)["messages"]
        enc = tokenizer.apply_chat_template(msgs, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
        ids = list(enc["input_ids"])[:max_length]
        mask = list(enc["assistant_masks"])[:max_length]
        rows.append({"input_ids": ids, "labels": [t if m else -100 for t, m in zip(ids, mask)]})
    return rows
