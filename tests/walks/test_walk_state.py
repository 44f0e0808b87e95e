"""A run's end and its results, the way the user meets them (issue 32, items 2, 6 and 9): the installed
`launch` in a subprocess (tests/walk.py), no credentials, stdin not a terminal.

- An end is final: an ssh run stopped by `launch down`, whose host then stops answering, stays
  stopped through `status`, `cost`, `up` and `down`; it bills nothing more, blocks nothing, and
  `launch down` of it succeeds here. A live run whose host does not answer shows as `unreachable`.
- `launch down RUN --fetch-artifacts` on a training run fetches after the final checkpoint it asked
  for: the last checkpoint in the fetched checkpoints.json is the final one, and the summary is there.
- `launch eval RUN` writes outside what the run's MANIFEST describes: fetch, eval, fetch again
  succeeds, and the fetched files verify against the MANIFEST.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import time
from pathlib import Path

import pytest

from launcher.store import registry
from launcher.profiles.profile import load_profile

try:
    from test_contract import _spec, machine_backend
    from test_walk_down import said_left_and_verified
    from walk import launch
except ImportError:
    from tests.test_contract import _spec, machine_backend
    from tests.test_walk_down import said_left_and_verified
    from tests.walk import launch

PRICE = 3600.0  # $1 a second: a second billed after `down` would show


def _shared(tmp_path) -> dict:
    """The walk's commands see the registry this test process writes (conftest's LAUNCH_HOME)."""
    return {"LAUNCH_HOME": os.environ["LAUNCH_HOME"]}


def _status(tmp_path, run_id) -> dict:
    r = launch(tmp_path, "status", run_id, "--json", env=_shared(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


def _spent(tmp_path, run_id) -> float:
    r = launch(tmp_path, "cost", "--json", env=_shared(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    return next(row["cost_usd"] for row in json.loads(r.stdout)["runs"] if row["id"] == run_id)


def _closed_port() -> int:
    from sshd import free_port

    return free_port()


# ------------------------------------------------------------------------------- item 2: ends are final


def test_an_ended_ssh_run_whose_host_is_gone_stays_ended(tmp_path, sshd):
    profile = load_profile("local-demo")
    task = {"name": "sleeper", "num_nodes": 1, "setup": "true", "run": "sleep 120",
            "envs": {"LAUNCH_CONFIG": "sky/config/local-demo.yaml", "LAUNCH_RUN_ID": "x",
                     "LAUNCH_VOLUME": ".launch/volume"}}
    be = machine_backend("ssh", tmp_path, sshd)
    run = be.up(_spec(tmp_path, "local-demo-20261126-000001", "ssh", profile, tmp_path, task=task))
    run.price_per_hour = PRICE
    registry.save(run)
    registry.accrue(run.id, True)

    down = launch(tmp_path, "down", run.id, env=_shared(tmp_path))
    assert down.returncode == 0 and f"{run.id} is down (stopped)" in down.stdout, down.stdout + down.stderr
    spent = _spent(tmp_path, run.id)
    assert spent > 0
    # The host goes away (a pod terminated at its provider): its address answers no more.
    host = f"{sshd.user}@127.0.0.1:{_closed_port()}"
    registry.update(run.id, handle={"host": host})

    time.sleep(1.0)  # at $1/s, any accrual from here on shows
    for args in (("up", "local-demo", "--dry-run"), ("down", run.id)):
        r = launch(tmp_path, *args, env=_shared(tmp_path))  # each refreshes the ended run from its gone host
        out = r.stdout + r.stderr
        assert r.returncode == 0 and "Traceback" not in out, out
        assert "already has an active run" not in out
    assert "cannot reach" in out and "marked down here" in out and f"{run.id} is down (stopped)" in out
    row = _status(tmp_path, run.id)
    assert row["state"] == "stopped" and row["ended_at"] is not None, row
    assert _spent(tmp_path, run.id) == pytest.approx(spent)
    assert registry.get(run.id).billing_since is None


def test_a_live_run_whose_host_does_not_answer_is_unreachable_and_may_bill(tmp_path, sshd):
    """Not `running`: `unreachable`, and still counted as billing (it was running when last seen, and
    a machine we cannot reach may still bill)."""
    run = registry.Run(id="local-demo-20261126-000002", profile="local-demo", backend="ssh", state="running",
                       price_per_hour=PRICE, started_at=time.time() - 10,
                       handle={"host": f"{sshd.user}@127.0.0.1:{_closed_port()}", "run_root": "/nowhere",
                               "run_dir": "/nowhere/run", "known_hosts": str(tmp_path / "known_hosts")})
    registry.save(run)
    registry.accrue(run.id, True)
    first = _status(tmp_path, run.id)
    assert first["state"] == "unreachable", first
    assert "last seen running, still counted as billing" in first["reason"]
    assert registry.get(run.id).state == "running"  # what it was when last seen, in the registry
    assert _status(tmp_path, run.id)["cost_usd"] > first["cost_usd"]


# ------------------------------------------------------------ item 9: the fetch after the final checkpoint


QUICK = ("--set", "outputs.merge=false", "--set", "outputs.export_mlx=false", "--set", "train.eval_steps=1000",
         "--set", "train.logging_steps=1")


def _started(r) -> str:
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout.split("started ")[1].split()[0]


def _leave_nothing(run_id):
    from launcher.backends.local import processes_of

    for pid in processes_of(registry.get(run_id)):
        os.kill(pid, signal.SIGKILL)


def test_down_fetches_after_the_final_checkpoint(tmp_path):
    env = _shared(tmp_path)
    run_id = _started(launch(tmp_path, "up", "local-demo", *QUICK, "--set", "train.max_steps=100000",
                             "--set", "train.checkpoints.save_steps=2", env=env))
    try:
        rd = Path(registry.get(run_id).handle.run_dir)
        deadline = time.time() + 180
        while not list(rd.glob("checkpoints/checkpoint-*/COMPLETE")):  # training, one periodic save done
            assert time.time() < deadline, (Path(registry.get(run_id).handle.home) / "run.log").read_text()
            time.sleep(0.3)
        dest = tmp_path / "artifacts"
        r = launch(tmp_path, "down", run_id, "--fetch-artifacts", "--dest", str(dest), env=env)
        out = r.stdout + r.stderr
        assert r.returncode == 0, out
    finally:
        _leave_nothing(run_id)
    final = json.loads((rd / "status.json").read_text())
    step = int(final["final_checkpoint"].rsplit("-", 1)[1])
    assert final["state"] == "stopped" and final["exit_code"] == 5 and step >= 2, final  # saved on request
    assert f"final checkpoint checkpoints/checkpoint-{step} saved" in " ".join(out.split())
    home = dest / run_id
    rows = json.loads((home / "checkpoints.json").read_text())
    assert rows[-1]["step"] == step and rows[-1]["complete"], rows
    summary = json.loads((home / "training_summary.json").read_text())
    assert summary["state"] == "stopped" and summary["steps"] == step
    assert f"{run_id} is down (stopped)" in out
    said_left_and_verified(out, rd, step, run_id, home)  # tests/walks/test_walk_down.py: what down leaves
    logs = launch(tmp_path, "logs", run_id, env=env)  # a clean stop's log ends on the payload's own line
    assert logs.returncode == 0 and "Traceback" not in logs.stdout and "ChildFailedError" not in logs.stdout, \
        logs.stdout[-3000:]
    last = " ".join(logs.stdout.split("payload train: ")[-1].split())  # the line, unwrapped at 80 columns
    assert last.startswith(f"stopped by launch down at step {step}") and last.endswith(
        f"saved (final); resumes from {rd / final['final_checkpoint']}"), logs.stdout[-3000:]  # nothing after it


# ------------------------------------------------------------------------ item 6: eval changes no run


def _verify_against_manifest(home: Path) -> None:
    manifest = json.loads((home / "MANIFEST.json").read_text())
    assert manifest["files"]
    for name, entry in manifest["files"].items():
        data = (home / name).read_bytes()
        assert len(data) == entry["bytes"] and hashlib.sha256(data).hexdigest() == entry["sha256"], name


def test_fetch_eval_fetch_again_verifies(tmp_path):
    env = _shared(tmp_path)
    run_id = _started(launch(tmp_path, "up", "local-demo", *QUICK, "--set", "train.max_steps=2",
                             "--set", "train.checkpoints.save_steps=2", "--set", "evaluation.max_new_tokens=4",
                             "--set", "evaluation.max_test_samples=3", env=env))
    home = Path(registry.get(run_id).handle.home)
    try:
        deadline = time.time() + 300
        while not (home / "exit_code").exists():  # the driver's last word (polling `launch status` costs more)
            assert time.time() < deadline, (home / "run.log").read_text()
            time.sleep(0.5)
    finally:
        _leave_nothing(run_id)
    row = _status(tmp_path, run_id)
    assert row["state"] == "completed", row
    rd = Path(registry.get(run_id).handle.run_dir)
    machine = {p: p.read_bytes() for p in (rd / "outputs").rglob("*") if p.is_file()}
    assert rd / "outputs" / "eval_test.json" in machine  # the run's own evaluation, in its MANIFEST
    dest = tmp_path / "artifacts"
    first = launch(tmp_path, "down", run_id, "--fetch-artifacts", "--dest", str(dest), env=env)
    assert first.returncode == 0 and "sha256-verified" in first.stdout, first.stdout + first.stderr
    assert "checkpoint step" not in first.stdout and "--resume" not in first.stdout  # completed: no checkpoint to say

    scored = launch(tmp_path, "eval", run_id, "--dest", str(dest), "--json", env=env)
    assert scored.returncode == 0, scored.stdout + scored.stderr
    result = json.loads(scored.stdout[scored.stdout.index("{"):])
    assert result["n"] == 3 and Path(result["file"]) == (dest / run_id / "eval" / "eval_test.json").resolve() \
        or Path(result["file"]) == dest / run_id / "eval" / "eval_test.json"
    assert {p: p.read_bytes() for p in (rd / "outputs").rglob("*") if p.is_file()} == machine  # untouched
    _verify_against_manifest(dest / run_id)

    again = launch(tmp_path, "down", run_id, "--fetch-artifacts", "--dest", str(dest), env=env)
    assert again.returncode == 0 and "sha256-verified" in again.stdout, again.stdout + again.stderr
    _verify_against_manifest(dest / run_id)
    assert (dest / run_id / "eval" / "eval_test.json").is_file()  # the re-score stays beside them
