"""One resume contract, every backend (issue 23): `launch up PROFILE --resume RUN` gives the machine
the run's recorded `--set` overrides and `--env` again with this command's `--set` on top, records
the change in the run's history, and refuses a change of the math (one line, exit 1) before any
backend is reached.

Real backends: the local one starts the rendered task here; the ssh one uploads to and starts on
the test OpenSSH server (tests/sshd.py); SkyPilot is faked only at its SDK calls (FakeSky). What is
checked is what each machine received: the uploaded run config and the run's environment. Each
started run is stopped with `launch down` at once (its training is tested in test_experiment.py).
"""

import os
import tempfile
from pathlib import Path

if "SKY_RUNTIME_DIR" not in os.environ:  # tests/conftest.py sets it; kept for a lone run of this file
    os.environ["SKY_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="sky-runtime-")

import pytest
import yaml
from click.testing import CliRunner

from launcher.store import registry
from launcher.cli import cli
from launcher.store.registry import Run
from test_skypilot_backend import FakeSky

BACKENDS = ("local", "ssh", "skypilot")
RECORDED = ["train.learning_rate=1e-3", "train.max_steps=12"]


def launch(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


class Machine:
    """One backend's side of the contract: how `launch up` reaches it, and what it received."""

    def __init__(self, kind, tmp_path, monkeypatch, sshd=None):
        self.kind, self.tmp, self.sshd = kind, tmp_path, sshd
        self.profile = "sonia-h100" if kind == "skypilot" else "local-demo"
        self.run_id = f"{self.profile}-20261125-000001"
        self.args, handle = ("--backend", kind), {}
        if kind == "ssh":
            ssh_dir = Path.home() / ".ssh"
            ssh_dir.mkdir(mode=0o700, exist_ok=True)
            (ssh_dir / "known_hosts").write_text(sshd.known_hosts_line())
            self.args += ("--host", sshd.host, "--identity", str(sshd.client_key))
            self.root = tmp_path / "remote"  # a resumed run keeps its place on the host
            handle = {"host": sshd.host, "remote_root": str(self.root), "volume": str(self.root / "volume")}
        if kind == "skypilot":
            from launcher.backends.skypilot import task as sp_backend  # where build_task looks it up

            self.sky, self.staged = FakeSky(monkeypatch), {}
            real_stage = sp_backend.stage_workdir
            monkeypatch.setattr(sp_backend, "stage_workdir",
                                lambda rid, files: (self.staged.update(files), real_stage(rid, files))[1])
        registry.save(Run(id=self.run_id, profile=self.profile, backend=kind, state="preempted", price_per_hour=0.1,
                          billed_s=60.0, billed_usd=0.01,
                          handle={**handle, "overrides": list(RECORDED), "envs": {"FOO": "bar"}}))

    def started(self) -> bool:
        if self.kind == "skypilot":
            return any(name in ("launch", "jobs.launch") for name, _, _ in self.sky.calls)
        if self.kind == "ssh":
            return (self.root / self.run_id).exists()
        from launcher.backends.local import LocalBackend

        return LocalBackend.home(registry.get(self.run_id)).exists()

    def received(self) -> tuple[dict, dict]:
        """(the run config the machine got, the environment its run got)."""
        run = registry.get(self.run_id)
        rel = f"sky/config/{self.profile}.yaml"
        if self.kind == "skypilot":
            (task,), _ = self.sky.one("launch")[1:]
            return yaml.safe_load(self.staged[rel].read_text()), dict(task.envs)
        if self.kind == "ssh":
            node = (Path(run.handle.run_root) / "node.sh").read_text()
            env = dict(line[len("export "):].split("=", 1) for line in node.splitlines() if line.startswith("export "))
            return yaml.safe_load((Path(run.handle.run_root) / "workdir" / rel).read_text()), env
        home = Path(run.handle.home)
        environ = Path(f"/proc/{run.handle.pid}/environ").read_bytes().split(b"\0")
        env = dict(x.decode().split("=", 1) for x in environ if b"=" in x)
        return yaml.safe_load((home / "workdir" / rel).read_text()), env

    def stop(self):
        if self.kind != "skypilot" and registry.get(self.run_id).active:
            assert launch("down", self.run_id).exit_code == 0


@pytest.fixture(params=BACKENDS)
def machine(request, tmp_path, monkeypatch):
    sshd = request.getfixturevalue("sshd") if request.param == "ssh" else None
    m = Machine(request.param, tmp_path, monkeypatch, sshd)
    yield m
    m.stop()


def test_a_math_change_on_resume_is_refused_before_any_backend_is_reached(machine):
    r = launch("up", machine.profile, "--resume", machine.run_id, *machine.args, "--set", "train.learning_rate=1e-4")
    assert r.exit_code == 1
    (line,) = r.output.strip().splitlines()
    assert line.startswith(f"✗ --resume {machine.run_id}: train.learning_rate: 0.001 -> 0.0001 would change "
                           "the math of the run in flight"), line
    assert f"launch up {machine.profile} --new" in line and "--allow-change train.learning_rate" in line
    assert not machine.started()
    run = registry.get(machine.run_id)
    assert run.state == "preempted" and run.handle.overrides == RECORDED and run.handle.history is None


def test_resume_gives_the_machine_the_runs_config_with_the_new_cadence_on_top(machine):
    r = launch("up", machine.profile, "--resume", machine.run_id, *machine.args, "--set", "train.max_steps=16",
               "--set", "train.eval_steps=4")
    assert r.exit_code == 0, r.output
    assert f"resumed {machine.run_id}" in r.output
    config, env = machine.received()
    assert config["train"]["learning_rate"] == 1e-3 and config["train"]["max_steps"] == 16
    assert config["train"]["eval_steps"] == 4
    assert env["FOO"] == "bar" and "LAUNCH_ALLOW_CHANGE" not in env
    run = registry.get(machine.run_id)
    assert run.handle.overrides == ["train.learning_rate=1e-3", "train.max_steps=16", "train.eval_steps=4"]
    (entry,) = run.handle.history
    assert entry["event"] == "resume" and entry["set"] == ["train.max_steps=16", "train.eval_steps=4"]
    assert entry["changes"]["train.max_steps"] == [12, 16] and entry["allowed"] == []
    assert set(entry["changes"]) == {"train.max_steps", "train.eval_steps"}


def test_an_allowed_math_change_reaches_the_payload_and_is_recorded(machine):
    r = launch("up", machine.profile, "--resume", machine.run_id, *machine.args, "--set", "train.learning_rate=5e-4",
               "--allow-change", "train.learning_rate")
    assert r.exit_code == 0, r.output
    config, env = machine.received()
    assert config["train"]["learning_rate"] == 5e-4 and config["train"]["max_steps"] == 12
    assert env["LAUNCH_ALLOW_CHANGE"] == "train.learning_rate"  # the payload's own check lets it through
    (entry,) = registry.get(machine.run_id).handle.history
    assert entry["changes"] == {"train.learning_rate": [1e-3, 5e-4]} and entry["allowed"] == ["train.learning_rate"]


def test_allow_change_goes_with_resume():
    r = CliRunner().invoke(cli, ["up", "local-demo", "--allow-change", "train.learning_rate"])
    assert r.exit_code == 2 and "--allow-change goes with --resume" in r.output


def test_resume_without_backend_options_continues_where_the_run_ran(machine):
    """No --backend (nor --host/--identity for ssh): the run's own backend and host, not the default."""
    if machine.kind == "ssh":  # the key is part of the run's record on a real run
        run = registry.get(machine.run_id)
        registry.update(run.id, handle={"identity_file": str(machine.sshd.client_key)})
    r = launch("up", machine.profile, "--resume", machine.run_id)
    assert r.exit_code == 0, r.output
    assert f"resumed {machine.run_id} ({machine.profile} on {machine.kind}" in r.output
    assert machine.started() and registry.get(machine.run_id).backend == machine.kind


def test_resume_on_another_backend_is_refused(machine):
    other = "local" if machine.kind != "local" else "skypilot"
    r = launch("up", machine.profile, "--resume", machine.run_id, "--backend", other)
    assert r.exit_code == 1
    assert r.output.strip() == (f"✗ --resume {machine.run_id}: the run ran on the {machine.kind} backend and its "
                                f"checkpoints are there; drop --backend {other}, or start a fresh run with --new")
    assert not machine.started()
