"""Where a vision-language training step's time goes: the payload's own step (payload.train.recipe's setup,
TRL's SFTTrainer) on a tiny Qwen3-VL model with images at runbook 002's sizes, under cProfile.

    .venv/bin/python bench/bench_vl_step.py                      # workers 0 (before) and 2 (after)
    .venv/bin/python bench/bench_vl_step.py --steps 8 --workers 0,4 --size 1024x800
    .venv/bin/python bench/bench_vl_step.py --text                # sonia: text records, VL model, seq 4096

Data as `make gpu-check`'s images mode (bench/gpu/gpu_data.py): well-log-header-like PNG pages of
1024x800 px (800 vision tokens: Qwen3-VL merges 32x32 px into one) + a ~100-token transcription,
seq 2048, batch 2, through the image processor with Qwen3-VL-2B's settings. The model is tiny, so
the step's matmuls cost little here: what this measures is the work around them, which on a GPU runs
on the CPU while the GPU waits unless it runs in dataloader workers. Per setting it prints the wall
time per step and the main process's time (cProfile, cumulative) in: TRL's collator (the chat template, tokenizing,
and the image processor, shown apart), decoding the images (datasets), and the training step
(forward, backward; the optimizer apart). One JSON line at the end.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH / "gpu"), str(BENCH.parent)]

import gpu_modes  # noqa: E402

# (label, file suffix, function) summed from cProfile's cumulative times, main process only
PARTS = [
    ("collate", "trl/trainer/sft_trainer.py", "torch_call"),
    ("image_processor", "qwen2_vl.py", "_preprocess"),
    ("decode_images", "datasets/features/image.py", "decode_example"),
    ("training_step", "transformers/trainer.py", "training_step"),
    ("optimizer_step", "torch/optim/optimizer.py", "wrapper"),
]


def build(work: Path, size: tuple[int, int], records: int) -> tuple[str, str]:
    from gpu_child import vl_image_processor
    from gpu_data import write_image_records, write_records

    from payload.model.tiny import build_tiny_tokenizer, materialize_shape

    tok = build_tiny_tokenizer(None)
    data = work / "data" / "mix.jsonl"
    im = gpu_modes.IMAGES
    write_image_records(Path(gpu_modes.images_path(str(data))), tok, records, size, im["text_tokens"], im["distinct"])
    write_records(data, tok, records, 4096)
    model = materialize_shape(work / "model", "qwen3_vl", gpu_modes.shape_dims("tiny-qwen3-vl"), None,
                              device="cpu", dtype="float32")
    vl_image_processor().save_pretrained(str(model))
    return str(model), str(data)


def part_times(stats: pstats.Stats) -> dict:
    out = {label: 0.0 for label, _f, _n in PARTS}
    for (path, _line, name), (_cc, _nc, _tt, ct, _callers) in stats.stats.items():
        for label, suffix, fn in PARTS:
            if name == fn and path.replace(os.sep, "/").endswith(suffix):
                out[label] += ct
    return out


def measure(model: str, data: str, work: Path, workers: int, steps: int, batch: int, top: int = 0,
            mode: str = "lora-bf16-images") -> dict:
    import gpu_measure

    from payload.train import recipe as train
    from payload.config import RunConfig

    m = gpu_modes.mode(mode)
    body = gpu_modes.run_config_dict(m, model_dir=model, kind="image_text_to_text", data_path=data,
                                     volume=str(work / "runs"), run_id=f"w{workers}-{time.time_ns()}", steps=steps,
                                     batch=batch, seq=4096, smoke=True)
    cfg = RunConfig.model_validate(body)
    run = train.Run(cfg=cfg, run_dir=cfg.run_dir)
    meter = gpu_measure.step_meter(1)
    try:
        train.setup(run)
        t = run.trainer
        t.args.dataloader_num_workers = workers  # as payload.train.arguments.dataloader_workers sets it on a GPU
        t.args.include_num_input_tokens_seen = "non_padding"
        t.add_callback(meter)
        prof = cProfile.Profile()
        t0 = time.perf_counter()
        prof.enable()
        t.train()
        prof.disable()
        wall = time.perf_counter() - t0
    finally:
        train.cleanup(run)
    stats = pstats.Stats(prof)
    if top:
        stats.sort_stats("tottime").print_stats(top)
    parts = part_times(stats)
    fig = meter.figures()
    return {"workers": workers, "steps": steps, "train_s": round(wall, 2), "step_s": fig["step_s"],
            "tokens_per_step": fig.get("tokens_per_step"),
            "main_process_s_per_step": {k: round(v / steps, 4) for k, v in parts.items()}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch", type=int, default=2, help="per-device batch (runbook 002: 2)")
    ap.add_argument("--size", default="1024x800", help="image WxH in pixels (runbook 002: 1024x800)")
    ap.add_argument("--records", type=int, default=64)
    ap.add_argument("--workers", default="0,2", help="dataloader workers to compare (0 = before)")
    ap.add_argument("--top", type=int, default=0, help="also print the N functions with most own time")
    ap.add_argument("--text", action="store_true",
                    help="text records at runbook 000's lengths (seq 4096) instead of images: sonia's VL path")
    a = ap.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from payload.volume import observe

    observe.setup_logging()
    size = tuple(int(x) for x in a.size.lower().split("x"))
    out = []
    with tempfile.TemporaryDirectory(prefix="bench-vl-step-") as tmp:
        work = Path(tmp)
        model, data = build(work, size, a.records)
        for w in (int(x) for x in a.workers.split(",")):
            r = measure(model, data, work, w, a.steps, a.batch, a.top, "lora-bf16-vl" if a.text else "lora-bf16-images")
            out.append(r)
            parts = ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in r["main_process_s_per_step"].items())
            print(f"workers {w}: {r['step_s'] * 1000:.0f} ms/step ({r['tokens_per_step']:.0f} tokens/step); "
                  f"main process per step: {parts}", flush=True)
    print(json.dumps({"data": "text" if a.text else "images", "size": list(size), "batch": a.batch, "runs": out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
