"""`launch ssh RUN` / `launch exec RUN -- CMD` on every backend: local for real, ssh against a real
OpenSSH server on 127.0.0.1 (tests/sshd.py), SkyPilot with only the process start recorded."""

import os
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner

from launcher.runs import access
from launcher.store import registry
from launcher.cli import cli
from launcher.store.registry import Run
from payload import layout


def launch(*args):
    return CliRunner().invoke(cli, list(args))


def local_run(tmp_path, rid="local-demo-20261123-000000-7"):
    volume = tmp_path / "volume"
    rd = layout.run_dir(volume, rid)
    rd.mkdir(parents=True)
    registry.save(Run(id=rid, profile="local-demo", backend="local", state="completed",
                      handle={"volume": str(volume), "run_dir": str(rd)}))
    return rid, rd


def with_stdin(monkeypatch, text: str):
    """The access process reads the terminal; here it reads `text` (the process itself is real)."""
    monkeypatch.setattr(access.subprocess, "call",
                        lambda argv, **kw: subprocess.run(argv, input=text.encode(), timeout=60, **kw).returncode)


# ----------------------------------------------------------------------------------------- local


def test_local_exec_runs_in_the_run_dir_and_returns_its_exit_code(tmp_path, capfd):
    rid, rd = local_run(tmp_path)
    r = launch("exec", rid, "--", 'pwd; echo "dir=$LAUNCH_RUN_DIR id=$LAUNCH_RUN_ID"; touch made-here; exit 3')
    assert r.exit_code == 3, r.output
    out = capfd.readouterr().out
    assert f"{rd}\n" in out and f"dir={rd} id={rid}" in out
    assert (rd / "made-here").exists()
    r = launch("exec", rid, "--", "ls", "-d", "made here", "made-here")  # several words: quoted one by one
    assert r.exit_code == 2 and "made-here" in capfd.readouterr().out


def test_local_ssh_opens_the_users_shell_in_the_run_dir(tmp_path, monkeypatch, capfd):
    rid, rd = local_run(tmp_path)
    monkeypatch.setenv("SHELL", "/bin/bash")
    with_stdin(monkeypatch, 'echo "in $PWD"; exit 4\n')
    r = launch("ssh", rid)
    assert r.exit_code == 4, r.output
    assert f"in {rd}" in capfd.readouterr().out


def test_a_run_that_never_started_says_so(tmp_path):
    registry.save(Run(id="local-demo-1", profile="local-demo", backend="local", state="failed",
                      handle={"volume": str(tmp_path / "nowhere")}))
    r = launch("exec", "local-demo-1", "--", "true")
    assert r.exit_code == 1 and "has no directory yet" in r.output and "Traceback" not in r.output


# ------------------------------------------------------------------------------------------- ssh



def ssh_run(sshd, tmp_path, known: str, rid="sonia-h100-20261123-000000"):
    rd = tmp_path / "remote" / "volume" / "runs" / rid  # 127.0.0.1: the same filesystem
    rd.mkdir(parents=True)
    (tmp_path / "known_hosts").write_text(known)
    registry.save(Run(id=rid, profile="sonia-h100", backend="ssh", state="running",
                      handle={"host": sshd.host, "identity_file": str(sshd.client_key),
                              "known_hosts": str(tmp_path / "known_hosts"), "run_dir": str(rd)}))
    return rid, rd


def test_ssh_exec_uses_the_runs_stored_connection_and_returns_the_remote_exit_code(sshd, tmp_path, capfd):
    rid, rd = ssh_run(sshd, tmp_path, sshd.known_hosts_line())
    r = launch("exec", rid, "--", 'echo "at $PWD dir=$LAUNCH_RUN_DIR"; nproc > cpus; exit 5')
    assert r.exit_code == 5, r.output
    assert f"at {rd} dir={rd}" in capfd.readouterr().out
    assert (rd / "cpus").read_text().strip().isdigit()
    assert launch("exec", rid, "--", "true").exit_code == 0


def test_ssh_shell_opens_in_the_remote_run_dir(sshd, tmp_path, monkeypatch, capfd):
    rid, rd = ssh_run(sshd, tmp_path, sshd.known_hosts_line())
    with_stdin(monkeypatch, 'echo "shell in $PWD"; exit 6\n')
    r = launch("ssh", rid)
    assert r.exit_code == 6, r.output
    assert f"shell in {rd}" in capfd.readouterr().out


def test_ssh_refuses_a_host_key_it_does_not_know(sshd, tmp_path, capfd):
    rid, rd = ssh_run(sshd, tmp_path, "")  # the stored known_hosts lacks this host
    r = launch("exec", rid, "--", "touch ran")
    assert r.exit_code == 255
    assert "Host key verification failed" in capfd.readouterr().err and not (rd / "ran").exists()


# -------------------------------------------------------------------------------------- skypilot


@pytest.fixture
def started(monkeypatch):
    calls = []

    def call(argv, **kw):
        calls.append((argv, kw))
        return 9

    monkeypatch.setattr(access.subprocess, "call", call)
    return calls


def test_skypilot_ssh_goes_through_skypilots_ssh_config(started):
    cluster = "sonia-h100-20261123-000000"
    config = Path(os.path.expanduser(f"~/.sky/generated/ssh/{cluster}"))
    config.parent.mkdir(parents=True)
    config.write_text(f"Host {cluster}\n  HostName 203.0.113.7\n")
    registry.save(Run(id=cluster, profile="sonia-h100", backend="skypilot", cluster=cluster, state="running",
                      handle={"kind": "cluster", "run_dir": "/workspace/runs/" + cluster}))
    r = launch("exec", cluster, "--", "nvidia-smi")
    assert r.exit_code == 9, r.output
    argv, kw = started[0]
    assert argv[:3] == ["ssh", "-F", str(config)] and argv[-3:-1] == ["-T", cluster]
    assert argv[-1] == f'cd /workspace/runs/{cluster} || exit 1; export LAUNCH_RUN_DIR="$PWD"; nvidia-smi'
    assert kw["cwd"] is None
    launch("ssh", cluster)
    assert started[1][0][-1].endswith('exec "${SHELL:-bash}" -l')


def test_skypilot_ssh_names_the_clusters_key_from_home_not_the_passwd_home(started):
    """SkyPilot writes `IdentityFile ~/.sky/generated/ssh-keys/<cluster>.key`; ssh expands that `~` from
    the passwd home, not $HOME, so with HOME elsewhere (sudo, a container, CI) every ssh of launch failed
    (status read no step, fetch nothing) while SkyPilot's own ssh worked: found on the emulated RunPod."""
    cluster = "sonia-h100-20261123-000000"
    sky = Path(os.path.expanduser("~/.sky/generated"))
    (sky / "ssh").mkdir(parents=True)
    (sky / "ssh-keys").mkdir()
    key = sky / "ssh-keys" / f"{cluster}.key"
    key.write_text("not a real key\n")
    (sky / "ssh" / cluster).write_text(f"Host {cluster}\n  HostName 203.0.113.7\n"
                                       f"  IdentityFile ~/.sky/generated/ssh-keys/{cluster}.key\n"
                                       "  IdentityFile ~/.sky/generated/ssh-keys/gone.key\n")
    registry.save(Run(id=cluster, profile="sonia-h100", backend="skypilot", cluster=cluster, state="running",
                      handle={"kind": "cluster", "run_dir": "/workspace/runs/" + cluster}))
    launch("exec", cluster, "--", "true")
    argv, _ = started[0]
    assert argv[:5] == ["ssh", "-F", str(sky / "ssh" / cluster), "-i", str(key)], argv
    assert argv.count("-i") == 1, argv  # a key that is not there is not named


def test_skypilot_managed_job_says_how_to_reach_it_instead(started):
    registry.save(Run(id="lovecraft-a100-spot-1", profile="lovecraft-a100-spot", backend="skypilot",
                      state="running", handle={"kind": "managed_job", "job_id": 3, "run_dir": "/workspace/runs/x"}))
    r = launch("ssh", "lovecraft-a100-spot-1")
    assert r.exit_code == 1 and not started
    assert "is a managed job" in r.output and "launch logs lovecraft-a100-spot-1 --follow" in r.output
