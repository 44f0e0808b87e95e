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
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from launcher.store import registry
from launcher.backends import LaunchSpec
from launcher.cli import cli
from launcher.project import PACKAGE_ROOT as REPO_ROOT
from launcher.profiles.profile import load_profile
from launcher.store.registry import Run
from launcher.profiles.render import render_text

try:  # tests/ is a plain directory on sys.path (or, later, a package)
    from artifact_fixtures import HOME_LAYOUT, JOB, MERGED, NOT_ARTIFACTS, FakeS3, make_run_dir
    from sshd import SSHServer, ensure_sshd
    from sky_edge import FakeSky, runpod_edge
except ImportError:
    from tests.artifact_fixtures import HOME_LAYOUT, JOB, MERGED, NOT_ARTIFACTS, FakeS3, make_run_dir
    from tests.sshd import SSHServer, ensure_sshd
    from tests.sky_edge import FakeSky, runpod_edge

VENV_BIN = str(Path(sys.executable).parent)
NODE_PATH = f"{VENV_BIN}:/usr/local/bin:/usr/bin:/bin"
BACKENDS = ("local", "ssh", "skypilot-cluster", "skypilot-managed")
EXPECTED = set(HOME_LAYOUT.values()) | {"checkpoints.json", "MANIFEST.json", "logs/run.log"}


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    return make_run_dir(tmp_path_factory.mktemp("template") / "run")



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


def machine_backend(kind, tmp_path, sshd):
    """The local backend, or the ssh one pointed at the test sshd (host key known, remote root in tmp)."""
    if kind == "local":
        from launcher.backends.local import LocalBackend

        return LocalBackend()
    from launcher.backends.ssh import SSHBackend

    known = tmp_path / "known_hosts"
    known.write_text(sshd.known_hosts_line())
    return SSHBackend(host=sshd.host, identity_file=str(sshd.client_key), known_hosts=str(known),
                      remote_root=str(tmp_path / "remote"))


def start(kind, tmp_path, template, sshd, monkeypatch):
    """(run, check_down): the run started on `kind` and finished; check_down() asserts the teardown."""
    if kind in ("local", "ssh"):
        profile = load_profile("local-demo")
        spec = _spec(tmp_path, f"contract-{kind}", kind, profile, template, task=_contract_task(profile))
        be = machine_backend(kind, tmp_path, sshd)
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
        clients = runpod_edge(monkeypatch, fake, mount)
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
    if kind in ("local", "ssh"):  # a machine of the user's own: the run's temporary files stay in the run's place
        [temp] = re.findall(r"contract job: temp (\S+)", (home / "logs" / "run.log").read_text())
        own = run.handle.home if kind == "local" else run.handle.run_root
        assert Path(temp).resolve().parent == (Path(own) / "tmp").resolve(), (temp, own)
    check_down()

    # Again, with the merged model: the same layout plus merged/, files replaced, nothing else.
    r = CliRunner().invoke(cli, ["down", run.id, "--fetch-artifacts", "--merged", "--dest", str(dest)])
    assert r.exit_code == 0, r.output
    assert _tree(home) == EXPECTED | set(MERGED.values())
    for src, name in MERGED.items():
        assert (home / name).read_bytes() == (template / src).read_bytes()
    assert all((template / rel).exists() for rel in NOT_ARTIFACTS)  # there, and never fetched


@pytest.mark.parametrize("kind", ["local", "ssh", "skypilot-cluster"])
def test_contract_exec_runs_in_the_run_dir_and_exits_with_the_commands_code(kind, tmp_path, template, sshd,
                                                                            monkeypatch, capfd):
    """`launch exec RUN -- CMD` on the run's machine, for real on every backend that has one (SkyPilot:
    `ssh CLUSTER` through its generated ssh config, here pointing at the real sshd): the command runs in
    the run's directory with LAUNCH_RUN_DIR set, and its exit code is launch's."""
    run, _ = start(kind, tmp_path, template, sshd, monkeypatch)
    registry.save(run)
    r = CliRunner().invoke(cli, ["exec", run.id, "--", 'pwd > exec_marker; echo "$LAUNCH_RUN_DIR" >> exec_marker; '
                                 "test -f status.json -a -d outputs || exit 9; exit 7"])
    assert r.exit_code == 7, (r.output, capfd.readouterr())
    markers = list(tmp_path.rglob("exec_marker"))
    assert len(markers) == 1, markers
    cwd, env_dir = markers[0].read_text().split()
    assert Path(cwd).resolve() == Path(env_dir).resolve() == markers[0].parent.resolve()
    assert markers[0].parent.name == run.id


# ------------------------------------------------------------------- what the contract refuses


def _local_run(tmp_path, template, run_id="r1", manifest=True, state="completed"):
    """A run of the local backend whose run directory is a copy of the template (no process)."""
    from launcher.backends.local import LocalBackend
    from payload import layout
    from payload.outputs import manifest as mf
    from payload.volume.money import atomic_write_json

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
    from launcher.store.artifacts import fetch

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


# --------------------------------------------------------------------------- hostile machines

HOSTILE_FIND = r"""#!/bin/bash
# A machine that lies in its listing: paths out of the layout, then the truth.
printf '%s\t%s\0' 7 ../../.bashrc 7 /etc/cron.d/evil 7 'outputs/adapter/../../../../.profile' \
  7 $'outputs/adapter/x\n../../y' 7 'outputs/adapter//passwd'
exec /usr/bin/find "$@"
"""


@pytest.fixture(scope="module")
def hostile_sshd(tmp_path_factory):
    """An OpenSSH server whose sessions find a lying `find` first on PATH (sshd_config SetEnv)."""
    ensure_sshd()
    root = tmp_path_factory.mktemp("hostile")
    bin_dir = root / "bin"
    bin_dir.mkdir()
    (bin_dir / "find").write_text(HOSTILE_FIND)
    (bin_dir / "find").chmod(0o755)
    server = SSHServer(root / "sshd")
    server.conf.write_text(server.conf.read_text() + f"SetEnv PATH={bin_dir}:{NODE_PATH}\n")
    yield server.start()
    server.stop()


def _plant_links(rd: Path, secret: Path) -> None:
    (rd / "outputs/adapter/passwd.json").symlink_to(secret)  # a file link out of the run dir
    (rd / "outputs/mlx").rename(rd / "outputs/mlx-real")
    (rd / "outputs/mlx").symlink_to(secret.parent, target_is_directory=True)  # a directory link


def _outside(tmp_path: Path, *inside: Path) -> dict[str, bytes]:
    """Every file under tmp_path except under `inside`: must not change."""
    return {p.as_posix(): p.read_bytes() for p in tmp_path.rglob("*")
            if p.is_file() and not p.is_symlink() and not any(p.is_relative_to(i) for i in inside)}


def test_hostile_ssh_machine_writes_nothing_outside_dest(hostile_sshd, template, tmp_path):
    secret = tmp_path / "secrets" / "id_ed25519"
    secret.parent.mkdir()
    secret.write_text("PRIVATE KEY")
    rd = tmp_path / "remote" / "runs" / "evil"
    shutil.copytree(template, rd)
    _plant_links(rd, secret)
    known = tmp_path / "known_hosts"
    known.write_text(hostile_sshd.known_hosts_line())
    run = Run(id="evil", profile="local-demo", backend="ssh", state="running",
              handle={"host": hostile_sshd.host, "known_hosts": str(known),
                      "identity_file": str(hostile_sshd.client_key), "run_dir": str(rd)})
    registry.save(run)
    dest = Path.home() / "artifacts"
    state = tmp_path / "launch-home"  # the registry records the fetch
    before = _outside(tmp_path, dest, rd, state)

    r = CliRunner().invoke(cli, ["down", "evil", "--fetch-artifacts", "--dest", str(dest)])
    assert r.exit_code == 0, r.output
    refused = [ln for ln in r.output.splitlines() if "refused" in ln]
    assert len(refused) == 1 and refused[0].startswith("! refused 5 path(s) listed by the machine outside "
                                                       "the artifact layout ('../../.bashrc', '/etc/cron.d/evil',")
    assert "nothing was written for them" in refused[0]
    assert _outside(tmp_path, dest, rd, state) == before and not (Path.home() / ".bashrc").exists()
    home = dest / "evil"
    assert not [p for p in home.rglob("*") if p.is_symlink()]
    assert not any(b"PRIVATE KEY" in p.read_bytes() for p in home.rglob("*") if p.is_file())
    assert (home / "adapter/adapter_model.safetensors").read_bytes() == \
        (template / "outputs/adapter/adapter_model.safetensors").read_bytes()
    assert not (home / "mlx").exists() and not (home / "adapter/passwd.json").exists()


def test_hostile_manifest_names_are_refused(template, tmp_path):
    """The MANIFEST comes from the machine too: its names are confined like any listing."""
    from launcher.store.artifacts import fetch
    from payload import layout

    be, run, rd = _local_run(tmp_path, template)
    manifest = json.loads((rd / layout.MANIFEST).read_text())
    real = manifest["files"]["training_summary.json"]
    for name in ("../../.bashrc", "/etc/passwd", "adapter/../../../x", "logs/run.log", "status.json"):
        manifest["files"][name] = real
    (rd / layout.MANIFEST).write_text(json.dumps(manifest))
    before = _outside(tmp_path, tmp_path / "a", rd)
    report = fetch(be, run, tmp_path / "a" / "r1")
    assert report.ok, report
    (line,) = [n for n in report.notes if "refused" in n]
    assert line.startswith("refused 5 path(s) named by the MANIFEST outside the artifact layout")
    assert _outside(tmp_path, tmp_path / "a", rd) == before
    assert "training_summary.json" in report.files


def test_local_fetch_never_follows_symlinks(template, tmp_path):
    from launcher.store.artifacts import fetch

    secret = tmp_path / "secrets" / "token"
    secret.parent.mkdir()
    secret.write_text("PRIVATE KEY")
    be, run, rd = _local_run(tmp_path, template, manifest=False, state="running")
    _plant_links(rd, secret)
    (rd / "metrics.jsonl").unlink()
    (rd / "metrics.jsonl").symlink_to(secret)  # a top-level artifact as a link
    report = fetch(be, run, tmp_path / "a" / "r1")
    home = tmp_path / "a" / "r1"
    assert not [p for p in home.rglob("*") if p.is_symlink()]
    assert not any(b"PRIVATE KEY" in p.read_bytes() for p in home.rglob("*") if p.is_file())
    assert not (home / "metrics.jsonl").exists() and not (home / "mlx").exists()
    assert report.ok and (home / "adapter/adapter_model.safetensors").is_file()


def test_rsync_brings_no_symlink_and_bucket_keys_stay_confined(template, tmp_path, sshd, monkeypatch):
    """SkyPilot's two routes: rsync (--no-links, an exact --files-from list) from a cluster that
    planted links, and S3 keys that climb out of the run's prefix."""
    from launcher.store.artifacts import fetch
    from launcher.backends import skypilot as sp

    secret = tmp_path / "secrets" / "token"
    secret.parent.mkdir()
    secret.write_text("PRIVATE KEY")
    fake = FakeSky(monkeypatch)
    rd = tmp_path / "volume" / "runs" / "r1"
    shutil.copytree(template, rd)
    _plant_links(rd, secret)
    fake.results["status"] = [{"name": "r1", "status": "UP"}]
    _cluster_ssh_config(sshd, "r1", tmp_path)
    run = Run(id="r1", profile="sonia-h100", backend="skypilot", cluster="r1", state="running",
              handle={"kind": "cluster", "cluster": "r1", "job_id": 7, "run_dir": str(rd)})
    from launcher.backends.skypilot import files as skypilot_files

    real_list = skypilot_files.list_command  # and the listing lies: the file link is "a regular file"
    monkeypatch.setattr(skypilot_files, "list_command", lambda d, roots: "printf '%s\\t%s\\0' 11 "
                        "outputs/adapter/passwd.json; " + real_list(d, roots))
    report = fetch(sp.SkyPilotBackend(), run, Path.home() / "a" / "r1")
    home = Path.home() / "a" / "r1"
    assert report.problems == ["adapter/passwd.json: did not arrive"]  # rsync --no-links skipped it
    assert (home / "adapter/adapter_model.safetensors").is_file()
    assert not [p for p in home.rglob("*") if p.is_symlink()] and not (home / "mlx").exists()
    assert not any(b"PRIVATE KEY" in p.read_bytes() for p in home.rglob("*") if p.is_file())

    clients = runpod_edge(monkeypatch, fake, tmp_path / "volume")
    real_init = FakeS3.__init__
    planted = {"runs/m1/outputs/adapter/../../../../../.bashrc": b"evil", "runs/m1/../../.profile": b"evil",
               "runs/m1/outputs/adapter/\n../x": b"evil"}
    monkeypatch.setattr(FakeS3, "__init__", lambda self, *a, **k: real_init(self, *a, extra=planted, **k))
    shutil.copytree(template, tmp_path / "volume" / "runs" / "m1")
    managed = Run(id="m1", profile="lovecraft-a100-spot", backend="skypilot", state="running",
                  handle={"kind": "managed_job", "job_id": 3, "job_name": "m1",
                          "volume": {"name": "lovecraft-workspace", "type": "runpod-network-volume",
                                     "zone": "US-CA-2", "key_prefix": "runs"}})
    before = _outside(Path.home().parent, Path.home() / "b")
    report = fetch(sp.SkyPilotBackend(), managed, Path.home() / "b" / "m1")
    assert report.ok, report
    (line,) = [n for n in report.notes if "refused" in n]
    assert line.startswith("refused 2 path(s) listed by the machine")  # the 3rd key is under no root
    assert _outside(Path.home().parent, Path.home() / "b") == before and clients
    assert not any(k for _, kw in clients[0].calls for k in [kw.get("Key", "")] if ".." in k)


def test_a_symlink_already_in_dest_is_never_written_through(template, tmp_path):
    from launcher.store.artifacts import fetch
    from launcher.backends import BackendError

    be, run, _ = _local_run(tmp_path, template)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    home = tmp_path / "a" / "r1"
    home.mkdir(parents=True)
    (home / "adapter").symlink_to(elsewhere, target_is_directory=True)
    (home / "loss.png").symlink_to(tmp_path / "victim.png")
    with pytest.raises(BackendError, match="adapter is a symlink or a file, not a directory: remove it"):
        fetch(be, run, home)
    assert list(elsewhere.iterdir()) == [] and not (tmp_path / "victim.png").exists()
    (home / "adapter").unlink()
    assert fetch(be, run, home).ok  # a file link is replaced, never written through
    assert not (home / "loss.png").is_symlink() and not (tmp_path / "victim.png").exists()
