"""The same entry point under torchrun: 2 processes on one node, and 2 simulated nodes (gloo, CPU).

2 processes x batch 2 see the same 4 records per step as 1 process x batch 4 (the sampler is
seeded identically on every rank and accelerate hands rank r the r-th half), and the loss is
normalized by the token count of all ranks, so the math is the same; only the order of the
floating-point sums differs (per-rank partial sums, padding to each rank's own longest record,
then an all-reduce), so the adapters agree to a tolerance, not bit for bit. Two nodes x 1 process
and one node x 2 processes run identical ranks and an identical 2-way all-reduce (a + b == b + a
in IEEE arithmetic), so those two adapters must be bit-identical.
Run: .venv/bin/python -m pytest -x -q tests/payload/train/test_distributed.py
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from train_fixtures import (
    REPO, adapter_tensors, logged_losses, make_config, subprocess_env, train_env, train_in_process,
    write_config, write_text_data,
)

from payload.volume import checkpoints as ck
from payload import layout

__all__ = ["train_env"]

TIMEOUT = 300
STEPS = {"max_steps": 12, "logging_steps": 2, "eval_steps": 6, "checkpoints": {"save_steps": 6}}
# Float32 sums in another order: observed max |difference| 8.4e-7 on tensors of magnitude ~1e-2.
ADAPTER_TOL = {"rtol": 1e-4, "atol": 1e-5}
LOSS_TOL = {"rtol": 1e-5, "atol": 1e-6}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(config: Path, nnodes: int, nproc: int, node_rank: int, port: int) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", f"--nnodes={nnodes}", f"--nproc_per_node={nproc}",
            f"--node_rank={node_rank}", "--master_addr=127.0.0.1", f"--master_port={port}",
            "-m", "payload", "train", "--config", str(config)]


def _launch(cmds: list[list[str]], log_dir: Path) -> None:
    procs = []
    for i, cmd in enumerate(cmds):
        out = open(log_dir / f"node{i}.log", "wb")
        procs.append((subprocess.Popen(cmd, cwd=REPO, env=subprocess_env(), stdout=out, stderr=subprocess.STDOUT),
                      out))
    try:
        for p, _ in procs:
            p.wait(timeout=TIMEOUT)
    finally:
        for p, out in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
            out.close()
    for i, (p, _) in enumerate(procs):
        assert p.returncode == 0, (log_dir / f"node{i}.log").read_text()[-4000:]


def _config(volume: Path, run_id: str, batch: int, tmp: Path):
    cfg = make_config(volume, run_id, train={**STEPS, "per_device_batch_size": batch})
    write_text_data(cfg.run_dir)
    return cfg, write_config(cfg, tmp / f"{run_id}.yaml")


def _check_run(run_dir: Path) -> dict:
    summary = json.loads((run_dir / layout.SUMMARY).read_text())
    assert summary["state"] == "completed" and summary["steps"] == 12
    done = ck.list_checkpoints(ck.checkpoints_dir(run_dir))
    assert done and all(ok for _, _, ok in done)
    assert (done[-1][1] / "rng_state_1.pth").is_file()  # rank 1's RNG state, saved before the marker
    assert not list((run_dir / layout.LOGS_DIR).glob("rank_*_traceback.log"))
    return summary


def test_two_processes_and_two_nodes_match_one_process(train_env, tmp_path):
    import torch

    single, _ = _config(train_env, "single", 4, tmp_path)
    assert train_in_process(single)["state"] == "completed"
    one_node, one_node_yaml = _config(train_env, "two-procs", 2, tmp_path)
    (tmp_path / "a").mkdir()
    _launch([_torchrun(one_node_yaml, 1, 2, 0, _free_port())], tmp_path / "a")
    two_nodes, two_nodes_yaml = _config(train_env, "two-nodes", 2, tmp_path)
    (tmp_path / "b").mkdir()
    port = _free_port()
    _launch([_torchrun(two_nodes_yaml, 2, 1, rank, port) for rank in (0, 1)], tmp_path / "b")

    _check_run(one_node.run_dir)
    _check_run(two_nodes.run_dir)
    ref = adapter_tensors(single.run_dir / layout.ADAPTER_DIR)
    procs = adapter_tensors(one_node.run_dir / layout.ADAPTER_DIR)
    nodes = adapter_tensors(two_nodes.run_dir / layout.ADAPTER_DIR)
    assert ref.keys() == procs.keys() == nodes.keys()
    for k in ref:
        assert torch.equal(procs[k], nodes[k]), k
        torch.testing.assert_close(procs[k], ref[k], **ADAPTER_TOL)
        assert ref[k].abs().max() > 0  # lora_B starts at zero: the comparison is not trivially true
    ref_losses, dist_losses = logged_losses(single.run_dir), logged_losses(one_node.run_dir)
    assert [x[:2] for x in ref_losses] == [x[:2] for x in dist_losses]
    torch.testing.assert_close([x[2] for x in dist_losses], [x[2] for x in ref_losses], **LOSS_TOL)
    assert logged_losses(two_nodes.run_dir) == dist_losses

    # Two ranks share the hashing of a resume's verification: damage checkpoint-12 of the
    # two-process run, resume it with two processes; it falls back to checkpoint-6 and ends the same.
    root = ck.checkpoints_dir(one_node.run_dir)
    marker = ck.read_marker(root / "checkpoint-12")
    assert {"loss_state_0.json", "loss_state_1.json", "rng_state_1.pth"} <= set(marker["files"])
    optimizer = root / "checkpoint-12" / "optimizer.pt"
    data = bytearray(optimizer.read_bytes())
    data[len(data) // 2] ^= 0xFF
    optimizer.write_bytes(bytes(data))
    shutil.rmtree(one_node.run_dir / layout.OUTPUTS_DIR)  # as if killed after the final save
    (tmp_path / "c").mkdir()
    _launch([_torchrun(one_node_yaml, 1, 2, 0, _free_port())], tmp_path / "c")
    assert json.loads((one_node.run_dir / layout.SUMMARY).read_text())["resumed_from"] == "checkpoint-6"
    assert (root / "quarantine" / "checkpoint-12-checksum").is_dir()
    again = adapter_tensors(one_node.run_dir / layout.ADAPTER_DIR)
    for k in procs:
        assert torch.equal(again[k], procs[k]), k
    assert logged_losses(one_node.run_dir) == dist_losses
