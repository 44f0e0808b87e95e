"""What a user watching a run sees, the way the user runs it (tests/walk.py: the installed `launch` in a
subprocess, fresh HOME and LAUNCH_HOME, stdin not a terminal, 80 columns): a resumed run followed from
`launch up` shows its new attempt, not the previous one again; `launch data preview` prints the
examples and nothing of the libraries; a run's log carries no library deprecation warning."""

from __future__ import annotations

import io
import os
import signal
import time

import pytest

from walk import launch

QUICK = ("--set", "train.max_steps=12", "--set", "train.checkpoints.save_steps=4", "--set", "train.eval_steps=4",
         "--set", "outputs.merge=false", "--set", "outputs.export_mlx=false")
MARK = "── launch: the run restarts here"


@pytest.fixture
def user_home(tmp_path, monkeypatch):
    """This process reads the registry the subprocesses write (walk's LAUNCH_HOME)."""
    monkeypatch.setenv("LAUNCH_HOME", str(tmp_path / "user-launch-home"))
    return tmp_path


def _kill_after_first_checkpoint(rid: str) -> str:
    """SIGKILL the run's process group (a machine lost) once checkpoint-4 is complete; its log so far."""
    from pathlib import Path

    from launcher.store import registry

    run = registry.get(rid)
    done = Path(run.handle.run_dir) / "checkpoints" / "checkpoint-4" / "COMPLETE"
    deadline = time.time() + 180
    while not done.is_file():
        assert time.time() < deadline, "checkpoint-4 never appeared"
        time.sleep(0.3)
    os.killpg(run.handle.pgid, signal.SIGKILL)
    from launcher.backends.local import processes_of

    while processes_of(run):
        assert time.time() < deadline, "the run's processes outlived SIGKILL"
        time.sleep(0.2)
    return (Path(run.handle.home) / "run.log").read_text()


def test_follow_after_resume_shows_the_new_attempt_only(user_home):
    first = launch(user_home, "up", "local-demo", *QUICK)
    assert first.returncode == 0, first.stdout + first.stderr
    rid = first.stdout.split("started ")[1].split()[0]
    before = _kill_after_first_checkpoint(rid)
    assert before.count("launch: setup on node 0") == 1

    r = launch(user_home, "up", "local-demo", *QUICK, "--resume", rid, "--follow")
    out = r.stdout
    assert r.returncode == 0 and f"resumed {rid}" in out and out.rstrip().endswith(f"✓ {rid}: completed"), out
    lines = out.splitlines()
    note = next(i for i, line in enumerate(lines) if line.startswith("… earlier attempts"))
    assert lines[note] == f"… earlier attempts not repeated (`launch logs {rid}` shows them)"
    mark = next(i for i, line in enumerate(lines) if line.startswith(MARK))
    assert mark - note - 1 == 3  # the previous attempt's last lines, as context
    assert lines[note + 1:mark] == before.rstrip("\n").splitlines()[-3:]
    # Only the new attempt follows: its setup once, training resumed past the killed attempt's steps.
    assert out.count("launch: setup on node 0") == 1 and out.count(MARK) == 1
    after = out[out.index(MARK):]
    assert "step 4/12" not in after and "step 12/12" in after
    assert "FutureWarning" not in out and "Writing model shards" not in out

    whole = launch(user_home, "logs", rid)  # without --follow: the whole log, both attempts
    assert whole.returncode == 0 and whole.stdout.count("launch: setup on node 0") == 2
    assert whole.stdout.count(MARK) == 1 and "earlier attempts" not in whole.stdout
    assert "FutureWarning" not in whole.stdout  # peft's read of a name transformers deprecated is filtered
    assert whole.stdout.index("step 4/12") < whole.stdout.index(MARK) < whole.stdout.rindex("step 12/12")
    again = launch(user_home, "logs", rid, "--follow")  # right after the resume: its attempt, as `up` showed
    assert again.stdout.count("launch: setup on node 0") == 1 and again.stdout.count(MARK) == 1
    home = user_home / "user-home"  # the loss plot's matplotlib cache went under LAUNCH_HOME, not ~
    assert not (home / ".cache").exists() and not (home / ".config").exists(), sorted(home.rglob("*"))


def test_the_restart_mark_is_found_across_read_blocks():
    from launcher.backends.base import log_start, restart_line

    head = "".join(f"old line {i}\n" for i in range(40))
    log = (head + restart_line() + "new line\n").encode()
    mark = log.index(MARK.encode())
    for block in (7, 16, 64, 1 << 16):  # the mark split across reads, or inside one
        from launcher.backends import base

        f = io.BytesIO(log)
        assert base._last_mark(f, len(log), block=block) == mark
    assert log_start(io.BytesIO(log), len(log), follow=True, tail=None) == (log.index(b"old line 37"), True)
    assert log_start(io.BytesIO(log), len(log), follow=False, tail=None) == (0, False)
    assert log_start(io.BytesIO(log), len(log), follow=True, tail=1) == (log.index(b"new line"), False)
    plain = head.encode()
    assert log_start(io.BytesIO(plain), len(plain), follow=True, tail=None) == (0, False)


def test_data_preview_prints_the_examples_only(user_home):
    r = launch(user_home, "data", "preview", "local-demo", "-n", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("── example 1 of 1 (source demo-chat): "), r.stdout
    assert r.stderr == "" and "Writing model shards" not in r.stdout
    assert not list(user_home.glob("user-launch-home/**/model.safetensors"))
