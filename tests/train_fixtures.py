"""Helpers and fixtures of the training tests (test_train, test_resume, test_distributed).

Tiny models on CPU, synthetic canonical records written straight into `{run_dir}/data/`, runs
either in-process (`payload.train.recipe.main`) or as `python -m payload train --config FILE`
subprocesses (always with a timeout).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
DEMO_PROFILE = REPO / "clusters" / "local-demo.yaml"
# Ceilings, not targets: they hold on a machine 3x slower than the 2 cores these were measured on (a
# loaded laptop, a CI box running two suites), where a 24-step trainer took ~10 s and its imports ~8 s.
SUBPROCESS_TIMEOUT = 540

# Small and fast: 24 steps of batch 2, evaluation and checkpoints every few steps.
FAST_TRAIN = {
    "max_seq_length": 128,
    "per_device_batch_size": 2,
    "max_steps": 24,
    "logging_steps": 2,
    "eval_steps": 8,
    "warmup_ratio": 0.1,
    "high_loss_samples": 3,
    "checkpoints": {"save_steps": 4, "keep_best": 1, "keep_recent": 2},
}


def demo_dict() -> dict:
    """The local-demo profile as a run-config dict (launcher-only sections dropped)."""
    data = yaml.safe_load(DEMO_PROFILE.read_text())
    data.pop("cluster", None)
    data.pop("budget", None)
    return data


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def make_config(volume: Path, run_id: str = "run", train: dict | None = None, model: dict | None = None,
                runtime: dict | None = None, fast: bool = True):
    """A RunConfig from local-demo with overrides; runtime points at `volume`/runs/`run_id`."""
    from payload.config import RunConfig

    data = demo_dict()
    if fast:
        data["train"] = _merge(data["train"], FAST_TRAIN)
    data["train"] = _merge(data["train"], train or {})
    if model is not None:
        data["model"] = model
    data["runtime"] = _merge({"volume": str(volume), "run_id": run_id}, runtime or {})
    data["outputs"] = {"merge": False, "export_mlx": False}
    return RunConfig.model_validate(data)


VL_MODEL = {"name_or_path": "tiny-qwen3-vl", "kind": "image_text_to_text",
            "attn_implementation": ["sdpa", "eager"], "tiny": {"arch": "qwen3_vl"}}


def write_config(cfg, path: Path) -> Path:
    from payload.config import dump_run_config

    path = Path(path)
    path.write_text(dump_run_config(cfg))
    return path


# -------------------------------------------------------------------------------------------- data

_SUBJECTS = ["the cat", "a dog", "the sea", "my friend", "the model", "a bird", "the sun", "water"]
_VERBS = ["likes", "sees", "finds", "wants", "makes", "knows"]
_OBJECTS = ["the mat", "a book", "the park", "some water", "the answer", "a song", "the light"]


def text_records(n: int, seed: int) -> list[dict]:
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        s, v, o = rnd.choice(_SUBJECTS), rnd.choice(_VERBS), rnd.choice(_OBJECTS)
        answer = " ".join([f"{s.capitalize()} {v} {o}."] * rnd.randint(1, 4))
        out.append({"messages": [
            {"role": "system", "content": "You are Demo, a concise assistant."},
            {"role": "user", "content": f"What does {s} do? Tell me, item {i}."},
            {"role": "assistant", "content": answer}], "source": "synthetic"})
    return out


def _write_jsonl(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def write_text_data(run_dir: Path, n_train: int = 48, n_val: int = 6) -> None:
    _write_jsonl(Path(run_dir) / "data" / "train.jsonl", text_records(n_train, 1))
    _write_jsonl(Path(run_dir) / "data" / "val.jsonl", text_records(n_val, 2))


COLORS = {"red": (255, 0, 0), "green": (0, 255, 0), "blue": (0, 0, 255), "white": (255, 255, 255)}


def vl_records(image_dir: Path, n: int, seed: int) -> list[dict]:
    """Color questions about 40x48 images, with a text-only record every 4th."""
    from PIL import Image

    image_dir.mkdir(parents=True, exist_ok=True)
    for name, rgb in COLORS.items():
        if not (image_dir / f"{name}.png").exists():
            Image.new("RGB", (40, 48), rgb).save(image_dir / f"{name}.png")
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        c = rnd.choice(list(COLORS))
        if i % 4 == 3:
            msgs = [{"role": "user", "content": "Say hello."}, {"role": "assistant", "content": "Hello!"}]
        else:
            msgs = [{"role": "user", "content": [{"type": "image", "image": str(image_dir / f"{c}.png")},
                                                  {"type": "text", "text": "What color is the image?"}]},
                    {"role": "assistant", "content": f"The image is {c}."}]
        out.append({"messages": msgs, "source": "colors"})
    return out


def write_vl_data(run_dir: Path, n_train: int = 24, n_val: int = 4) -> None:
    images = Path(run_dir) / "images"
    _write_jsonl(Path(run_dir) / "data" / "train.jsonl", vl_records(images, n_train, 1))
    _write_jsonl(Path(run_dir) / "data" / "val.jsonl", vl_records(images, n_val, 2))


# ------------------------------------------------------------------------------------- subprocesses


RUNTIME_ENV = ("LAUNCH_VOLUME", "LAUNCH_RUN_ID", "SKYPILOT_TASK_ID", "LAUNCH_PRICE_PER_HOUR", "LAUNCH_BUDGET_USD")


def subprocess_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in RUNTIME_ENV}
    env.update({"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
                "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"})
    env.update({k: str(v) for k, v in extra.items()})
    return env


def payload_cmd(stage: str, config: Path) -> list[str]:
    return [sys.executable, "-m", "payload", stage, "--config", str(config)]


def run_payload(stage: str, config: Path, timeout: float = SUBPROCESS_TIMEOUT, **env) -> subprocess.CompletedProcess:
    return subprocess.run(payload_cmd(stage, config), cwd=REPO, env=subprocess_env(**env), capture_output=True,
                          text=True, timeout=timeout)


def start_payload(stage: str, config: Path, log: Path, **env) -> subprocess.Popen:
    out = open(log, "ab")
    return subprocess.Popen(payload_cmd(stage, config), cwd=REPO, env=subprocess_env(**env), stdout=out,
                            stderr=subprocess.STDOUT)


# ------------------------------------------------------------------------------------------ results


def adapter_tensors(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(Path(path) / "adapter_model.safetensors"))


def metrics(run_dir: Path) -> list[dict]:
    p = Path(run_dir) / "metrics.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines()] if p.exists() else []


def logged_losses(run_dir: Path) -> list[tuple]:
    """(step, kind, value) for every train and eval loss in metrics.jsonl."""
    out = []
    for r in metrics(run_dir):
        if r.get("loss") is not None:
            out.append((r["step"], "loss", r["loss"]))
        if r.get("eval_loss") is not None:
            out.append((r["step"], "eval_loss", r["eval_loss"]))
    return out


# ----------------------------------------------------------------------------------------- fixtures

import pytest  # noqa: E402


@pytest.fixture
def train_env(monkeypatch, tmp_path):
    """In-process training: one torch thread (as in the subprocesses), env restored afterwards."""
    import torch

    saved_env = dict(os.environ)
    saved_threads = torch.get_num_threads()
    for k in RUNTIME_ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("RANK", "0")
    torch.set_num_threads(1)
    yield tmp_path / "vol"
    torch.set_num_threads(saved_threads)
    os.environ.clear()
    os.environ.update(saved_env)


def train_in_process(cfg) -> dict:
    import payload.train.recipe as train

    return train.main(cfg)


_REFERENCE: dict = {}


def reference_run(tmp_path_factory) -> tuple:
    """One uninterrupted in-process run of the FAST_TRAIN config, shared by every test module of the
    session: (run_dir, adapter tensors, logged losses). Read it, copy it; never change it."""
    if "run" not in _REFERENCE:
        import torch

        saved_env, threads = dict(os.environ), torch.get_num_threads()
        for k in RUNTIME_ENV:
            os.environ.pop(k, None)
        os.environ.update({"HF_HUB_OFFLINE": "1", "RANK": "0"})
        torch.set_num_threads(1)
        try:
            cfg = make_config(tmp_path_factory.mktemp("ref") / "vol", "reference")
            write_text_data(cfg.run_dir)
            assert train_in_process(cfg)["state"] == "completed"
        finally:
            torch.set_num_threads(threads)
            os.environ.clear()
            os.environ.update(saved_env)
        _REFERENCE["run"] = (cfg.run_dir, adapter_tensors(cfg.run_dir / "outputs" / "adapter"),
                             logged_losses(cfg.run_dir))
    return _REFERENCE["run"]


KILL_TIMEOUT = 360  # seconds a kill/resume test waits for a training subprocess at most (3x the 120 s
# that failed test_sigkill_in_dpo_resumes_in_dpo_without_rerunning_sft on a ~3x loaded machine)


def wait_for(pred, proc, timeout: float = KILL_TIMEOUT, every: float = 0.001, what: str = "") -> bool:
    """True once `pred()` holds, False if `proc` ended first; fails the test after `timeout`, naming
    what it waited for (`what`, else the predicate's own source line) and how long."""
    start = time.monotonic()
    end = start + timeout
    while time.monotonic() < end:
        if pred():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(every)
    raise AssertionError(f"the training subprocess made no progress in time: waited {time.monotonic() - start:.0f} s "
                         f"for {what or _described(pred)}")


def _described(pred) -> str:
    import inspect

    try:
        return inspect.getsource(pred).strip()
    except (OSError, TypeError):
        return getattr(pred, "__name__", repr(pred))


def kill_marked(mark: str) -> None:
    """SIGKILL every process (but this one) whose environment has a variable starting with `mark`, e.g.
    `LAUNCH_VOLUME=<this test's dir>`: what a test started (a driver, a trainer, a stand-in that loops
    until a signal) does not outlive it, whether the test passed or failed before its own `down`."""
    import signal

    want = mark.encode()
    for env in Path("/proc").glob("[0-9]*/environ"):
        try:
            if int(env.parent.name) != os.getpid() and any(v.startswith(want) for v in env.read_bytes().split(b"\0")):
                os.kill(int(env.parent.name), signal.SIGKILL)
        except (OSError, ValueError):
            continue
