"""`launch up` stopped by a signal at any point from its start to its ✓ line (issue 50, item 1): the
installed `launch` in a subprocess (tests/walk.py), SIGTERM or SIGHUP sent after a delay spread over
the measured duration of an `up`, on the local backend and on the ssh one (a real OpenSSH server).
Every time, either nothing started (no record, no process), or `launch status` shows the run, `launch
down` leaves nothing of it running and `launch cost` bills it. Before, a signal after the backend
started left a trainer running with no record: "no runs yet", "$0.00 over 0 run(s)"."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from walk import LAUNCH, REPO, fresh_env, launch

try:
    from sshd import SSHServer, ensure_sshd
except ImportError:
    from tests.sshd import SSHServer, ensure_sshd

POINTS = 20
VENV_BIN = str(Path(LAUNCH).parent)


def _processes_under(home: Path) -> list[int]:
    """Pids of processes whose environment names `home` (a run's LAUNCH_VOLUME, its TMPDIR: the run's)."""
    needle = str(home)
    found = []
    for proc in psutil.process_iter():
        try:
            if any(needle in v for v in proc.environ().values()) and proc.pid != os.getpid():
                found.append(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def _gone(home: Path, timeout: float = 30) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := _processes_under(home)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _signalled_up(tmp_path: Path, milestone, offset: float, sig: int, args: tuple,
                  env: dict) -> subprocess.CompletedProcess:
    """`launch up` signalled `offset` seconds after `milestone(tmp_path)` first holds (polled every ms)."""
    proc = subprocess.Popen([str(LAUNCH), "up", "local-demo", *args], cwd=REPO, env=fresh_env(tmp_path, env),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while proc.poll() is None and not milestone(tmp_path):
        time.sleep(0.001)
    time.sleep(offset)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _check(tmp_path: Path, r: subprocess.CompletedProcess, sig: int, env: dict, where: Path) -> str:
    """The invariant after one signalled `up`; returns what happened ('none', 'started', 'finished')."""
    out = r.stdout + r.stderr
    assert "Traceback" not in out, out
    assert r.returncode in (0, 128 + sig, -sig), (r.returncode, out)  # -sig: before launch's handlers
    st = launch(tmp_path, "status", "--all", "--json", env=env)
    assert st.returncode == 0, (out, st.stdout + st.stderr)
    runs = json.loads(st.stdout)
    if not runs:  # stopped before the record: nothing may have started
        assert r.returncode in (-sig, 128 + sig), out
        assert not _processes_under(where), out
        return "none"
    [run] = runs
    # a record: launch's own handler ran, or the signal came as the interpreter exited after the ✓ line
    assert r.returncode != -sig or "✓ started" in r.stdout, out
    if r.returncode > 0:
        name = signal.Signals(sig).name
        assert f"interrupted ({name}) once {run['id']} was recorded" in " ".join(out.split()), out
        assert f"`launch down {run['id']}` stops it" in " ".join(out.split()), out
    down = launch(tmp_path, "down", run["id"], env=env)
    assert down.returncode == 0 and "Traceback" not in down.stdout + down.stderr, down.stdout + down.stderr
    assert not _gone(where), f"left running after `launch down`: {down.stdout}"
    cost = json.loads(launch(tmp_path, "cost", "--json", env=env).stdout)
    [row] = cost["runs"]
    assert row["id"] == run["id"] and row["billed_s"] > 0 and row["cost_usd"] > 0, row
    assert row["state"] not in ("starting", "running"), row
    return "started" if r.returncode > 0 else "finished"


def _recorded(trial: Path) -> bool:
    """The trial's registry holds a run (read-only, as a second `launch status` would read it)."""
    db = trial / "user-launch-home" / "runs.db"
    if not db.exists():
        return False
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=0.05)
        try:
            return con.execute("SELECT count(*) FROM runs").fetchone()[0] > 0
        finally:
            con.close()
    except sqlite3.Error:
        return False


def _first(pattern: str):
    """A milestone: a file or directory matching `pattern` (a glob under the trial, or absolute) exists."""
    def seen(trial: Path) -> bool:
        return any(Path("/").glob(pattern.lstrip("/"))) if pattern.startswith("/") else any(trial.glob(pattern))
    return seen


OFFSETS = (0.0, 0.003, 0.01, 0.03)  # seconds after each milestone


def _walk(tmp_path: Path, args: tuple, env: dict, where, milestones, after=lambda: None) -> dict:
    """POINTS signals from before `up` records its run to its ✓ line: after each milestone it passes on
    the way (`milestones`: from the id's reservation to the driver's start), at OFFSETS after it,
    SIGTERM and SIGHUP in turn. Returns {what happened: times}."""
    seen: dict[str, int] = {}
    for i in range(POINTS):
        sig = signal.SIGTERM if i % 2 == 0 else signal.SIGHUP
        milestone = milestones[i % len(milestones)]
        offset = OFFSETS[(i // len(milestones)) % len(OFFSETS)]
        trial = tmp_path / f"t{i:02d}"
        r = _signalled_up(trial, milestone, offset, sig, args, env)
        what = _check(trial, r, sig, env, where(trial))
        seen[what] = seen.get(what, 0) + 1
        after()
    assert seen.get("started", 0) >= POINTS // 2, seen  # most signals landed while the backend started
    return seen


LOCAL_MILESTONES = (_first("user-launch-home/runs.db"), _recorded, _first("user-launch-home/local/*"),
                    _first("user-launch-home/local/*/workdir/payload"), _first("user-launch-home/local/*/driver.log"))


@pytest.mark.timeout(900)  # ~40 s here unloaded: each `launch down` stops a trainer as it starts
def test_up_signalled_at_20_points_on_local_keeps_every_run_it_started(tmp_path):
    r = launch(tmp_path / "whole", "up", "local-demo")  # unsignalled: its ✓ line one line piped, hints whole
    [started] = [line for line in r.stdout.splitlines() if line.startswith("✓ started")]
    assert started.endswith(", budget $1.00)") and "  → launch down local-demo-" in r.stdout, r.stdout
    assert launch(tmp_path / "whole", "down").returncode == 0
    seen = _walk(tmp_path, (), {}, lambda trial: trial / "user-launch-home", LOCAL_MILESTONES)
    print(seen)


@pytest.fixture
def ssh_host(tmp_path):
    """A host of the user's own (its HOME in tmp_path)."""
    ensure_sshd()
    remote_home = tmp_path / "remote-home"
    remote_home.mkdir()
    server = SSHServer(tmp_path / "sshd")
    server.conf.write_text(server.conf.read_text() + f"SetEnv PATH={VENV_BIN}:/usr/bin:/bin HOME={remote_home} "
                           "LAUNCH_LOCAL=1\n")  # this machine's python: nothing to install (payload/gpu_env.sh)
    server.start()
    try:
        yield server, remote_home
    finally:
        server.stop()


@pytest.mark.timeout(900)
def test_up_signalled_at_20_points_on_ssh_keeps_every_run_it_started(tmp_path, ssh_host):
    server, remote_home = ssh_host
    args = ("--backend", "ssh", "--host", server.host, "--identity", str(server.client_key),
            "--accept-new-host-key")
    root = f"{remote_home}/launch"
    milestones = (_first("user-launch-home/runs.db"), _recorded, _first(f"{root}/*/workdir"),
                  _first(f"{root}/*/start.sh"), _first(f"{root}/*/pid"))
    seen = _walk(tmp_path, args, {}, lambda trial: remote_home, milestones,
                 after=lambda: shutil.rmtree(root, ignore_errors=True))  # the next trial's milestones are its own
    print(seen)
