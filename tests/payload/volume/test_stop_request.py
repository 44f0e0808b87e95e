"""`launch down`'s save-and-exit request (payload/volume/stop_request.py), on a real tiny CPU training run:
the trainer sees the request file, saves a complete checkpoint whatever a save costs (a SIGTERM save is
skipped when it would outlast the signal's deadline), records it in status.json and exits 5; the next
session removes the old request and resumes from that checkpoint to the uninterrupted run's adapter."""

from __future__ import annotations

import json

import pytest

from train_fixtures import (
    KILL_TIMEOUT, adapter_tensors, make_config, reference_run, start_payload, train_env, train_in_process,
    wait_for, write_config, write_text_data,
)

from payload.volume import checkpoints as ck
from payload import layout
from payload.volume import stop_request
from payload.errors import EXIT_STOP_REQUESTED, state_for_exit

__all__ = ["train_env"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return reference_run(tmp_path_factory)


def test_a_stop_request_saves_a_complete_checkpoint_exits_5_and_resumes(reference, train_env, tmp_path):
    import torch

    _, ref_adapter, _ = reference
    cfg = make_config(train_env, "asked")
    write_text_data(cfg.run_dir)
    rd, log = cfg.run_dir, tmp_path / "train.log"
    # A save slower than any signal deadline: a SIGTERM would stop without saving; a request saves anyway.
    proc = start_payload("train", write_config(cfg, tmp_path / "run.yaml"), log)
    assert wait_for(lambda: (rd / layout.CHECKPOINTS_DIR / "checkpoint-4" / layout.COMPLETE_MARKER).exists(),
                    proc, every=0.01), log.read_text()[-3000:]
    by = "the launcher's budget check (billed spend reached budget.max_usd)"  # who asked: the end line says
    (rd / stop_request.REQUEST).write_text(json.dumps({"by": by}))
    assert proc.wait(timeout=KILL_TIMEOUT) == EXIT_STOP_REQUESTED == 5, log.read_text()[-3000:]
    assert state_for_exit(5) == "stopped"
    status = json.loads((rd / layout.STATUS).read_text())
    step = status["step"]
    assert (status["state"], status["exit_code"]) == ("stopped", 5) and step > 4
    assert status["final_checkpoint"] == f"checkpoints/checkpoint-{step}"
    assert status["reason"] == f"stopped by {by} at step {step} of 24; checkpoint-{step} saved (final)"
    assert ck.read_marker(rd / status["final_checkpoint"])["step"] == step  # the COMPLETE marker
    assert "stop requested (stop_request.json)" in log.read_text()
    # No `post` follows a stop: its training wrote the MANIFEST of what it has, before status.json said so.
    manifest = json.loads((rd / layout.MANIFEST).read_text())
    assert (manifest["state"], manifest["required"], manifest["missing"]) == ("stopped", [], [])
    assert {"checkpoints.json", "training_summary.json", "metrics.jsonl"} <= set(manifest["files"])
    listing = json.loads((rd / layout.CHECKPOINT_LISTING).read_text())
    assert (listing[-1]["step"], listing[-1]["complete"]) == (step, True)

    summary = train_in_process(cfg)  # the old request is removed: this session trains to the end
    assert summary["state"] == "completed" and summary["resumed_from"] == f"checkpoint-{step}"
    assert not (rd / stop_request.REQUEST).exists()
    assert not (rd / layout.MANIFEST).exists()  # the stop's MANIFEST went when training went on (post writes one)
    got = adapter_tensors(rd / layout.ADAPTER_DIR)
    assert all(torch.equal(got[k], ref_adapter[k]) for k in ref_adapter)
