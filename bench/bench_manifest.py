"""Manifest and verification cost: sha256 over an artifact set, on the machine (threads) and at home.

    python bench/bench_manifest.py [--gb 1.0] [--files 4]

Writes `--files` synthetic safetensors-sized files (random bytes) under a temp run directory's
outputs/merged/, then times `payload.outputs.manifest.build` with 1 and 8 threads (files just written, so
mostly in the page cache, as after `post`) and the launcher's streamed check of each file, and
reports the peak RSS growth: the files are streamed in 8 MiB blocks, never read whole.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from payload import layout
from payload.volume import checksums
from payload.outputs import manifest


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gb", type=float, default=1.0)
    ap.add_argument("--files", type=int, default=4)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-manifest-") as tmp:
        rd = Path(tmp) / "runs" / "r"
        merged = rd / layout.MERGED_DIR
        merged.mkdir(parents=True)
        per = int(args.gb * 1e9 / args.files)
        block = os.urandom(8 << 20)
        for i in range(args.files):
            with open(merged / f"model-{i:05d}.safetensors", "wb") as f:
                for _ in range(per // len(block)):
                    f.write(block)
        total = sum(p.stat().st_size for p in merged.iterdir())
        rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print(f"{args.files} files, {total / 1e9:.2f} GB, {os.cpu_count()} CPUs")
        for threads in (1, 8):
            t = time.perf_counter()
            m = manifest.build(rd, [], "r", "completed", threads=threads)
            dt = time.perf_counter() - t
            print(f"  manifest, {threads} thread(s): {dt:.2f} s, {total / dt / 1e6:.0f} MB/s "
                  f"({len(m['files'])} files)")
        t = time.perf_counter()
        for p in merged.iterdir():
            checksums.file_digest(p)
        dt = time.perf_counter() - t
        print(f"  verify at home (sequential, streamed): {dt:.2f} s, {total / dt / 1e6:.0f} MB/s")
        grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024
        print(f"  peak RSS growth while hashing: {grew:.0f} MB")


if __name__ == "__main__":
    main()
