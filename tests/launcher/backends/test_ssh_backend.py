"""SSH backend, end to end against a real OpenSSH server on 127.0.0.1 (tests/sshd.py).

One short scripted run (`FAKE_TASK`: the rendered task's shape, a loop instead of training) is shared
by the mechanics tests: upload, detached start, secrets, status, following the log across a dropped
connection, fetch, down. The real local-demo profile runs once more at the end when the payload is
there. Host keys: unknown keys are refused with their fingerprint, changed keys always.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from launcher.backends import BackendError, LaunchSpec
from launcher.backends.ssh import SSHBackend, _state
from launcher.project import PACKAGE_ROOT as REPO_ROOT
from launcher.store.registry import Run
from payload import layout

try:  # tests/ is a plain directory (pytest puts it on sys.path) or, later, a package
    from sshd import free_port, keygen
except ImportError:
    from tests.sshd import free_port, keygen

SECRET = "test-secret-value-123"
VENV_BIN = str(Path(sys.executable).parent)
NODE_PATH = f"{VENV_BIN}:/usr/local/bin:/usr/bin:/bin"

# The rendered task's shape; the run loop writes status/metrics like the payload and waits for a
# `release` file in its run dir (so tests decide when it ends), then writes a real safetensors adapter.
FAKE_RUN = r"""set -euo pipefail
RD="$LAUNCH_VOLUME/runs/$LAUNCH_RUN_ID"
mkdir -p "$RD/outputs/adapter" "$RD/data"
# Like torchrun's workers: a child in its own session, out of reach of a process-group signal.
if [ -n "${FAKE_DETACHED_CHILD:-}" ]; then setsid sleep 600 & fi
if [ -n "${FAKE_EXIT:-}" ]; then echo "stopping with $FAKE_EXIT"; exit "$FAKE_EXIT"; fi
for i in $(seq 1 1200); do
  echo "step $i café"
  printf '{"state": "training", "step": %d, "max_steps": 1200, "loss": 1.5, "cost_usd": 0.01}' "$i" > "$RD/status.tmp"
  mv "$RD/status.tmp" "$RD/status.json"
  echo "{\"step\": $i, \"loss\": 1.5}" >> "$RD/metrics.jsonl"
  if [ -f "$RD/release" ] && [ "$i" -ge 3 ]; then break; fi
  sleep 0.1
done
python -c "import sys, numpy as np; from safetensors.numpy import save_file; save_file({'lora_A': np.arange(6, dtype=np.float32).reshape(2, 3)}, sys.argv[1])" "$RD/outputs/adapter/adapter_model.safetensors"
echo '{"adapter_config": "fake"}' > "$RD/outputs/adapter/adapter_config.json"
echo '{"train_records": 3}' > "$RD/outputs/training_summary.json"
echo '{"state": "completed", "step": 3}' > "$RD/status.json"
echo "fake run done"
"""
FAKE_TASK = {
    "name": "fake",
    "num_nodes": 1,
    "envs": {"LAUNCH_CONFIG": "sky/config/fake.yaml", "LAUNCH_VOLUME": ".launch/volume", "LAUNCH_RUN_ID": "fake"},
    "secrets": {"HF_TOKEN": None},
    "setup": 'echo "setup: token sha256 $(printf %s "$HF_TOKEN" | sha256sum | cut -c1-64)"',
    "run": FAKE_RUN,
}



@pytest.fixture(scope="module")
def env(tmp_path_factory, sshd):
    """A known_hosts that trusts the test server, and the remote root, under tmp (conftest gives
    every test its own HOME and LAUNCH_HOME)."""
    base = tmp_path_factory.mktemp("ssh-backend")
    ROOTS.append(str(base))
    known = base / "known_hosts"
    known.write_text(sshd.known_hosts_line())
    yield {"base": base, "known_hosts": known, "remote_root": base / "remote"}
    for run_dir_ in (base / "remote" / "volume" / "runs").glob("*"):  # leave no process behind
        for pid in tagged_pids(run_dir_.name):
            os.kill(pid, 9)


def make_backend(sshd, env, **kw) -> SSHBackend:
    opts = dict(host=sshd.host, identity_file=str(sshd.client_key), known_hosts=str(env["known_hosts"]),
                remote_root=str(env["remote_root"]), connect_timeout=10)
    return SSHBackend(**{**opts, **kw})


def fake_spec(env, run_id: str, config_text: str = "name: fake\n", run: Run | None = None) -> LaunchSpec:
    d = env["base"] / run_id
    d.mkdir(exist_ok=True)
    task, config = d / "fake-task.yaml", d / "fake.yaml"
    task.write_text(yaml.safe_dump(FAKE_TASK))
    config.write_text(config_text)
    return LaunchSpec(run=run or Run(id=run_id, profile="fake", backend="ssh"), profile=None, task_yaml=task,
                      config_yaml=config, envs={"LAUNCH_LOCAL": "1", "PATH": NODE_PATH},
                      secrets={"HF_TOKEN": SECRET})


@pytest.fixture(scope="module")
def fake_run(sshd, env):
    backend = make_backend(sshd, env)
    run = backend.up(fake_spec(env, "fake-1"))
    yield backend, run
    backend.down(run, grace_s=2)


def run_dir(run: Run) -> Path:
    return Path(run.handle.run_dir)


def release(run: Run) -> None:
    (run_dir(run) / "release").touch()


def wait_state(backend, run, states, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = backend.status(run)
        if st.state in states:
            return st
        time.sleep(0.3)
    raise AssertionError(f"run {run.id} still {st.state} after {timeout} s")


class Collector(io.TextIOBase):
    """A TextIO that remembers what was written (thread-safe enough for one writer)."""

    def __init__(self):
        self.parts: list[str] = []

    def write(self, s: str) -> int:
        self.parts.append(s)
        return len(s)

    def text(self) -> str:
        return "".join(self.parts)


def _files(top: Path) -> dict[str, Path]:
    return {p.relative_to(top).as_posix(): p for p in top.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


# This module's remote roots (the `env` fixture): a run's processes are those with its id AND a volume under
# one of them. By the id alone, a second `make test` beside this one (the same run ids: demo-kill...) had its
# trainers counted here and SIGKILLed by this module's cleanup: its resumed run went silent, its `down` "left"
# processes that were not its own.
ROOTS: list[str] = []


def tagged_pids(run_id: str) -> list[int]:
    """Live processes whose environment says they belong to the run (its id, a volume of this module's)."""
    marker, out = f"LAUNCH_RUN_ID={run_id}".encode(), []
    volumes = [f"LAUNCH_VOLUME={root}".encode() for root in ROOTS]
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            entries = environ.read_bytes().split(b"\0")
            ours = not volumes or any(e.startswith(v) for e in entries for v in volumes)
            if marker in entries and ours and "Z" not in _proc_state(environ.parent):
                out.append(int(environ.parent.name))
        except OSError:
            pass
    return out


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group `pgid`."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def _proc_state(proc: Path) -> str:
    return (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]


# A trainer's start (imports, model, data) before its first steps: 180 s was not
# enough with a second `make test` beside this one (the resumed run had not trained). 3x that load holds.
TRAINER_START_S = 360


def wait_for(predicate, timeout=60, what="condition", seen=None):
    """Until `predicate()`; on giving up, says what it waited for and what `seen()` shows of the run."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}" + (f"\n{seen()}" if seen else ""))


def payload_pids(run_id: str) -> list[int]:
    """The run's `python -m payload STAGE` processes and torchrun's agent (`python -m
    payload.train.torchrun`), not the driver's shell: each writes its stacks on SIGUSR1."""
    out = []
    for pid in tagged_pids(run_id):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        module = argv[argv.index(b"-m") + 1] if b"-m" in argv[:-1] else None  # python [-u] -m MODULE
        if module in (b"payload", b"payload.train.torchrun"):
            out.append(pid)
    return out


def run_seen(run: Run, lines: int = 30) -> str:
    """What a wait that gave up saw: the run's status.json, the end of its log, and where each of its
    payload processes was (SIGUSR1: each writes its threads' stacks to the log and goes on)."""
    def read(path: Path) -> str:
        try:
            return path.read_text(errors="replace")
        except OSError as e:
            return f"({e.strerror})"

    log = Path(run.handle.log) if run.handle.log else None
    before = read(log) if log else "(no log)"
    for pid in payload_pids(run.id):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGUSR1)
    time.sleep(3)
    after = read(log)[len(before):] if log else ""
    stacks = [line for line in after.splitlines() if line.startswith(("Thread 0x", "Current thread", "  File"))]
    tail = "\n".join(before.splitlines()[-lines:])
    return (f"status.json: {read(run_dir(run) / layout.STATUS).strip()}\nlast {lines} lines of run.log:\n{tail}"
            f"\nits processes (pid ppid state wchan argv):\n{processes(run.id)}"
            f"\nits payload processes' stacks (SIGUSR1):\n" + ("\n".join(stacks) or "(none written)"))


def processes(run_id: str) -> str:
    """Each live process of the run, one line: pid, parent, state (R S D T...), where the kernel has it
    waiting, its command line."""
    out = []
    for pid in tagged_pids(run_id):
        proc = Path(f"/proc/{pid}")
        try:
            stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            wchan = (proc / "wchan").read_text() or "-"
            argv = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:120]
        except OSError:
            continue
        out.append(f"{pid} {stat[1]} {stat[0]} {wchan} {argv}")
    return "\n".join(out) or "(none)"


# --------------------------------------------------------------------------------- the shared run


def test_up_uploads_workdir_and_starts_detached(fake_run, sshd):
    backend, run = fake_run
    h = run.handle
    assert run.state == "running" and h.host == sshd.host and h.identity_file == str(sshd.client_key)
    workdir = Path(h.run_root) / "workdir"
    assert (workdir / "payload" / "layout.py").read_bytes() == (REPO_ROOT / "payload" / "layout.py").read_bytes()
    assert (workdir / "sky" / "config" / "fake.yaml").read_text() == "name: fake\n"
    assert not list(workdir.rglob("*.pyc"))  # caches stay home
    up = h.upload
    assert up["files_sent"] > 5 and up["bytes_sent"] > 1000 and up["files_removed"] == 0
    assert h.volume == str(Path(h.remote_root) / "volume")
    assert os.getpgid(h.pid) == h.pid  # its own process group: `down` signals all of it
    node_sh = (Path(h.run_root) / "node.sh").read_text()
    assert "export LAUNCH_LOCAL=1" in node_sh and f"export LAUNCH_RUN_ID={run.id}" in node_sh
    assert f"export LAUNCH_VOLUME={h.volume}" in node_sh and "SKYPILOT_NUM_GPUS_PER_NODE=0" in node_sh


def test_secret_reaches_the_process_but_no_command_line(fake_run):
    backend, run = fake_run
    pid = run.handle.pid
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    assert f"HF_TOKEN={SECRET}".encode() in environ
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            assert SECRET.encode() not in cmdline.read_bytes(), f"secret on the command line of {cmdline}"
        except OSError:
            pass


def test_status_while_running_reads_status_json(fake_run):
    backend, run = fake_run
    wait_for(lambda: (run_dir(run) / layout.STATUS).exists(), what="status.json")
    st = backend.status(run)
    assert st.state == "running" and st.max_steps == 1200 and st.step >= 1
    assert st.cost_usd == 0.01 and st.extra["payload_state"] == "training"


def test_logs_follow_survives_dropped_connection(fake_run, sshd):
    backend, run = fake_run
    out, result = Collector(), []
    follower = threading.Thread(target=lambda: result.append(backend.logs(run, True, out)), daemon=True)
    follower.start()
    wait_for(lambda: "step 5 " in out.text(), what="the first log lines")
    accepted_before = sshd.log.read_text().count("Accepted publickey")
    killed = sshd.kill_sessions()
    assert killed, "no sshd session process to kill"
    sshd.restart(down_for=1.5)  # the listener is gone too for a while: reconnects must back off
    shown = len(out.text())
    wait_for(lambda: len(out.text()) > shown + 40, what="the stream to resume")
    release(run)
    follower.join(timeout=120)
    assert not follower.is_alive() and result == [0]
    assert sshd.log.read_text().count("Accepted publickey") > accepted_before
    text = out.text()
    assert text == Path(run.handle.log).read_text()  # every byte once: no gap, no duplicate
    steps = [int(line.split()[1]) for line in text.splitlines() if line.startswith("step ")]
    assert steps == list(range(1, len(steps) + 1)) and "café" in text and text.endswith("fake run done\n")


def test_completed_status_and_fetch_verified(fake_run, tmp_path):
    from launcher.store.artifacts import fetch

    backend, run = fake_run
    release(run)
    st = wait_state(backend, run, ("completed", "failed"))
    assert st.state == "completed" and st.reason is None
    report = fetch(backend, run, tmp_path / "art")  # this scripted run writes no MANIFEST: sizes checked
    assert report.ok and report.checked == "size", report
    assert set(report.files) == {"adapter/adapter_model.safetensors", "adapter/adapter_config.json",
                                 "training_summary.json", "metrics.jsonl", "logs/run.log", "checkpoints.json"}
    from safetensors.torch import load_file

    tensors = load_file(tmp_path / "art" / "adapter" / "adapter_model.safetensors")
    assert tensors["lora_A"].shape == (2, 3) and float(tensors["lora_A"].sum()) == 15.0
    assert (tmp_path / "art" / "metrics.jsonl").read_bytes() == (run_dir(run) / layout.METRICS).read_bytes()
    assert not list((tmp_path / "art").rglob("*.part")) and not (tmp_path / "art" / ".incoming").exists()
    out = Collector()
    assert backend.logs(run, False, out) == 0 and out.text() == Path(run.handle.log).read_text()
    assert (tmp_path / "art" / "logs" / "run.log").read_text() == out.text()  # the log is in the run dir


def test_secret_never_written_anywhere(fake_run, env, sshd):
    backend, run = fake_run
    release(run)
    wait_state(backend, run, ("completed", "failed"))
    log = Path(run.handle.log).read_text()
    assert f"token sha256 {hashlib.sha256(SECRET.encode()).hexdigest()}" in log  # the run saw it
    scanned = assert_secret_absent(log, env["base"], Path(os.environ["LAUNCH_HOME"]), Path(os.environ["HOME"]),
                                   sshd.root)
    assert scanned > 20


def assert_secret_absent(text: str, *tops: Path) -> int:
    """The secret is in no file under `tops` and not in `text`; returns how many files were read."""
    assert SECRET not in text
    scanned = 0
    for top in tops:
        for f in (p for p in top.rglob("*") if p.is_file()) if top.exists() else []:
            assert SECRET.encode() not in f.read_bytes(), f"secret written to {f}"
            scanned += 1
    return scanned


def test_second_run_uploads_incrementally_and_down_stops_it(fake_run, sshd, env):
    first_workdir = Path(fake_run[1].handle.run_root) / "workdir"
    backend = make_backend(sshd, env)
    config_text = "name: fake\n# changed\n"
    spec = fake_spec(env, "fake-2", config_text=config_text)
    spec.envs["FAKE_DETACHED_CHILD"] = "1"
    run = backend.up(spec)
    try:
        # The new workdir is seeded from the newest one (hard links): only files that differ from it
        # travel: the changed config, plus any repo file edited since the first upload.
        workdir = Path(run.handle.run_root) / "workdir"
        new, old = _files(workdir), _files(first_workdir)
        sent = {rel for rel in new if rel not in old or new[rel].read_bytes() != old[rel].read_bytes()}
        up = run.handle.upload
        assert "sky/config/fake.yaml" in sent and up["files_sent"] == len(sent)
        assert up["bytes_sent"] == sum(new[rel].stat().st_size for rel in sent)
        assert up["files_unchanged"] == len(new) - len(sent)
        assert up["files_removed"] == len(set(old) - set(new))
        assert (workdir / "sky/config/fake.yaml").read_text() == config_text
        assert (first_workdir / "sky/config/fake.yaml").read_text() == "name: fake\n"  # not through a hard link
        wait_for(lambda: (run_dir(run) / layout.STATUS).exists(), what="the second run to start")
        wait_for(lambda: len(tagged_pids(run.id)) >= 3, what="the detached child")
        backend.down(run, grace_s=5)
        assert group_members(run.handle.pgid) == []  # a zombie leader waiting for its reaper is gone
        assert tagged_pids(run.id) == []  # the detached child (new session) was stopped as well
        st = backend.status(run)
        assert st.state == "stopped"
    finally:
        release(run)
        backend.down(run, grace_s=1)


def test_exit_codes_and_vanished_processes_map_to_states(sshd, env):
    backend = make_backend(sshd, env)
    spec = fake_spec(env, "fake-budget")
    spec.envs["FAKE_EXIT"] = "3"  # the payload's exit code when the budget is spent
    budget = backend.up(spec)
    spec = fake_spec(env, "fake-killed")
    killed = backend.up(spec)
    spec = fake_spec(env, "fake-failed")
    spec.envs["FAKE_EXIT"] = "7"
    failed = backend.up(spec)
    assert wait_state(backend, budget, ("budget_exhausted", "failed", "completed")).state == "budget_exhausted"
    st = wait_state(backend, failed, ("budget_exhausted", "failed", "completed"))
    assert st.state == "failed" and "exit code 7" in st.reason
    wait_for(lambda: len(tagged_pids(killed.id)) >= 2, what="the run to start")
    os.killpg(killed.handle.pgid, 9)  # what a host reboot does: no exit code recorded
    st = wait_state(backend, killed, ("preempted", "failed", "completed"))
    assert st.state == "preempted" and "--resume" in st.reason
    # `launch up --resume`: same run, same place, a fresh driver; the log goes on after the old one.
    resumed = backend.up(fake_spec(env, killed.id, run=killed))
    assert resumed.handle.run_root == killed.handle.run_root
    release(resumed)
    assert wait_state(backend, resumed, ("preempted", "failed", "completed")).state == "completed"
    assert Path(resumed.handle.log).read_text().count("launch: setup on node 0") == 2
    # Following it shows the new attempt (after a restart mark and the old one's last lines), not both.
    whole, followed = Collector(), Collector()
    assert backend.logs(resumed, False, whole) == 0 and backend.logs(resumed, True, followed) == 0
    assert whole.text().count("launch: setup on node 0") == 2 and "earlier attempts" not in whole.text()
    assert followed.text().startswith(f"… earlier attempts not repeated (`launch logs {killed.id}` shows them)\n")
    after = followed.text().split("── launch: the run restarts here (", 1)[1]
    assert after.count("launch: setup on node 0") == 1 and "restarts here" not in after


@pytest.mark.parametrize("facts, reported, run_state, expected", [
    ({"alive": "1", "pid": "9"}, {"state": "training"}, "running", "running"),
    ({"exit": "0", "pid": "9"}, {}, "running", "completed"),
    ({"exit": "0", "pid": "9", "stopped": "1"}, {}, "stopped", "completed"),
    ({"exit": "3", "pid": "9"}, {"reason": "spent $1.00"}, "running", "budget_exhausted"),
    ({"exit": "143", "pid": "9"}, {}, "running", "preempted"),
    ({"exit": "143", "pid": "9", "stopped": "1"}, {}, "running", "stopped"),
    ({"exit": "1", "pid": "9"}, {}, "running", "failed"),
    ({"pid": "9"}, {}, "running", "preempted"),
    ({"pid": "9"}, {}, "stopped", "stopped"),
    ({}, {}, "starting", "failed"),
    ({"nodir": "1"}, {}, "running", "failed"),
])
def test_state_table(facts, reported, run_state, expected):
    run = Run(id="r", profile="p", backend="ssh", state=run_state)
    assert _state(facts, reported, run)[0] == expected


# ---------------------------------------------------------------------------------------- host keys


def test_unknown_host_key_refused_with_fingerprint(sshd, env, tmp_path):
    known = tmp_path / "known_hosts"
    backend = make_backend(sshd, env, known_hosts=str(known))
    with pytest.raises(BackendError) as e:
        backend.probe()
    msg = str(e.value)
    assert sshd.host_fingerprint() in msg and "ssh-ed25519" in msg and "--accept-new-host-key" in msg
    assert not known.exists()
    info = make_backend(sshd, env, known_hosts=str(known), accept_new_host_key=True).probe()
    assert info["home"].startswith("/") and info["gpus"] == 0
    assert known.read_text() == sshd.known_hosts_line()
    assert make_backend(sshd, env, known_hosts=str(known)).probe()["home"] == info["home"]


def test_changed_host_key_always_refused(sshd, env, tmp_path):
    other = keygen(tmp_path / "impostor")
    kind, b64 = (tmp_path / "impostor.pub").read_text().split()[:2]
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{sshd.port} {kind} {b64}\n")
    for accept in (False, True):
        with pytest.raises(BackendError) as e:
            make_backend(sshd, env, known_hosts=str(known), accept_new_host_key=accept).probe()
        assert "HOST KEY CHANGED" in str(e.value) and "man-in-the-middle" in str(e.value)
        assert sshd.host_fingerprint() in str(e.value)
    assert known.read_text() == f"[127.0.0.1]:{sshd.port} {kind} {b64}\n"
    assert other.exists()


def test_changed_host_key_hint_is_the_command_that_fixes_it(sshd, env, tmp_path):
    """Port != 22: known_hosts says `[127.0.0.1]:PORT`; the hint must remove exactly that entry."""
    import shlex
    import subprocess

    keygen(tmp_path / "impostor")
    kind, b64 = (tmp_path / "impostor.pub").read_text().split()[:2]
    known = tmp_path / "known_hosts"
    other = "[10.0.0.9]:2200 ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJdD7y3aLq454yWBdwLWbieU1ebz9/cu7/QEXn9OIeZJ\n"
    known.write_text(f"[127.0.0.1]:{sshd.port} {kind} {b64}\n" + other)
    with pytest.raises(BackendError) as e:
        make_backend(sshd, env, known_hosts=str(known)).probe()
    hint = str(e.value).split("remove the old key with `")[1].split("`")[0]
    assert hint == f"ssh-keygen -R '[127.0.0.1]:{sshd.port}' -f {known}"
    subprocess.run(shlex.split(hint), check=True, capture_output=True, timeout=30)  # what the user runs
    assert known.read_text() == other  # exactly that entry is gone
    info = make_backend(sshd, env, known_hosts=str(known), accept_new_host_key=True).probe()
    assert info["home"].startswith("/")


def test_wrong_client_key_is_a_clear_error(sshd, env, tmp_path):
    stranger = keygen(tmp_path / "stranger")
    with pytest.raises(BackendError, match="refused our key"):
        make_backend(sshd, env, identity_file=str(stranger)).probe()


def test_unreachable_host_status_does_not_raise(env):
    backend = SSHBackend(known_hosts=str(env["known_hosts"]), connect_timeout=2)
    run = Run(id="gone", profile="fake", backend="ssh", state="running",
              handle={"host": f"nobody@127.0.0.1:{free_port()}", "run_root": "/nowhere", "run_dir": "/nowhere"})
    st = backend.status(run)
    assert st.state == "unreachable" and st.extra["unreachable"] and st.reason.startswith("unreachable: cannot reach")
    assert st.extra["last_state"] == "running"
    run.state = "failed"  # an ended run is never reported live (it was, as "running", before issue 32)
    assert backend.status(run).state == "unreachable"


# ------------------------------------------------------------------------ the real local-demo run


def demo_spec(tmp_path: Path, run_id: str, run: Run | None = None, export_mlx: bool = False,
              **train) -> LaunchSpec:
    """The real local-demo task (tiny model, CPU), rendered with `train` overrides."""
    from launcher.profiles.profile import load_profile
    from launcher.profiles.render import render_text

    prof = yaml.safe_load((REPO_ROOT / "clusters" / "local-demo.yaml").read_text())
    prof["train"].update(train)
    prof["outputs"].update(merge=False, export_mlx=export_mlx)  # the MLX export comes home too (runbook 001)
    d = tmp_path / run_id
    d.mkdir(exist_ok=True)
    (d / "local-demo.yaml").write_text(yaml.safe_dump(prof))
    profile = load_profile(str(d / "local-demo.yaml"))
    task_text, config_text = render_text(profile, 0.1)
    (d / "task.yaml").write_text(task_text)
    (d / "config.yaml").write_text(config_text)
    return LaunchSpec(run=run or Run(id=run_id, profile="local-demo", backend="ssh"), profile=profile,
                      task_yaml=d / "task.yaml", config_yaml=d / "config.yaml",
                      envs={"LAUNCH_LOCAL": "1", "PATH": NODE_PATH, "OMP_NUM_THREADS": "1",
                            "LAUNCH_MASTER_PORT": str(free_port())},
                      secrets={"HF_TOKEN": SECRET})


@pytest.mark.slow
def test_local_demo_end_to_end_over_ssh(sshd, env, tmp_path):
    spec = demo_spec(tmp_path, "demo-ssh", export_mlx=True, max_steps=10, eval_steps=5, logging_steps=5,
                     checkpoints={"save_steps": 5, "keep_best": 1, "keep_recent": 2})
    backend = make_backend(sshd, env)
    run = backend.up(spec)
    assert f"HF_TOKEN={SECRET}".encode() in Path(f"/proc/{run.handle.pid}/environ").read_bytes()
    out = Collector()
    code = backend.logs(run, True, out)
    assert code == 0, out.text()[-3000:]
    st = backend.status(run)
    assert st.state == "completed" and st.step == 10, st
    from launcher.store.artifacts import fetch

    report = fetch(backend, run, tmp_path / "art")
    assert report.ok and report.checked == "sha256" and not report.notes, report  # the real MANIFEST
    for name in ("adapter/adapter_model.safetensors", "mlx/adapters.safetensors", "mlx/adapter_config.json",
                 "high_loss_samples.jsonl", "training_summary.json", "loss.png", "data_stats.json",
                 "checkpoints.json", "metrics.jsonl", "logs/run.log", "MANIFEST.json"):
        assert (tmp_path / "art" / name).is_file(), name
    manifest = json.loads((tmp_path / "art" / "MANIFEST.json").read_text())
    assert manifest["required"] == ["adapter", "training_summary.json", "metrics.jsonl", "mlx"]
    from safetensors.torch import load_file

    tensors = load_file(tmp_path / "art" / "adapter" / "adapter_model.safetensors")
    assert any("lora_A" in k for k in tensors) and all(t.isfinite().all() for t in tensors.values())
    assert_secret_absent(out.text(), env["base"], tmp_path)


def _training_step(run: Run) -> int:
    try:
        return int(json.loads((run_dir(run) / layout.STATUS).read_text()).get("step") or 0)
    except (OSError, ValueError):
        return 0


@pytest.mark.slow
def test_preemption_and_down_leave_no_process_of_the_run(sshd, env, tmp_path):
    """The real payload under torchrun: SIGKILL of the driver's group (the host's processes dying),
    then a resume that takes over the dead trainer's lease, then `down`: nothing of the run remains."""
    backend = make_backend(sshd, env)
    train = dict(max_steps=100000, logging_steps=1, eval_steps=100000,
                 checkpoints={"save_steps": 3, "keep_best": 1, "keep_recent": 2})
    run = backend.up(demo_spec(tmp_path, "demo-kill", **train))
    try:
        wait_for(lambda: _training_step(run) >= 4, timeout=TRAINER_START_S, what="training to start",
                 seen=lambda: run_seen(run))
        os.killpg(run.handle.pgid, 9)
        wait_for(lambda: tagged_pids(run.id) == [], timeout=20, what="the torchrun worker to die with its agent")
        st = wait_state(backend, run, ("preempted", "failed", "completed"), timeout=30)  # once init reaped them
        assert st.state == "preempted" and "--resume" in st.reason
        stopped_at = _training_step(run)
        run = backend.up(demo_spec(tmp_path, run.id, run=run, **train))
        wait_for(lambda: _training_step(run) > stopped_at + 1, timeout=TRAINER_START_S,
                 what=f"the resumed run to train past step {stopped_at + 1}", seen=lambda: run_seen(run))
        backend.down(run, grace_s=15)
        # SIGKILLed by down, a trainer may still be ending (its memory freed) on a loaded machine
        wait_for(lambda: tagged_pids(run.id) == [], timeout=20, what="every process of the run to end after down",
                 seen=lambda: processes(run.id))
        st = backend.status(run)
        assert st.state == "stopped" and st.extra["payload_state"] == "stopped"
        log = Path(run.handle.log).read_text()
        assert log.count("launch: setup on node 0") == 2 and "took over this run's stale lease" in log
        assert "stopped by SIGTERM at step" in log
    finally:
        for pid in tagged_pids(run.id):
            os.kill(pid, 9)


def _dead_pid() -> int:
    import subprocess

    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


STOP_REASON = "stopped by SIGTERM at step 5 of 40; checkpoint-5 saved"


@pytest.mark.parametrize("code, reported, asked, state, reason", [
    (None, {}, False, "preempted", "`launch up --resume` continues from the last checkpoint"),
    (None, {}, True, "stopped", "stopped by launch down"),
    (0, {"state": "completed", "exit_code": 0, "reason": None}, False, "completed", None),
    (1, {"state": "budget_exhausted", "exit_code": 3, "reason": "budget of $1.00 reached at step 7"}, False,
     "budget_exhausted", "budget of $1.00 reached at step 7"),
    (1, {"state": "failed", "exit_code": 1, "reason": "ValueError: boom"}, False, "failed", "ValueError: boom"),
    (2, {"state": "stopped", "exit_code": 143, "reason": "an older session's end"}, False, "failed",
     "config or data error (exit 2)"),
    (1, {"state": "stopped", "exit_code": 143, "reason": STOP_REASON}, False, "preempted", STOP_REASON),
    (143, {"state": "stopped", "exit_code": 143, "reason": STOP_REASON}, True, "stopped", STOP_REASON),
    (1, {"state": "preempted", "exit_code": 75, "reason": "ConnectionResetError: peer"}, False, "preempted",
     "ConnectionResetError: peer"),
    (4, {"state": "training", "step": 9}, False, "failed", "another trainer holds this run's lease"),
])
@pytest.mark.parametrize("backend_name", ["local", "ssh"])
def test_end_state_contract(backend_name, code, reported, asked, state, reason, sshd, env, tmp_path):
    """One mapping from (driver exit code, the payload's status.json, stopped by `launch down`) to the
    state and reason `launch status` shows, held for every backend that runs the task itself."""
    run_id = f"contract-{backend_name}"
    if backend_name == "local":
        from launcher.backends.local import LocalBackend

        backend = LocalBackend()
        run = Run(id=run_id, profile="p", backend="local", state="running",
                  handle={"pid": _dead_pid(), "pgid": 0, "volume": str(tmp_path / "vol")})
        home, rd = backend.home(run), backend.run_dir(run)
    else:
        backend = make_backend(sshd, env)
        home, rd = tmp_path / "remote" / run_id, tmp_path / "vol" / "runs" / run_id
        run = Run(id=run_id, profile="p", backend="ssh", state="running",
                  handle={"host": sshd.host, "known_hosts": str(env["known_hosts"]),
                          "identity_file": str(sshd.client_key), "run_root": str(home), "run_dir": str(rd)})
        home.mkdir(parents=True)
        (home / "pid").write_text(f"{_dead_pid()}\n")
    home.mkdir(parents=True, exist_ok=True)
    rd.mkdir(parents=True)
    if code is not None:
        (home / "exit_code").write_text(f"{code}\n")
    if asked:
        (home / "stopped").touch()
    (rd / layout.STATUS).write_text(json.dumps(reported))
    st = backend.status(run)
    assert st.state == state
    assert (st.reason is None) if reason is None else (reason in st.reason), st.reason


def test_a_reused_pid_on_the_host_is_not_the_run_and_down_leaves_it_alone(sshd, env, tmp_path):
    """The driver's pid file outlives a driver killed without an exit code (a reboot): when another
    program holds that pid now, status says the run is gone (preempted, not running) and `launch down`
    signals nothing of the other program."""
    import subprocess

    run_id = "reused-pid"

    def tagged(volume):  # a process of a run with this id, of this launch home's volume or another one's
        env_ = {**os.environ, "LAUNCH_RUN_ID": run_id, "LAUNCH_VOLUME": str(volume)}
        return subprocess.Popen(["sleep", "60"], start_new_session=True, env=env_)

    other = subprocess.Popen(["sleep", "60"], start_new_session=True, cwd=tmp_path)
    stray, elsewhere = tagged(tmp_path / "vol"), tagged(tmp_path / "another-home-volume")
    try:
        backend = make_backend(sshd, env)
        home, rd = tmp_path / "remote" / run_id, tmp_path / "vol" / "runs" / run_id
        run = Run(id=run_id, profile="p", backend="ssh", state="running",
                  handle={"host": sshd.host, "known_hosts": str(env["known_hosts"]), "volume": str(tmp_path / "vol"),
                          "identity_file": str(sshd.client_key), "run_root": str(home), "run_dir": str(rd)})
        home.mkdir(parents=True)
        rd.mkdir(parents=True)
        (home / "pid").write_text(f"{other.pid}\n")
        st = backend.status(run)
        assert st.state == "preempted" and "--resume" in st.reason
        backend.down(run, grace_s=2)
        assert other.poll() is None, "launch down signalled another program's process group on the host"
        assert stray.wait(timeout=10) is not None  # the run's own stray: stopped
        assert elsewhere.poll() is None, "launch down stopped a process of another launch home's run"
    finally:
        for p in (other, stray, elsewhere):
            p.kill()
            p.wait()
