"""What bills or loses work on the ssh and SkyPilot paths, found by walking them as a paying user
(issue 32's leftovers): each test fails on the code before its fix.

- two runs on one ssh host (two launch homes, or `launch up --new`) each get a torchrun port free on
  that host: the rendered default 29500 made the second fail with EADDRINUSE after its setup billed;
- `launch down` and `launch status` without a RUN take the latest run: a live run behind a newer one
  that ended is said (with the command that stops it), where `down` said "is down" and it billed on;
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import yaml

from launcher.backends import LaunchSpec
from launcher.backends.ssh import SSHBackend
from launcher.store import registry
from launcher.store.registry import Run

try:
    from walk import launch
except ImportError:
    from tests.walk import launch

NODE_PATH = f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin"


def _ssh_backend(tmp_path: Path, sshd) -> SSHBackend:
    known = tmp_path / "known_hosts"
    known.write_text(sshd.known_hosts_line())
    return SSHBackend(host=sshd.host, identity_file=str(sshd.client_key), known_hosts=str(known),
                      remote_root=str(tmp_path / "remote"))


def _spec(tmp_path: Path, run_id: str, run_script: str) -> LaunchSpec:
    """A one-node task of the rendered shape whose run is `run_script` (no training)."""
    d = tmp_path / run_id
    d.mkdir()
    task = {"name": "walk", "num_nodes": 1, "run": run_script,
            "envs": {"LAUNCH_CONFIG": "sky/config/walk.yaml", "LAUNCH_VOLUME": ".launch/volume", "LAUNCH_RUN_ID": "walk"}}
    (d / "task.yaml").write_text(yaml.safe_dump(task))
    (d / "walk.yaml").write_text("name: walk\n")
    return LaunchSpec(run=Run(id=run_id, profile="walk", backend="ssh"), profile=None, task_yaml=d / "task.yaml",
                      config_yaml=d / "walk.yaml", envs={"LAUNCH_LOCAL": "1", "PATH": NODE_PATH}, secrets={})


def _wait_ended(be: SSHBackend, run: Run, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while (st := be.status(run)).state == "running":
        assert time.monotonic() < deadline, f"{run.id} still running"
        time.sleep(0.2)
    return st


# ------------------------------------------------- two runs on one ssh host: a torchrun port each


# What the rendered run script's torchrun does with its rendezvous port: bind it (all addresses) and
# hold it while training (launcher/profiles/render.py: --master_port="${LAUNCH_MASTER_PORT:-29500}").
HOLD_PORT = """\
python -c 'import os, socket, time
s = socket.socket(); s.bind(("", int(os.environ.get("LAUNCH_MASTER_PORT", "29500")))); s.listen()
time.sleep(3)'
"""


def test_two_runs_on_one_ssh_host_each_get_a_free_torchrun_port(tmp_path, sshd):
    be = _ssh_backend(tmp_path, sshd)
    first = be.up(_spec(tmp_path, "walk-money-port-1", HOLD_PORT))
    time.sleep(1)  # the first holds its port
    second = be.up(_spec(tmp_path, "walk-money-port-2", HOLD_PORT))
    ends = [_wait_ended(be, run) for run in (first, second)]
    log = Path(second.handle["log"]).read_text()
    assert [st.state for st in ends] == ["completed", "completed"], (ends, log)


# ------------------------------------------- `down`/`status` without a RUN: a live run is never hidden


def _shared() -> dict:
    """The walk's commands see the registry this test process writes (conftest's LAUNCH_HOME)."""
    return {"LAUNCH_HOME": os.environ["LAUNCH_HOME"]}


def _flat(r) -> str:
    return " ".join((r.stdout + r.stderr).split())  # rich wraps at 80 columns


def test_down_of_the_latest_run_says_an_older_one_still_runs(tmp_path, sshd):
    be = _ssh_backend(tmp_path, sshd)
    training = be.up(_spec(tmp_path, "walk-money-live-1", "sleep 60"))  # the run that bills
    training.state, training.started_at, training.price_per_hour = "running", time.time() - 120, 3.6
    registry.save(training)
    finished = be.up(_spec(tmp_path, "walk-money-live-2", "true"))  # a newer one that ended
    assert _wait_ended(be, finished).state == "completed"
    finished.state, finished.ended_at, finished.price_per_hour = "completed", time.time(), 3.6
    registry.save(finished)
    try:
        status = _flat(launch(tmp_path, "status", env=_shared()))
        assert "walk-money-live-2" in status, status
        assert "! walk-money-live-1 is running and may be billing (ssh): launch status --all" in status, status
        r = launch(tmp_path, "down", env=_shared())
        out = _flat(r)
        assert r.returncode == 0 and "walk-money-live-2 is down (completed)" in out, out
        assert "! walk-money-live-1 is running and may be billing (ssh): launch down walk-money-live-1" in out, out
        assert registry.get("walk-money-live-1").state == "running"  # said, never stopped unasked
    finally:
        be.down(training, grace_s=1)
