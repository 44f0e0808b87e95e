"""A Slurm run's files after its SkyPilot cluster is gone: read and fetched on the shared filesystem
through the cluster's login node (`ssh -F ~/.slurm/config HOST`, as SkyPilot reaches it), here a real
OpenSSH server on 127.0.0.1 playing the login node. Before, `launch status` of such a run had neither
its step nor why it ended (the RunPod volume's S3 API was the only route once the cluster went)."""

from __future__ import annotations

import json

from launcher.backends.skypilot import run_state
from launcher.backends.skypilot.files import RunFiles
from launcher.store.handle import Handle
from launcher.store.registry import Run


def _site(tmp_path, sshd, monkeypatch):
    home = tmp_path / "home"
    (home / ".slurm").mkdir(parents=True)
    (home / ".slurm" / "config").write_text(
        f"Host lab\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User {sshd.user}\n  IdentityFile {sshd.client_key}\n"
        f"  IdentitiesOnly yes\n  UserKnownHostsFile {tmp_path / 'known_hosts'}\n")
    (tmp_path / "known_hosts").write_text(sshd.known_hosts_line())
    monkeypatch.setenv("HOME", str(home))
    run_dir = tmp_path / "shared" / "launch" / "runs" / "r1"
    (run_dir / "outputs").mkdir(parents=True)
    (run_dir / "status.json").write_text(json.dumps({"state": "stopped", "step": 7}))
    (run_dir / "outputs" / "model.safetensors").write_bytes(b"w" * 100)
    run = Run(id="r1", profile="p", backend="skypilot", state="stopped")
    run.cluster = "r1"
    run.handle = Handle(kind="cluster", run_dir=str(run_dir), slurm_login="lab")
    return run


def test_a_gone_clusters_status_and_files_are_read_on_the_login_node(tmp_path, sshd, monkeypatch):
    run = _site(tmp_path, sshd, monkeypatch)
    text = run_state.run_text(run=run, rel="status.json", up=False)  # the route itself
    assert json.loads(text or "{}") == {"state": "stopped", "step": 7}
    files = RunFiles.of(run, cluster_up=lambda: False)
    assert files.list(("outputs",)) == {"outputs/model.safetensors": 100}
    files.copy(["outputs/model.safetensors"], tmp_path / "got")
    assert (tmp_path / "got" / "outputs" / "model.safetensors").read_bytes() == b"w" * 100
