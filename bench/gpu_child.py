"""One measured training run in its own process: `python bench/gpu_child.py SPEC.json RESULT.json`.

role `prepare`: build the local tokenizer, the random models at the shapes asked for, the data.
role `payload`: the payload's own training path (payload.train's phases, a resolved RunConfig).
role `baseline`: a plain transformers Trainer on the same model, data, batch and sequence length.
Whatever happens (an exception, CUDA out of memory), RESULT.json gets a row with a one-line reason
and the memory peaks reached so far; the parent handles a kill or a timeout the same way.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gpu_flops  # noqa: E402
import gpu_modes  # noqa: E402

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


def one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    first = text[0] if text else ""
    if "out of memory" in str(e).lower():
        return f"CUDA out of memory: {first[:200]}"
    return f"{type(e).__name__}: {first[:300]}"


# ------------------------------------------------------------------------------------ prepare


def prepare(spec: dict) -> dict:
    """Tokenizer, data, and the models at the shapes asked for (built on the GPU when there is one)."""
    from gpu_data import write_records

    from payload.tiny import build_tiny_tokenizer, materialize_shape

    out = {"device": None, "gpu_memory_gb": None}
    if cuda():
        import torch

        out["device"] = torch.cuda.get_device_name(0)
        out["gpu_memory_gb"] = round(torch.cuda.get_device_properties(0).total_memory / GIB, 1)
    tok = build_tiny_tokenizer(None)
    out["data"] = write_records(Path(spec["data_path"]), tok, spec["records"], spec["seq"])
    out["models"] = {}
    for shape in spec["shapes"]:
        t = time.perf_counter()
        dest = materialize_shape(Path(spec["models_dir"]) / shape, gpu_modes.SHAPES[shape]["arch"],
                                 gpu_modes.shape_dims(shape), gpu_modes.vision_of(shape),
                                 device="cuda" if cuda() else "cpu", dtype="bfloat16" if cuda() else "float32")
        out["models"][shape] = {"path": str(dest), "seconds": round(time.perf_counter() - t, 1)}
    return out


# ------------------------------------------------------------------------------------ estimate


def estimate(cfg, fused_lm_head: bool) -> dict:
    """payload/memory.py's estimate for this run, with checkpointing as the payload decides it."""
    from payload import modeling
    from payload.memory import estimate_gpu_memory_gb
    from payload.preflight import model_dims

    every, why = modeling.checkpointing_decision(cfg)
    if not modeling.on_gpu():  # the estimate for this run as the payload decided it (off on CPU)
        cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"gradient_checkpointing": every > 0})})
    est = estimate_gpu_memory_gb(cfg, modeling.gpu_memory_gb(), 1, dims=model_dims(cfg), fused_lm_head=fused_lm_head)
    return {"estimate_gb": est.get("total_gb"), "estimate_components_gb": est.get("components_gb"),
            "gradient_checkpointing": every > 0, "checkpoint_every_n_layers": every,
            "gradient_checkpointing_reason": why}


def load_cfg(spec: dict, offload: bool = False):
    from payload.config import RunConfig

    m = gpu_modes.mode(spec["mode"])
    body = gpu_modes.run_config_dict(
        m, model_dir=spec["model_dir"], kind=gpu_modes.SHAPES[spec["shape"]]["kind"], data_path=spec["data_path"],
        volume=spec["volume"], run_id=f"{spec['mode']}-{spec['role']}", steps=spec["steps"], batch=spec["batch"],
        seq=spec["seq"], smoke=spec["smoke"], offload=offload)
    return RunConfig.model_validate(body)


def full_offload(spec: dict) -> bool:
    """ZeRO-3 on one GPU: offload the optimizer to CPU only when the estimate says it does not fit."""
    from payload import modeling

    cfg = load_cfg(spec)
    mem = modeling.gpu_memory_gb()
    return bool(cfg.train.deepspeed and mem and estimate(cfg, True)["estimate_gb"] > 0.9 * mem)


def flops(result: dict, cfg, lengths, trainable: int, device: str | None) -> None:
    from payload.preflight import model_dims

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


# ------------------------------------------------------------------------------------ runs


def record_lengths(ds, spec: dict, cfg) -> list[int]:
    """Token length of every training record: from TRL's prepared dataset, or (vision-language
    datasets are tokenized on the fly) by tokenizing the records as the baseline does."""
    if "seq_lengths" in ds.column_names:
        return [x for row in ds["seq_lengths"] for x in row]
    if "input_ids" in ds.column_names:
        return [len(x) for x in ds["input_ids"]]
    from gpu_baseline import tokenize
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(cfg.model.name_or_path)
    return [len(r["input_ids"]) for r in tokenize(tok, spec["data_path"], cfg.train.max_seq_length)]


def run_payload(spec: dict, result: dict) -> None:
    from payload import modeling, observe, train

    observe.setup_logging()
    cfg = load_cfg(spec, offload=full_offload(spec))
    result.update(estimate(cfg, True))
    result["offload_optimizer"] = bool(cfg.train.deepspeed and cfg.train.deepspeed.offload_optimizer)
    run = train.Run(cfg=cfg, run_dir=cfg.run_dir)
    meter = step_meter(spec["warmup"])
    try:
        train.setup(run)
        run.trainer.args.include_num_input_tokens_seen = "non_padding"
        run.trainer.add_callback(meter)
        lengths = record_lengths(run.trainer.train_dataset, spec, cfg)
        train.load_checkpoint(run)
        train.train(run)
        summary = train.save(run)
        result.update(meter.figures())
        result.update({"attn_used": run.attn, "liger": modeling.use_liger(cfg),
                       "gradient_checkpointing": modeling.gradient_checkpointing(cfg),
                       "checkpoint_every_n_layers": modeling.checkpointing_decision(cfg)[0],
                       "padding_free": bool(getattr(run.trainer, "padding_free", False)),
                       "real_token_fraction": summary.get("real_token_fraction"),
                       "trainable_params": summary.get("trainable_params"),
                       "first_loss": summary.get("first_loss"), "last_loss": summary.get("final_loss"),
                       "checkpoint_save_s": round(sum(run.control.save_history), 2) if run.control else None})
        flops(result, cfg, lengths, summary.get("trainable_params") or 0, result.get("device"))
    finally:
        train.cleanup(run)


def single_process_group() -> None:
    """DeepSpeed wants a process group even on one GPU: the variables torchrun would set, for one rank."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for k, v in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
        os.environ.setdefault(k, v)


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    if spec.get("mode") in gpu_modes.MODE_NAMES and gpu_modes.mode(spec["mode"]).get("deepspeed"):
        single_process_group()
    out = Path(argv[1])
    result = {"mode": spec.get("mode"), "role": spec["role"], "status": "ok"}
    t0 = time.perf_counter()
    code = 0
    try:
        if cuda():
            import torch

            result["device"] = torch.cuda.get_device_name(0)
        if spec["role"] == "prepare":
            result.update(prepare(spec))
        elif spec["role"] == "payload":
            run_payload(spec, result)
        else:
            from gpu_baseline import run_baseline

            run_baseline(spec, result)
    except BaseException as e:  # noqa: BLE001 - every failure becomes a row with a reason
        result.update({"status": "failed", "reason": one_line(e)})
        traceback.print_exc()
        code = 1
    result["wall_s"] = round(time.perf_counter() - t0, 1)
    if spec["role"] != "prepare":
        memory(result)
    out.write_text(json.dumps(result, indent=1, default=str))
    return code


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main(sys.argv[1:]))
