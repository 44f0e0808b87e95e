"""DeepSpeed ZeRO-3 on CPU: two torchrun ranks (gloo), DeepSpeed's CPU accelerator, the payload's own
train entry point. What runbook 004's and sonia's profiles run on GPUs, with the same sharding, the same
checkpoints (each rank's shard under global_stepN) and the same 16-bit gather at save; what differs on
GPUs is the speed, NCCL and the dtype (bf16 there, float32 here).

ZeRO-3 against plain DDP on the same two ranks: the same records per step and the same AdamW, so the
losses agree to float32 rounding (reduce-scatter sums in another order); a resume from a ZeRO-3
checkpoint replays the uninterrupted run exactly.
Run: .venv/bin/python -m pytest -x -q tests/payload/train/test_deepspeed_cpu.py
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from train_fixtures import REPO, logged_losses, make_config, subprocess_env, train_env, write_config, write_text_data

from payload import layout
from payload.volume import checkpoints as ck

__all__ = ["train_env"]

# the dev lock has deepspeed on Linux only (an sdist; macOS is not a platform it supports on CPU)
pytest.importorskip("deepspeed", reason="deepspeed is in the dev lock on Linux only")

TIMEOUT = 600  # a run here takes ~40 s on 2 idle cores; the ceiling holds on one ~3x as loaded
STEPS = {"method": "full", "max_steps": 12, "logging_steps": 2, "eval_steps": 6, "checkpoints": {"save_steps": 6},
         "per_device_batch_size": 2}
ZERO3 = {"deepspeed": {"zero_stage": 3}}
# float32 sums in another order over 12 AdamW steps: measured max |difference| 9.5e-7 (relative 1.8e-7)
LOSS_TOL = {"rtol": 1e-5, "atol": 1e-6}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train(config: Path, log: Path) -> None:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
           "--master_addr=127.0.0.1", f"--master_port={_free_port()}", "-m", "payload", "train", "--config", str(config)]
    with log.open("wb") as out:
        try:
            p = subprocess.run(cmd, cwd=REPO, env=subprocess_env(), stdout=out, stderr=subprocess.STDOUT, timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"two ranks did not finish within {TIMEOUT} s: {log.read_text()[-3000:]}") from None
    assert p.returncode == 0, log.read_text()[-4000:]


def _run(volume: Path, run_id: str, tmp: Path, train: dict):
    cfg = make_config(volume, run_id, train={**STEPS, **train})
    write_text_data(cfg.run_dir)
    config = write_config(cfg, tmp / f"{run_id}.yaml")
    _train(config, tmp / f"{run_id}.log")
    return cfg, config


def test_zero3_on_two_cpu_ranks_trains_the_whole_model_as_ddp_does_and_resumes_exactly(train_env, tmp_path):
    import torch
    from safetensors.torch import load_file

    ddp, _ = _run(train_env, "ddp", tmp_path, {})
    z3, z3_yaml = _run(train_env, "zero3", tmp_path, ZERO3)
    summary = json.loads((z3.run_dir / layout.SUMMARY).read_text())
    assert summary["state"] == "completed" and summary["steps"] == 12, summary

    # each checkpoint holds both ranks' shards (model and optimizer), listed in its marker
    root = ck.checkpoints_dir(z3.run_dir)
    done = ck.list_checkpoints(root)
    assert [p.name for _, p, ok in done if ok] == ["checkpoint-6", "checkpoint-12"], done
    files = ck.read_marker(root / "checkpoint-12")["files"]
    shards = sorted(f for f in files if f.startswith("global_step12/"))
    assert shards == [f"global_step12/zero_pp_rank_{r}_mp_rank_00_{k}_states.pt" for r in (0, 1)
                      for k in ("model", "optim")], shards

    # the exported model is whole (gathered at save), trained, and carries none of DeepSpeed's own files
    out = z3.run_dir / layout.ADAPTER_DIR
    model, base = load_file(out / "model.safetensors"), load_file(z3.run_dir / "base_model" / "model.safetensors")
    assert model.keys() == base.keys() and all(model[k].shape == base[k].shape for k in base)
    assert max((model[k] - base[k]).abs().max().item() for k in base) > 1e-3
    assert not {"latest", "zero_to_fp32.py", "zero_to_torch.py"} & {p.name for p in out.iterdir()}

    # the same training as DDP's on the same two ranks, to float32 rounding
    ddp_losses, z3_losses = logged_losses(ddp.run_dir), logged_losses(z3.run_dir)
    assert [x[:2] for x in ddp_losses] == [x[:2] for x in z3_losses]
    torch.testing.assert_close([x[2] for x in z3_losses], [x[2] for x in ddp_losses], **LOSS_TOL)

    # killed after checkpoint-6: the resume loads both ranks' shards and replays steps 7-12 exactly
    shutil.rmtree(root / "checkpoint-12")
    shutil.rmtree(z3.run_dir / layout.OUTPUTS_DIR)
    _train(z3_yaml, tmp_path / "resume.log")
    assert json.loads((z3.run_dir / layout.SUMMARY).read_text())["resumed_from"] == "checkpoint-6"
    assert logged_losses(z3.run_dir) == z3_losses
    again = load_file(out / "model.safetensors")
    for k in model:
        assert torch.equal(again[k], model[k]), k
