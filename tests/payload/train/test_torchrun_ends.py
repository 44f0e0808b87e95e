"""A stopped run ends clean: the rendered `run` script (sky/local-demo.yaml, run by bash as SkyPilot
runs it) on two nodes with three real training processes under payload.train.torchrun, stopped by
`launch down`'s request, exits 5 on each node with the payload's line last, not torchrun's
ChildFailedError traceback (`launch logs` of a local run that `launch down` stopped:
tests/walks/test_walk_state.py). A crash keeps torchrun's report; a SIGTERM to torchrun exits 143 in one
line (stand-in workers: the trainer's side of both is tests/payload/volume/test_stop_request.py's and
tests/payload/volume/test_resume.py's)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from train_fixtures import REPO, make_config, subprocess_env, write_config

from payload import layout
from payload.train.torchrun import deliberate_code
from payload.volume import stop_request

RUN = yaml.safe_load((REPO / "sky" / "local-demo.yaml").read_text())["run"]
TIMEOUT = 240


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _lines(log: Path) -> list[str]:
    return [x for x in log.read_text(errors="replace").splitlines() if x.strip()]


def test_a_stop_request_ends_the_run_script_on_every_node_with_5_and_the_payloads_line(tmp_path):
    cfg = make_config(tmp_path / "vol", "r1", train={"max_steps": 400, "checkpoints": {"save_steps": 4}})
    config = write_config(cfg, tmp_path / "run.yaml")
    rd, port, jobs = cfg.run_dir, _free_port(), []
    logs = [tmp_path / "node0.log", tmp_path / "node1.log"]
    for node, nproc in ((0, 2), (1, 1)):  # node 0: rank 0 and a rank beside it; node 1: a rank of its own
        env = subprocess_env(LAUNCH_LOCAL="1", LAUNCH_CONFIG=config, LAUNCH_VOLUME=tmp_path / "vol",
                             LAUNCH_RUN_ID="r1", LAUNCH_MASTER_PORT=port, SKYPILOT_NODE_IPS="127.0.0.1\n127.0.0.1",
                             SKYPILOT_NUM_NODES=2, SKYPILOT_NODE_RANK=node, SKYPILOT_NUM_GPUS_PER_NODE=nproc,
                             PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
        with open(logs[node], "wb") as out:
            jobs.append(subprocess.Popen(["bash", "-c", RUN], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT))
    try:
        deadline = time.monotonic() + TIMEOUT
        while not (rd / layout.CHECKPOINTS_DIR / "checkpoint-4" / layout.COMPLETE_MARKER).exists():
            assert all(j.poll() is None for j in jobs) and time.monotonic() < deadline, logs[0].read_text()[-3000:]
            time.sleep(0.05)
        (rd / stop_request.REQUEST).write_text(json.dumps({"by": "launch down"}))
        codes = [j.wait(timeout=TIMEOUT) for j in jobs]
    finally:
        for j in jobs:
            if j.poll() is None:
                j.kill()
                j.wait()
    texts = [log.read_text(errors="replace") for log in logs]
    assert codes == [5, 5], texts[0][-3000:] + texts[1][-3000:]  # the payload's code on every node, not torchrun's 1
    for text in texts:
        noise = [w for w in ("Traceback", "ChildFailedError", "failed (exitcode") if w in text]
        assert not noise, text[-3000:]
    status = json.loads((rd / layout.STATUS).read_text())
    step = status["step"]
    assert (status["state"], status["exit_code"], status["final_checkpoint"]) == \
        ("stopped", 5, f"checkpoints/checkpoint-{step}")
    assert _lines(logs[0])[-1] == (f"payload train: stopped by launch down at step {step} of 400; checkpoint-{step} "
                                   f"saved (final); resumes from {rd / 'checkpoints' / f'checkpoint-{step}'}")
    assert "".join(texts).count("payload train:") == 1  # rank 0 speaks for the run
    manifest = json.loads((rd / layout.MANIFEST).read_text())  # rank 1's exit did not cut rank 0's end short
    assert manifest["state"] == "stopped" and "checkpoints.json" in manifest["files"]


WORKER = r"""
import os, signal, sys, time
rank = int(os.environ["RANK"])
mode = sys.argv[1]
if mode == "crash":
    sys.exit(1 if rank == 1 else 0)
def on_term(*_):
    print(f"rank {rank} saved and stopped", flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, on_term)
open(sys.argv[2] + f".{rank}", "w").close()
time.sleep(60)
"""


def _wrapper(tmp_path, *args) -> subprocess.Popen:
    (tmp_path / "worker.py").write_text(WORKER)
    cmd = [sys.executable, "-m", "payload.train.torchrun", "--nproc_per_node=2", f"--master_port={_free_port()}",
           str(tmp_path / "worker.py"), *args]
    return subprocess.Popen(cmd, cwd=REPO, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def test_a_crash_keeps_torchruns_report_and_exit_1(tmp_path):
    proc = _wrapper(tmp_path, "crash")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, out
    assert "ChildFailedError" in out and "exitcode  : 1" in out  # names the rank that crashed


def test_sigterm_to_torchrun_exits_143_in_one_line(tmp_path):
    proc = _wrapper(tmp_path, "wait", str(tmp_path / "ready"))
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"ready.{r}").exists() for r in (0, 1)):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, out
    assert "Traceback" not in out and out.count("saved and stopped") == 2, out
    assert out.strip().splitlines()[-1] == "torchrun: stopped by SIGTERM; its workers were handed the signal and " \
                                           "have ended"


@pytest.mark.parametrize("codes, job", [([5], 5), ([3, 3], 3), ([143], 143), ([2], 2), ([75, -15], 75),
                                        ([5, 1], None), ([1], None), ([-15], None), ([-9, -15], None),
                                        ([3, 5], None), ([1, -15], None)])
def test_one_deliberate_code_passes_for_the_job_and_anything_else_stays_torchruns(codes, job):
    assert deliberate_code(codes) == job
