"""Wall time of `launch --help` and `launch plan` (cold processes, as a user runs them).

    .venv/bin/python bench/bench_cli.py
"""

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LAUNCH = Path(sys.executable).parent / "launch"


def timed(args, env, n=5):
    times = []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run([str(LAUNCH), *args], env=env, cwd=REPO, capture_output=True, timeout=120, check=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times), min(times), max(times)


def main():
    env = {**os.environ, "LAUNCH_HOME": tempfile.mkdtemp(), "SKYPILOT_DISABLE_USAGE_COLLECTION": "1"}
    for args in (["--help"], ["plan", "sonia-h100"], ["plan", "qwen3-32b-4x4-a100"], ["profiles"]):
        med, lo, hi = timed(args, env)
        print(f"launch {' '.join(args):<28} median {med:.2f} s  (min {lo:.2f}, max {hi:.2f}, n=5)")


if __name__ == "__main__":
    main()
