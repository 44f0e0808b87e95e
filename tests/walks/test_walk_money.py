"""What bills or loses work on the ssh and SkyPilot paths, found by walking them as a paying user
(issue 32's leftovers): each test fails on the code before its fix.

- two runs on one ssh host (two launch homes, or `launch up --new`) each get a torchrun port free on
  that host: the rendered default 29500 made the second fail with EADDRINUSE after its setup billed;
- `launch down` and `launch status` without a RUN take the latest run: a live run behind a newer one
  that ended is said (with the command that stops it), where `down` said "is down" and it billed on;
- a SkyPilot cluster run seen ended while its cluster idled before autostop billed on in `launch cost`
  forever (an ended run was never asked again): its bill closes once the cluster is gone, at the end
  plus the autostop idle (SkyPilot faked at its API edge, tests/sky_edge.py);
- `launch up --resume` of a run that still runs is refused in one line: it said "resumed" and did nothing
  on ssh (a new budget not applied), and on SkyPilot would start a second machine billing beside it;
- an ssh host short of the profile's GPUs or nodes is refused before any upload: a GPU short failed only
  after setup, and a multi-node profile trained on one node without a word (another batch, more hours);
- `launch down` asking for a final checkpoint stops waiting once the machine stops answering, instead of
  waiting out the 30 min a save may take and only then saying it cannot reach the host;
- an ssh command whose connection drops before its exit status is retried like any dropped connection
  (it was an error, "failed (-1)", that ended `launch down` mid-way);
- `--resume` of an ssh run on another host (a new pod after the old one died) is refused before any
  upload when the run's directory is not there: it said "resumed" and trained again from step 0;
- an --identity that is a .pub file, or a key with a passphrase, is said as such at once: it was "cannot
  reach HOST after 5 tries" (a live run's host then read as unreachable, `down` naming --forget), or
  "HOST refused our key";
- an ssh host whose GPUs already compute (another run's trainer, from this launch home or another) is
  refused before any upload: a second run there took the memory the first one's next step needed.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from launcher.backends import LaunchSpec
from launcher.backends.ssh import SSHBackend
from launcher.store import registry
from launcher.store.registry import Run

try:
    from walk import assert_one_line_error, launch, run_pids
except ImportError:
    from tests.walk import assert_one_line_error, launch, run_pids

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


def _trust(tmp_path: Path, sshd) -> None:
    """The walk's user knows the test host: its key is in their ~/.ssh/known_hosts (tests/walk.py's HOME)."""
    ssh_dir = tmp_path / "user-home" / ".ssh"
    ssh_dir.mkdir(parents=True, exist_ok=True)
    (ssh_dir / "known_hosts").write_text(sshd.known_hosts_line())


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
    log = Path(second.handle.log).read_text()
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
        assert "! walk-money-live-1 was running when last seen and may be billing (ssh): launch status --all" in status, status
        r = launch(tmp_path, "down", env=_shared())
        out = _flat(r)
        assert r.returncode == 0 and "walk-money-live-2 is down (completed)" in out, out
        assert "! walk-money-live-1 was running when last seen and may be billing (ssh): launch down walk-money-live-1" in out, out
        assert registry.get("walk-money-live-1").state == "running"  # said, never stopped unasked
    finally:
        be.down(training, grace_s=1)


# ----------------------------------- a cluster that autostopped after its job: its bill closes


def test_an_ended_cluster_run_stops_billing_once_autostop_took_its_cluster(monkeypatch):
    import json

    from sky.skylet.job_lib import JobStatus
    from sky.utils.status_lib import ClusterStatus

    from launcher.cli import cli

    try:
        from sky_edge import FakeSky
    except ImportError:
        from tests.sky_edge import FakeSky

    fake, now = FakeSky(monkeypatch), time.time()
    run = Run(id="sonia-h100-20261126-120000", profile="sonia-h100", backend="skypilot", cluster="c1", job_id="7",
              state="running", started_at=now - 200, price_per_hour=3600.0,  # $1 a second
              handle={"kind": "cluster", "cluster": "c1", "job_id": 7, "job_name": "c1", "autostop_minutes": 10,
                      "run_dir": "/workspace/runs/x", "volume": None, "bucket": None, "push_to_hub": None})
    run.billed_s, run.billed_usd, run.billing_since = 0.0, 0.0, now - 200
    registry.save(run)

    def cost() -> dict:
        r = CliRunner().invoke(cli, ["cost", "--json"])
        assert r.exit_code == 0, r.output
        return json.loads(r.output)["runs"][0]

    fake.results["status"] = [{"name": "c1", "status": ClusterStatus.UP}]  # the job done, autostop's idle
    fake.results["job_status"] = {7: JobStatus.SUCCEEDED}
    assert cost()["state"] == "completed"
    # Seen so two hours ago, not looked at since; autostop took the cluster 10 idle minutes after.
    registry.update(run.id, ended_at=now - 7200, billing_since=now - 7200, billed_s=200.0, billed_usd=200.0)
    fake.results["status"] = []
    row = cost()
    assert row["state"] == "completed" and abs(row["cost_usd"] - 800) < 5, row  # 200 s + 10 idle min, not 2 h
    assert abs(registry.get(run.id).billed(now=time.time() + 86400)[1] - row["cost_usd"]) < 1e-3  # no more after


# ------------------------------------------------------- --resume of a run that still runs: refused


def test_resume_of_a_run_that_still_runs_is_refused_in_one_line(tmp_path, sshd):
    be = _ssh_backend(tmp_path, sshd)
    run = be.up(_spec(tmp_path, "local-demo-20261126-walkmoney", "sleep 60"))
    run.profile, run.state = "local-demo", "running"
    registry.save(run)
    _trust(tmp_path, sshd)  # `up` could go on
    try:
        r = launch(tmp_path, "up", "local-demo", "--resume", run.id, "--set", "budget.max_usd=5", env=_shared())
        assert_one_line_error(r, f"run {run.id} is running: it needs no --resume", f"launch down {run.id}")
        assert "resumed" not in r.stdout
        assert registry.get(run.id).budget_usd is None and be.status(run).state == "running"
    finally:
        be.down(run, grace_s=1)


# ---------------------------------------------- an ssh host short of GPUs or nodes: before any upload


def test_an_ssh_host_short_of_the_profiles_gpus_or_nodes_is_refused_before_upload(tmp_path, sshd):
    _trust(tmp_path, sshd)
    ssh = ("--backend", "ssh", "--host", sshd.host, "--identity", str(sshd.client_key))
    r = launch(tmp_path, "up", "local-demo", *ssh, "--set", "cluster.accelerators=H100:2", env=_shared())
    assert_one_line_error(r, f"{sshd.host} has 0 GPU(s)", "local-demo asks for H100:2 per node")
    r = launch(tmp_path, "up", "local-demo", *ssh, "--set", "cluster.num_nodes=2", env=_shared())
    assert_one_line_error(r, "local-demo asks for 2 nodes and the ssh backend runs on one machine",
                          "--set cluster.num_nodes=1")
    assert registry.all_runs() == [], "a run was started"


# --------------------------------------- down's final checkpoint: a machine that stops answering


# A trainer that says it is training and never answers a stop request (its save takes long).
TRAINING = """\
RD="$LAUNCH_VOLUME/runs/$LAUNCH_RUN_ID"; mkdir -p "$RD"
echo '{"state": "training", "step": 3}' > "$RD/status.json"
sleep 60
"""


def test_the_final_checkpoint_wait_ends_when_the_machine_stops_answering(tmp_path, monkeypatch):
    from launcher.backends import final_save

    try:
        from sshd import SSHServer
    except ImportError:
        from tests.sshd import SSHServer

    server = SSHServer(tmp_path / "sshd").start()  # its own: this test takes it away
    be = _ssh_backend(tmp_path, server)
    run = be.up(_spec(tmp_path, "walk-money-lost", TRAINING))
    run.state = "running"
    try:
        deadline = time.monotonic() + 30
        while final_save.status_json(be, run).get("state") != "training":
            assert time.monotonic() < deadline, "the stand-in trainer never said it trains"
            time.sleep(0.2)
        monkeypatch.setattr(final_save, "UNREACHABLE_S", 2.0, raising=False)
        request = Path(run.handle.run_dir) / final_save.REQUEST

        def gone_once_asked():  # the machine goes once the request is written (a timer raced the write)
            end = time.monotonic() + 60
            while not request.exists() and time.monotonic() < end:
                time.sleep(0.05)
            server.stop()

        threading.Thread(target=gone_once_asked, daemon=True).start()
        saved = final_save.request(be, run, timeout_s=30, poll_s=0.2)
        # the wait ended on the machine's silence (UNREACHABLE_S), not on its 30 s bound: that says
        # "did not finish saving within 30 s", so nothing here is timed
        assert saved is not None and not saved.saved and "stopped answering" in saved.line, saved
    finally:
        server.stop()
        for pid in run_pids("walk-money-lost", tmp_path):
            os.kill(pid, 9)


# ------------------------------------- a connection that drops mid-command: retried, not "failed (-1)"


def test_a_command_whose_connection_drops_is_retried_not_failed(tmp_path, sshd):
    be = _ssh_backend(tmp_path, sshd)
    conn = be._conn()
    marker = tmp_path / "tries"
    threading.Timer(0.7, sshd.kill_sessions).start()  # while the first try sleeps
    out = be._sh(conn, f"echo x >> {marker}; sleep 1.5; echo done")
    assert out == "done\n" and marker.read_text().count("x") == 2  # the dropped try, then the one that answered


# --------------------------------------------- --resume on another host: its checkpoints are not there


def test_resume_on_a_host_without_the_runs_directory_is_refused_before_upload(tmp_path, sshd):
    from launcher.errors import BackendError

    try:
        from sshd import SSHServer
    except ImportError:
        from tests.sshd import SSHServer

    (tmp_path / "a").mkdir()
    first = _ssh_backend(tmp_path / "a", sshd)
    run = first.up(_spec(tmp_path, "walk-money-moved", "true"))
    assert _wait_ended(first, run).state == "completed"
    other = SSHServer(tmp_path / "sshd-new").start()  # the new pod
    try:
        (tmp_path / "b").mkdir()
        moved = _ssh_backend(tmp_path / "b", other)
        spec = dataclasses.replace(_spec(tmp_path / "b", "walk-money-moved", "true"), run=run, resume=True)
        with pytest.raises(BackendError) as refused:
            moved.up(spec)
        assert f"run {run.id} ran on {sshd.host} and its checkpoints are there, not in {other.host}:" in \
            str(refused.value)
        assert not (tmp_path / "b" / "remote" / run.id).exists(), "uploaded before refusing"
    finally:
        other.stop()


# ------------------------------------------------ an --identity launch cannot read: said as what it is


def test_an_identity_that_is_no_usable_private_key_is_said_as_such(tmp_path, sshd):
    import subprocess

    _trust(tmp_path, sshd)
    locked = tmp_path / "locked_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "a passphrase", "-f", str(locked)], check=True,
                   capture_output=True, timeout=60)
    for key, fix in ((f"{sshd.client_key}.pub", "pass the private key file (not the .pub)"),
                     (str(locked), "it has a passphrase: load it into ssh-agent")):
        r = launch(tmp_path, "up", "local-demo", "--backend", "ssh", "--host", sshd.host, "--identity", key,
                   env=_shared())
        assert_one_line_error(r, f"identity file {key} is not a private key launch can read", fix)
    assert registry.all_runs() == []


# ------------------------------------------------- a host whose GPUs already train: refused before upload


FAKE_NVIDIA_SMI = """\
#!/bin/sh
# two GPUs, one process computing on them (another run's trainer)
case "$*" in
  -L) echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)"; echo "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-1)";;
  *query-compute-apps*) echo "4242";;
esac
"""


def test_an_ssh_host_whose_gpus_already_train_is_refused_before_upload(tmp_path):
    try:
        from sshd import SSHServer
    except ImportError:
        from tests.sshd import SSHServer

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text(FAKE_NVIDIA_SMI)
    (bin_dir / "nvidia-smi").chmod(0o755)
    gpu_host = SSHServer(tmp_path / "sshd-gpu")  # a host with GPUs: nvidia-smi answers there
    remote_home = tmp_path / "remote-home"  # what an upload would write goes there, not to this machine's ~
    remote_home.mkdir()
    gpu_host.conf.write_text(gpu_host.conf.read_text() + f"SetEnv PATH={bin_dir}:/usr/bin:/bin HOME={remote_home}\n")
    gpu_host.start()
    try:
        _trust(tmp_path, gpu_host)
        ssh = ("--backend", "ssh", "--host", gpu_host.host, "--identity", str(gpu_host.client_key),
               "--set", "cluster.accelerators=H100:2")
        r = launch(tmp_path, "up", "local-demo", *ssh, env=_shared())
        assert_one_line_error(r, f"{gpu_host.host}'s GPUs already run 1 process(es) (nvidia-smi)",
                              "--env CUDA_VISIBLE_DEVICES=")
        assert registry.all_runs() == [] and not (remote_home / "launch").exists(), "a run was started"
    finally:
        gpu_host.stop()
