"""A third new-user walk (issue 32's leftovers), each finding where the user meets it: the installed
`launch` in a subprocess with a fresh HOME and LAUNCH_HOME (tests/walk.py). A path launch cannot write
is made with a file in the way (that holds for root too, where a read-only chmod does not); runs the
user would have made are written into that LAUNCH_HOME's registry first; nothing here trains."""

from __future__ import annotations

import json

import pytest

from walk import REPO, assert_one_line_error, launch

RUN = "local-demo-20261126-000000"


@pytest.fixture
def user_home(tmp_path, monkeypatch):
    """This process writes the registry the subprocess reads (walk's LAUNCH_HOME)."""
    monkeypatch.setenv("LAUNCH_HOME", str(tmp_path / "user-launch-home"))
    return tmp_path


def completed_run(tmp_path, rid: str = RUN):
    """A completed local-backend run of local-demo with its run dir, as `launch up` leaves it."""
    from launcher.store import registry
    from launcher.store.registry import Run
    from payload import layout

    volume = tmp_path / "volume"
    rd = layout.run_dir(volume, rid)
    rd.mkdir(parents=True)
    (rd / "config.yaml").write_text((REPO / "sky/config/local-demo.yaml").read_text())
    (rd / layout.STATUS).write_text(json.dumps({"state": "completed", "exit_code": 0}))
    registry.save(Run(id=rid, profile="local-demo", backend="local", state="completed",
                      handle={"volume": str(volume)}))
    return rd


# ------------------------------------------------------------------ a state dir or a --dest it cannot use


@pytest.mark.parametrize("args", [("status",), ("plan", "sonia-h100")])
def test_a_launch_home_that_cannot_be_a_directory_is_one_line_naming_it(tmp_path, args):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    r = launch(tmp_path, *args, env={"LAUNCH_HOME": str(blocker)})
    assert_one_line_error(r, str(blocker), "LAUNCH_HOME")


def test_profiles_with_an_unusable_state_dir_says_so_once_not_every_profile_invalid(tmp_path):
    home = tmp_path / "lh"
    home.mkdir()
    (home / "sky-offline").write_text("")  # where the offline catalog goes: a file in the way
    r = launch(tmp_path, "profiles", env={"LAUNCH_HOME": str(home)})
    assert "invalid" not in r.stdout
    assert_one_line_error(r, str(home / "sky-offline"), "LAUNCH_HOME")


def test_a_dest_that_cannot_be_written_is_one_line_naming_it(user_home):
    completed_run(user_home)
    blocker = user_home / "a file"
    blocker.write_text("")
    r = launch(user_home, "down", RUN, "--fetch-artifacts", "--dest", str(blocker / "x"))
    assert_one_line_error(r, str(blocker / "x"))


# ------------------------------------------------------------------------------------- Ctrl-C


def test_ctrl_c_on_logs_follow_says_the_run_goes_on_and_bills(user_home):
    """Ctrl-C ends the following, not the run: the user is told it still runs (and bills) and how to
    stop it, instead of click's bare `Aborted!` that reads as if the run was aborted."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from launcher.store import registry
    from launcher.store.registry import Run
    from walk import LAUNCH, fresh_env

    volume = user_home / "volume"
    volume.mkdir()
    driver = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                              env={**os.environ, "LAUNCH_RUN_ID": RUN, "LAUNCH_VOLUME": str(volume)})
    try:
        log = user_home / "user-launch-home" / "local" / RUN / "run.log"
        log.parent.mkdir(parents=True)
        log.write_text("step 1/40 | loss 6.9\n")
        registry.save(Run(id=RUN, profile="local-demo", backend="local", state="running",
                          handle={"volume": str(volume), "pid": driver.pid}))
        follow = subprocess.Popen([str(LAUNCH), "logs", RUN, "--follow"], cwd=REPO, env=fresh_env(user_home),
                                  stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)
        assert follow.stdout.readline() == "step 1/40 | loss 6.9\n"  # following now
        time.sleep(0.5)
        follow.send_signal(signal.SIGINT)
        out, err = follow.communicate(timeout=30)
    finally:
        driver.kill()
        driver.wait()
    assert follow.returncode == 130, err
    assert "Aborted" not in err and "Traceback" not in err, err
    assert "the run goes on" in err and "launch down" in err, err


# ------------------------------------------------------------------------------------ up --nodes


def test_up_nodes_below_one_is_refused_and_starts_nothing(tmp_path):
    r = launch(tmp_path, "up", "local-demo", "--nodes", "0")
    assert r.returncode == 2 and "--nodes" in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert "started" not in r.stdout


def test_up_nodes_on_a_cloud_backend_is_refused_not_ignored(tmp_path):
    """`--nodes` sizes the local backend's node processes; on SkyPilot it was dropped without a word and
    the run went up on the profile's node count: said before the credentials check, naming the fix."""
    r = launch(tmp_path, "up", "sonia-h100", "--nodes", "2")
    assert_one_line_error(r, "--nodes", "--backend local", "cluster.num_nodes")


# ---------------------------------------------------------------------------------- chat --image


def with_adapter(rd):
    (rd / "outputs" / "adapter").mkdir(parents=True)
    (rd / "outputs" / "adapter" / "adapter_config.json").write_text("{}")


def test_chat_image_on_a_text_model_is_refused_before_loading_it(user_home):
    """The image was dropped without a word and a text-only answer came back as if it had been seen."""
    with_adapter(completed_run(user_home))
    image = user_home / "header é.png"
    image.write_bytes(b"\x89PNG\r\n\x1a\n")
    r = launch(user_home, "chat", RUN, "--prompt", "What does it say?", "--image", str(image))
    assert_one_line_error(r, "--image", "tiny-qwen3", "text-only", "drop --image")
    assert "loaded" not in r.stderr  # refused before the model is loaded


def test_chat_image_that_is_no_image_is_one_line_on_a_vision_model(user_home):
    rd = completed_run(user_home)
    (rd / "config.yaml").write_text((REPO / "sky/config/well-log-ocr-spot.yaml").read_text())
    with_adapter(rd)
    notes = user_home / "notes.txt"
    notes.write_text("not an image")
    r = launch(user_home, "chat", RUN, "--prompt", "Read it", "--image", str(notes))
    assert_one_line_error(r, "--image", str(notes), "not an image")


def test_chat_with_a_base_model_out_of_reach_is_one_line_naming_it(user_home):
    """A vision run's base model neither cached here nor reachable (offline): transformers' OSError came
    out as a traceback (after minutes of retries without HF_HUB_OFFLINE)."""
    from PIL import Image

    rd = completed_run(user_home)
    (rd / "config.yaml").write_text((REPO / "sky/config/well-log-ocr-spot.yaml").read_text())
    with_adapter(rd)
    Image.new("RGB", (8, 8)).save(user_home / "header.png")
    r = launch(user_home, "chat", RUN, "--prompt", "Read it", "--image", str(user_home / "header.png"),
               env={"HF_HUB_OFFLINE": "1"})
    assert_one_line_error(r, "Qwen/Qwen3-VL-2B-Instruct", "hf download Qwen/Qwen3-VL-2B-Instruct")


# ------------------------------------------------------------------------------------------ --help


@pytest.mark.parametrize("args", [("--help",), ("compare", "--help")])
def test_help_at_80_columns_never_breaks_a_run_id_of_an_example(tmp_path, args):
    """The compare example's second run id was wrapped at its hyphen (`local-` / `demo-2026...`): copied
    from the terminal it is no run id."""
    r = launch(tmp_path, *args)
    assert r.returncode == 0, r.stderr
    assert "local-demo-20261125-113000" in r.stdout, r.stdout
    assert all(len(line) <= 80 for line in r.stdout.splitlines()), r.stdout


# ------------------------------------------------------------------------------ --resume of another's run


def test_resume_of_a_run_of_another_profile_is_refused_naming_its_profile(user_home):
    """A run id pasted from the wrong line: `launch up local-demo --resume <a well-log run>` resumed that
    run with local-demo's model and data (a run recorded without its config compared with nothing), and a
    completed one was answered with `launch up local-demo --resume ...` again."""
    from launcher.store import registry

    completed_run(user_home, "well-log-ocr-spot-20261126-000000")
    run = registry.get("well-log-ocr-spot-20261126-000000")
    run.profile, run.state = "well-log-ocr-spot", "stopped"
    registry.save(run)
    r = launch(user_home, "up", "local-demo", "--resume", "well-log-ocr-spot-20261126-000000")
    assert_one_line_error(r, "well-log-ocr-spot-20261126-000000", "well-log-ocr-spot",
                          "launch up well-log-ocr-spot --resume well-log-ocr-spot-20261126-000000")
    assert registry.get("well-log-ocr-spot-20261126-000000").state == "stopped"


def test_eval_into_a_dest_it_cannot_write_says_so_before_scoring(user_home):
    """The whole evaluation (minutes for a real model on CPU) ran first, then the write failed."""
    with_adapter(completed_run(user_home))
    blocker = user_home / "a file"
    blocker.write_text("")
    r = launch(user_home, "eval", RUN, "--dest", str(blocker / "x"))
    assert_one_line_error(r, str(blocker))
    assert "loaded" not in r.stderr  # nothing loaded, nothing scored


# ----------------------------------------------------------------------------------------- compare


def test_compare_of_a_run_that_logged_no_step_does_not_say_it_was_not_fetched(user_home):
    """A run stopped before its first logged step, fetched, its local machine still there: compare said
    `nowhere (not fetched, machine gone)`, both untrue."""
    from payload import layout

    rd = completed_run(user_home)
    (rd / layout.METRICS).write_text(json.dumps({"step": 5, "loss": 6.5}) + "\n")
    completed_run(user_home, "local-demo-20261126-000100")  # no metrics.jsonl anywhere
    fetched = user_home / "artifacts" / "local-demo-20261126-000100"
    fetched.mkdir(parents=True)
    (fetched / "data_stats.json").write_text("{}")
    r = launch(user_home, "compare", RUN, "local-demo-20261126-000100", "--dest", str(user_home / "artifacts"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "not fetched" not in r.stdout and "machine gone" not in r.stdout, r.stdout
    assert "local-demo-20261126-000100: from nowhere: no metrics fetched, none on its local machine" in r.stdout
