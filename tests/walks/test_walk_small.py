"""Issue 32's smaller items, each where the user meets it: the installed `launch` in a subprocess with a
fresh HOME and LAUNCH_HOME (tests/walk.py). Runs the user would have made are written into that
LAUNCH_HOME's registry first (a local-backend run dir with the payload's status.json), as `launch up`
leaves them; nothing here trains."""

from __future__ import annotations

import json
import os
import logging
import subprocess
import sys
import time
import types

import pytest
import yaml

from walk import REPO, assert_one_line_error, launch


@pytest.fixture
def user_home(tmp_path, monkeypatch):
    """This process writes the registry the subprocess reads (walk's LAUNCH_HOME)."""
    monkeypatch.setenv("LAUNCH_HOME", str(tmp_path / "user-launch-home"))
    return tmp_path


def local_run(tmp_path, rid: str, state: str, status: dict | None = None, **run):
    """A local-backend run of local-demo in the registry, its run dir holding `status.json`."""
    from launcher.store import registry
    from launcher.store.registry import Run
    from payload import layout

    volume = tmp_path / "volume"
    rd = layout.run_dir(volume, rid)
    rd.mkdir(parents=True)
    (rd / "config.yaml").write_text((REPO / "sky/config/local-demo.yaml").read_text())
    if status is not None:
        (rd / layout.STATUS).write_text(json.dumps(status))
    handle = {"volume": str(volume), **run.pop("handle", {})}
    registry.save(Run(id=rid, profile="local-demo", backend="local", state=state, handle=handle, **run))
    return rd


def tmp_profile(tmp_path, text: str):
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    return path


# ---------------------------------------------------------------------------------- eval / chat


def test_eval_and_chat_of_a_run_without_an_adapter_say_the_fix_in_one_line(user_home):
    local_run(user_home, "local-demo-20261126-000000", "failed", {"state": "failed", "exit_code": 1})
    for args in (("eval", "local-demo-20261126-000000"), ("chat", "local-demo-20261126-000000", "--prompt", "hi")):
        r = launch(user_home, *args)
        line = assert_one_line_error(r, "local-demo-20261126-000000 has no adapter: it ended failed before training "
                                        "saved a checkpoint", "launch up local-demo --resume local-demo-20261126-000000")
        assert "--adapter" not in r.stdout + r.stderr and len((r.stdout + r.stderr).splitlines()) == 1, line


# ---------------------------------------------------------------------------------------- status


def test_status_projects_at_least_the_spend_and_no_eta_once_a_run_ended(user_home):
    now = time.time()
    # the payload's own projection counts training seconds only: $0.001 while the machine billed ~$1
    reported = {"state": "training", "step": 10, "max_steps": 40, "eta_s": 600.0, "projected_cost_usd": 0.001,
                "cost_usd": 0.0005}
    # the live run's driver, carrying the run's id and volume as the local backend's driver does
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                               env={**os.environ, "LAUNCH_RUN_ID": "local-demo-20261126-000001",
                                    "LAUNCH_VOLUME": str(user_home / "volume")})
    try:
        local_run(user_home, "local-demo-20261126-000001", "running", reported, handle={"pid": sleeper.pid},
                  started_at=now - 3600, price_per_hour=1.0, billed_s=0.0, billed_usd=0.0, billing_since=now - 3600)
        local_run(user_home, "local-demo-20261126-000002", "running", reported,  # no process left: it ended
                  started_at=now - 3600, price_per_hour=1.0, billed_s=0.0, billed_usd=0.0, billing_since=now - 3600)
        r = launch(user_home, "status", "--all", "--json")
    finally:
        sleeper.kill()
        sleeper.wait()
    assert r.returncode == 0, r.stdout + r.stderr
    rows = {row["id"]: row for row in json.loads(r.stdout)}
    live, dead = rows["local-demo-20261126-000001"], rows["local-demo-20261126-000002"]
    assert live["state"] == "running" and live["eta_s"] == 600.0
    assert live["projected_cost_usd"] == pytest.approx(live["cost_usd"] + 600 / 3600, abs=0.01)
    assert live["projected_cost_usd"] >= live["cost_usd"] > 0.9
    assert dead["state"] != "running" and dead["eta_s"] is None and dead["projected_cost_usd"] is None


def test_status_json_with_no_runs_is_of_the_type_it_has_with_runs(tmp_path):
    """`status --json` was `[]` with no runs and an object with runs (`jq .state` failed on a new machine);
    plain `status` with no runs exited 1 while `--all` and `--json` exited 0."""
    for args, empty in ((("status", "--json"), {}), (("status", "--all", "--json"), [])):
        r = launch(tmp_path, *args)
        assert r.returncode == 0 and json.loads(r.stdout) == empty, r.stdout + r.stderr
    for args in (("status",), ("status", "--all")):
        r = launch(tmp_path, *args)
        assert r.returncode == 0 and r.stdout.startswith("no runs yet: start one with `launch up PROFILE`"), r.stdout


# ------------------------------------------------------------------------------------- money


def test_the_budget_stop_shows_sub_cent_money_and_names_the_users_fix():
    from payload.volume.money import usd
    from payload.train.recipe import end_of_training

    assert [usd(x) for x in (None, 0, 0.00004, 0.0042, 0.01, 1234.5)] == \
        ["-", "$0.00", "<$0.0001", "$0.0042", "$0.01", "$1,234.50"]
    from launcher.term.units import money

    assert money(0.0042) == "$0.0042"  # one formatter for launch and the machine
    run = types.SimpleNamespace(
        trainer=types.SimpleNamespace(state=types.SimpleNamespace(global_step=12, max_steps=40)),
        control=types.SimpleNamespace(reason="budget_exhausted"),
        cfg=types.SimpleNamespace(runtime=types.SimpleNamespace(budget_usd=0.003, profile="local-demo")),
        tracker=types.SimpleNamespace(usd=lambda: 0.0031))
    state, reason = end_of_training(run)
    assert state == "budget_exhausted"
    assert reason == ("budget of $0.0030 reached at step 12 of 40 (spent $0.0031); checkpoint-12 saved: continue "
                      "with `launch up local-demo --resume --set budget.max_usd=N` with a larger N")


# ----------------------------------------------------------------------------------- volumes


def test_volumes_without_skypilot_runs_starts_no_api_server_and_prints_no_escapes(tmp_path):
    r = launch(tmp_path, "volumes")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "\x1b" not in r.stdout + r.stderr
    assert "SkyPilot not asked: launch has run nothing on SkyPilot here" in " ".join(r.stdout.split())
    assert "no volumes or buckets" in r.stdout


def test_a_skypilot_session_stops_the_api_server_it_started_and_keeps_stdout_clean(monkeypatch, capsys):
    """With SkyPilot runs the SDK is asked: its coloured lines go to stderr without escapes (not a tty
    here) and a local API server the first call started is stopped (SkyPilot replaced at its edge)."""
    from launcher.runs import volumes
    from launcher.backends.skypilot import control

    stops, pids = [], iter([[], [4242]])  # none before the command; one with this command's mark after
    fake_sky = types.SimpleNamespace(api_stop=lambda: stops.append(True))
    monkeypatch.setattr("launcher.backends.skypilot.sdk", lambda: fake_sky)
    monkeypatch.setattr(control, "local_api_server_pids", lambda origin=None: next(pids))
    logger = logging.getLogger("sky")
    handler = logging.StreamHandler(sys.stdout)  # where SkyPilot's handler writes
    logger.addHandler(handler)
    level = logger.level  # offline planning in this process (another test) quiets SkyPilot to ERROR
    logger.setLevel(logging.INFO)
    try:
        with volumes._sky_session() as sky:
            assert sky is fake_sky
            logger.warning("\x1b[32m✓ SkyPilot API server started. \x1b[0m")
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    out = capsys.readouterr()
    assert stops == [True] and out.out == ""
    assert "✓ SkyPilot API server started." in out.err and "\x1b" not in out.err
    assert handler.stream is sys.stdout  # SkyPilot's handler is given back its stream


# ------------------------------------------------------------------------------ profile text


def test_a_profile_description_prints_its_control_characters_escaped(tmp_path):
    body = yaml.safe_load((REPO / "clusters/local-demo.yaml").read_text())
    body["description"] = "demo \x1b[31mred\x1b[0m\x07 done"
    r = launch(tmp_path, "plan", str(tmp_profile(tmp_path, yaml.safe_dump(body))))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "\x1b" not in r.stdout and "\x07" not in r.stdout
    assert "demo \\x1b[31mred\\x1b[0m\\x07 done" in r.stdout


def test_a_key_given_twice_is_refused_with_both_lines(tmp_path):
    text = (REPO / "clusters/local-demo.yaml").read_text().replace("  max_steps: 40\n",
                                                                  "  max_steps: 40\n  max_steps: 4000\n")
    path = tmp_profile(tmp_path, text)
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if ln == "  max_steps: 4000")
    assert_one_line_error(launch(tmp_path, "validate", str(path)),
                          f"{path}:{line}: key `train.max_steps` is given twice (also at line {line - 1})")


def test_a_boolean_where_a_number_belongs_is_refused(tmp_path):
    text = (REPO / "clusters/local-demo.yaml").read_text().replace("  max_steps: 40\n", "  max_steps: true\n")
    assert_one_line_error(launch(tmp_path, "validate", str(tmp_profile(tmp_path, text))),
                          "train.max_steps: `true` is a boolean where a number is expected")


# ------------------------------------------------------------------------------ resume, README


def test_resume_of_a_completed_run_trains_further_only_with_more_steps(user_home):
    from launcher.runs.experiment import flat_config
    from launcher.profiles.profile import load_profile

    rid = "local-demo-20261126-000003"
    local_run(user_home, rid, "completed", {"state": "completed", "exit_code": 0},
              handle={"config": flat_config(load_profile("local-demo")), "overrides": []})
    assert_one_line_error(launch(user_home, "up", "local-demo", "--resume", rid, "--dry-run"),
                          f"run {rid} already completed; to train it further resume it with more steps (`launch up "
                          f"local-demo --resume {rid} --set train.max_steps=N`, N above the 40 steps it trained)")
    r = launch(user_home, "up", "local-demo", "--resume", rid, "--set", "train.max_steps=80", "--dry-run")
    assert r.returncode == 0 and rid in r.stdout, r.stdout + r.stderr


def test_readme_shows_what_plan_prints_for_sonia(tmp_path):
    """README's `launch plan sonia-h100` block is the program's output (it showed 65.2 GiB for 53.6)."""
    r = launch(tmp_path, "plan", "sonia-h100", env={"COLUMNS": "100"})  # as README shows it
    assert r.returncode == 0, r.stdout + r.stderr
    readme = (REPO / "README.md").read_text()
    for key in ("GPU memory", "Cost", "Duration", "Training", "Secrets"):
        line = next(ln.rstrip() for ln in r.stdout.splitlines() if ln.strip().startswith(key))
        assert line in readme, line


def test_down_prints_the_runs_losses_rounded_like_compare(user_home):
    rid = "local-demo-20261126-000004"
    rd = local_run(user_home, rid, "stopped", {"state": "stopped", "exit_code": 0})
    (rd / "outputs").mkdir()
    (rd / "outputs" / "training_summary.json").write_text(json.dumps(
        {"state": "stopped", "global_step": 171, "final_train_loss": 4.332685470581055,
         "final_eval_loss": 4.493845462799072}))
    r = launch(user_home, "down", rid, "--fetch-artifacts", "--dest", str(user_home / "art"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "  steps 171, final loss 4.333, eval loss 4.494\n" in r.stdout, r.stdout  # was 4.332685470581055


def test_a_cloud_profile_on_the_local_backend_keeps_its_model_cache_under_launch_home(tmp_path):
    # the profile's HF_HOME is /workspace/.hf, on its RunPod volume; here the volume is LAUNCH_HOME's
    r = launch(tmp_path, "up", "well-log-ocr-spot", "--backend", "local", "--follow", env={"HF_HUB_OFFLINE": "1"},
               timeout=180)
    out = r.stdout + r.stderr
    cache = tmp_path / "user-launch-home" / "volumes" / "well-log-ocr-spot" / ".hf"
    assert f"OK   hf_cache: {cache} writable" in out, out
    assert "/workspace/.hf" not in out, out
    assert "preflight: preflight:" not in out, out  # where preflight fails here (no bitsandbytes): named once


def test_down_of_a_preempted_run_asks_no_trainer_and_returns(user_home):
    """A run killed mid-training (its processes gone without an exit code) still says "training" in its
    status.json: `launch down` must not ask that dead trainer for a final checkpoint and wait 30 min."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    rid = "local-demo-20261126-000009"
    rd = local_run(user_home, rid, "running", {"state": "training", "step": 115, "max_steps": 3000},
                   handle={"pid": dead.pid, "pgid": dead.pid}, started_at=time.time() - 60, price_per_hour=0.1)
    (rd / "outputs").mkdir()
    (rd / "outputs" / "checkpoints.json").write_text(json.dumps([{"step": 100, "complete": True}]))
    r = launch(user_home, "down", rid, timeout=120)  # the old code waits FINAL_SAVE_TIMEOUT_S (30 min): TimeoutExpired
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{rid} is down (preempted)" in r.stdout, r.stdout
    assert not (rd / "stop_request.json").exists()  # nobody was asked


def test_down_forget_of_a_run_whose_machine_answers_says_it_went_on_as_usual(user_home):
    rid = "local-demo-20261126-000010"
    local_run(user_home, rid, "completed", {"state": "completed", "exit_code": 0}, ended_at=time.time())
    r = launch(user_home, "down", rid, "--forget")
    assert r.returncode == 0, r.stdout + r.stderr
    out = " ".join(r.stdout.split())
    assert f"--forget is for a machine launch cannot reach; {rid}'s answered, so `down` goes on as usual" in out
    assert f"{rid} is down (completed)" in out
