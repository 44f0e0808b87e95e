"""Issue 50's items 2 to 6, each where the user met it: the installed `launch` in a subprocess with a
fresh HOME, no credentials, stdin not a terminal (tests/walk.py). Runs the user would have made are
written into the registry first, as `launch up` leaves them (their machine: this one, a process that
carries the run's id); nothing here trains. Item 1 (signals during `up`) is test_walk_signals.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from launcher.store import registry
from launcher.store.registry import Run
from walk import launch

try:
    from artifact_fixtures import make_run_dir
except ImportError:
    from tests.artifact_fixtures import make_run_dir


def _shared() -> dict:
    """The walk's commands see the registry this test process writes (conftest's LAUNCH_HOME)."""
    return {"LAUNCH_HOME": os.environ["LAUNCH_HOME"]}


def _flat(r) -> str:
    return " ".join((r.stdout + r.stderr).split())


def _local_run(run_id: str, tmp_path: Path, status: dict, post_running: bool) -> tuple[Run, subprocess.Popen]:
    """A local run of local-demo as the local backend leaves it: its run directory on the volume (a finished
    one, MANIFEST written), its home, and, while `post_running`, its driver (a process carrying its id)."""
    from payload import layout
    from payload.outputs import manifest as mf
    from payload.volume.money import atomic_write_json

    from launcher.store.state import state_dir

    volume = tmp_path / "volume"
    rd = layout.run_dir(volume, run_id)
    make_run_dir(rd)
    atomic_write_json(rd / layout.CHECKPOINT_LISTING, mf.checkpoint_listing(rd))
    atomic_write_json(rd / layout.MANIFEST, mf.build(rd, ["adapter", "training_summary.json", "metrics.jsonl",
                                                          "mlx"], run_id, "completed"))
    (rd / layout.STATUS).write_text(json.dumps(status))
    from launcher.profiles.profile import load_profile
    from launcher.runs.experiment import flat_config

    home = state_dir() / "local" / run_id
    home.mkdir(parents=True)
    driver = subprocess.Popen(["bash", "-c", "sleep 120"], start_new_session=True,
                              env={**os.environ, "LAUNCH_RUN_ID": run_id, "LAUNCH_VOLUME": str(volume)})
    run = Run(id=run_id, profile="local-demo", backend="local", state="running", price_per_hour=3.6,
              started_at=time.time() - 600, cluster="localhost",
              handle={"pid": driver.pid, "pgid": driver.pid, "home": str(home), "volume": str(volume),
                      "run_dir": str(rd), "num_nodes": 1, "config": flat_config(load_profile("local-demo"))})
    registry.save(run)
    registry.accrue(run_id, True, now=run.started_at)
    return run, driver


# ------------------------------------------ 2: `down` in a finished run's post phase: `completed`


def test_down_fetching_a_run_in_its_post_phase_records_it_completed(tmp_path):
    """Training at 20/20, the merge/export running: `down --fetch-artifacts` fetched, printed `completed`,
    and recorded `stopped` ("stopped by launch down"); a resume of it was then accepted (setup, data,
    merge and export again, billed). Now the record says what the run's status.json says."""
    status = {"state": "completed", "exit_code": 0, "step": 20, "max_steps": 20, "reason": None,
              "ended_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    run, driver = _local_run("local-demo-20261202-050000", tmp_path, status, post_running=True)
    try:
        r = launch(tmp_path, "down", run.id, "--fetch-artifacts", "--dest", str(tmp_path / "artifacts"),
                   env=_shared())
        out = _flat(r)
        assert r.returncode == 0, out
        assert f"{run.id} is down (completed)" in out, out
        assert f"--resume {run.id}" not in out, out  # nothing to resume
        row = json.loads(launch(tmp_path, "status", run.id, "--json", env=_shared()).stdout)
        assert row["state"] == "completed", row
        assert driver.wait(timeout=30) is not None  # the post phase's process was stopped all the same
        r = launch(tmp_path, "up", "local-demo", "--resume", run.id, env=_shared())
        assert r.returncode == 1 and f"run {run.id} already completed" in _flat(r), _flat(r)
    finally:
        driver.kill()


# -------------------------------------------- 3: a local run billed until it ended, not until seen


def test_a_local_run_is_billed_until_its_end_not_until_status_looked(tmp_path):
    """A run that ended ten minutes before the first `launch status` was billed those ten minutes too."""
    status = {"state": "completed", "exit_code": 0, "step": 20, "max_steps": 20}
    run, driver = _local_run("local-demo-20261202-050200", tmp_path, status, post_running=False)
    driver.kill()
    driver.wait(timeout=30)
    home = Path(run.handle.home)
    (home / "exit_code").write_text("0\n")
    end = run.started_at + 100  # it ran 100 s; the look comes 500 s later
    os.utime(home / "exit_code", (end, end))
    for command in (("status", run.id, "--json"), ("cost", "--json")):
        r = launch(tmp_path, *command, env=_shared())
        assert r.returncode == 0, _flat(r)
        data = json.loads(r.stdout)
        row = data if "id" in data else data["runs"][0]
        assert row["state"] == "completed" and abs(row["billed_s"] - 100) < 3, row
        assert abs(row["cost_usd"] - 0.1) < 0.005, row  # 100 s at $3.60/h
    shutil.rmtree(home)


# ------------------------------------- 4 and 7: a read-only command ends within seconds of its answer

HANGING_EXIT = """\
# What SkyPilot's SDK can leave a process waiting on once the command is done: a non-daemon thread
# (Python joins it) and an exit handler that blocks (its request DB's close, on a lock another process holds).
import atexit, threading, time
threading.Thread(target=time.sleep, args=(600,)).start()
atexit.register(time.sleep, 600)
"""


def test_read_only_commands_exit_within_seconds_whatever_waits_at_exit(tmp_path):
    """`launch status RUN --json` wrote its whole JSON and then did not exit within 180 s (an exit handler of
    SkyPilot's SDK, a thread): every command's process now ends a few seconds after its answer."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(HANGING_EXIT)
    env = {**_shared(), "PYTHONPATH": str(site)}
    for command in (("status", "--json"), ("cost",), ("status", "--all")):
        t0 = time.monotonic()
        r = launch(tmp_path, *command, env=env, timeout=60)
        took = time.monotonic() - t0
        assert r.returncode == 0 and r.stdout, _flat(r)
        assert took < 15, (command, took)


# -------------------------------------------- 5: notes and hints are one line piped, whatever their length


def test_piped_notes_and_hints_are_whole_lines(tmp_path):
    """`launch up local-demo --dry-run | head -3` split `launch up local-demo --resume` from its run id."""
    run_id = "local-demo-20261202-050300"
    registry.save(Run(id=run_id, profile="local-demo", backend="local", state="stopped", started_at=time.time() - 60,
                      ended_at=time.time() - 30, reason="stopped by launch down"))
    r = launch(tmp_path, "up", "local-demo", "--dry-run", env=_shared())
    assert r.returncode == 0, _flat(r)
    [line] = [line for line in r.stdout.splitlines() if line.startswith("! last run")]
    assert line.endswith(f"(continue it instead with `launch up local-demo --resume {run_id}`)"), r.stdout
    r = launch(tmp_path, "down", run_id, env=_shared())  # an ended run: its ✓ line and hint, each whole
    assert r.returncode == 0 and f"✓ {run_id} is down (stopped)" in r.stdout.splitlines(), r.stdout
    assert f"  → launch status {run_id}" in r.stdout.splitlines(), r.stdout


# ------------------------------------------------------ 1: SIGTERM during `down` is Ctrl-C's path


def test_down_signalled_while_it_waits_says_to_run_it_again_and_keeps_the_run(tmp_path):
    """`launch down` waiting for a trainer's final checkpoint, sent SIGTERM (a CI timeout): it said nothing and
    died; now it says the run may still run and bill and to run the same `launch down` again, and the run
    keeps its live record."""
    import signal

    from walk import LAUNCH, REPO, fresh_env

    status = {"state": "training", "step": 7, "max_steps": 20}
    run, driver = _local_run("local-demo-20261202-050400", tmp_path, status, post_running=True)
    try:
        proc = subprocess.Popen([str(LAUNCH), "down", run.id], cwd=REPO, env=fresh_env(tmp_path, _shared()),
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        request = Path(run.handle.run_dir) / "stop_request.json"
        deadline = time.monotonic() + 60
        while not request.exists() and time.monotonic() < deadline:  # it asked the trainer, and waits
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
        said = " ".join((out + err).split())
        assert proc.returncode == 143 and "Traceback" not in said, said
        assert "interrupted (SIGTERM) before the run was down: it may still run and bill; run the same " \
               "`launch down` again" in said, said
        assert registry.get(run.id).state == "running"
    finally:
        driver.kill()


# ----------------------------------------------------------------------------- 6: the smaller ones


def test_logs_progress_without_follow_is_refused_naming_follow(tmp_path):
    r = launch(tmp_path, "logs", "--progress")  # it printed the raw log, the option unsaid
    assert r.returncode == 2 and "--progress shows a progress bar while following: add --follow" in _flat(r), _flat(r)
    assert "Traceback" not in _flat(r)


def test_chat_help_says_what_ends_its_prompt_loop(tmp_path):
    r = launch(tmp_path, "chat", "--help")
    assert r.returncode == 0 and "an empty line, /exit or /quit ends" in _flat(r), r.stdout


def test_an_ended_run_keeps_the_training_cost_it_showed_live(tmp_path):
    """`status --json` of an ended run had `"train_cost_usd": null` where the live run had a value."""
    status = {"state": "training", "step": 5, "max_steps": 20, "cost_usd": 0.0123}
    run, driver = _local_run("local-demo-20261202-050500", tmp_path, status, post_running=True)
    try:
        live = json.loads(launch(tmp_path, "status", run.id, "--json", env=_shared()).stdout)
        assert live["state"] == "running" and live["train_cost_usd"] == 0.0123, live
    finally:
        driver.kill()
        driver.wait(timeout=30)
    (Path(run.handle.home) / "exit_code").write_text("0\n")
    Path(run.handle.run_dir, "status.json").write_text(json.dumps({**status, "state": "completed", "exit_code": 0,
                                                                      "step": 20, "cost_usd": 0.05}))
    ended = json.loads(launch(tmp_path, "status", run.id, "--json", env=_shared()).stdout)
    assert ended["state"] == "completed" and ended["train_cost_usd"] == 0.05, ended
    again = json.loads(launch(tmp_path, "status", run.id, "--json", env=_shared()).stdout)  # as recorded now
    assert again["train_cost_usd"] == 0.05, again


def test_profiles_shows_a_sub_minute_plan_in_hours_it_costs(tmp_path):
    """`launch profiles` showed local-demo's hours as `0.0` beside its `$0.0010`."""
    r = launch(tmp_path, "profiles")
    [row] = [ln for ln in r.stdout.splitlines() if ln.startswith("local-demo ")]
    assert r.returncode == 0 and row.split()[3] in ("0.01", "0.02", "<0.01") and "$0.0010" in row, r.stdout


def test_compare_writes_the_dollars_of_its_runs_to_one_precision():
    """`launch compare` printed `$0.0042` beside `$0.01` in its `$ spent` row."""
    from launcher.results.compare import table_rows

    runs = [{"id": rid, "profile": "local-demo", "state": "completed", "commit": None, "dirty": False,
             "data_sha256": {}, "steps": 20, "final_eval_loss": None, "best_eval_loss": None, "metric": None,
             "tokens_per_s": None, "hours": 0.01, "cost_usd": usd}
            for rid, usd in (("a", 0.0042), ("b", 0.01), ("c", None))]
    [spent] = [row for row in table_rows(runs, {}) if row[""] == "$ spent"]
    assert spent == {"": "$ spent", "a": "$0.0042", "b": "$0.0100", "c": "-"}, spent
    whole = [{**r, "cost_usd": usd} for r, usd in zip(runs, (1.5, 12.25, 0.0))]
    [spent] = [row for row in table_rows(whole, {}) if row[""] == "$ spent"]
    assert spent == {"": "$ spent", "a": "$1.50", "b": "$12.25", "c": "$0.00"}, spent
    [spent] = [row for row in table_rows([{**runs[0], "cost_usd": 0.00001}, runs[1]], {}) if row[""] == "$ spent"]
    assert spent == {"": "$ spent", "a": "<$0.0001", "b": "$0.0100"}, spent  # money's floor kept


def test_skypilots_client_lines_never_reach_launchs_stdout(tmp_path):
    """`launch status --all --json` of a starting SkyPilot run began with SkyPilot's "Failed to connect to
    SkyPilot API server ... Starting a local server." on stdout: not JSON (the emulated RunPod's signal
    walk, tests/cloud/scenarios/test_signal_walk.py). SkyPilot's client logs go to stderr."""
    import sys

    code = ("import logging; from launcher.backends.skypilot.sdk import sdk; sdk(); "
            "logging.getLogger('sky').warning('Starting a local server.')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "HOME": str(tmp_path), "SKY_RUNTIME_DIR": str(tmp_path / "sky")})
    assert r.returncode == 0, r.stderr
    assert r.stdout == "" and "Starting a local server." in r.stderr, (r.stdout, r.stderr)
