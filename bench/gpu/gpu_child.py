"""One measured training run in its own process: `python bench/gpu/gpu_child.py SPEC.json RESULT.json`.

role `prepare`: build the local tokenizer, the random models at the shapes asked for, the data.
role `payload`: the payload's own training path (payload.train.recipe's phases, a resolved RunConfig).
role `baseline`: a plain transformers Trainer on the same model, data, batch and sequence length.
Whatever happens (an exception, CUDA out of memory), RESULT.json gets a row with a one-line reason
and the memory peaks reached so far; the parent handles a kill or a timeout the same way.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
import traceback
from pathlib import Path

gc.set_threshold(10_000)  # as the payload's own processes (payload/__main__.py), for every role alike
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gpu_measure  # noqa: E402
import gpu_modes  # noqa: E402


def one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    first = text[0] if text else ""
    if "out of memory" in str(e).lower():
        return f"CUDA out of memory: {first[:200]}"
    return f"{type(e).__name__}: {first[:300]}"


# ------------------------------------------------------------------------------------ prepare


def prepare(spec: dict) -> dict:
    """Tokenizer, data, and the models at the shapes asked for (built on the GPU when there is one)."""
    from gpu_data import write_image_records, write_records

    from payload.model.tiny import build_tiny_tokenizer, materialize_shape

    out = {"device": None, "gpu_memory_gb": None}
    on_gpu = gpu_measure.cuda()
    if on_gpu:
        import torch

        out["device"] = torch.cuda.get_device_name(0)
        out["gpu_memory_gb"] = round(torch.cuda.get_device_properties(0).total_memory / gpu_measure.GIB, 1)
    tok = build_tiny_tokenizer(None)
    out["data"] = write_records(Path(spec["data_path"]), tok, spec["records"], spec["seq"], text="cycle")
    if spec.get("images"):
        im = gpu_modes.IMAGES
        out["data"]["images"] = write_image_records(
            Path(gpu_modes.images_path(spec["data_path"])), tok, im["records"], tuple(spec["images"]),
            im["text_tokens"], im["distinct"])
    out["models"] = {}
    for shape in spec["shapes"]:
        t = time.perf_counter()
        arch = gpu_modes.SHAPES[shape]["arch"]
        dest = materialize_shape(Path(spec["models_dir"]) / shape, arch,
                                 gpu_modes.shape_dims(shape), gpu_modes.vision_of(shape),
                                 device="cuda" if on_gpu else "cpu", dtype="bfloat16" if on_gpu else "float32")
        if arch == "qwen3_vl":
            vl_image_processor().save_pretrained(str(dest))  # images at their real size, as Qwen3-VL-2B's
        out["models"][shape] = {"path": str(dest), "seconds": round(time.perf_counter() - t, 1)}
    return out


def vl_image_processor():
    """Qwen3-VL-2B's image processor settings (patch 16, 2x2 merge, its pixel limits): the torchvision
    one where torchvision is installed, as the real model loads, else the PIL one."""
    import importlib.util

    from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl as pil

    kw = dict(patch_size=16, merge_size=2, temporal_patch_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3,
              **gpu_modes.VL_PIXELS)
    if importlib.util.find_spec("torchvision") is not None:
        from transformers.models.qwen2_vl.image_processing_qwen2_vl import Qwen2VLImageProcessor

        return Qwen2VLImageProcessor(**kw)
    return pil.Qwen2VLImageProcessorPil(**kw)


# ------------------------------------------------------------------------------------ runs


def record_lengths(ds, spec: dict, cfg) -> list[int]:
    """Token length of every training record: from TRL's prepared dataset, or (vision-language
    datasets are tokenized on the fly) by tokenizing the records as the baseline does; an image
    counts its vision tokens (the language model's FLOPs; the vision tower's are not counted)."""
    if gpu_modes.mode(spec["mode"]).get("images"):
        from gpu_data import chat_len, image_tokens
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(cfg.model.name_or_path)
        rows = [json.loads(x) for x in Path(gpu_modes.images_path(spec["data_path"])).read_text().splitlines()]
        instr = gpu_modes.IMAGES["instruction"]  # + <|vision_start|>, the image's tokens, <|vision_end|>
        return [chat_len(tok, [{"role": "user", "content": instr}, {"role": "assistant", "content": r["text"]}])
                + 2 + image_tokens(tuple(spec["images"])) for r in rows]
    if "seq_lengths" in ds.column_names:
        return [x for row in ds["seq_lengths"] for x in row]
    if "input_ids" in ds.column_names:
        return [len(x) for x in ds["input_ids"]]
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(cfg.model.name_or_path)
    return [len(r["input_ids"]) for r in gpu_measure.tokenize(tok, spec["data_path"], cfg.train.max_seq_length)]


def run_payload(spec: dict, result: dict) -> None:
    from payload.model import adapters, modeling
    from payload.volume import observe
    from payload.train import recipe as train

    observe.setup_logging()
    cfg = gpu_measure.load_cfg(spec, offload=gpu_measure.full_offload(spec))
    result.update(gpu_measure.estimate(cfg, True))
    result["offload_optimizer"] = bool(cfg.train.deepspeed and cfg.train.deepspeed.offload_optimizer)
    run = train.Run(cfg=cfg, run_dir=cfg.run_dir)
    meter = gpu_measure.step_meter(spec["warmup"])
    try:
        train.setup(run)
        run.trainer.args.include_num_input_tokens_seen = "non_padding"
        run.trainer.add_callback(meter)
        gpu_measure.track_longest(run.trainer, result)
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
                       "losses": losses(cfg.run_dir),
                       **({"kbit_preparation": getattr(adapters, "KBIT_PREPARATION", "fp32-upcast")}
                          if cfg.train.method == "qlora" else {}),
                       "checkpoint_save_s": round(sum(run.control.save_history), 2) if run.control else None})
        gpu_measure.flops(result, cfg, lengths, summary.get("trainable_params") or 0, result.get("device"))
        ran_with_facts(result, cfg)
    finally:
        train.cleanup(run)


def ran_with_facts(result: dict, cfg) -> None:
    """The estimate is held to the peak of what ran: before training it can only assume the kernels
    (`estimate_preflight_gb`, what preflight would say); after, it is recomputed with the attention,
    Liger, padding-free, longest padded row and QLoRA preparation the run recorded."""
    from payload.model.memory import Kernels

    free = bool(result.get("padding_free"))
    kernels = Kernels(attention=result.get("attn_used") or "sdpa", liger=bool(result.get("liger")),
                      padding_free=free, padded_len=None if free else result.get("longest_row_tokens"),
                      kbit_upcast=result.get("kbit_preparation") == "fp32-upcast")
    result["estimate_preflight_gb"] = result.get("estimate_gb")
    result["estimate_gb"] = gpu_measure.estimate(cfg, True, kernels)["estimate_gb"]


def losses(run_dir: Path) -> list[list]:
    """[step, loss] at every log point of the payload's metrics.jsonl."""
    from payload import layout
    from payload.volume import observe

    return [[r.get("step"), r["loss"]] for r in observe.read_metrics(run_dir / layout.METRICS)
            if r.get("loss") is not None]


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
        if gpu_measure.cuda():
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
        gpu_measure.memory(result)
    out.write_text(json.dumps(result, indent=1, default=str))
    return code


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main(sys.argv[1:]))
