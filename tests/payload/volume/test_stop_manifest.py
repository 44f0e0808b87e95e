"""Every stop leaves a MANIFEST (payload/outputs/manifest.py): a run with `stages:` stopped mid-stage by
`launch down`'s request, or by the budget before a stage, gets the outputs it has then (the finished
stages' adapters, the metrics so far) and their sha256, so `launch down --fetch-artifacts` verifies what
it fetches instead of checking sizes. (A one-stage run stopped by SIGTERM: tests/payload/volume/test_resume.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stage_fixtures import stage_config, write_stage_data
from train_fixtures import KILL_TIMEOUT, start_payload, train_env, wait_for, write_config

from payload import layout
from payload.errors import BudgetExhausted
from payload.outputs import manifest
from payload.volume import checkpoints as ck
from payload.volume import stop_request

__all__ = ["train_env"]

SFT_ADAPTER = "stages/1-sft/adapter/adapter_model.safetensors"  # MANIFEST name of outputs/stages/1-sft/adapter/...


def _describes_the_disk(rd: Path) -> dict:
    """The MANIFEST, checked against the files as they are now (what a fetch verifies)."""
    written = json.loads((rd / layout.MANIFEST).read_text())
    assert written["files"] == manifest.build(rd, [])["files"]
    return written


def test_a_stop_request_in_the_second_stage_leaves_the_runs_outputs_and_their_manifest(tmp_path):
    data = write_stage_data(tmp_path / "data")
    cfg = stage_config(tmp_path / "vol", data, run_id="asked", steps=(2, 40, 2), save_steps=2)
    rd, log = cfg.run_dir, tmp_path / "train.log"
    dpo = rd / "stages" / "2-dpo"
    proc = start_payload("train", write_config(cfg, tmp_path / "run.yaml"), log)
    try:
        assert wait_for(lambda: ck.latest_complete(ck.checkpoints_dir(dpo)) is not None, proc, every=0.01), \
            log.read_text()[-3000:]
        (rd / stop_request.REQUEST).write_text(json.dumps({"by": "launch down"}))
        assert proc.wait(timeout=KILL_TIMEOUT) == 5, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    status = json.loads((rd / layout.STATUS).read_text())
    step = status["step"]
    assert (status["state"], status["stage"]["name"]) == ("stopped", "dpo")
    assert status["final_checkpoint"] == f"stages/2-dpo/checkpoints/checkpoint-{step}"
    written = _describes_the_disk(rd)
    assert (written["state"], written["required"], written["missing"]) == ("stopped", [], [])
    assert {SFT_ADAPTER, "metrics.jsonl"} <= set(written["files"])  # the finished stage's adapter is an output
    stages_logged = {json.loads(x)["stage"] for x in (rd / layout.METRICS).read_text().splitlines()}
    assert stages_logged == {"1-sft", "2-dpo"}
    last = log.read_text().strip().splitlines()[-1]
    assert last.endswith(f"checkpoint-{step} saved (final); resumes from {rd / status['final_checkpoint']}"), last


def test_a_budget_spent_before_a_stage_ends_the_run_with_its_manifest(train_env, tmp_path):
    import payload.train.stages as stages
    from payload.config.stages import stage_run_config

    cfg = stage_config(train_env, write_stage_data(tmp_path / "data"))
    cfg.runtime.budget_usd = 1.0
    rd = cfg.run_dir
    sft_out = rd / layout.STAGE_ADAPTERS / "1-sft" / "adapter"  # what the finished first stage left
    sft_out.mkdir(parents=True)
    (sft_out / "adapter_model.safetensors").write_bytes(b"weights")
    with pytest.raises(BudgetExhausted, match=r"budget of \$1.00 spent by the stages before dpo"):
        stages.run_stage(cfg, stage_run_config(cfg, 1, sft_out), spent_before=1.25)
    status = json.loads((rd / layout.STATUS).read_text())  # no stage trained to record it: the end is the run's
    assert (status["state"], status["exit_code"], status["stage"]["name"]) == ("budget_exhausted", 3, "dpo")
    written = _describes_the_disk(rd)
    assert written["state"] == "budget_exhausted" and SFT_ADAPTER in written["files"]
