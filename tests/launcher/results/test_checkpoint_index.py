"""The checkpoint index of a live run: the payload rewrites `outputs/checkpoints.json` at every save
and at retention, and `launch checkpoints RUN` reads it where the run is: the run directory (local
backend), over the stored SSH connection (ssh backend, real sshd), through the SkyPilot backend's
status.json path (SDK faked at the edge, real ssh to a loopback cluster). Fetched artifacts remain
the fallback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from launcher.store import registry
from launcher.cli import cli
from launcher.store.registry import Run
from payload.volume import checkpoints as ck
from payload import layout


def save(ckdir: Path, step: int, eval_loss: float, cer: float, nbytes: int = 1000, keep_best: int = 1) -> Path:
    """A checkpoint as the trainer leaves it: files, then the COMPLETE marker (then retention)."""
    path = ckdir / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "adapter_model.safetensors").write_bytes(b"\0" * nbytes)
    files = ck.digest_checkpoint(path)
    ck.write_marker(path, {"step": step, "eval_loss": eval_loss, "eval_cer": cer, "eval_wer": cer * 2,
                           "loss": eval_loss + 0.1, "files": files})
    ck.apply_retention(ckdir, keep_best=keep_best, keep_recent=1, key="eval_cer")
    return path


def index(run_dir: Path) -> list[dict]:
    return json.loads((run_dir / layout.CHECKPOINT_LISTING).read_text())


def test_the_payload_rewrites_the_index_at_every_save_and_at_retention(tmp_path):
    run_dir = tmp_path / "runs" / "r1"
    ckdir = ck.checkpoints_dir(run_dir)
    save(ckdir, 10, 2.0, 0.5)
    assert [(r["step"], r["eval_loss"], r["eval_cer"], r["complete"]) for r in index(run_dir)] == [(10, 2.0, 0.5, True)]
    save(ckdir, 20, 1.5, 0.3, nbytes=2000)
    save(ckdir, 30, 1.7, 0.4)  # retention (best 1 by CER + recent 1) removes step 10
    rows = index(run_dir)
    assert [(r["step"], r["eval_cer"], r["eval_wer"]) for r in rows] == [(20, 0.3, 0.6), (30, 0.4, 0.8)]
    assert rows[0]["bytes"] > 2000 and not list((run_dir / "outputs").glob(".*tmp"))  # atomic: no temp left
    # A half-written save (no marker yet) shows as incomplete until its marker lands.
    (ckdir / "checkpoint-40").mkdir()
    ck.apply_retention(ckdir, keep_best=1, keep_recent=1, key="eval_cer")
    assert [(r["step"], r["complete"]) for r in index(run_dir)][-1] == (40, False)
    # Only a run's own checkpoints/ gets an index next to it.
    other = tmp_path / "elsewhere"
    other.mkdir()
    assert ck.write_index(other) is None and not (tmp_path / "outputs").exists()


# ------------------------------------------------------------------- where the run is, per backend



def local_run(tmp_path, sshd, monkeypatch) -> tuple[Run, Path]:
    run = Run(id="r1", profile="local-demo", backend="local", state="running",
              handle={"volume": str(tmp_path / "volume")})
    return run, layout.run_dir(tmp_path / "volume", "r1")


def ssh_run(tmp_path, sshd, monkeypatch) -> tuple[Run, Path]:
    known = tmp_path / "known_hosts"
    known.write_text(sshd.known_hosts_line())
    run_dir = tmp_path / "remote" / "volume" / "runs" / "r1"
    run = Run(id="r1", profile="local-demo", backend="ssh", state="running",
              handle={"host": sshd.host, "known_hosts": str(known), "identity_file": str(sshd.client_key),
                      "run_root": str(tmp_path / "remote" / "runs" / "r1"), "run_dir": str(run_dir)})
    return run, run_dir


def skypilot_run(tmp_path, sshd, monkeypatch) -> tuple[Run, Path]:
    import sky
    from sky.skylet.job_lib import JobStatus
    from sky.utils.status_lib import ClusterStatus

    answers = {"status": [{"name": "r1", "status": ClusterStatus.UP}], "job_status": {7: JobStatus.RUNNING}}
    monkeypatch.setattr(sky, "status", lambda *a, **k: "req:status")
    monkeypatch.setattr(sky, "job_status", lambda *a, **k: "req:job_status")
    monkeypatch.setattr(sky, "get", lambda request_id, **k: answers[request_id.removeprefix("req:")])
    known = tmp_path / "known_hosts"
    known.write_text(sshd.known_hosts_line())
    config = Path.home() / ".sky" / "generated" / "ssh" / "r1"  # what SkyPilot writes at launch
    config.parent.mkdir(parents=True)
    config.write_text(f"Host r1\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User {sshd.user}\n"
                      f"  IdentityFile {sshd.client_key}\n  IdentitiesOnly yes\n"
                      f"  UserKnownHostsFile {known}\n  StrictHostKeyChecking yes\n")
    run_dir = tmp_path / "volume" / "runs" / "r1"
    run = Run(id="r1", profile="well-log-ocr-spot", backend="skypilot", cluster="r1", job_id="7", state="running",
              handle={"kind": "cluster", "cluster": "r1", "job_id": 7, "job_name": "r1", "run_dir": str(run_dir),
                      "volume": None, "bucket": None, "push_to_hub": None})
    return run, run_dir


@pytest.mark.parametrize("make", [local_run, ssh_run, skypilot_run], ids=["local", "ssh", "skypilot"])
def test_launch_checkpoints_reads_a_live_run_where_it_is(make, tmp_path, sshd, monkeypatch):
    run, run_dir = make(tmp_path, sshd, monkeypatch)
    registry.save(run)
    ckdir = ck.checkpoints_dir(run_dir)
    save(ckdir, 10, 2.0, 0.5, keep_best=2)
    save(ckdir, 20, 1.5, 0.25, keep_best=2)

    r = CliRunner().invoke(cli, ["checkpoints", "r1", "--json", "--dest", str(tmp_path / "nothing-fetched")])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert [(c["step"], c["eval_loss"], c["eval_cer"], c["verified"]) for c in out["checkpoints"]] == \
        [(10, 2.0, 0.5, True), (20, 1.5, 0.25, True)]
    assert all(c["bytes"] > 1000 for c in out["checkpoints"])
    if run.backend == "local":
        assert out["source"] == str(ckdir)  # read in place, each checkpoint verified against its marker
    else:
        assert out["source"] == f"the run's outputs/checkpoints.json on its {run.backend} machine (live)"

    # The next save shows at once; the table names the run and where the rows came from.
    save(ckdir, 30, 1.0, 0.125, keep_best=2)  # retention: best 2 by CER (30, 20) + the newest (30)
    r = CliRunner().invoke(cli, ["checkpoints", "r1"], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    assert "checkpoint-30" in r.output and "0.1250" in r.output and "r1: 2 checkpoint(s) from" in r.output


@pytest.mark.parametrize("make", [ssh_run, skypilot_run], ids=["ssh", "skypilot"])
def test_fetched_artifacts_are_the_fallback(make, tmp_path, sshd, monkeypatch):
    run, run_dir = make(tmp_path, sshd, monkeypatch)
    registry.save(run)
    dest = tmp_path / "artifacts"
    r = CliRunner().invoke(cli, ["checkpoints", "r1", "--dest", str(dest)])
    assert r.exit_code != 0 and "has no checkpoint index" in r.output and "--fetch-artifacts" in r.output
    assert "Traceback" not in r.output
    (dest / "r1").mkdir(parents=True)
    (dest / "r1" / "checkpoints.json").write_text(json.dumps(
        [{"step": 5, "name": "checkpoint-5", "bytes": 10, "complete": True, "eval_loss": 3.0}]))
    r = CliRunner().invoke(cli, ["checkpoints", "r1", "--json", "--dest", str(dest)])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["source"] == str(dest / "r1" / "checkpoints.json") and out["checkpoints"][0]["step"] == 5
