"""Checkpoint save time: the real save path on the tiny demo model, plus write+fsync throughput.

    .venv/bin/python bench/bench_checkpoint.py
    .venv/bin/python bench/bench_checkpoint.py --mb 1024 --dir /workspace/bench   # on the volume

1. Trains the local-demo tiny Qwen3 LoRA for a few steps with a save every 2 steps and reports
   what `LaunchTrainer._save_checkpoint` measured (Trainer save + config + fsync + COMPLETE marker
   + retention) - the number Young's formula uses.
2. Writes a synthetic checkpoint of `--mb` MB (adapter in safetensors + optimizer state via
   torch.save, 1:2 like LoRA + AdamW) and finalizes it the same way, for the disk's MB/s.
3. From that, the estimated save time of runbook 000's Qwen3-VL-32B LoRA r=32 (adapter fp32 +
   AdamW moments) and the Young's-formula interval for a few preemption rates.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def tiny_saves(work: Path) -> dict:
    import yaml

    import payload.train as train
    from payload.config import RunConfig

    data = yaml.safe_load((REPO / "clusters" / "local-demo.yaml").read_text())
    for k in ("cluster", "budget"):
        data.pop(k)
    data["train"].update(max_steps=12, logging_steps=2, eval_steps=100)
    data["train"]["checkpoints"] = {"save_steps": 2, "keep_best": 1, "keep_recent": 2}
    data["runtime"] = {"volume": str(work), "run_id": "bench"}
    cfg = RunConfig.model_validate(data)
    sys.path.insert(0, str(REPO / "tests"))
    from train_fixtures import write_text_data

    write_text_data(cfg.run_dir, n_train=48, n_val=0)
    (cfg.run_dir / "data" / "val.jsonl").unlink()
    train.observe.setup_logging()
    run = train.Run(cfg=cfg, run_dir=cfg.run_dir)
    try:
        train.setup(run)
        train.load_checkpoint(run)
        train.train(run)
    finally:
        train.cleanup(run)
    ckpt = next((cfg.run_dir / "checkpoints").glob("checkpoint-*"))
    size = sum(p.stat().st_size for p in ckpt.iterdir())
    times = run.control.save_history
    return {"saves": len(times), "median_s": statistics.median(times), "max_s": max(times), "bytes": size}


def synthetic(work: Path, mb: int) -> dict:
    import torch
    from safetensors.torch import save_file

    from payload.checkpoints import finalize_checkpoint

    path = work / "checkpoint-1"
    path.mkdir(parents=True)
    n = mb * 1024 * 1024 // 4 // 3  # fp32 elements of the adapter; optimizer holds 2x
    adapter, moments = torch.randn(n), {"exp_avg": torch.randn(n), "exp_avg_sq": torch.rand(n)}
    t = time.perf_counter()
    save_file({"adapter": adapter}, str(path / "adapter_model.safetensors"))
    torch.save(moments, path / "optimizer.pt")
    finalize_checkpoint(path, "{}\n", {"step": 1})
    seconds = time.perf_counter() - t
    size = sum(p.stat().st_size for p in path.iterdir())
    return {"bytes": size, "seconds": seconds, "mb_per_s": size / 1e6 / seconds}


def qwen3_vl_32b_lora_bytes(r: int = 32) -> int:
    """LoRA on q,k,v,o,gate,up,down of Qwen3-VL-32B's language model: fp32 params + 2 AdamW moments."""
    hidden, inter, layers, q_out, kv_out = 5120, 25600, 64, 64 * 128, 8 * 128
    shapes = [(hidden, q_out), (hidden, kv_out), (hidden, kv_out), (q_out, hidden),
              (hidden, inter), (hidden, inter), (inter, hidden)]
    params = layers * sum(r * (i + o) for i, o in shapes)
    return params * 4 * 3


def main() -> None:
    from payload.checkpoints import young_interval_s

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=int, default=256, help="size of the synthetic checkpoint")
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir; use the volume on a pod)")
    a = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
        tiny = tiny_saves(Path(tmp) / "tiny")
        disk = synthetic(Path(tmp) / "synthetic", a.mb)
    big = qwen3_vl_32b_lora_bytes()
    print(f"tiny demo LoRA checkpoint ({tiny['bytes'] / 1e3:.0f} kB): median save {tiny['median_s']:.3f} s, "
          f"max {tiny['max_s']:.3f} s over {tiny['saves']} saves (Trainer save + config + fsync + marker)")
    print(f"synthetic {disk['bytes'] / 1e6:.0f} MB checkpoint: {disk['seconds']:.2f} s -> {disk['mb_per_s']:.0f} MB/s")
    print(f"Qwen3-VL-32B LoRA r=32 checkpoint ~{big / 1e9:.2f} GB:")
    for label, rate in (("this disk", disk["mb_per_s"]), ("RunPod volume 200 MB/s", 200.0),
                        ("RunPod volume 400 MB/s", 400.0)):
        save_s = big / 1e6 / rate
        young = ", ".join(f"MTBF {h} h -> every {young_interval_s(save_s, h) / 60:.0f} min" for h in (2, 8, 24))
        print(f"  {label:<24} save ~{save_s:5.1f} s; Young's interval: {young}")
    print(json.dumps({"tiny": tiny, "synthetic": disk, "qwen3_vl_32b_lora_r32_bytes": big}))


if __name__ == "__main__":
    main()
