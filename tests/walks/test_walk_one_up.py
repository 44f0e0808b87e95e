"""One run is trained by one `up` (issue 37, item 2), the way the user meets it: the installed `launch` in
a subprocess (tests/walk.py), no credentials, stdin not a terminal, and real processes started together.

- Two `launch up local-demo --resume RUN` started at the same moment, 20 times over: exactly one says
  `✓ resumed` and starts a trainer; the other says in one `✗` line which command holds the run (or, when it
  came after, that the run needs no --resume) and changes nothing; the run's record (state, driver pid)
  and its bill follow the one trainer, and it is never recorded `failed` while that trainer trains.
- Two plain `launch up local-demo` at once: one run, one trainer.
- A run held by another command (a real flock in LAUNCH_HOME, held by another process) is neither
  resumed nor downed; the holder's exit, however it exits, frees it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.store import registry

from train_fixtures import kill_marked
from walk import LAUNCH, REPO, assert_one_line_error, fresh_env, launch

ROUNDS = 20


def _shared() -> dict:
    """The walk's commands see the registry this test process reads (conftest's LAUNCH_HOME)."""
    return {"LAUNCH_HOME": os.environ["LAUNCH_HOME"]}


@pytest.fixture(autouse=True)
def no_trainer_left(tmp_path):
    """Whatever a test started under its LAUNCH_HOME (a driver, a trainer) is killed after it."""
    yield
    kill_marked(f"LAUNCH_VOLUME={os.environ['LAUNCH_HOME']}")


def _together(tmp_path, *args: str, n: int = 2) -> list[tuple[subprocess.Popen, str]]:
    """`launch ARGS` n times, started back to back (within milliseconds), each (process, its output)."""
    env = fresh_env(tmp_path, _shared())
    procs = [subprocess.Popen([str(LAUNCH), *args], cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(n)]
    return [(p, p.communicate(timeout=120)[0]) for p in procs]


def _processes(run_id: str) -> list[int]:
    """This run's processes (its id within its own volume: another test may run one of the same name)."""
    from launcher.backends.local import processes_of

    return processes_of(registry.get(run_id))


def _drivers(run_id: str) -> list[int]:
    """This run's local drivers alive now: processes of the run whose command is its driver.sh and that
    lead their session (a driver's own forks, `cmd &` or `$(...)`, carry its command line for a moment
    before they exec, in its session)."""
    out = []
    for pid in _processes(run_id):
        try:
            if b"driver.sh" in Path(f"/proc/{pid}/cmdline").read_bytes() and os.getsid(pid) == pid:
                out.append(pid)
        except OSError:
            continue
    return out


def _preempt(run_id: str) -> None:
    """Kill the run's whole process group (a lost machine) and wait until nothing of it runs."""
    try:
        os.killpg(registry.get(run_id).handle.pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + 30
    while _processes(run_id):
        assert time.monotonic() < deadline, "the run's processes outlived SIGKILL"
        for pid in _processes(run_id):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:  # it died between the listing and the kill
                pass
        time.sleep(0.05)


def _one_won(results, verb: str, run_id: str | None = None):
    """(winner, loser's output): exactly one said `✓ VERB`, the other one `✗` line and no traceback."""
    won = [(p, out) for p, out in results if p.returncode == 0]
    lost = [(p, out) for p, out in results if p.returncode != 0]
    said = "\n---\n".join(out for _, out in results)
    assert len(won) == 1 and len(lost) == 1, said
    assert f"✓ {verb} {run_id or ''}" in won[0][1] and "✓" not in lost[0][1], said
    assert_one_line_error(subprocess.CompletedProcess([], lost[0][0].returncode, lost[0][1], ""))
    return won[0][0], lost[0][1]


def test_two_resumes_started_together_train_once_20_times(tmp_path):
    first = launch(tmp_path, "up", "local-demo", env=_shared())
    assert first.returncode == 0, first.stdout + first.stderr
    run_id = first.stdout.split("started ")[1].split()[0]
    _preempt(run_id)
    resume = ("up", "local-demo", "--resume", run_id, "--set", "train.max_steps=1500")
    held_by_winner = 0
    for _ in range(ROUNDS):
        winner, lost = _one_won(_together(tmp_path, *resume), "resumed", run_id)
        flat = " ".join(lost.split())
        if f"(pid {winner.pid})" in flat:  # it found the run claimed: it names the winner's command
            assert f"`launch up local-demo --resume {run_id} --set train.max_steps=1500` (pid {winner.pid})" \
                   in flat and "changed nothing" in flat, lost
            held_by_winner += 1
        else:  # it came once the winner had recorded the run: live, it needs no --resume
            assert f"run {run_id} is running: it needs no --resume" in flat, lost
        run = registry.get(run_id)
        (driver,) = _drivers(run_id)  # one trainer's driver, and the record is that one's
        assert run.state == "running" and run.handle.pid == driver and run.billing_since is not None, run
        _preempt(run_id)
    assert held_by_winner, "no loser ever met the winner's claim: the two did not start together"
    # The last winner trains on: its record and bill follow it, never `failed` while it trains.
    winner, _ = _one_won(_together(tmp_path, *resume), "resumed", run_id)
    rd = Path(registry.get(run_id).handle.run_dir)
    deadline = time.monotonic() + 120
    while json.loads((rd / "status.json").read_text() or "{}").get("state") != "training" \
            if (rd / "status.json").exists() else True:
        assert time.monotonic() < deadline, "the trainer never trained"
        time.sleep(0.2)
    rows = [json.loads(launch(tmp_path, "status", run_id, "--json", env=_shared()).stdout) for _ in range(2)]
    assert [r["state"] for r in rows] == ["running", "running"], rows
    assert rows[1]["cost_usd"] > rows[0]["cost_usd"] and rows[1]["step"] is not None, rows
    assert len(_drivers(run_id)) == 1


def test_two_plain_ups_at_once_start_one_run(tmp_path):
    results = _together(tmp_path, "up", "local-demo")
    winner, lost = _one_won(results, "started")
    (run,) = registry.all_runs()
    flat = " ".join(lost.split())
    assert (f"`launch up local-demo` (pid {winner.pid}) is starting or resuming a run of local-demo right now"
            in flat) or f"local-demo already has an active run {run.id}" in flat, lost
    assert run.state == "running" and _drivers(run.id) == [run.handle.pid]


HOLDER = """
import sys, time
from launcher.store import claims
sys.argv = ["launch", *sys.argv[1:]]
with claims.of_run(sys.argv[-1]):
    print("held", flush=True)
    time.sleep(60)
"""


def test_a_run_held_by_another_command_is_neither_resumed_nor_downed(tmp_path):
    run = registry.Run(id="local-demo-20261128-000001", profile="local-demo", backend="local", state="preempted",
                       price_per_hour=3600.0, started_at=time.time() - 60, ended_at=time.time() - 30,
                       billed_s=30.0, billed_usd=30.0)
    registry.save(run)
    env = fresh_env(tmp_path, _shared())
    for how in (signal.SIGTERM, signal.SIGKILL):  # a holder that ends, or is killed, frees the run
        holder = subprocess.Popen([sys.executable, "-c", HOLDER, "down", run.id], cwd=REPO, env=env,
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout.readline() == "held\n"
            for args in (("up", "local-demo", "--resume", run.id), ("down", run.id)):
                r = launch(tmp_path, *args, env=_shared())
                line = assert_one_line_error(r, f"`launch down {run.id}` (pid {holder.pid}) is acting on run "
                                                f"{run.id} right now", "changed nothing")
                assert line.count("✗") == 1
            assert registry.get(run.id) == run  # record and bill untouched
            assert not list(Path(os.environ["LAUNCH_HOME"]).glob("local/*"))  # nothing started
        finally:
            holder.send_signal(how)
            holder.wait(timeout=10)
    r = launch(tmp_path, "down", run.id, env=_shared())
    assert r.returncode == 0 and f"{run.id} is down (preempted)" in r.stdout, r.stdout + r.stderr


# ------------------------------------------- item 6: a resume continues from the run's own profile file


def test_a_run_started_from_a_profile_path_is_not_resumed_from_clusters(tmp_path):
    """`launch up local-demo --resume RUN` of a run started from another file named local-demo is refused in
    one line naming that file and the command (it trained to clusters/' max_steps 40, not its own 10);
    its own file resumes it, with no config change."""
    mine = tmp_path / "mine.yaml"
    mine.write_text((REPO / "clusters" / "local-demo.yaml").read_text().replace("max_steps: 40", "max_steps: 10"))
    first = launch(tmp_path, "up", str(mine), env=_shared())
    assert first.returncode == 0, first.stdout + first.stderr
    run_id = first.stdout.split("started ")[1].split()[0]
    _preempt(run_id)
    before = registry.get(run_id)

    r = launch(tmp_path, "up", "local-demo", "--resume", run_id, env=_shared())
    assert_one_line_error(r, f"run {run_id} was started from {mine}, not clusters/local-demo.yaml",
                          f"resume it with `launch up {mine} --resume {run_id}`")
    assert registry.get(run_id) == before and not _drivers(run_id)  # nothing started, nothing recorded
    r = launch(tmp_path, "up", str(mine), "--resume", run_id, "--set", "train.learning_rate=1e-3", env=_shared())
    assert_one_line_error(r, f"start a new run instead (launch up {mine} --new)")  # its commands name its file

    r = launch(tmp_path, "up", str(mine), "--resume", run_id, env=_shared())
    assert r.returncode == 0 and f"✓ resumed {run_id}" in r.stdout, r.stdout + r.stderr
    after = registry.get(run_id)
    assert after.handle.config["train.max_steps"] == 10 and after.handle.history[-1]["changes"] == {}
