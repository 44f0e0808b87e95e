"""Tracking where the user looks: the W&B URL and the TensorBoard command in status.json and the training
summary, and each step window's GPU figures in metrics.jsonl and status.json (on CPU: not measured)."""

from __future__ import annotations

import json

import pytest

from payload import layout
from payload.outputs import tracking
from tests.train_fixtures import make_config, metrics, train_env, train_in_process  # noqa: F401


def test_a_cpu_run_says_gpu_not_measured(train_env, monkeypatch):
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    cfg = make_config(train_env, train={"max_steps": 4, "logging_steps": 2, "eval_steps": 4})
    summary = train_in_process(cfg)
    rd = cfg.run_dir
    train_lines = [r for r in metrics(rd) if r.get("loss") is not None]
    assert [r["step"] for r in train_lines] == [2, 4]
    for r in train_lines:  # never a number where nothing was measured
        assert r["gpu_not_measured"] == "no CUDA device"
        assert "gpu_peak_memory_gb" not in r and "gpu_util_mean_pct" not in r
    assert all("gpu_not_measured" not in r for r in metrics(rd) if r.get("eval_loss") is not None)
    status = json.loads((rd / layout.STATUS).read_text())
    assert status["gpu_not_measured"] == "no CUDA device" and status["gpu_peak_memory_gb"] is None
    assert "wandb_url" not in status and "tensorboard" not in status and "tensorboard" not in summary


def test_tensorboard_logs_say_the_command_that_opens_them(tmp_path, monkeypatch):
    monkeypatch.delenv("TENSORBOARD_LOGGING_DIR", raising=False)
    monkeypatch.setattr(tracking, "_RUN", None)
    cfg = make_config(tmp_path, train={"report_to": ["tensorboard"]})
    tracking.start(cfg)
    status = json.loads((cfg.run_dir / layout.STATUS).read_text())
    command = f"tensorboard --logdir {cfg.run_dir / 'logs' / 'tensorboard'}"
    assert status["tensorboard"] == command and status["tensorboard_logdir"] == "logs/tensorboard"
    assert tracking.links(cfg) == {"tensorboard": command, "tensorboard_logdir": "logs/tensorboard"}
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "elsewhere"))  # the user's own: not fetched
    assert tracking.links(cfg)["tensorboard_logdir"] == str(tmp_path / "elsewhere")


class FakeWandbRun:
    """The run wandb.init returns (its service is the network edge): id and url as wandb gives them."""

    id, url = "local-demo-run-train", "https://wandb.ai/someone/launch/runs/local-demo-run-train"


def test_the_wandb_url_goes_into_status_json(tmp_path, monkeypatch):
    cfg = make_config(tmp_path)
    monkeypatch.setattr(tracking, "_RUN", None)

    def start(cfg, job_type):
        tracking._RUN = FakeWandbRun()
        return tracking._RUN

    monkeypatch.setattr(tracking, "_start", start)
    assert tracking.start(cfg) is tracking._RUN
    status = json.loads((cfg.run_dir / layout.STATUS).read_text())
    assert status["wandb_url"] == FakeWandbRun.url and "tensorboard" not in status
    assert tracking.links(cfg) == {"wandb_url": FakeWandbRun.url}
    tracking._RUN = None


class State:
    is_world_process_zero, global_step = True, 10


@pytest.fixture
def on_cuda(monkeypatch):
    """A CUDA device as torch reports it (none here): utilisation samples and the allocator's peak."""
    import torch

    samples = iter([80.0, 90.0, 100.0, 50.0])
    monkeypatch.setattr(tracking, "_cuda", lambda: True)
    monkeypatch.setattr(torch.cuda, "utilization", lambda *a: next(samples))
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda *a: 41_234_000_000)


def test_a_window_is_the_mean_utilisation_of_its_steps_and_the_peak_so_far(tmp_path, on_cuda):
    window = tracking.GpuWindow(tmp_path)
    for _ in range(3):
        window.on_step_end(None, State(), None)
    logs = {"loss": 1.0}
    window.on_log(None, State(), None, logs=logs)
    assert logs == {"loss": 1.0, "gpu_peak_memory_gb": 41.234, "gpu_util_mean_pct": 90.0}
    window.on_step_end(None, State(), None)
    logs = {"loss": 0.9}
    window.on_log(None, State(), None, logs=logs)
    assert logs["gpu_util_mean_pct"] == 50.0  # the next window's own samples
    status = json.loads((tmp_path / layout.STATUS).read_text())
    assert status["gpu_util_mean_pct"] == 50.0 and status["gpu_not_measured"] is None


def test_without_nvml_utilisation_is_said_not_measured(tmp_path, on_cuda, monkeypatch):
    import torch

    def no_nvml(*a):
        raise ModuleNotFoundError("pynvml")

    monkeypatch.setattr(torch.cuda, "utilization", no_nvml)
    window = tracking.GpuWindow(tmp_path)
    window.on_step_end(None, State(), None)
    logs = {"loss": 1.0}
    window.on_log(None, State(), None, logs=logs)
    assert logs["gpu_peak_memory_gb"] == 41.234 and "gpu_util_mean_pct" not in logs
    assert logs["gpu_not_measured"].startswith("utilisation not measured (ModuleNotFoundError: needs nvidia-ml-py")
