"""One artifact contract, every backend: up -> (the job) -> `launch down --fetch-artifacts` -> verify -> down.

The same job runs everywhere (tests/artifact_fixtures.py JOB): it puts a finished run directory in
place and runs the real `python -m payload manifest` on "the machine". Transfers are real: a local
copy, SFTP to the test OpenSSH server, rsync over ssh through the per-cluster SSH config SkyPilot
writes, and the RunPod volume's S3 API answered by a directory (boto3's client is the only thing
replaced, with SkyPilot's SDK calls: FakeSky). Every backend must leave the same files, byte for
byte, verified against the MANIFEST, and only then tear down.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from launcher import registry
from launcher.backends import LaunchSpec
from launcher.cli import cli
from launcher.profile import REPO_ROOT, load_profile
from launcher.registry import Run
from launcher.render import render_text

try:  # tests/ is a plain directory on sys.path (or, later, a package)
    from artifact_fixtures import HOME_LAYOUT, JOB, MERGED, NOT_ARTIFACTS, FakeS3, make_run_dir
    from sshd import SSHServer, ensure_sshd
    from test_skypilot_backend import FakeSky
except ImportError:
    from tests.artifact_fixtures import HOME_LAYOUT, JOB, MERGED, NOT_ARTIFACTS, FakeS3, make_run_dir
    from tests.sshd import SSHServer, ensure_sshd
    from tests.test_skypilot_backend import FakeSky

VENV_BIN = str(Path(sys.executable).parent)
NODE_PATH = f"{VENV_BIN}:/usr/local/bin:/usr/bin:/bin"
BACKENDS = ("local", "ssh", "skypilot-cluster", "skypilot-managed")
EXPECTED = set(HOME_LAYOUT.values()) | {"checkpoints.json", "MANIFEST.json", "logs/run.log"}


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    return make_run_dir(tmp_path_factory.mktemp("template") / "run")


@pytest.fixture(scope="module")
def sshd(tmp_path_factory):
    ensure_sshd()
    server = SSHServer(tmp_path_factory.mktemp("sshd")).start()
    yield server
    server.stop()


# ---------------------------------------------------------------------------- starting the job


def _spec(tmp_path, run_id, backend, profile, template, task=None):
    task_text, config_text = render_text(profile, 0.1)
    task_yaml, config_yaml = tmp_path / "task.yaml", tmp_path / f"{profile.name}.yaml"
    if task is not None:  # local/ssh: the rendered task's shape, the contract job as its `run`
        task_text = yaml.safe_dump(task)
    task_yaml.write_text(task_text)
    config_yaml.write_text(config_text)
    envs = {"CONTRACT_TEMPLATE": str(template), "LAUNCH_LOCAL": "1", "PATH": NODE_PATH}
    return LaunchSpec(run=Run(id=run_id, profile=profile.name, backend=backend), profile=profile,
                      task_yaml=task_yaml, config_yaml=config_yaml, envs=envs)


def _contract_task(profile):
    return {"name": "contract", "num_nodes": 1, "setup": "true", "run": JOB,
            "envs": {"LAUNCH_CONFIG": f"sky/config/{profile.name}.yaml", "LAUNCH_RUN_ID": "x",
                     "LAUNCH_VOLUME": ".launch/volume"}}


def _cloud_profile(tmp_path, name, mount):
    data = yaml.safe_load((REPO_ROOT / "clusters" / f"{name}.yaml").read_text())
    data["cluster"]["volume"]["mount"] = str(mount)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data))
    return load_profile(str(path))


def _run_job_as_skypilot_would(spec, run, mount):
    """What SkyPilot runs on the machine: the job, with the run's env (from the repo: the staged
    workdir is tested on its own in test_uploads_are_an_allowlist_staged_for_skypilot)."""
    env = {**os.environ, "LAUNCH_VOLUME": str(mount), "LAUNCH_RUN_ID": run.id, "SKYPILOT_NODE_RANK": "0",
           "LAUNCH_CONFIG": str(spec.config_yaml), "CONTRACT_TEMPLATE": spec.envs["CONTRACT_TEMPLATE"],
           "PYTHONPATH": str(REPO_ROOT), "PATH": NODE_PATH}
    done = subprocess.run(["bash", "-c", JOB], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def _cluster_ssh_config(server, cluster, tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text(server.known_hosts_line())
    config = Path.home() / ".sky" / "generated" / "ssh" / cluster
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(f"Host {cluster}\n  HostName 127.0.0.1\n  Port {server.port}\n  User {server.user}\n"
                      f"  IdentityFile {server.client_key}\n  IdentitiesOnly yes\n"
                      f"  UserKnownHostsFile {known}\n  StrictHostKeyChecking yes\n")


def _runpod_edge(monkeypatch, fake, mount):
    """RunPod's REST API (volume id) and the volume's S3 API (a directory): the only fakes."""
    import boto3
    import requests

    monkeypatch.setenv("RUNPOD_API_KEY", "rp_key")
    monkeypatch.setenv("RUNPOD_S3_ACCESS_KEY", "user_abc")
    monkeypatch.setenv("RUNPOD_S3_SECRET_KEY", "rps_def")
    fake.results["volumes.ls"] = [{"name": "lovecraft-workspace", "zone": "US-CA-2", "region": "US",
                                   "name_on_cloud": "lovecraft-workspace-1a2b3c"}]

    class Listing:
        status_code, text = 200, "[...]"

        def json(self):
            return [{"id": "vol123", "name": "lovecraft-workspace-1a2b3c", "dataCenterId": "US-CA-2"}]

    monkeypatch.setattr(requests, "request", lambda method, url, **kw: Listing())
    clients = []

    def client(service, endpoint_url, region_name, aws_access_key_id, aws_secret_access_key):
        assert service == "s3" and aws_access_key_id == "user_abc"
        clients.append(FakeS3(mount, endpoint_url, region_name))
        return clients[-1]

    monkeypatch.setattr(boto3, "client", client)
    return clients


def start(kind, tmp_path, template, sshd, monkeypatch):
    """(run, check_down): the run started on `kind` and finished; check_down() asserts the teardown."""
    if kind in ("local", "ssh"):
        profile = load_profile("local-demo")
        spec = _spec(tmp_path, f"contract-{kind}", kind, profile, template, task=_contract_task(profile))
        if kind == "local":
            from launcher.backends.local import LocalBackend

            be = LocalBackend()
        else:
            from launcher.backends.ssh import SSHBackend

            known = tmp_path / "known_hosts"
            known.write_text(sshd.known_hosts_line())
            be = SSHBackend(host=sshd.host, identity_file=str(sshd.client_key), known_hosts=str(known),
                            remote_root=str(tmp_path / "remote"))
        run = be.up(spec)
        deadline = time.time() + 60
        while be.status(run).state != "completed":
            assert time.time() < deadline, be.status(run)
            time.sleep(0.2)
        return run, lambda: None
    from launcher.backends import skypilot as sp

    fake = FakeSky(monkeypatch)
    mount = tmp_path / "volume"
    if kind == "skypilot-cluster":
        profile = _cloud_profile(tmp_path, "sonia-h100", mount)
        run = sp.SkyPilotBackend().up(_spec(tmp_path, "contract-cluster", "skypilot", profile, template))
        fake.results["status"] = [{"name": run.cluster, "status": "UP"}]
        fake.results["job_status"] = {7: "SUCCEEDED"}
        _cluster_ssh_config(sshd, run.cluster, tmp_path)
        gone = "down"
    else:
        clients = _runpod_edge(monkeypatch, fake, mount)
        profile = _cloud_profile(tmp_path, "lovecraft-a100-spot", mount)
        run = sp.SkyPilotBackend().up(_spec(tmp_path, "contract-managed", "skypilot", profile, template))
        fake.results["jobs.queue"] = ([{"job_id": 3, "job_name": run.id, "status": "SUCCEEDED"}], 1, {}, 0)
        gone = "jobs.cancel"
    _run_job_as_skypilot_would(_spec(tmp_path, run.id, "skypilot", profile, template), run, mount)

    def check_down():
        assert gone in fake.names()
        if kind == "skypilot-managed":
            assert clients and clients[0].meta.endpoint_url == "https://s3api-us-ca-2.runpod.io"

    return run, check_down


# --------------------------------------------------------------------------------- the contract


def _tree(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() or p.is_symlink()}


@pytest.mark.parametrize("kind", BACKENDS)
def test_contract_up_fetch_verify_down(kind, tmp_path, template, sshd, monkeypatch):
    run, check_down = start(kind, tmp_path, template, sshd, monkeypatch)
    registry.save(run)
    dest = tmp_path / "artifacts"

    r = CliRunner().invoke(cli, ["down", run.id, "--fetch-artifacts", "--dest", str(dest)])
    assert r.exit_code == 0, r.output
    home = dest / run.id
    assert _tree(home) == EXPECTED, r.output
    for src, name in HOME_LAYOUT.items():
        assert (home / name).read_bytes() == (template / src).read_bytes(), name
    manifest = json.loads((home / "MANIFEST.json").read_text())
    assert manifest["run_id"] == run.id and manifest["state"] == "completed"
    assert set(manifest["files"]) == EXPECTED - {"MANIFEST.json", "logs/run.log", "logs/rank_0_traceback.log"} \
        | set(MERGED.values())
    listing = json.loads((home / "checkpoints.json").read_text())
    assert [(c["step"], c["complete"], c["eval_loss"]) for c in listing] == [(4, True, 1.75), (8, True, 1.5)]
    assert "sha256-verified against the machine's MANIFEST" in r.output
    assert "merged/" in r.output and "add --merged" in r.output
    assert f"{run.id} is down" in r.output and "adapter/ mlx/" in r.output
    assert registry.get(run.id).artifacts == str(home.resolve())
    check_down()

    # Again, with the merged model: the same layout plus merged/, files replaced, nothing else.
    r = CliRunner().invoke(cli, ["down", run.id, "--fetch-artifacts", "--merged", "--dest", str(dest)])
    assert r.exit_code == 0, r.output
    assert _tree(home) == EXPECTED | set(MERGED.values())
    for src, name in MERGED.items():
        assert (home / name).read_bytes() == (template / src).read_bytes()
    assert all((template / rel).exists() for rel in NOT_ARTIFACTS)  # there, and never fetched


# ------------------------------------------------------------------- what the contract refuses


def _local_run(tmp_path, template, run_id="r1", manifest=True, state="completed"):
    """A run of the local backend whose run directory is a copy of the template (no process)."""
    from launcher.backends.local import LocalBackend
    from payload import layout, manifest as mf
    from payload.money import atomic_write_json

    volume = tmp_path / "volume"
    rd = layout.run_dir(volume, run_id)
    shutil.copytree(template, rd, symlinks=True)
    if manifest:
        atomic_write_json(rd / layout.CHECKPOINT_LISTING, mf.checkpoint_listing(rd))
        atomic_write_json(rd / layout.MANIFEST, mf.build(rd, ["adapter", "training_summary.json",
                                                             "metrics.jsonl", "mlx"], run_id, state))
    run = Run(id=run_id, profile="local-demo", backend="local", state=state,
              handle={"volume": str(volume), "home": str(tmp_path / "home-of-run")})
    return LocalBackend(), run, rd


def test_a_corrupt_or_missing_required_artifact_refuses_teardown(tmp_path, template, monkeypatch):
    _, run, rd = _local_run(tmp_path, template)
    registry.save(run)
    downs = []
    monkeypatch.setattr("launcher.backends.local.LocalBackend.down", lambda self, r: downs.append(r.id))
    weights = rd / "outputs/adapter/adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # one flipped bit after the MANIFEST was written
    weights.write_bytes(bytes(data))
    r = CliRunner().invoke(cli, ["down", "r1", "--fetch-artifacts", "--dest", str(tmp_path / "a")])
    assert r.exit_code == 1 and downs == []
    assert "not tearing down r1: adapter/adapter_model.safetensors: sha256" in r.output
    assert "differs from the MANIFEST" in r.output and "retry `launch down r1 --fetch-artifacts`" in r.output
    assert not (tmp_path / "a/r1/adapter/adapter_model.safetensors").exists()  # a bad file never lands

    data[-1] ^= 1
    weights.write_bytes(bytes(data))  # repaired
    shutil.rmtree(rd / "outputs/mlx")  # the config asked for an MLX export; it is gone
    r = CliRunner().invoke(cli, ["down", "r1", "--fetch-artifacts", "--dest", str(tmp_path / "a")])
    assert r.exit_code == 1 and downs == [] and "mlx/adapters.safetensors: in the MANIFEST but gone" in r.output
    r = CliRunner().invoke(cli, ["down", "r1", "--dest", str(tmp_path / "a")])  # the way out it names
    assert r.exit_code == 0 and downs == ["r1"]


def test_a_run_without_manifest_fetches_what_exists_by_size(tmp_path, template):
    from launcher.artifacts import fetch

    be, run, rd = _local_run(tmp_path, template, manifest=False, state="stopped")
    shutil.rmtree(rd / "outputs")  # stopped mid-training: no adapter, summary, plot yet
    (rd / "checkpoints/checkpoint-8/COMPLETE").unlink()  # its last save was cut off
    report = fetch(be, run, tmp_path / "a" / run.id)
    assert report.ok and report.checked == "size", report
    assert any("wrote no MANIFEST" in n and "sizes checked, not checksums" in n for n in report.notes)
    home = tmp_path / "a" / run.id
    assert _tree(home) == {"metrics.jsonl", "data_stats.json", "logs/rank_0_traceback.log",
                           "checkpoints.json", "MANIFEST.json"}
    rows = json.loads((home / "checkpoints.json").read_text())
    assert [(c["step"], c["complete"], c["eval_loss"]) for c in rows] == [(4, True, 1.75), (8, False, None)]
    assert json.loads((home / "MANIFEST.json").read_text())["origin"].startswith("computed at home")
    # A completed run without the adapter, though, is not fine.
    run.state = "completed"
    report = fetch(be, run, tmp_path / "b" / run.id)
    assert not report.ok and "adapter: missing, yet the run completed" in report.problems
