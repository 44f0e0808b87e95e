"""The run's typed handle against a registry written before it was typed (fixtures/runs-v1.db, made by
fixtures/make_runs_v1.py with that launch: its runs as each backend, the start and a refresh leave
them, a row a newer launch wrote, one with values of unexpected types; runs-v1.json is what that
launch's `Run.to_dict` and status rows said of them). Read now, every row is a typed Handle with the
values stored, re-saving writes the same JSON byte for byte, keys launch does not know survive, and
the database is migrated to the current schema version on open."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from launcher.runs.refresh import status_row
from launcher.store import registry
from launcher.store.handle import Handle
from launcher.store.registry import Run

FIXTURES = Path(__file__).parent / "fixtures"
HOME = "/tmp/launch-home-v1"  # the LAUNCH_HOME the fixture was made in: its paths say so


@pytest.fixture
def v1(tmp_path, monkeypatch):
    """A copy of the fixture as this LAUNCH_HOME's registry; the rows' handle JSON as stored."""
    monkeypatch.setenv("LAUNCH_HOME", str(tmp_path))
    shutil.copy(FIXTURES / "runs-v1.db", tmp_path / "runs.db")
    return _stored(tmp_path / "runs.db")


def _stored(path) -> dict[str, str]:
    con = sqlite3.connect(path)
    try:
        return dict(con.execute("SELECT id, handle FROM runs"))
    finally:
        con.close()


def _version(path) -> int:
    con = sqlite3.connect(path)
    try:
        return con.execute("PRAGMA user_version").fetchone()[0]
    finally:
        con.close()


def test_the_fixture_is_an_unversioned_registry(tmp_path):
    assert _version(FIXTURES / "runs-v1.db") == 0 and len(_stored(FIXTURES / "runs-v1.db")) == 7


def test_each_backends_row_reads_into_a_typed_handle(v1):
    runs = {r.id: r for r in registry.all_runs()}
    local = runs["local-demo-20260101-000000"].handle
    assert isinstance(local, Handle) and (local.pid, local.pgid, local.num_nodes) == (4242, 4242, 2)
    assert local.volume == f"{HOME}/volumes/local-demo" and local.home == f"{HOME}/local/local-demo-20260101-000000"
    assert local.run_dir == f"{HOME}/volumes/local-demo/runs/local-demo-20260101-000000"
    assert local.overrides == ["train.max_steps=40"] and local.envs == {"FOO": "bar"}
    assert local.config["train.max_steps"] == 40 and [e["event"] for e in local.history] == ["start", "resume"]
    assert local.provenance["commit"].startswith("0123") and local.last_status["step"] == 40
    assert local.host is None and local.kind is None and local.extra == {}

    ssh = runs["sonia-h100-20260101-000100"].handle
    assert ssh.host == "root@10.0.0.5:22022" and ssh.identity_file is None and ssh.known_hosts == f"{HOME}/known_hosts"
    assert ssh.ssh_route["jumps"][0]["host"] == "me@bastion:22" and ssh.remote_root == "/root/launch"
    assert ssh.run_root == "/root/launch/sonia-h100-20260101-000100" and ssh.volume == "/workspace"
    assert ssh.log.endswith("/logs/run.log") and (ssh.pid, ssh.gpus_per_node) == (31337, 1)
    assert ssh.upload["bytes_sent"] == 34567
    assert "identity_file" in ssh.to_dict()  # stored as null: kept so

    cluster = runs["sonia-h100-20260101-000200"].handle
    assert (cluster.kind, cluster.cluster, cluster.job_id, cluster.autostop_minutes) == (
        "cluster", "sonia-h100-20260101-000200", 1, 10)
    assert cluster.volume["zone"] == "US-CA-2" and cluster.infra == ["runpod/US-CA-2"]
    assert cluster.bucket is None and cluster.push_to_hub is None and cluster.slurm_login is None

    managed = runs["lovecraft-a100-spot-20260101-000300"].handle
    assert (managed.kind, managed.job_id, managed.push_to_hub) == ("managed_job", 3, "me/lovecraft")
    assert managed.job_name == "lovecraft-a100-spot-20260101-000300" and managed.volume["created"] is True
    assert managed.runpod_pods_seen == "lovecraft-a100-spot-20260101-000300-3-abcd" and managed.cluster is None

    slurm = runs["qwen3-32b-4x4-a100-20260101-000400"].handle
    assert slurm.slurm_login == "lab" and slurm.bucket["name"] == "qwen3-32b-checkpoints"
    assert slurm.job_id is None and slurm.volume is None and slurm.overrides is None

    assert runs["local-demo-20260101-000500"].handle == Handle()


def test_unknown_keys_and_values_of_other_types_are_kept_and_read_as_unset(v1):
    odd = registry.get("local-demo-20260101-000600").handle
    assert (odd.pid, odd.volume) == (77, f"{HOME}/volumes/local-demo")
    assert (odd.config, odd.history, odd.num_nodes, odd.provenance, odd.last_status) == (None,) * 5
    assert odd.extra == {"from_the_future": {"nested": [1, 2, {"k": None}]}, "zz_unknown": None,
                         "config": "not a dict", "history": {"not": "a list"}, "num_nodes": "2",
                         "provenance": ["odd"], "last_status": 5}


def test_resaving_writes_the_same_json_byte_for_byte(v1, tmp_path):
    for run in registry.all_runs():
        registry.save(run)
    assert _stored(tmp_path / "runs.db") == v1
    registry.update("local-demo-20260101-000600", reason="seen again")  # a read-modify-write keeps it too
    assert _stored(tmp_path / "runs.db") == v1


def test_to_dict_and_status_rows_are_what_that_launch_printed(v1):
    said = json.loads((FIXTURES / "runs-v1.json").read_text())
    runs = registry.all_runs()
    assert json.dumps([r.to_dict() for r in runs], indent=1) == json.dumps(said["runs"], indent=1)
    rows = [status_row(r) for r in runs if not r.active]
    odd = "local-demo-20260101-000600"  # its history and provenance were of other types: read as none
    for row, was in zip(rows, said["rows"], strict=True):
        if row["id"] == odd:
            assert (was["history"], was["provenance"]) == ({"not": "a list"}, ["odd"])
            was = {**was, "history": [], "provenance": None}
        assert json.dumps(row) == json.dumps(was), row["id"]


def test_an_old_registry_is_migrated_to_the_schema_version_once(v1, tmp_path):
    registry.all_runs()
    assert _version(tmp_path / "runs.db") == registry.SCHEMA_VERSION
    con = sqlite3.connect(tmp_path / "runs.db")
    con.execute(f"PRAGMA user_version = {registry.SCHEMA_VERSION + 1}")  # a newer launch's: used as it is
    con.close()
    registry._CHECKED.clear()  # as a new process opens it
    assert len(registry.all_runs()) == 7 and _version(tmp_path / "runs.db") == registry.SCHEMA_VERSION + 1


def test_a_handle_is_the_dict_it_was_built_from():
    h = Handle.from_dict({"zeta": 1, "pid": 5, "volume": None})
    h.bucket = None  # set: in the record, null too
    h.update(pid=6, run_dir="/r")
    assert list(h.to_dict().items()) == [("zeta", 1), ("pid", 6), ("volume", None), ("bucket", None), ("run_dir", "/r")]
    assert Handle(pid=1, host="h").to_dict() == {"pid": 1, "host": "h"}  # None in the constructor: unset
    assert Handle.from_dict(["not", "an", "object"]) == Handle() and Handle.from_dict({"pid": True}).pid is None
    merged = Handle(pid=1, host="h").merged({"pid": 2, "new": [3]})
    assert merged.to_dict() == {"pid": 2, "host": "h", "new": [3]} and merged.extra == {"new": [3]}
    with pytest.raises(TypeError):
        Handle().update(no_such_key=1)


def test_a_run_built_with_a_dict_handle_reads_it_and_keeps_its_remote_out_of_the_record():
    run = Run(id="r", profile="p", backend="ssh", handle={"host": "me@h:22", "later": 1})
    assert run.handle.host == "me@h:22" and run.handle.extra == {"later": 1}
    run.remote = object()
    assert "remote" not in run.to_dict() and run.to_dict()["handle"] == {"host": "me@h:22", "later": 1}
    assert "remote" not in registry.COLUMNS
