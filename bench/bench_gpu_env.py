"""GPU environment setup: first setup vs a recovery's setup (payload/gpu_env.sh), with a stand-in lock.

    .venv/bin/python bench/bench_gpu_env.py                      # a few small real packages (PyPI)
    .venv/bin/python bench/bench_gpu_env.py --lock payload/requirements-gpu.lock --managed-python
                                                                # the real stack (GBs; a GPU machine)

Runs the exact `source payload/gpu_env.sh` of the rendered setup twice against one env root (the
volume), as a spot recovery would, and reports the seconds of each and what the second installed
(it should install nothing). By default the lock is a couple of small packages resolved for this
machine and this machine's Python 3.11 stands in for the uv-managed one.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
STAND_IN = "pyyaml==6.0.3\nidna==3.20\nsix\n"


def setup_once(env: dict) -> tuple[float, str]:
    t0 = time.perf_counter()
    done = subprocess.run(["bash", "-c", "set -euo pipefail; source payload/gpu_env.sh"], cwd=REPO, env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"setup failed:\n{done.stdout}\n{done.stderr}")
    return time.perf_counter() - t0, done.stdout.strip()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lock", help="lock file to install (default: a small stand-in resolved here)")
    ap.add_argument("--managed-python", action="store_true", help="let uv download its own Python 3.11")
    args = ap.parse_args()
    uv = shutil.which("uv", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    if not uv:
        sys.exit("uv is not installed: make install")
    work = Path(tempfile.mkdtemp(prefix="bench-gpu-env-"))
    lock = Path(args.lock).resolve() if args.lock else work / "lock.txt"
    if not args.lock:
        (work / "in.txt").write_text(STAND_IN)
        subprocess.run([uv, "pip", "compile", "-q", str(work / "in.txt"), "-o", str(lock)], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "LAUNCH_"))}
    env.update({"PATH": f"{Path(uv).parent}{os.pathsep}{env['PATH']}", "LAUNCH_VOLUME": str(work / "volume"),
                "LAUNCH_GPU_LOCK": str(lock), "UV_CACHE_DIR": str(work / "uv-cache")})
    if not args.lock:
        env.update({"LAUNCH_ENV_SMOKE": "yaml idna six", "FLASH_ATTN_WHEEL": ""})
    if not args.managed_python:
        env["UV_PYTHON_PREFERENCE"] = "only-system"
    first, out1 = setup_once(env)
    shutil.rmtree(work / "uv-cache", ignore_errors=True)  # a recovery is a fresh machine: no uv cache
    second, out2 = setup_once(env)
    packages = sum(1 for ln in lock.read_text().splitlines() if "==" in ln and not ln.startswith("#"))
    print(f"lock: {lock.name} ({packages} packages)")
    print(f"first setup (builds the environment):  {first:6.2f} s   {out1.splitlines()[0]}")
    print(f"second setup (a recovery, same volume): {second:6.2f} s   {out2.splitlines()[0]}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
