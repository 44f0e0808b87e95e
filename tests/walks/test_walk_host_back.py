"""An ssh run whose host went away, the way the user meets it (issue 37, items 9 and 4): the installed
`launch` in a subprocess (tests/walk.py), no credentials, a real sshd on 127.0.0.1 (tests/sshd.py), the
host "gone" by pointing the run at a port nobody answers and "back" by pointing it at the sshd again.

- After `launch down RUN --forget` and the host coming back with the trainer still training, `--resume`
  is refused (a second trainer would be refused there) and a second `launch down` asks the trainer for a
  final checkpoint and names the one it saved, not an older one.
- `launch logs RUN` of an ended run whose host is down says the log is on that host and to ask again,
  naming the run; never that the run goes on, nor a `--follow` that would follow another run.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import time
from pathlib import Path

from launcher.store import registry
from launcher.profiles.profile import load_profile

try:
    from test_contract import _spec, machine_backend
    from walk import assert_one_line_error, launch, run_pids
except ImportError:
    from tests.test_contract import _spec, machine_backend
    from tests.walk import assert_one_line_error, launch, run_pids


def _shared() -> dict:
    """The walk's commands see the registry this test process writes (conftest's LAUNCH_HOME)."""
    return {"LAUNCH_HOME": os.environ["LAUNCH_HOME"]}


def _flat(r) -> str:
    return " ".join((r.stdout + r.stderr).split())  # rich wraps at 80 columns


def _nobody() -> str:
    from sshd import free_port

    return f"nobody@127.0.0.1:{free_port()}"


# A trainer as the payload is one: periodic checkpoints listed in checkpoints.json; on stop_request.json it
# saves a final one and exits 5, on SIGTERM it saves one (it fits) and exits 143.
TRAINER = r"""
import json, os, pathlib, signal, sys, time
rd = pathlib.Path(os.environ["LAUNCH_VOLUME"]) / "runs" / os.environ["LAUNCH_RUN_ID"]
(rd / "outputs").mkdir(parents=True, exist_ok=True)
rows = []

def write(rel, value):
    (rd / (rel + ".part")).write_text(json.dumps(value))
    (rd / (rel + ".part")).replace(rd / rel)

def save(step):
    ck = rd / f"checkpoints/checkpoint-{step}"
    ck.mkdir(parents=True)
    (ck / "adapter.bin").write_bytes(b"x" * step)
    (ck / "COMPLETE").write_text("{}")
    rows.append({"step": step, "complete": True, "bytes": step})
    write("outputs/checkpoints.json", rows)

termed = []
signal.signal(signal.SIGTERM, lambda *_: termed.append(1))
save(4)
step = 5
while True:
    write("status.json", {"state": "training", "step": step})
    time.sleep(0.05)
    step += 1
    if (rd / "stop_request.json").exists() or termed:
        save(step)
        code, why = (143, "stopped by SIGTERM") if termed and not (rd / "stop_request.json").exists() else \
            (5, "stopped by launch down")
        write("status.json", {"state": "stopped", "step": step, "exit_code": code, "reason": f"{why} at step {step}",
                              "final_checkpoint": f"checkpoints/checkpoint-{step}"})
        sys.exit(code)
"""


def test_a_second_down_after_forget_names_the_checkpoint_the_trainer_saved(tmp_path, sshd):
    profile = load_profile("local-demo")
    task = {"name": "trainer", "num_nodes": 1, "setup": "true", "run": f"exec python -c {shlex.quote(TRAINER)}",
            "envs": {"LAUNCH_CONFIG": "sky/config/local-demo.yaml", "LAUNCH_RUN_ID": "x",
                     "LAUNCH_VOLUME": ".launch/volume"}}
    be = machine_backend("ssh", tmp_path, sshd)
    run = be.up(_spec(tmp_path, "local-demo-20261128-000010", "ssh", profile, tmp_path, task=task))
    run.state, run.price_per_hour = "running", 3600.0
    registry.save(run)
    registry.accrue(run.id, True)
    rd = Path(run.handle.run_dir)
    try:
        deadline = time.monotonic() + 60
        while not (rd / "status.json").exists():
            assert time.monotonic() < deadline, "the stand-in trainer never started"
            time.sleep(0.1)
        registry.update(run.id, handle={"host": _nobody()})  # the host goes away
        r = launch(tmp_path, "down", run.id, "--forget", env=_shared())
        assert r.returncode == 0 and f"{run.id} is down (stopped, here only)" in _flat(r), r.stdout + r.stderr
        registry.update(run.id, handle={"host": sshd.host})  # ...and comes back, the trainer still training
        time.sleep(0.3)

        r = launch(tmp_path, "up", "local-demo", "--resume", run.id, env=_shared())
        assert_one_line_error(r, f"run {run.id} was ended here only", f"launch down {run.id}")
        assert json.loads((rd / "status.json").read_text())["state"] == "training"

        r = launch(tmp_path, "down", run.id, env=_shared())
        out = _flat(r)
        assert r.returncode == 0, out
    finally:
        for pid in run_pids(run.id, tmp_path):
            os.kill(pid, signal.SIGKILL)
    final = json.loads((rd / "status.json").read_text())
    step = final["step"]
    newest = json.loads((rd / "outputs/checkpoints.json").read_text())[-1]["step"]
    assert final["exit_code"] == 5 and newest == step > 4, final  # saved on request, before any signal
    assert f"final checkpoint checkpoints/checkpoint-{step} saved" in out, out
    assert f"checkpoint step {step} (checkpoint-{step}, {step} B) is kept in {sshd.host}:{rd}" in out, out
    assert "checkpoint step 4 " not in out


def test_logs_of_an_ended_run_whose_host_is_down_say_where_the_log_waits(tmp_path):
    run = registry.Run(id="local-demo-20261128-000011", profile="local-demo", backend="ssh", state="stopped",
                       started_at=time.time() - 100, ended_at=time.time() - 50, reason="stopped by launch down",
                       handle={"host": _nobody(), "run_root": "/nowhere", "run_dir": "/nowhere/run",
                               "log": "/nowhere/run/logs/run.log", "pgid": 5,
                               "known_hosts": str(tmp_path / "known_hosts")})
    registry.save(run)
    started = time.monotonic()
    r = launch(tmp_path, "logs", env=_shared())
    line = assert_one_line_error(r, "cannot reach", f"{run.id} ended (stopped) and its log is on that host",
                                 f"`launch logs {run.id}` once it answers")
    assert "goes on" not in line and "--follow" not in line, line
    assert time.monotonic() - started < 10  # two tries, not five with backoff (~16 s)
