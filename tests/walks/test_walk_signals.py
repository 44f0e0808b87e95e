"""`launch up` stopped by a signal at any point from its start to its ✓ line (issue 50, item 1): the
installed `launch` in a subprocess (tests/walk.py), SIGTERM or SIGHUP sent after a delay spread over
the measured duration of an `up`, on the local backend and on the ssh one (a real OpenSSH server).
Every time, either nothing started (no record, no process), or `launch status` shows the run, `launch
down` leaves nothing of it running and `launch cost` bills it. Before, a signal after the backend
started left a trainer running with no record: "no runs yet", "$0.00 over 0 run(s)"."""

from __future__ import annotations

import json
import os
import signal
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


def _signalled_up(tmp_path: Path, delay: float, sig: int, args: tuple, env: dict) -> subprocess.CompletedProcess:
    proc = subprocess.Popen([str(LAUNCH), "up", "local-demo", *args], cwd=REPO, env=fresh_env(tmp_path, env),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(delay)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _check(tmp_path: Path, r: subprocess.CompletedProcess, sig: int, env: dict, where: Path) -> str:
    """The invariant after one signalled `up`; returns what happened ('none', 'started', 'finished')."""
    out = r.stdout + r.stderr
    assert "Traceback" not in out, out
    assert r.returncode in (0, 128 + sig, -sig), (r.returncode, out)  # -sig: before launch's handlers
    runs = json.loads(launch(tmp_path, "status", "--all", "--json", env=env).stdout)
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


def _measure(tmp_path: Path, args: tuple, env: dict, mark: Path) -> tuple[float, float]:
    """(first, last): seconds from its start at which an unsignalled `up` here reaches its backend (`mark`
    appears: the run's directory there) and prints its ✓ line and exits. Its run is taken down after."""
    proc = subprocess.Popen([str(LAUNCH), "up", "local-demo", *args], cwd=REPO, env=fresh_env(tmp_path, env),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    while not mark.exists() and proc.poll() is None:
        time.sleep(0.002)
    first = time.monotonic() - t0
    out, err = proc.communicate(timeout=120)
    last = time.monotonic() - t0
    assert proc.returncode == 0 and "✓ started" in out, out + err
    run_id = json.loads(launch(tmp_path, "status", "--json", env=env).stdout)["id"]
    assert launch(tmp_path, "down", run_id, env=env).returncode == 0
    return first, last


def _walk(tmp_path: Path, args: tuple, env: dict, where, mark) -> dict:
    """POINTS signals spread from before `up` reaches its backend (the run's record, provenance, render:
    a fifth of the points) to its ✓ line, SIGTERM and SIGHUP in turn; {what happened: times}."""
    first, last = _measure(tmp_path / "measure", args, env, mark(tmp_path / "measure"))
    first = max(0.0, first - (last - first) / 4)
    seen: dict[str, int] = {}
    for i in range(POINTS):
        sig = signal.SIGTERM if i % 2 == 0 else signal.SIGHUP
        trial = tmp_path / f"t{i:02d}"
        r = _signalled_up(trial, first + (last - first) * i / (POINTS - 1), sig, args, env)
        what = _check(trial, r, sig, env, where(trial))
        seen[what] = seen.get(what, 0) + 1
    assert seen.get("started", 0) >= POINTS // 4, seen  # most signals landed while the backend started
    return seen


def test_up_signalled_at_20_points_on_local_keeps_every_run_it_started(tmp_path):
    home = lambda trial: trial / "user-launch-home"  # noqa: E731
    seen = _walk(tmp_path, (), {}, home, lambda trial: home(trial) / "local")
    assert sum(seen.values()) == POINTS, seen
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


def test_up_signalled_at_20_points_on_ssh_keeps_every_run_it_started(tmp_path, ssh_host):
    server, remote_home = ssh_host
    args = ("--backend", "ssh", "--host", server.host, "--identity", str(server.client_key),
            "--accept-new-host-key")
    seen = _walk(tmp_path, args, {}, lambda trial: remote_home, lambda trial: remote_home / "launch")
    assert sum(seen.values()) == POINTS, seen
    print(seen)
