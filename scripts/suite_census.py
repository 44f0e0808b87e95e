#!/usr/bin/env python3
"""Where `make test`'s CPU goes: every Python process the suite starts, its CPU time and what it imported.

`--durations` names the slow tests; it cannot say that most of a slow test is spent in the processes it
starts (a trainer pays ~5 s of CPU importing torch, transformers and TRL before its first step), nor that
2 cores are a CPU floor no worker count moves. This counts them:

    python scripts/suite_census.py                       # the whole suite, as `make test` runs it
    python scripts/suite_census.py tests/walks -n 0      # or any pytest arguments
    CENSUS_RECORDS=FILE python scripts/suite_census.py   # and every process's record in FILE (JSON lines)

While it runs, a `.pth` hook in the project's own .venv (removed after, also on ^C) makes every Python
process of that interpreter (the pytest workers, `launch`, the payload's stages, torchrun, the bench
children, also those started over SSH or by the local backend with an environment of their own) write one
small JSON record to a temporary folder when it exits. A process killed by SIGKILL writes none: it is
counted as started, without CPU. Non-Python processes (sshd, rsync, bash) are not counted.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV_PY = ROOT / ".venv" / "bin" / "python"
MAKE_TEST_ARGS = ["-q", "-p", "no:cacheprovider", "-n", "3", "--dist", "loadfile", "--durations=10",
                  "--ignore=tests/cloud/scenarios", "tests"]
HEAVY = ("torch", "transformers", "trl")

HOOK = '''import atexit, json, os, sys, time
_T0 = time.time()
def _census_record():
    try:
        t = os.times()
        rec = {"pid": os.getpid(), "argv": [str(a) for a in sys.argv[:3]], "cpu": t.user + t.system,
               "wall": time.time() - _T0, "test": os.environ.get("PYTEST_CURRENT_TEST", ""),
               "heavy": [m for m in %(heavy)r if m in sys.modules], "pytest": "_pytest" in sys.modules}
        with open(os.path.join(%(out)r, "%%d.end" %% os.getpid()), "w") as f:
            json.dump(rec, f)
    except Exception:
        pass
try:
    open(os.path.join(%(out)r, "%%d.start" %% os.getpid()), "w").close()
except OSError:
    pass
atexit.register(_census_record)
'''


def site_packages() -> Path:
    out = subprocess.run([str(VENV_PY), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    return Path(out)


def kind(rec: dict) -> str:
    """A process by what it ran: `payload train`, `launch up`, `torchrun`, `pytest (in-process tests)`, a script."""
    argv = rec["argv"] or [""]
    first = argv[0]
    if first.endswith("payload/__main__.py"):
        what = "payload " + (argv[1] if len(argv) > 1 else "")
    elif first.endswith("bin/launch"):
        what = "launch " + (argv[1] if len(argv) > 1 else "")
    elif rec.get("pytest"):
        what = "pytest (in-process tests)"
    elif "torch/distributed/run.py" in first or first.endswith("torchrun.py"):
        what = "torchrun"
    else:
        what = first.rsplit("/", 1)[-1] or "-c"
    return what + (" [imports torch]" if "torch" in rec["heavy"] else "")


def report(out: Path, wall: float) -> None:
    recs = [json.loads(p.read_text()) for p in out.glob("*.end")]
    started = len(list(out.glob("*.start")))
    cpu = sum(r["cpu"] for r in recs)
    print(f"\n{started} Python processes started, {len(recs)} exited normally; their CPU: {cpu:.0f} s "
          f"in {wall:.0f} s of wall ({cpu / max(wall, 1e-9):.2f} cores busy on average)")
    by_kind = collections.defaultdict(lambda: [0, 0.0])
    for r in recs:
        by_kind[kind(r)][0] += 1
        by_kind[kind(r)][1] += r["cpu"]
    print(f"\n{'CPU s':>7} {'procs':>6} {'s each':>7}  process")
    for k, (n, c) in sorted(by_kind.items(), key=lambda kv: -kv[1][1])[:25]:
        print(f"{c:7.1f} {n:6d} {c / n:7.2f}  {k}")
    by_test = collections.defaultdict(lambda: [0, 0.0])
    for r in recs:
        if r["test"] and not kind(r).startswith("pytest"):
            t = r["test"].rsplit(" (", 1)[0]
            by_test[t][0] += 1
            by_test[t][1] += r["cpu"]
    print(f"\n{'CPU s':>7} {'procs':>6}  test (the CPU of the processes it started)")
    for t, (n, c) in sorted(by_test.items(), key=lambda kv: -kv[1][1])[:15]:
        print(f"{c:7.1f} {n:6d}  {t}")


def main(argv: list[str]) -> int:
    if not VENV_PY.exists():
        print("suite_census: no .venv: run `make install` first", file=sys.stderr)
        return 2
    site = site_packages()
    hook, pth = site / "_launch_census.py", site / "zz_launch_census.pth"
    with tempfile.TemporaryDirectory(prefix="launch-census-") as out:
        hook.write_text(HOOK % {"out": out, "heavy": HEAVY})
        pth.write_text("import _launch_census\n")
        t0 = time.monotonic()
        try:
            code = subprocess.call([str(VENV_PY), "-m", "pytest", *(argv or MAKE_TEST_ARGS)], cwd=ROOT)
        except KeyboardInterrupt:
            code = 130
        finally:
            pth.unlink(missing_ok=True)
            hook.unlink(missing_ok=True)
        report(Path(out), time.monotonic() - t0)
        if os.environ.get("CENSUS_RECORDS"):  # every record, one JSON object a line, for a closer look
            with open(os.environ["CENSUS_RECORDS"], "w") as f:
                for rec in sorted(Path(out).glob("*.end")):
                    f.write(rec.read_text().strip() + "\n")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
