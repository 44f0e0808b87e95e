"""One contract, every backend, for how a run ends: `launch down` gets the final checkpoint before any
signal, and a run whose SkyPilot jobs controller went away settles from its own status.json.

The trainer here stands in for the payload (payload/volume/stop_request.py, really trained in
tests/payload/volume/test_stop_request.py): it checkpoints, trains, and on `stop_request.json` takes longer to save
than SkyPilot allows after SIGTERM (tests/sky_edge.py: SIGKILL SKY_KILL_AFTER_S after the cancel's
SIGTERM, scaled down here), ignoring SIGTERM while it saves, then exits 5. A trainer of the old kind
(no request file honoured) stops on SIGTERM without a final save: `launch down` says which
checkpoint the run keeps. Transfers are real (a local file, SSH to the test sshd, rsync/ssh through
SkyPilot's SSH config, the RunPod volume's S3 API answered by a directory).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from launcher.store import registry
from launcher.backends import final_save
from launcher.backends.skypilot import control
from launcher.cli import cli
from launcher.profiles.profile import load_profile

try:
    from sky_edge import FakeSky, runpod_edge
    from test_contract import (BACKENDS, NODE_PATH, _cloud_profile, _cluster_ssh_config, _spec, machine_backend,
                               start, template)
except ImportError:
    from tests.sky_edge import FakeSky, runpod_edge
    from tests.test_contract import (BACKENDS, NODE_PATH, _cloud_profile, _cluster_ssh_config, _spec, machine_backend,
                                     start, template)

__all__ = ["template"]

SAVE_S = 1.0  # the final save: longer than the scaled SIGTERM -> SIGKILL below

TRAINER = r"""
import json, os, pathlib, signal, sys, time
rd = pathlib.Path(os.environ["LAUNCH_VOLUME"]) / "runs" / os.environ["LAUNCH_RUN_ID"]
(rd / "checkpoints/checkpoint-4").mkdir(parents=True, exist_ok=True)
(rd / "outputs").mkdir(exist_ok=True)

def status(**kw):
    (rd / "status.json.part").write_text(json.dumps(kw))
    (rd / "status.json.part").replace(rd / "status.json")

(rd / "checkpoints/checkpoint-4/COMPLETE").write_text("{}")
(rd / "outputs/checkpoints.json").write_text(json.dumps([{"step": 4, "complete": True}]))
honour = os.environ["CONTRACT_HONOUR"] == "1"

def on_term(*_):
    if honour:
        return  # saving: the signal waits for the step boundary, which the save holds up
    status(state="stopped", step=step, exit_code=143, reason="stopped by SIGTERM; no checkpoint saved")
    sys.exit(143)

signal.signal(signal.SIGTERM, on_term)
step = 5
status(state="training", step=step)
while not (honour and (rd / "stop_request.json").exists()):
    time.sleep(0.05)
    step += 1
time.sleep(float(os.environ["CONTRACT_SAVE_S"]))
ck = rd / f"checkpoints/checkpoint-{step}"
ck.mkdir()
(ck / "COMPLETE").write_text("{}")
status(state="stopped", step=step, exit_code=5, final_checkpoint=f"checkpoints/checkpoint-{step}",
       reason=f"stopped by launch down at step {step}; checkpoint-{step} saved (final)")
sys.exit(5)
"""


@pytest.fixture(autouse=True)
def no_trainer_left(tmp_path):
    """A test that fails before its `down` leaves no stand-in trainer behind (the old-trainer one loops
    until a signal): every process whose LAUNCH_VOLUME lies under the test's tmp_path is killed."""
    yield
    from train_fixtures import kill_marked

    kill_marked(f"LAUNCH_VOLUME={tmp_path}")


@pytest.fixture
def scaled(monkeypatch):
    """SkyPilot's 30 s between SIGTERM and SIGKILL, and launch's waits, scaled down."""
    monkeypatch.setattr(control, "SKY_KILL_AFTER_S", 0.3)
    monkeypatch.setattr(control, "POLL_S", 0.05)
    monkeypatch.setattr(final_save, "POLL_S", 0.1)
    monkeypatch.setattr(final_save, "FINAL_SAVE_TIMEOUT_S", 30.0)


def _trainer_task(profile):
    return {"name": "trainer", "num_nodes": 1, "setup": "true", "run": f"exec python -c {shlex.quote(TRAINER)}",
            "envs": {"LAUNCH_CONFIG": f"sky/config/{profile.name}.yaml", "LAUNCH_RUN_ID": "x",
                     "LAUNCH_VOLUME": ".launch/volume"}}


def _wait_training(read):
    deadline = time.time() + 60
    while (json.loads(read() or "{}")).get("state") != "training":
        assert time.time() < deadline, "the trainer never started"
        time.sleep(0.1)


def start_trainer(kind, honour, tmp_path, template, sshd, monkeypatch):
    """(run, backend's run-dir reader, fake SkyPilot or None) with the trainer training."""
    env = {"CONTRACT_HONOUR": "1" if honour else "0", "CONTRACT_SAVE_S": str(SAVE_S)}
    if kind in ("local", "ssh"):
        profile = load_profile("local-demo")
        spec = _spec(tmp_path, f"trainer-{kind}", kind, profile, template, task=_trainer_task(profile))
        spec.envs.update(env)
        be = machine_backend(kind, tmp_path, sshd)
        run = be.up(spec)
        _wait_training(lambda: be.read_run_file(run, "status.json"))
        return run, None
    from launcher.backends import skypilot as sp

    fake, mount = FakeSky(monkeypatch), tmp_path / "volume"
    managed = kind == "skypilot-managed"
    if managed:
        runpod_edge(monkeypatch, fake, mount)
    profile = _cloud_profile(tmp_path, "lovecraft-a100-spot" if managed else "sonia-h100", mount)
    run = sp.SkyPilotBackend().up(_spec(tmp_path, f"trainer-{kind}", "skypilot", profile, template))
    fake.job = subprocess.Popen([sys.executable, "-c", TRAINER], start_new_session=True, env={
        **os.environ, **env, "LAUNCH_VOLUME": str(mount), "LAUNCH_RUN_ID": run.id, "PATH": NODE_PATH})
    alive = lambda: fake.job.poll() is None  # noqa: E731
    if managed:  # the controller's view: running while the job runs, FAILED after its exit 5
        fake.results["jobs.queue"] = lambda: [{"job_id": 3, "job_name": run.id, "recovery_count": 0,
                                               "status": "RUNNING" if alive() else "FAILED",
                                               "cluster_name_on_cloud": "trainer-3-abcd1234"}]
    else:
        fake.results["status"] = [{"name": run.cluster, "status": "UP"}]
        fake.results["job_status"] = lambda: {7: "RUNNING" if alive() else "FAILED"}
        _cluster_ssh_config(sshd, run.cluster, tmp_path)
    _wait_training(lambda: (mount / "runs" / run.id / "status.json").read_text()
                   if (mount / "runs" / run.id / "status.json").exists() else None)
    return run, fake


def _run_dir_files(tmp_path, run_id):
    return {p.relative_to(p.parents[2]).as_posix() for p in tmp_path.rglob(f"runs/{run_id}/checkpoints/*/COMPLETE")}


@pytest.mark.parametrize("honour", [True, False], ids=["final-checkpoint", "old-trainer"])
@pytest.mark.parametrize("kind", BACKENDS)
def test_contract_down_gets_the_final_checkpoint_before_any_signal(kind, honour, tmp_path, sshd, monkeypatch,
                                                                  scaled):
    if not honour:
        monkeypatch.setattr(final_save, "FINAL_SAVE_TIMEOUT_S", 0.5)
    run, fake = start_trainer(kind, honour, tmp_path, tmp_path, sshd, monkeypatch)
    registry.save(run)
    r = CliRunner().invoke(cli, ["down", run.id])
    assert r.exit_code == 0, r.output
    assert f"{run.id} is down (stopped)" in r.output
    marked = _run_dir_files(tmp_path, run.id)
    said = " ".join(r.output.split())
    step = max(int(m.split("/")[1].removeprefix("checkpoint-")) for m in marked)  # final, or the periodic one
    assert f"checkpoint step {step} (checkpoint-{step}" in said and f"→ launch up {run.profile} --resume {run.id}" \
        in said, said  # what down left, where, and what next
    volume = run.handle.volume.get("name") if isinstance(run.handle.volume, dict) else None
    assert (f"volume {volume} (" in said and f"holds checkpoint step {step} " in said
            and f"→ launch volumes rm {volume}" in said) if volume else "is kept in" in said, said
    if honour:
        (final,) = marked - {"checkpoints/checkpoint-4/COMPLETE"}
        assert f"final checkpoint {final.removesuffix('/COMPLETE')} saved (its COMPLETE marker checked)" in r.output
        row = json.loads(CliRunner().invoke(cli, ["status", run.id, "--json"]).output)
        assert row["step"] == step, row  # where it ended, kept from the final save's status.json
        if fake is not None:  # saved for longer than SkyPilot's SIGTERM -> SIGKILL: no signal before it was
            complete = next(tmp_path.rglob(f"runs/{run.id}/{final}")).stat().st_mtime  # complete (a cancel may
            assert all(t >= complete for t in fake.signalled), (fake.signalled, complete)  # meet it exiting)
            assert fake.job.wait(timeout=10) == 5 or fake.signalled
    else:
        assert marked == {"checkpoints/checkpoint-4/COMPLETE"}
        assert "no final checkpoint: the trainer did not finish saving within 0.5 s; the run keeps " \
               "checkpoint-4" in " ".join(r.output.split())
        if fake is not None:
            assert fake.job.wait(timeout=10) in (143, -9)  # stopped on SIGTERM (-9: SIGKILLed while exiting)
    if fake is not None:
        assert ("jobs.cancel" if kind == "skypilot-managed" else "down") in fake.names()



def test_a_budget_teardown_saves_a_final_checkpoint_first_and_the_bill_stops(tmp_path, monkeypatch, scaled):
    """`launch status` tearing a run down for its spent budget goes the way `down` goes: the trainer
    is asked for a final checkpoint (its last periodic one, checkpoint-4, is older), the teardown
    waits for it, says it, and the bill stops there (the launcher's bill, setup in, reaches the budget
    before the payload's own count would stop it)."""
    run, _ = start_trainer("local", True, tmp_path, tmp_path, None, monkeypatch)
    run.price_per_hour, run.budget_usd = 3600.0, 0.2  # $1/s: spent in a fifth of a second
    registry.save(run)
    registry.accrue(run.id, True)
    time.sleep(0.3)
    r = CliRunner().invoke(cli, ["status", run.id])
    said = " ".join(r.output.split())
    assert r.exit_code == 0, said
    (final,) = _run_dir_files(tmp_path, run.id) - {"checkpoints/checkpoint-4/COMPLETE"}
    step = int(final.split("/")[1].removeprefix("checkpoint-"))
    assert "asking for a final checkpoint before tearing down (waiting at most 10m00s, $600.00 at" in said, said
    assert f"final checkpoint checkpoints/checkpoint-{step} saved (its COMPLETE marker checked)" in said, said
    assert f"torn down; it keeps checkpoint step {step} (checkpoint-{step}" in said, said
    (request,) = tmp_path.rglob(f"runs/{run.id}/stop_request.json")  # the trainer's end line names who asked
    assert json.loads(request.read_text())["by"] == "the launcher's budget check (billed spend reached budget.max_usd)"
    ended = registry.get(run.id)
    assert ended.state == "budget_exhausted" and ended.billing_since is None
    time.sleep(0.2)
    row = json.loads(CliRunner().invoke(cli, ["status", run.id, "--json"]).output)
    assert row["step"] == step and row["cost_usd"] == pytest.approx(ended.billed_usd), row  # billed no more


ENDED = "2026-11-25T10:00:00Z"


@pytest.mark.parametrize("kind", BACKENDS)
def test_contract_a_finished_run_settles_from_its_status_json(kind, tmp_path, template, sshd, monkeypatch):
    """Whatever SkyPilot no longer knows (the cluster autostopped and went away; the jobs controller
    autostopped with `down: true`, so queue and cancel raise ClusterNotUpError), the run ends as its
    own status.json says, bills until then and no longer, and `launch down` succeeds."""
    run, _ = start(kind, tmp_path, template, sshd, monkeypatch)
    end = control.epoch(ENDED)
    rd = tmp_path / "volume" / "runs" / run.id if kind.startswith("skypilot") else \
        __import__("pathlib").Path(run.handle.run_dir)
    (rd / "status.json").write_text(json.dumps({"state": "completed", "exit_code": 0, "step": 8, "max_steps": 8,
                                                "ended_at": ENDED, "updated_at": ENDED}))
    if kind == "skypilot-managed":
        fake = FakeSky.latest
        fake.controller_gone()
    elif kind == "skypilot-cluster":
        fake = FakeSky.latest
        runpod_edge(monkeypatch, fake, tmp_path / "volume", volume="sonia-workspace")
        fake.results["status"] = []  # autostopped after the job, and torn down (down: true)
    run.started_at, run.price_per_hour, run.state = end - 3600, 2.0, "running"
    registry.save(run)
    registry.accrue(run.id, True, now=end - 1800)  # billed up to half an hour before the end so far

    r = CliRunner().invoke(cli, ["status", run.id, "--json"])
    assert r.exit_code == 0, r.output
    row = json.loads(r.output)
    assert row["state"] == "completed", row
    if kind.startswith("skypilot"):  # settled from status.json: billed until it ended (+ a cluster's idle autostop)
        billed = 3600 + (600 if kind == "skypilot-cluster" else 0)
        assert row["ended_at"] == end + billed - 3600 and row["billed_s"] == billed
        assert row["cost_usd"] == pytest.approx(2.0 * billed / 3600)
        assert "SkyPilot not reachable" not in (row["reason"] or "")
    again = json.loads(CliRunner().invoke(cli, ["status", run.id, "--json"]).output)
    assert again["cost_usd"] == row["cost_usd"]  # nothing accrues on paper any more
    r = CliRunner().invoke(cli, ["down", run.id])
    assert r.exit_code == 0 and f"{run.id} is down (completed)" in r.output, r.output


def _machine_says_live(kind, run, sshd, tmp_path):
    """After `down`, the machine's side reports the run live again, each backend its own way; returns
    what to clean up. local: the driver's pid reused by another program (its exit code lost with a
    SIGKILLed driver); ssh: the host no longer answers; SkyPilot: a cluster / managed job of that
    name running (relaunched by hand)."""
    if kind == "local":
        other = subprocess.Popen(["sleep", "60"], start_new_session=True)
        registry.update(run.id, handle={"pid": other.pid, "pgid": other.pid})
        (__import__("pathlib").Path(run.handle.home) / "exit_code").unlink(missing_ok=True)
        return other
    if kind == "ssh":
        from sshd import free_port

        registry.update(run.id, handle={"host": f"{sshd.user}@127.0.0.1:{free_port()}"})
    elif kind == "skypilot-cluster":
        FakeSky.latest.results["status"] = [{"name": run.cluster, "status": "UP"}]
        FakeSky.latest.results["job_status"] = {7: "RUNNING"}
    else:  # running until `launch down` cancels it
        fake = FakeSky.latest
        cancels = fake.names().count("jobs.cancel")
        fake.results["jobs.queue"] = lambda: [{"job_id": 3, "job_name": run.id, "recovery_count": 0, "status":
                                               "RUNNING" if fake.names().count("jobs.cancel") == cancels else
                                               "CANCELLED"}]
    return None


@pytest.mark.parametrize("kind", BACKENDS)
def test_contract_an_ended_run_stays_ended(kind, tmp_path, template, sshd, monkeypatch):
    """Once a run has ended, no refresh turns it live again, nothing accrues after `down`, its profile
    is free for `launch up`, and `launch down` of it succeeds (registry.observe, one rule for all)."""
    run, _ = start(kind, tmp_path, template, sshd, monkeypatch)
    run.price_per_hour = 3600.0  # $1/s: any second billed after `down` shows
    registry.save(run)
    registry.accrue(run.id, True)
    assert CliRunner().invoke(cli, ["down", run.id]).exit_code == 0
    ended = registry.get(run.id)
    assert not ended.active and ended.billing_since is None
    other = _machine_says_live(kind, run, sshd, tmp_path)
    try:
        time.sleep(0.3)
        for args in (["status", run.id, "--json"], ["cost", "--json"], ["down", run.id]):
            r = CliRunner().invoke(cli, args)
            assert r.exit_code == 0, r.output
        now = registry.get(run.id)
        assert (now.state, now.reason, now.ended_at) == (ended.state, ended.reason, ended.ended_at)
        assert now.billed() == (ended.billed_s, ended.billed_usd) and now.billing_since is None
        assert registry.active_for_profile(run.profile) is None
        if other is not None:  # `down` of an ended run never signals a process group that is not the run's
            assert other.poll() is None
    finally:
        if other is not None:
            other.kill()
