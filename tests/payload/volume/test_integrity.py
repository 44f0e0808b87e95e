"""Integrity drills: damaged checkpoints, the run's lease, named ends, the stop details.

The reference is the uninterrupted FAST_TRAIN run shared with test_resume (train_fixtures.reference_run).
Damage drills copy its run directory (checkpoints 20 and 24 kept), damage checkpoint-24 while keeping
its COMPLETE marker, and resume in-process: the run must complete from checkpoint-20 with the
reference's final adapter and logged losses, the damaged checkpoint set aside in quarantine.
Run: .venv/bin/python -m pytest -q tests/payload/volume/test_integrity.py
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from train_fixtures import (
    adapter_tensors, logged_losses, make_config, metrics, reference_run, train_env, train_in_process,
    write_config, write_text_data,
)

from payload.volume import checkpoints as ck
from payload.volume.control import RunControl, StopSignal, TrainingInterrupted
from payload import layout
from payload.volume import checksums
from payload.volume import lease
from payload.volume import verify
from payload.errors import EXIT_CRASH, EXIT_TRANSIENT, PayloadError, exit_code_for

__all__ = ["train_env"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return reference_run(tmp_path_factory)


@pytest.fixture
def logs(caplog):
    """caplog that sees the payload's loggers (observe.setup_logging stops their propagation)."""
    import logging

    from payload.volume.observe import setup_logging

    setup_logging()  # once per process: later calls leave `propagate` alone
    logger = logging.getLogger("payload")
    before, logger.propagate = logger.propagate, True
    caplog.set_level(logging.INFO, logger="payload")
    yield caplog
    logger.propagate = before


def assert_same_adapter(run_dir: Path, expected: dict) -> None:
    import torch

    got = adapter_tensors(run_dir / layout.ADAPTER_DIR)
    assert got.keys() == expected.keys()
    for k in expected:
        assert torch.equal(got[k], expected[k]), k


def copy_reference(reference, volume: Path):
    """The reference run dir under `volume`, as if killed after its last save: no outputs, no status."""
    ref_dir = reference[0]
    cfg = make_config(volume, "reference")
    shutil.copytree(ref_dir, cfg.run_dir)
    shutil.rmtree(cfg.run_dir / layout.OUTPUTS_DIR)
    (cfg.run_dir / layout.STATUS).unlink()
    root = ck.checkpoints_dir(cfg.run_dir)
    assert [s for s, _, ok in ck.list_checkpoints(root) if ok] == [20, 24]
    return cfg


def _truncate(path: Path) -> None:
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


DAMAGE = {
    "truncated": ("adapter_model.safetensors", _truncate, "truncated"),
    "missing": ("optimizer.pt", lambda p: p.unlink(), "missing"),
    "checksum": ("optimizer.pt", _flip, "checksum"),
}


# ------------------------------------------------------------------------------- damaged checkpoints


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_damaged_newest_checkpoint_falls_back_and_completes_exactly(reference, train_env, kind, logs):
    _, ref_adapter, ref_losses = reference
    cfg = copy_reference(reference, train_env)
    root = ck.checkpoints_dir(cfg.run_dir)
    name, damage, why = DAMAGE[kind]
    damage(root / "checkpoint-24" / name)
    assert ck.is_complete(root / "checkpoint-24")  # the marker stays: only verification can tell
    summary = train_in_process(cfg)
    assert summary["state"] == "completed" and summary["resumed_from"] == "checkpoint-20"
    assert_same_adapter(cfg.run_dir, ref_adapter)
    assert logged_losses(cfg.run_dir) == ref_losses
    kept = list((root / verify.QUARANTINE_DIR).iterdir())
    assert [p.name for p in kept] == [f"checkpoint-24-{why}"] and (kept[0] / layout.COMPLETE_MARKER).is_file()
    assert f"skipping checkpoint-24 for resume: {name}" in logs.text
    assert [s for s, _, ok in ck.list_checkpoints(root) if ok] == [20, 24]  # retention ignores quarantine


def test_no_checkpoint_verifies_is_one_line_exit_2(reference, train_env, tmp_path, capsys):
    from payload.__main__ import main

    cfg = copy_reference(reference, train_env)
    root = ck.checkpoints_dir(cfg.run_dir)
    _flip(root / "checkpoint-20" / "adapter_model.safetensors")
    (root / "checkpoint-24" / "scheduler.pt").unlink()
    assert main(["train", "--config", str(write_config(cfg, tmp_path / "run.yaml"))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("payload train: no checkpoint of this run verifies (checkpoint-24: "
                                               "scheduler.pt is missing | checkpoint-20: adapter_model")
    assert "Run again to train this run from step 0" in err[0] and "--new" in err[0]
    assert sorted(p.name for p in (root / verify.QUARANTINE_DIR).iterdir()) == [
        "checkpoint-20-checksum", "checkpoint-24-missing"]
    status = json.loads((cfg.run_dir / layout.STATUS).read_text())
    assert status["state"] == "failed" and status["exit_code"] == 2 and "verifies" in status["reason"]


def test_legacy_marker_is_used_unverified(tmp_path, logs):
    p = tmp_path / "checkpoint-4"
    p.mkdir()
    (p / "adapter_model.safetensors").write_bytes(b"x" * 10)
    ck.write_marker(p, {"step": 4})
    assert verify.verify_checkpoint(p) == [] and "used unverified" in logs.text
    ck.write_marker(p, {"step": 4, "files": ck.digest_checkpoint(p)})
    assert verify.verify_checkpoint(p) == []
    (p / "adapter_model.safetensors").write_bytes(b"y" * 10)
    assert [x.kind for x in verify.verify_checkpoint(p)] == ["checksum"]


def test_damaged_export_is_exported_again_before_merge_and_export(reference, train_env, logs):
    ref_dir, ref_adapter, _ = reference
    cfg = make_config(train_env, "reference")
    shutil.copytree(ref_dir, cfg.run_dir)
    adapter = cfg.run_dir / layout.ADAPTER_DIR
    assert subprocess.run(["sha256sum", "--quiet", "-c", checksums.SUMS_FILE], cwd=adapter).returncode == 0
    assert verify.ensure_export(cfg.run_dir) == adapter  # intact: nothing happens
    _flip(adapter / "adapter_model.safetensors")
    verify.ensure_export(cfg.run_dir)
    assert "is damaged (adapter_model.safetensors does not match its sha256" in logs.text
    assert (adapter.parent / "adapter.damaged-checksum").is_dir()
    assert_same_adapter(cfg.run_dir, ref_adapter)
    # Every checkpoint damaged as well: nothing good left to export, one line says so.
    _flip(adapter / "adapter_model.safetensors")
    for c in ck.checkpoints_dir(cfg.run_dir).glob("checkpoint-*"):
        _flip(c / "adapter_model.safetensors")
    with pytest.raises(PayloadError, match="no checkpoint verifies to export it again"):
        verify.ensure_export(cfg.run_dir)


def test_artifacts_are_deterministic(reference):
    ref_dir = reference[0]
    config = json.loads((ref_dir / layout.ADAPTER_DIR / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == "tiny-qwen3"  # as the config names it, no absolute path
    assert config["target_modules"] == sorted(config["target_modules"])
    text = (ref_dir / layout.ADAPTER_DIR / "adapter_config.json").read_text()
    assert text == json.dumps(config, indent=2, sort_keys=True) + "\n"
    marker = ck.read_marker(ck.checkpoints_dir(ref_dir) / "checkpoint-24")
    assert "optimizer.pt" in marker["files"] and "loss_state_0.json" in marker["files"]


# -------------------------------------------------------------------------------------- stop details


def test_resume_from_the_final_checkpoint_trains_no_extra_step(train_env, logs):
    # max_steps ends mid-epoch (24 steps per epoch): the Trainer would otherwise train step 11.
    cfg = make_config(train_env, "final", train={"max_steps": 10, "eval_steps": 5,
                                                 "checkpoints": {"save_steps": 5}})
    write_text_data(cfg.run_dir)
    assert train_in_process(cfg)["steps"] == 10
    adapter, losses = adapter_tensors(cfg.run_dir / layout.ADAPTER_DIR), logged_losses(cfg.run_dir)
    shutil.rmtree(cfg.run_dir / layout.OUTPUTS_DIR)  # killed after the final save, before the outputs
    summary = train_in_process(cfg)
    assert summary["state"] == "completed" and summary["steps"] == 10 and summary["train_runtime_s"] == 0.0
    assert "nothing left to train" in logs.text
    assert not (ck.checkpoints_dir(cfg.run_dir) / "checkpoint-11").exists()
    assert_same_adapter(cfg.run_dir, adapter)
    assert logged_losses(cfg.run_dir) == losses


def test_sigterm_before_the_first_checkpoint_saves_and_the_logged_loss_is_unchanged(
        reference, train_env, monkeypatch):
    _, ref_adapter, ref_losses = reference
    cfg = make_config(train_env, "early-term")
    write_text_data(cfg.run_dir)
    step_end = RunControl.on_step_end

    def sigterm_at_step_3(self, args, state, control, **kw):  # between logging steps 2 and 4
        if state.global_step == 3:
            self.stop.signum = signal.SIGTERM
        return step_end(self, args, state, control, **kw)

    monkeypatch.setattr(RunControl, "on_step_end", sigterm_at_step_3)
    with pytest.raises(TrainingInterrupted) as info:
        train_in_process(cfg)
    assert info.value.exit_code == 143
    status = json.loads((cfg.run_dir / layout.STATUS).read_text())
    assert status["state"] == "stopped" and status["exit_code"] == 143
    assert status["reason"] == "stopped by SIGTERM at step 3 of 24; checkpoint-3 saved"
    assert ck.latest_complete(ck.checkpoints_dir(cfg.run_dir)).name == "checkpoint-3"
    monkeypatch.setattr(RunControl, "on_step_end", step_end)
    summary = train_in_process(cfg)
    assert summary["state"] == "completed" and summary["resumed_from"] == "checkpoint-3"
    assert_same_adapter(cfg.run_dir, ref_adapter)
    assert logged_losses(cfg.run_dir) == ref_losses  # step 4's loss averages steps 3 and 4, as uninterrupted
    keys = ("step", "loss", "lr", "grad_norm", "real_token_fraction")
    ref = [{k: r.get(k) for k in keys} for r in metrics(reference[0])]
    assert [{k: r.get(k) for k in keys} for r in metrics(cfg.run_dir)] == ref


def test_a_lost_lease_stops_training_without_saving():
    import torch
    from transformers import TrainerControl, TrainerState

    from payload.config import CheckpointConfig

    class Args:
        device = torch.device("cpu")

    class Lost:
        lost = True

    ctl = RunControl(CheckpointConfig(), StopSignal(), lease=Lost())
    state, control = TrainerState(max_steps=10, global_step=10), TrainerControl()
    ctl.on_step_end(Args(), state, control)
    assert control.should_training_stop and not control.should_save and ctl.reason == "lease_lost"


# --------------------------------------------------------------------------------------------- lease


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def _write_lease(run_dir: Path, **over) -> lease.Holder:
    h = lease.Holder.me("r")
    for k, v in over.items():
        setattr(h, k, v)
    run_dir.mkdir(parents=True, exist_ok=True)
    lease.lease_path(run_dir).write_text(h.dumps())
    return h


def test_lease_refuses_a_live_holder_and_takes_over_a_stale_one(tmp_path, logs):
    rd = tmp_path / "run"
    # Another machine, heartbeat fresh: refused, with host, pid and age.
    _write_lease(rd, host="pod-7", boot_id="b", pid=4242, heartbeat=time.time() - 5)
    with pytest.raises(lease.LeaseHeld, match=r"pid 4242 on pod-7, heartbeat 5 s ago: stop it first") as e:
        lease.acquire(rd, "r")
    assert e.value.exit_code == 4
    with pytest.raises(lease.LeaseHeld):
        lease.ensure_free(rd, "r")
    # The same machine, a live process (this one): refused whatever the heartbeat's age.
    _write_lease(rd, heartbeat=time.time() - 3600)
    with pytest.raises(lease.LeaseHeld, match=f"pid {os.getpid()} on {socket.gethostname()}"):
        lease.acquire(rd, "r")
    # Stale: another machine silent past STALE_S, or this machine's holder gone.
    for stale in ({"host": "pod-7", "heartbeat": time.time() - lease.STALE_S - 1}, {"pid": _dead_pid()}):
        _write_lease(rd, **stale)
        lease.ensure_free(rd, "r")
        held = lease.acquire(rd, "r")
        assert lease.read(rd).token == held.holder.token and "took over this run's stale lease" in logs.text
        held.release()
        assert not lease.lease_path(rd).exists()


def test_lease_without_hard_links_and_an_unreadable_lease(tmp_path, monkeypatch):
    rd = tmp_path / "run"
    rd.mkdir()
    path = lease.lease_path(rd)
    path.write_text("{torn")  # unreadable and recent: maybe being written, so not taken over yet
    with pytest.raises(lease.LeaseHeld, match="could not take the lease"):
        lease.acquire(rd, "r", tries=2)
    os.utime(path, (time.time() - 3600, time.time() - 3600))  # unreadable and old: taken over
    lease.acquire(rd, "r").release()

    def no_links(src, dst):  # FUSE bucket mounts (gcsfuse, blobfuse) have no hard links
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    held = lease.acquire(rd, "r")
    assert lease.read(rd).token == held.holder.token
    with pytest.raises(lease.LeaseHeld):
        lease.acquire(rd, "r")
    held.release()
    assert not path.exists() and not list(rd.glob(".*tmp"))


def test_lease_heartbeat_notices_a_takeover(tmp_path):
    rd = tmp_path / "run"
    held = lease.acquire(rd, "r")
    first = lease.read(rd).heartbeat
    time.sleep(0.01)
    assert held.refresh() and lease.read(rd).heartbeat > first
    other = _write_lease(rd, host="pod-9", token="someone-else")
    assert not held.refresh() and held.lost
    held.release()
    assert lease.read(rd).token == other.token  # not ours: left alone


def test_train_refuses_while_another_trainer_holds_the_run(train_env, tmp_path, capsys):
    from payload.__main__ import main

    cfg = make_config(train_env, "held")
    write_text_data(cfg.run_dir)
    (cfg.run_dir / layout.STATUS).write_text('{"state": "training", "step": 7}')
    holder = _write_lease(cfg.run_dir, host="pod-3", boot_id="b", pid=99, heartbeat=time.time())
    config = write_config(cfg, tmp_path / "run.yaml")
    for stage in ("data", "train"):
        assert main([stage, "--config", str(config)]) == 4
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and re.fullmatch(
            f"payload {stage}: run held is being trained by pid 99 on pod-3, heartbeat \\d+ s ago: stop it first "
            r"\(`launch down held`\), or wait: a lease without heartbeat for 60 s is taken over", err[0]), err
    assert json.loads((cfg.run_dir / layout.STATUS).read_text()) == {"state": "training", "step": 7}
    assert lease.read(cfg.run_dir).token == holder.token


# --------------------------------------------------------------------------------- exit codes, states


class DistNetworkError(RuntimeError):
    """Stands in for torch.distributed's (recognised by name)."""


@pytest.mark.parametrize("exc, code", [
    (ConnectionResetError("peer reset"), EXIT_TRANSIENT),
    (RuntimeError("NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error"), EXIT_TRANSIENT),
    (DistNetworkError("rendezvous lost"), EXIT_TRANSIENT),
    (RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB (NCCL buffers)"), EXIT_CRASH),
    (ValueError("bad shape"), EXIT_CRASH),
    (PayloadError("fix the config"), 2),
    (KeyboardInterrupt(), 143),
])
def test_exit_codes_of_exceptions(exc, code):
    assert exit_code_for(exc) == code


def test_a_network_failure_under_a_wrapper_is_transient():
    try:
        try:
            raise TimeoutError("read timed out")
        except TimeoutError as inner:
            raise OSError("could not download model.safetensors") from inner
    except OSError as e:
        assert exit_code_for(e) == EXIT_TRANSIENT


def test_checksums_share_the_work_and_catch_every_change(tmp_path):
    for name, size in (("a.bin", 5000), ("b.bin", 3000), ("c/d.bin", 2500), ("e.txt", 10)):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(os.urandom(size))
    sizes = checksums.list_files(tmp_path)
    shares = [checksums.share(sizes, r, 2) for r in range(2)]
    assert sorted(shares[0] + shares[1]) == sorted(sizes) and shares == [["a.bin", "e.txt"], ["b.bin", "c/d.bin"]]
    listing = checksums.digest(tmp_path, list(sizes))
    assert checksums.check(tmp_path, listing) == []
    (tmp_path / "c/d.bin").unlink()
    _truncate(tmp_path / "a.bin")
    assert [p.kind for p in checksums.check(tmp_path, listing)] == ["truncated", "missing"]


def test_a_trainer_killed_mid_takeover_delays_the_next_start_but_does_not_fail_it(tmp_path, monkeypatch, logs):
    """A trainer SIGKILLed while taking over a stale lease leaves the takeover mutex behind: the next
    trainer waits until that mutex is stale, then takes the lease (before: exit 4 after 5 quick tries)."""
    monkeypatch.setattr(lease, "MUTEX_STALE_S", 1.0)
    rd = tmp_path / "run"
    _write_lease(rd, pid=_dead_pid())  # the lease of a trainer that is gone
    mutex = lease.lease_path(rd).with_name(lease.lease_path(rd).name + ".takeover")
    mutex.mkdir()  # ... and the mutex of the trainer killed while taking it over
    waited, real_sleep = [], time.sleep
    monkeypatch.setattr(lease.time, "sleep", lambda s: (waited.append(mutex.exists()), real_sleep(s)))
    held = lease.acquire(rd, "r")
    assert lease.read(rd).token == held.holder.token and "took over this run's stale lease" in logs.text
    assert waited[0] is True and not mutex.exists()  # it waited while the mutex was held, then took it over
    held.release()
