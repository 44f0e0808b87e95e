"""Wall and CPU time of `launch --help`, `launch plan` and `launch profiles`, run as a user runs them:
the installed console script in a cold process, a fresh HOME and LAUNCH_HOME, no credentials, stdin
not a terminal, 80 columns (tests/walk.py's environment).

    .venv/bin/python bench/bench_cli.py [-n 5] [--cold] [--without-pyc]

Targets (issue 32, medians on 2 cores): `launch plan sonia-h100` <= 3 s, `launch profiles` <= 4 s.
Wall time moves with whatever else the machine runs; CPU time (user + sys of the process and its
children) much less, so both are printed: compare CPU figures across a busy machine, wall figures on
a quiet one. PYTHONDONTWRITEBYTECODE=1 is kept as the environment has it: without the .pyc files that
`make install` writes, every command recompiles what it imports.
"""

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from walk import LAUNCH, fresh_env  # noqa: E402  (the user's environment, one definition)

COMMANDS = (["--help"], ["plan", "sonia-h100"], ["plan", "qwen3-32b-4x4-a100"], ["profiles"])


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def timed(args, make_env, n):
    """(wall seconds, CPU seconds) of n runs of `launch ARGS`, each in a new process."""
    walls, cpus = [], []
    for _ in range(n):
        env = make_env()
        c, t = children_cpu(), time.perf_counter()
        subprocess.run([str(LAUNCH), *args], env=env, cwd=REPO, stdin=subprocess.DEVNULL, capture_output=True,
                       timeout=300, check=True)
        walls.append(time.perf_counter() - t)
        cpus.append(children_cpu() - c)
    return walls, cpus


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=5, help="runs per command (medians are printed)")
    ap.add_argument("--without-pyc", action="store_true",
                    help="as a .venv without bytecode runs (the .pyc files are looked for in an empty dir)")
    ap.add_argument("--cold", action="store_true", help="a new LAUNCH_HOME for every run: no optimizer answer "
                    "kept from an earlier one (launcher/catalog: a new user's first plan, or a changed task)")
    a = ap.parse_args()
    n, tmp = a.n, Path(tempfile.mkdtemp(prefix="bench-cli-"))
    extra = {"PYTHONPYCACHEPREFIX": str(tmp / "no-pyc")} if a.without_pyc else None
    shared = fresh_env(tmp, extra)

    def make_env():
        return fresh_env(Path(tempfile.mkdtemp(dir=tmp)), extra) if a.cold else shared

    print(f"{'cold' if a.cold else 'warm (optimizer answers kept after the first run)'}, "
          f"{'without' if a.without_pyc else 'with'} bytecode")
    print(f"PYTHONDONTWRITEBYTECODE={os.environ.get('PYTHONDONTWRITEBYTECODE', '')!r}, "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for args in COMMANDS:
        walls, cpus = timed(args, make_env, n)
        print(f"launch {' '.join(args):<28} wall median {statistics.median(walls):5.2f} s "
              f"(min {min(walls):.2f}, max {max(walls):.2f})  cpu median {statistics.median(cpus):5.2f} s  n={n}")


if __name__ == "__main__":
    main()
