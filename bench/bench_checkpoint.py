"""Checkpoint save time: the real save path on the tiny demo model, write+fsync throughput, and
what the checksums cost (hashing while saving, verifying before a resume).

    .venv/bin/python bench/bench_checkpoint.py                 # synthetic = a 32B LoRA r=32 checkpoint
    .venv/bin/python bench/bench_checkpoint.py --rank 64       # r=64 (~6.4 GB)
    .venv/bin/python bench/bench_checkpoint.py --mb 1024 --dir /workspace/bench   # on the volume

1. Trains the local-demo tiny Qwen3 LoRA for a few steps with a save every 2 steps and reports
   what `LaunchTrainer._save_checkpoint` measured (Trainer save + config + fsync + COMPLETE marker
   + retention) - the number Young's formula uses.
2. Writes a synthetic checkpoint (adapter in safetensors + optimizer state via torch.save, 1:2 like
   LoRA + AdamW; by default the size of Qwen3-VL-32B LoRA r=`--rank` with AdamW, else `--mb` MB),
   then times the pieces of `checkpoints.finalize_checkpoint`: fsync alone (what saving cost before
   checksums), sha256 of every file right after the write (page cache: the overhead checksums add
   to a save), and `verify.verify_checkpoint` hot (just written) and cold (pages evicted with
   posix_fadvise DONTNEED: the disk's read speed, as on a fresh machine resuming from the volume).
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

    import payload.train.recipe as train
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


def synthetic(work: Path, nbytes: int) -> dict:
    import torch
    from safetensors.torch import save_file

    from payload.volume import checksums
    from payload.volume.checkpoints import digest_checkpoint, fsync_tree, write_marker
    from payload.volume.verify import verify_checkpoint

    path = work / "checkpoint-1"
    path.mkdir(parents=True)
    n = nbytes // 4 // 3  # fp32 elements of the adapter; optimizer holds 2x
    adapter, moments = torch.randn(n), {"exp_avg": torch.randn(n), "exp_avg_sq": torch.rand(n)}
    t = time.perf_counter()
    save_file({"adapter": adapter}, str(path / "adapter_model.safetensors"))
    torch.save(moments, path / "optimizer.pt")
    out = {"write_s": time.perf_counter() - t}
    del adapter, moments
    t = time.perf_counter()
    fsync_tree(path)
    out["fsync_s"] = time.perf_counter() - t
    t = time.perf_counter()
    files = checksums.digest(path, list(checksums.list_files(path)))
    out["hash_s"] = time.perf_counter() - t
    t = time.perf_counter()
    assert digest_checkpoint(path) == files  # the save path: hash + fsync in one pass (pages already clean)
    out["hash_fsync_s"] = time.perf_counter() - t
    write_marker(path, {"step": 1, "files": files})
    t = time.perf_counter()
    assert verify_checkpoint(path) == []
    out["verify_hot_s"] = time.perf_counter() - t
    for f in files:
        fd = os.open(path / f, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
    t = time.perf_counter()
    assert verify_checkpoint(path) == []
    out["verify_cold_s"] = time.perf_counter() - t
    out["bytes"] = sum(v["bytes"] for v in files.values())
    mb = out["bytes"] / 1e6
    out.update(seconds=out["write_s"] + out["fsync_s"], mb_per_s=mb / (out["write_s"] + out["fsync_s"]),
               hash_mb_per_s=mb / out["hash_s"], verify_cold_mb_per_s=mb / out["verify_cold_s"])
    return out


def qwen3_vl_32b_lora_bytes(r: int = 32) -> int:
    """LoRA on q,k,v,o,gate,up,down of Qwen3-VL-32B's language model: fp32 params + 2 AdamW moments."""
    hidden, inter, layers, q_out, kv_out = 5120, 25600, 64, 64 * 128, 8 * 128
    shapes = [(hidden, q_out), (hidden, kv_out), (hidden, kv_out), (q_out, hidden),
              (hidden, inter), (hidden, inter), (inter, hidden)]
    params = layers * sum(r * (i + o) for i, o in shapes)
    return params * 4 * 3


def main() -> None:
    from payload.volume.control import young_interval_s

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rank", type=int, default=32, help="LoRA rank of the 32B checkpoint the synthetic one mimics")
    ap.add_argument("--mb", type=int, default=None, help="size of the synthetic checkpoint instead (MB)")
    ap.add_argument("--dir", default=None, help="where to write (default: a temp dir; use the volume on a pod)")
    ap.add_argument("--skip-tiny", action="store_true", help="only the synthetic checkpoint")
    a = ap.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    big = qwen3_vl_32b_lora_bytes(a.rank)
    nbytes = a.mb * 10**6 if a.mb else big
    with tempfile.TemporaryDirectory(dir=a.dir) as tmp:
        tiny = None if a.skip_tiny else tiny_saves(Path(tmp) / "tiny")
        disk = synthetic(Path(tmp) / "synthetic", nbytes)
    if tiny:
        print(f"tiny demo LoRA checkpoint ({tiny['bytes'] / 1e3:.0f} kB): median save {tiny['median_s']:.3f} s, "
              f"max {tiny['max_s']:.3f} s over {tiny['saves']} saves (Trainer save + config + sha256 + fsync + "
              "marker)")
    gb = disk["bytes"] / 1e9
    print(f"synthetic {gb:.2f} GB checkpoint: write {disk['write_s']:.2f} s + fsync {disk['fsync_s']:.2f} s "
          f"-> {disk['mb_per_s']:.0f} MB/s")
    print(f"  checksums while saving: sha256 {disk['hash_s']:.2f} s ({disk['hash_mb_per_s']:.0f} MB/s, "
          f"+{100 * disk['hash_s'] / disk['seconds']:.0f}% on the save); hash+fsync pass {disk['hash_fsync_s']:.2f} s")
    print(f"  verify before resume: {disk['verify_hot_s']:.2f} s hot, {disk['verify_cold_s']:.2f} s cold "
          f"({disk['verify_cold_mb_per_s']:.0f} MB/s from disk)")
    print(f"Qwen3-VL-32B LoRA r={a.rank} checkpoint ~{big / 1e9:.2f} GB:")
    for label, rate in (("this disk", disk["mb_per_s"]), ("RunPod volume 200 MB/s", 200.0),
                        ("RunPod volume 400 MB/s", 400.0)):
        save_s = big / 1e6 / rate + big / 1e6 / disk["hash_mb_per_s"]
        young = ", ".join(f"MTBF {h} h -> every {young_interval_s(save_s, h) / 60:.0f} min" for h in (2, 8, 24))
        print(f"  {label:<24} save ~{save_s:5.1f} s with checksums; Young's interval: {young}")
    print(json.dumps({"tiny": tiny, "synthetic": disk, "qwen3_vl_32b_lora_bytes": big, "rank": a.rank}))


if __name__ == "__main__":
    main()
