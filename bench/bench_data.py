"""Benchmark the data stage on a synthetic corpus shaped like runbook 000 (Sonia + glm).

    .venv/bin/python bench/bench_data.py                    # 200k records
    .venv/bin/python bench/bench_data.py --records 1000000  # the 1M memory check
    .venv/bin/python bench/bench_data.py --images 200       # 10% of records reference 200 image files

Generates two JSONL files (persona chats with a system prompt; glm-style chats with empty system
prompts and `<think>` blocks, ~1% exact duplicates), then runs `payload.data.prepare` on the
runbook-000 recipe in a fresh child process pinned to one core, and reports records/second and the
child's peak resident memory (baseline of the interpreter + imports reported separately). The rate
is given per wall-clock second and per CPU-second of the child (the latter is what one free core
would do; the two differ on a busy machine).
Every image is opened, size-checked and decoded by the data stage, once per distinct file, and the
inputs are content-hashed for the cache key: both are inside the measured time.
Target: >= 50k records/s on one core for the JSONL path, with or without image references (images
validated once per distinct file); memory a few hundred MB at 1M records.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SONIA = "You are Sonia, a warm and precise assistant. Keep your behavioural contract."
TOPICS = ["rivers", "prime numbers", "tea", "orbits", "bridges", "violins", "glaciers", "compilers"]


def _chat(rng: random.Random, i: int, glm: bool) -> dict:
    topic = rng.choice(TOPICS)
    question = f"Question {i}: tell me something about {topic} and why it matters ({rng.random():.6f})."
    answer = (f"Here is a short note on {topic}. " * rng.randint(2, 6)).strip()
    if glm:
        think = f"<think>The user asks about {topic}. " + "Let me reason step by step. " * rng.randint(3, 12)
        return {"messages": [{"role": "system", "content": ""}, {"role": "user", "content": question},
                             {"role": "assistant", "content": think + "</think>\n\n" + answer}]}
    follow = f"And what about {rng.choice(TOPICS)}?"
    return {"messages": [{"role": "system", "content": SONIA}, {"role": "user", "content": question},
                         {"role": "assistant", "content": answer}, {"role": "user", "content": follow},
                         {"role": "assistant", "content": "That one is lovely too. " * rng.randint(1, 4)}]}


def _images(out: Path, n: int, rng: random.Random) -> list[str]:
    """`n` distinct 256x256 JPEG photos-to-be (noise), the kind of file a VL record references."""
    from PIL import Image

    names = []
    for i in range(n):
        img = Image.effect_noise((256, 256), 40 + rng.random() * 40).convert("RGB")
        name = f"img_{i:04d}.jpg"
        img.save(out / name, format="JPEG", quality=85)
        names.append(name)
    return names


def _with_image(rec: dict, image: str) -> dict:
    msgs = rec["messages"]
    user = next(m for m in msgs if m["role"] == "user")
    user["content"] = [{"type": "image", "image": image}, {"type": "text", "text": user["content"]}]
    return rec


def generate(out: Path, records: int, seed: int = 0, images: int = 0, image_share: float = 0.1) -> dict:
    """Write sonia.jsonl (~80%) and glm.jsonl (~20%) with ~1% duplicates; return paths and sizes.
    With `images`, that many distinct image files exist and `image_share` of the sonia records
    reference one of them (the data stage validates each file once)."""
    rng = random.Random(seed)
    pool = _images(out, images, rng) if images else []
    n_glm = records // 5
    files = {"sonia": (out / "sonia.jsonl", records - n_glm, False), "glm": (out / "glm.jsonl", n_glm, True)}
    for name, (path, n, glm) in files.items():
        recent: list[str] = []
        with open(path, "w", encoding="utf-8") as f:
            for i in range(n):
                if recent and rng.random() < 0.01:
                    line = rng.choice(recent)
                else:
                    rec = _chat(rng, i, glm)
                    if pool and not glm and rng.random() < image_share:
                        rec = _with_image(rec, rng.choice(pool))
                    line = json.dumps(rec, ensure_ascii=False)
                    recent = (recent + [line])[-100:]
                f.write(line + "\n")
    return {name: {"path": str(p), "records": n, "mb": round(p.stat().st_size / 2**20, 1)}
            for name, (p, n, _g) in files.items()}


def recipe(corpus: Path) -> dict:
    return {
        "seed": 42,
        "system_prompts": {"sonia": SONIA},
        "sources": [
            {"name": "sonia", "path": str(corpus / "sonia.jsonl"), "format": "messages",
             "split": {"train": 0.98, "val": 0.01, "test": 0.01}},
            {"name": "glm", "path": str(corpus / "glm.jsonl"), "format": "messages", "strip_think": True,
             "system_prompt": "sonia", "split": {"train": 0.95, "val": 0.05}},
        ],
    }


def child(config_json: str, out_dir: str) -> None:
    """Runs in the measured process: import, note the baseline RSS, prepare, print the result."""
    sys.path.insert(0, str(ROOT))
    from payload.config import DataConfig
    from payload.data import prepare

    baseline = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    data = DataConfig.model_validate(json.loads(config_json))
    t0, c0 = time.perf_counter(), time.process_time()
    stats = prepare(data, out_dir, log=lambda line: None)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    print(json.dumps({"seconds": seconds, "cpu": cpu, "totals": stats["totals"], "baseline_kb": baseline}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--images", type=int, default=0, metavar="N",
                    help="N distinct image files, referenced by 10%% of the sonia records (validated once each)")
    ap.add_argument("--keep", help="generate into (and keep) this directory instead of a temp dir")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(*args.child)
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(args.keep or tmp)
        corpus.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        files = generate(corpus, args.records, images=args.images)
        print(f"generated {args.records:,} records in {time.perf_counter() - t0:.1f}s: {json.dumps(files)}")
        cmd = [sys.executable, __file__, "--child", json.dumps(recipe(corpus)), str(corpus / "out")]
        if _has_taskset():
            cmd = ["taskset", "-c", "0", *cmd]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        if proc.returncode != 0:
            sys.exit(f"child failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
        res = json.loads(proc.stdout.strip().splitlines()[-1])
        peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        t = res["totals"]
        print(f"records in {t['in']:,} -> out {t['out']:,} (train {t['train']:,}, val {t['val']:,}, "
              f"test {t['test']:,}; duplicates {t['duplicates']:,}, dropped {t['dropped']:,})")
        print(f"wall {res['seconds']:.2f}s -> {t['in'] / res['seconds']:,.0f} records/s; CPU {res['cpu']:.2f}s -> "
              f"{t['in'] / res['cpu']:,.0f} records per CPU-second (one core; wall < CPU rate when the "
              f"machine is shared)")
        print(f"peak RSS {peak_mb:,.0f} MB (interpreter + imports before prepare: "
              f"{res['baseline_kb'] / 1024:,.0f} MB)")


def _has_taskset() -> bool:
    return any(os.access(os.path.join(d, "taskset"), os.X_OK) for d in os.environ.get("PATH", "").split(":"))


if __name__ == "__main__":
    main()
