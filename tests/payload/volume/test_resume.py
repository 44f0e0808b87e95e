"""Checkpoints, exact resume, budget stop, SIGTERM, retention, cost arithmetic.

The reference is one uninterrupted in-process run; the interrupted runs must end with the same
adapter tensors (torch.equal) and the same logged losses.
Run: .venv/bin/python -m pytest -x -q tests/payload/volume/test_resume.py
"""

from __future__ import annotations

import json
import logging
import math
import random
import shutil
import signal
import time
from pathlib import Path

import pytest

from train_fixtures import (
    adapter_tensors, logged_losses, make_config, metrics, reference_run, start_payload, train_env,
    train_in_process, wait_for, write_config, write_text_data, KILL_TIMEOUT,
)

from payload.volume import checkpoints as ck
from payload.volume.control import (INITIAL_SAVE_ESTIMATE_S, RunControl, StopSignal, save_interval_s,
                                    young_interval_s)
from payload import layout
from payload.errors import BudgetExhausted
from payload.volume.money import CostTracker

__all__ = ["train_env"]



@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One uninterrupted run of the FAST_TRAIN config: (run_dir, adapter tensors, logged losses)."""
    return reference_run(tmp_path_factory)


def assert_same_adapter(run_dir: Path, expected: dict) -> None:
    import torch

    got = adapter_tensors(run_dir / layout.ADAPTER_DIR)
    assert got.keys() == expected.keys()
    for k in expected:
        assert torch.equal(got[k], expected[k]), k


def _incomplete(run_dir: Path) -> bool:
    return any(not ok for _, _, ok in ck.list_checkpoints(ck.checkpoints_dir(run_dir)))


def _stop(proc, sig=signal.SIGKILL) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
    return proc.wait(timeout=KILL_TIMEOUT)


# -------------------------------------------------------------------------------------- exact resume


def test_sigkill_at_random_moments_then_resume_is_bit_exact(reference, tmp_path):
    ref_dir, ref_adapter, ref_losses = reference
    cfg = make_config(tmp_path / "vol", "killed")
    write_text_data(cfg.run_dir)
    config = write_config(cfg, tmp_path / "run.yaml")
    rd, log = cfg.run_dir, tmp_path / "train.log"
    rnd = random.Random(20240607)
    kills = []
    # 1st: while a checkpoint is being written (a checkpoint-N directory without its marker).
    proc = start_payload("train", config, log)
    hit = wait_for(lambda: _incomplete(rd), proc)
    _stop(proc)
    kills.append(("during-save" if hit else "exited", _incomplete(rd)))
    # 2nd and 3rd: at a random moment after the restarted run made progress past its checkpoint.
    for _ in range(2):
        start = ck.latest_complete(ck.checkpoints_dir(rd))
        resumed = ck.step_of(start) if start else 0
        proc = start_payload("train", config, log)
        wait_for(lambda: any(r["step"] > resumed for r in metrics(rd)), proc, every=0.01)
        time.sleep(rnd.uniform(0.0, 0.8))
        kills.append(("random", _stop(proc)))
    proc = start_payload("train", config, log)
    assert proc.wait(timeout=KILL_TIMEOUT) == 0, log.read_text()[-3000:]
    assert kills[0] == ("during-save", True), kills  # the first kill caught a save half-way
    assert_same_adapter(rd, ref_adapter)
    assert logged_losses(rd) == ref_losses
    summary = json.loads((rd / layout.SUMMARY).read_text())
    assert summary["state"] == "completed" and summary["steps"] == 24
    assert summary["sessions"] >= 2  # cost accumulated over the restarts
    assert not _incomplete(rd)


def test_budget_stop_leaves_resumable_checkpoint_and_half_written_one_is_skipped(reference, train_env):
    _, ref_adapter, _ = reference
    # $100 a second against a $1 budget: exhausted by the first step.
    cfg = make_config(train_env, "budget", runtime={"price_per_hour": 360000.0, "budget_usd": 1.0})
    write_text_data(cfg.run_dir)
    with pytest.raises(BudgetExhausted, match="budget of \\$1.00 reached") as info:
        train_in_process(cfg)
    assert info.value.exit_code == 3
    rd, root = cfg.run_dir, ck.checkpoints_dir(cfg.run_dir)
    saved = ck.latest_complete(root)
    stopped = ck.step_of(saved)
    assert saved is not None and 0 < stopped < 24
    status = json.loads((rd / layout.STATUS).read_text())
    assert status["state"] == "budget_exhausted" and status["step"] == stopped and status["exit_code"] == 3
    assert status["reason"].startswith("budget of $1.00 reached at step")
    assert json.loads((rd / layout.SUMMARY).read_text())["state"] == "budget_exhausted"
    assert not (rd / layout.ADAPTER_DIR).exists()
    assert json.loads((rd / layout.MANIFEST).read_text())["state"] == "budget_exhausted"  # no post follows a stop
    # A later save that was cut off: files there, marker missing, one file truncated.
    half = root / f"checkpoint-{stopped + 5}"
    shutil.copytree(saved, half)
    (half / layout.COMPLETE_MARKER).unlink()
    (half / "adapter_model.safetensors").write_bytes(b"\0" * 10)
    spent = json.loads((rd / layout.COST).read_text())["usd"]
    summary = train_in_process(cfg.model_copy(update={"runtime": cfg.runtime.model_copy(update={"budget_usd": 1e12})}))
    assert summary["state"] == "completed" and summary["resumed_from"] == saved.name
    assert not half.exists()
    assert_same_adapter(rd, ref_adapter)
    cost = json.loads((rd / layout.COST).read_text())
    assert cost["sessions"] == 2 and cost["usd"] > spent


def test_sigterm_stops_at_a_step_boundary_and_resumes(reference, train_env, tmp_path):
    _, ref_adapter, _ = reference
    cfg = make_config(train_env, "sigterm")
    write_text_data(cfg.run_dir)
    rd, log = cfg.run_dir, tmp_path / "train.log"
    proc = start_payload("train", write_config(cfg, tmp_path / "run.yaml"), log)
    wait_for(lambda: (rd / layout.CHECKPOINTS_DIR / "checkpoint-4" / layout.COMPLETE_MARKER).exists(), proc, every=0.01)
    assert _stop(proc, signal.SIGTERM) == 143, log.read_text()[-3000:]
    assert "stopped by SIGTERM at step" in log.read_text()
    status = json.loads((rd / layout.STATUS).read_text())
    assert status["state"] == "stopped" and status["exit_code"] == 143 and "saved" in status["reason"]
    written = json.loads((rd / layout.MANIFEST).read_text())  # a signal's stop leaves a MANIFEST too
    assert written["state"] == "stopped" and {"checkpoints.json", "metrics.jsonl"} <= set(written["files"])
    assert not _incomplete(rd)
    stopped = ck.step_of(ck.latest_complete(ck.checkpoints_dir(rd)))
    assert stopped >= 4
    summary = train_in_process(cfg)
    assert summary["state"] == "completed" and summary["resumed_from"] == f"checkpoint-{stopped}"
    assert_same_adapter(rd, ref_adapter)


# ----------------------------------------------------------------------------------- checkpoint rules


def _fake_checkpoint(root: Path, step: int, eval_loss=None, complete=True) -> Path:
    p = root / f"checkpoint-{step}"
    p.mkdir(parents=True)
    (p / "adapter_model.safetensors").write_bytes(b"x")
    if complete:
        ck.write_marker(p, {"step": step, "eval_loss": eval_loss})
    return p


def test_retention_keeps_best_and_most_recent(tmp_path):
    tmp_path = tmp_path / "checkpoints"
    losses = {2: 3.0, 4: 1.5, 6: 2.0, 8: None, 10: 2.5}
    for step, loss in losses.items():
        _fake_checkpoint(tmp_path, step, loss)
    ck.apply_retention(tmp_path, keep_best=1, keep_recent=2)
    assert [s for s, _, _ in ck.list_checkpoints(tmp_path)] == [4, 8, 10]
    assert ck.best_checkpoint(tmp_path).name == "checkpoint-4"
    ck.apply_retention(tmp_path, keep_best=0, keep_recent=1)
    assert [s for s, _, _ in ck.list_checkpoints(tmp_path)] == [10]
    assert not list(tmp_path.glob(".trash-*"))


def test_incomplete_checkpoints_are_ignored_and_cleaned(tmp_path):
    tmp_path = tmp_path / "checkpoints"
    _fake_checkpoint(tmp_path, 4, 1.0)
    _fake_checkpoint(tmp_path, 8, complete=False)
    (tmp_path / ".trash-checkpoint-2").mkdir()
    assert ck.latest_complete(tmp_path).name == "checkpoint-4"
    removed = ck.clean_incomplete(tmp_path)
    assert [p.name for p in removed] == ["checkpoint-8"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-4"]
    assert ck.read_marker(tmp_path / "checkpoint-4")["eval_loss"] == 1.0


def test_save_interval_from_youngs_formula():
    from payload.config import CheckpointConfig

    assert young_interval_s(30.0, 4.0) == pytest.approx(math.sqrt(2 * 30 * 4 * 3600))
    assert save_interval_s(CheckpointConfig(save_every_minutes=15), 30.0) == 900.0
    spot = CheckpointConfig(expected_preemption_hours=2.0)
    assert save_interval_s(spot, 8.0) == pytest.approx(math.sqrt(2 * 8 * 7200))
    assert save_interval_s(spot, None) == pytest.approx(math.sqrt(2 * INITIAL_SAVE_ESTIMATE_S * 7200))
    assert save_interval_s(CheckpointConfig(), 8.0) is None  # on-demand: step-based saving only


def test_time_based_save_waits_for_a_logging_boundary():
    import torch
    from transformers import TrainerControl, TrainerState

    from payload.config import CheckpointConfig

    class Args:
        device = torch.device("cpu")

    ctl = RunControl(CheckpointConfig(save_every_minutes=1e-5), StopSignal(), logging_steps=4)
    state, control = TrainerState(max_steps=100), TrainerControl()
    ctl.on_train_begin(Args(), state, control)
    time.sleep(0.01)  # past the 0.6 ms interval
    saves = []
    for step in range(1, 9):
        state.global_step = step
        control.should_save = False
        ctl.on_step_end(Args(), state, control)
        saves.append(control.should_save)
        if control.should_save:
            ctl.note_save(0.1)
            time.sleep(0.01)
    assert saves == [False, False, False, True, False, False, False, True]


def test_cost_accumulates_across_restarts_warns_and_stops(tmp_path, caplog):
    now = [0.0]
    first = CostTracker(tmp_path, price_per_hour=3.6, budget_usd=0.01, clock=lambda: now[0])
    now[0] = 5.0  # 5 s at $3.6/h = $0.005
    assert first.usd() == pytest.approx(0.005) and not first.exhausted()
    first.save()
    second = CostTracker(tmp_path, price_per_hour=3.6, budget_usd=0.01, clock=lambda: now[0])
    assert second.sessions == 2 and second.usd() == pytest.approx(0.005)
    with caplog.at_level(logging.WARNING, logger="payload.train"):
        now[0] = 9.5
        assert not second.exhausted()  # $0.0095: 95%
        assert "95% of the $0.01 budget" in caplog.text
        # ... and in status.json, where `launch status` shows it (once: the tracker warns once)
        warning = json.loads((tmp_path / layout.STATUS).read_text())["budget_warning"]
        assert "95% of the $0.01 budget (warning at 90%)" in warning and warning == second.warning
        now[0] = 10.0
        assert second.exhausted()
    assert second.eta_s(step=10, max_steps=40, session_steps=10, session_train_s=5.0) == pytest.approx(15.0)
    assert second.projected_usd(15.0) == pytest.approx(0.01 + 0.015)
    second.save()
    saved = json.loads((tmp_path / layout.COST).read_text())
    assert saved["seconds"] == pytest.approx(10.0) and saved["usd"] == pytest.approx(0.01)
