"""GPU proof: the payload's own training path, per mode, against a plain transformers Trainer.

    make gpu-check                          # on a machine with one NVIDIA GPU (no network needed)
    make gpu-check ARGS="--modes lora-bf16-sdpa,qlora-4bit --budget-s 540"
    make gpu-check-smoke                    # the same code on CPU at tiny shapes (the test suite runs it)
    python bench/gpu/gpu_check.py --merge a.json b.json   # one table from several partial runs

Builds random models at real shapes locally (Qwen3-8B; Qwen3-VL-2B), synthetic records at runbook
000's lengths, then runs each mode (bench/gpu/gpu_modes.py) in its own process, bounded in time: the
payload (payload.train.recipe's phases) and its plain-Trainer baseline (bench/gpu/gpu_baseline.py). A mode that
cannot run here, runs out of memory or times out is a row with a reason. Missing packages are
installed from wheels carried in `.whl/` and `.whl-bnb/` (bench/gpu/gpu_wheels.py) when the machine's own
are missing or too old (payload/preflight/versions.py). Writes bench/results/<gpu>-<date>.{json,md}, prints a
summary. bench/README.md has the device command sequence.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parents[1]
sys.path[:0] = [str(BENCH), str(BENCH.parent), str(ROOT)]  # bench/gpu, bench (bench_packing), the repo

import gpu_env  # noqa: E402
import gpu_modes  # noqa: E402
import gpu_report  # noqa: E402

from payload import layout  # noqa: E402

IMPORT_NAMES = {"flash-attn": "flash_attn", "bitsandbytes": "bitsandbytes", "deepspeed": "deepspeed"}


def parse(argv):
    p = argparse.ArgumentParser(prog="bench/gpu/gpu_check.py", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="example: python bench/gpu/gpu_check.py --modes lora-bf16-sdpa --steps 20")
    p.add_argument("--smoke", action="store_true", help="tiny shapes on CPU, seconds (the test suite runs it)")
    p.add_argument("--modes", help=f"comma-separated, default all: {','.join(gpu_modes.MODE_NAMES)}")
    p.add_argument("--steps", type=int, help="optimizer steps per run (default 15; smoke 4)")
    p.add_argument("--warmup", type=int, help="first steps not timed (default 4; smoke 1)")
    p.add_argument("--batch", type=int, default=2, help="per-device batch (runbook 000: 2)")
    p.add_argument("--seq", type=int, help="max sequence length (default 4096; smoke 256)")
    p.add_argument("--records", type=int, help="synthetic records (default 1200; smoke 48)")
    p.add_argument("--budget-s", type=float, help="stop starting runs past this (default 540 s; smoke 600)")
    p.add_argument("--mode-timeout", type=float, default=420, help="seconds one run may take")
    p.add_argument("--baselines", default="all",
                   help="modes whose plain-Trainer baseline runs: all (default), none, or a comma-separated list")
    p.add_argument("--workdir", help="models, data, runs (default: a temp dir)")
    p.add_argument("--out", help="results folder (default bench/results; smoke: WORKDIR/results)")
    p.add_argument("--merge", nargs="+", metavar="JSON", help="combine result files into one table")
    a = p.parse_args(argv)
    for k, gpu, smoke in (("steps", 15, 4), ("warmup", 4, 1), ("seq", 4096, 256), ("records", 1200, 48),
                          ("budget_s", 540.0, 600.0)):
        if getattr(a, k) is None:
            setattr(a, k, smoke if a.smoke else gpu)
    if a.warmup >= a.steps:
        p.error(f"--warmup ({a.warmup}) must be smaller than --steps ({a.steps})")
    return a


def has(pkg: str) -> bool:
    return importlib.util.find_spec(IMPORT_NAMES.get(pkg, pkg)) is not None


def run_child(spec: dict, work: Path, timeout: float) -> dict:
    """One child process; a crash, kill or timeout becomes a row with the reason."""
    tag = f"{spec.get('mode') or 'prepare'}-{spec['role']}"
    spec_path, out, log = work / f"{tag}.spec.json", work / f"{tag}.result.json", work / f"{tag}.log"
    spec_path.write_text(json.dumps(spec))
    out.unlink(missing_ok=True)
    row = {"mode": spec.get("mode"), "role": spec["role"]}
    t0 = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, str(BENCH / "gpu_child.py"), str(spec_path), str(out)],
                                cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=max(1.0, timeout))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return {**row, "status": "timeout", "reason": f"timed out after {timeout:.0f} s (log {log})"}
    lines = [x for x in log.read_text(errors="replace").splitlines() if x.strip()]
    if out.is_file():
        result = json.loads(out.read_text())
        if result.get("status") != "ok":
            result["log_tail"] = lines[-15:]  # the device returns few files: keep the evidence in the row
        return result
    tail = lines[-1:] or ["no output"]
    why = "killed (out of host memory?)" if proc.returncode in (-9, 137) else f"exit {proc.returncode}"
    return {**row, "status": "failed", "reason": f"{why}: {tail[0][:300]}", "log_tail": lines[-15:],
            "wall_s": round(time.perf_counter() - t0, 1)}


class Check:
    """One invocation: environment, models and data, then the modes, writing results as it goes."""

    def __init__(self, a, argv):
        self.a, self.t0 = a, time.monotonic()
        self.work = Path(a.workdir or tempfile.mkdtemp(prefix="launch-gpu-check-")).resolve()
        (self.work / "logs").mkdir(parents=True, exist_ok=True)
        self.out = Path(a.out) if a.out else (self.work / "results" if a.smoke else ROOT / "bench" / "results")
        names = a.modes.split(",") if a.modes else (gpu_modes.SMOKE_MODES if a.smoke else gpu_modes.MODE_NAMES)
        self.modes = [gpu_modes.mode(n.strip()) for n in names]
        if a.smoke:
            for m in self.modes:
                m["shape"] = gpu_modes.SMOKE_SHAPE[m["shape"]]
        # every invocation trains fresh runs (a reused run id is a resume to the payload); the built
        # models and data in --workdir are reused
        self.stamp = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        self.results = {"date": dt.date.today().isoformat(), "smoke": a.smoke, "steps": a.steps,
                        "warmup": a.warmup, "batch": a.batch, "seq": a.seq,
                        "command": "python bench/gpu/gpu_check.py " + shlex.join(argv), "rows": []}

    def left(self) -> float:
        return self.a.budget_s - (time.monotonic() - self.t0)

    def environment(self) -> bool:
        site = None if self.a.smoke else gpu_env.prepare(ROOT, self.modes, self.work / "site")
        if site:
            if site not in sys.path:
                sys.path.insert(0, site)
            os.environ["PYTHONPATH"] = os.pathsep.join([site, str(ROOT), os.environ.get("PYTHONPATH", "")])
            os.environ["GPU_CHECK_SITE"] = site
        import torch

        self.results["env"] = gpu_env.report(self.modes)
        return torch.cuda.is_available()

    def spec(self, m: dict, role: str) -> dict:
        a = self.a
        return {"role": role, "mode": m["name"], "shape": m["shape"], "model_dir": self.models[m["shape"]]["path"],
                "data_path": str(self.work / "data" / "mix.jsonl"), "volume": str(self.work / "runs"),
                "run_id": self.run_id(m, role), "steps": a.steps, "warmup": a.warmup, "batch": a.batch,
                "seq": a.seq, "smoke": a.smoke, "images": self.image_size() if m.get("images") else None}

    def run_id(self, m: dict, role: str) -> str:
        return f"{m['name']}-{role}-{self.stamp}"

    def image_size(self) -> list[int]:
        return list(gpu_modes.IMAGES["smoke_size" if self.a.smoke else "size"])

    def roles(self, m: dict) -> list[str]:
        """The payload, and its own baseline unless it shares one, has none, or --baselines leaves it out."""
        wanted = self.a.baselines.split(",")
        own = not m.get("baseline_of") and m.get("baseline", True)
        return ["payload"] + (["baseline"] if own and ("all" in wanted or m["name"] in wanted) else [])

    def run(self) -> int:
        cuda = self.environment()
        skip = {m["name"]: gpu_modes.skip_reason(m, cuda, has) for m in self.modes}
        for m in self.modes:
            if skip[m["name"]]:
                self.add({"mode": m["name"], "role": "payload", "status": "skipped", "reason": skip[m["name"]]}, m)
        todo = [m for m in self.modes if not skip[m["name"]]]
        shapes = sorted({m["shape"] for m in todo})
        prep = run_child({"role": "prepare", "shapes": shapes, "models_dir": str(self.work / "models"),
                          "data_path": str(self.work / "data" / "mix.jsonl"), "records": self.a.records,
                          "seq": self.a.seq, "images": self.image_size() if any(m.get("images") for m in todo)
                          else None}, self.work / "logs", max(30.0, self.left()))
        if prep.get("status") != "ok":
            print(f"gpu-check: preparing models and data failed: {prep.get('reason')}", file=sys.stderr)
            return 1
        self.models = prep["models"]
        self.results.update({k: prep.get(k) for k in ("device", "gpu_memory_gb", "data", "models")})
        for m in todo:
            for role in self.roles(m):
                budget = min(self.a.mode_timeout, self.left() - 5)
                if budget < 30:
                    self.add({"mode": m["name"], "role": role, "status": "not run",
                              "reason": f"time budget of {self.a.budget_s:.0f} s spent; run it with --modes"}, m)
                    continue
                print(f"gpu-check: {m['name']} {role} ...", flush=True)
                spec = self.spec(m, role)
                self.add(run_child(spec, self.work / "logs", budget), m)
                for done in (layout.run_dir(spec["volume"], spec["run_id"]), Path(spec["volume"]) / "baseline-out"):
                    shutil.rmtree(done, ignore_errors=True)  # checkpoints: a full 2B one is ~30 GB
        jpath, mpath = self.save()
        report(self.results, jpath, mpath)
        return 0

    def add(self, row: dict, m: dict) -> None:
        row.setdefault("shape", m["shape"])
        if m.get("baseline_of"):
            row["baseline_of"] = m["baseline_of"]
        self.results["rows"].append(row)
        if row.get("peak_source") and not self.results.get("peak_source"):
            self.results["peak_source"] = row["peak_source"]
        if "device" in self.results:
            self.save()  # a kill of the whole command still leaves the rows so far

    def save(self):
        return gpu_report.write(self.results, self.out)


def merge(paths: list[str], out: Path) -> int:
    first = json.loads(Path(paths[0]).read_text())
    rows = {(r["mode"], r["role"]): r for r in first["rows"]}
    for p in paths[1:]:
        data = json.loads(Path(p).read_text())
        if data.get("device") != first.get("device"):
            print(f"gpu-check: {p} ran on {data.get('device')}, not {first.get('device')}: not merged", file=sys.stderr)
            return 1
        rows.update({(r["mode"], r["role"]): r for r in data["rows"]})
        first["peak_source"] = first.get("peak_source") or data.get("peak_source")
        first["date"] = max(first["date"], data["date"])  # named by the newest: never over an older table
        first["command"] += " ; " + data["command"]
    first["rows"] = list(rows.values())
    jpath, mpath = gpu_report.write(first, out)
    report(first, jpath, mpath)
    return 0


def report(results: dict, jpath: Path, mpath: Path) -> None:
    print(gpu_report.summary(results))
    print(f"gpu-check: wrote {jpath} and {mpath}")
    try:
        rel = jpath.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        rel = jpath.name
    cites = gpu_report.citations(results, rel)
    if cites:
        print("launcher/plan/throughput.py MEASURED entries (one per method; keep the one of the mode you plan with):")
        print("\n".join("    " + c for c in cites))


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    a = parse(argv)
    if a.merge:
        return merge(a.merge, Path(a.out) if a.out else ROOT / "bench" / "results")
    return Check(a, argv).run()


if __name__ == "__main__":
    sys.exit(main())
