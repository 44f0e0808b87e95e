"""A fetch that was cut off goes on where it stopped, on every transport: over ssh (rsync to a real
OpenSSH server on 127.0.0.1), through S3 (the emulated RunPod S3 API over TLS) and on the local disk;
what an earlier try left whole is not moved again, a kept part that is not the machine's is fetched
again whole, and the result is verified against the machine's MANIFEST (sha256) all the same. What a
terminal and a pipe show while the bytes move."""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

import pytest

from payload import layout
from payload.outputs import manifest

from launcher.store.artifacts import INCOMING, fetch
from launcher.store.registry import Run

SHARD = "outputs/merged/model-00001-of-00001.safetensors"


def safetensors_bytes(n: int) -> bytes:
    header = json.dumps({"w": {"dtype": "U8", "shape": [n], "data_offsets": [0, n]}}).encode()
    return len(header).to_bytes(8, "little") + header + os.urandom(n)


def finished_run(rd: Path, shard_bytes: int = 3_000_000) -> dict[str, bytes]:
    """A completed run's directory: an adapter, a merged shard, and the MANIFEST the payload writes."""
    files = {"outputs/adapter/adapter_config.json": b'{"r": 8}',
             "outputs/adapter/adapter_model.safetensors": safetensors_bytes(40_000),
             SHARD: safetensors_bytes(shard_bytes)}
    for rel, data in files.items():
        (rd / rel).parent.mkdir(parents=True, exist_ok=True)
        (rd / rel).write_bytes(data)
    (rd / layout.MANIFEST).write_text(json.dumps(manifest.build(rd, [], "r1", "completed")))
    return files


def left_by_a_cut(dest: Path, files: dict[str, bytes], part: bytes | None = None) -> None:
    """What an interrupted try leaves: the adapter whole, the shard's first half (or `part`)."""
    inc = dest / INCOMING
    for rel, data in files.items():
        (inc / rel).parent.mkdir(parents=True, exist_ok=True)
        (inc / rel).write_bytes(data if "adapter" in rel else part if part is not None else data[:len(data) // 2])


def assert_home(dest: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        got = dest / layout.artifact_for(rel)[1]
        assert hashlib.sha256(got.read_bytes()).digest() == hashlib.sha256(data).digest(), rel
    assert not (dest / INCOMING).exists()


# ---------------------------------------------------------------------------------------- ssh


@pytest.fixture
def ssh_run(sshd, tmp_path):
    from launcher.backends.ssh import SSHBackend

    known = tmp_path / "known_hosts"
    known.write_text(sshd.known_hosts_line())
    rd = tmp_path / "host" / "runs" / "r1"
    files = finished_run(rd)
    run = Run(id="r1", profile="p", backend="ssh", state="completed",
              handle={"host": sshd.host, "known_hosts": str(known), "identity_file": str(sshd.client_key),
                      "run_dir": str(rd), "run_root": str(rd), "log": str(rd / "logs" / "run.log")})
    return SSHBackend(), run, files


def test_ssh_fetch_goes_on_from_the_cut_and_does_not_resend_what_arrived(ssh_run, tmp_path):
    backend, run, files = ssh_run
    dest = tmp_path / "art" / "r1"
    left_by_a_cut(dest, files)
    report = fetch(backend, run, dest, merged=True)
    assert report.ok and report.checked == "sha256", report.problems
    assert_home(dest, files)
    rest = len(files[SHARD]) - len(files[SHARD]) // 2
    assert backend.last_fetch["via"] == "rsync"
    # rsync's own count of what came over the wire: the shard's second half, not the adapter or the first half
    assert rest <= backend.last_fetch["bytes_received"] < rest + 100_000, backend.last_fetch


def test_a_kept_part_that_is_not_the_machines_comes_again_whole(ssh_run, tmp_path):
    backend, run, files = ssh_run
    dest = tmp_path / "art" / "r1"
    left_by_a_cut(dest, files, part=os.urandom(1_000_000))  # another file's bytes under the shard's name
    report = fetch(backend, run, dest, merged=True)
    assert report.ok, report.problems
    assert_home(dest, files)


@pytest.mark.slow  # 3 s: a fetch over ssh
def test_files_already_home_are_kept_not_fetched_again(ssh_run, tmp_path):
    backend, run, files = ssh_run
    dest = tmp_path / "art" / "r1"
    assert fetch(backend, run, dest, merged=True).ok
    report = fetch(backend, run, dest, merged=True)  # e.g. the teardown after it failed: `down` again
    assert report.ok and set(report.files) >= {"merged/model-00001-of-00001.safetensors"}
    assert backend.last_fetch["bytes_received"] < 100_000, backend.last_fetch  # the MANIFEST and the log
    assert_home(dest, files)


# ----------------------------------------------------------------------------------------- S3


@pytest.fixture
def s3_run(tmp_path):
    from tests.cloud.emulator.runpod_s3 import VolumeS3, make_tls

    import boto3

    from launcher.backends.skypilot.files import S3Volume

    vol = tmp_path / "vol"
    files = finished_run(vol / "runs" / "r1", shard_bytes=40_000_000)  # over the 16 MB part size: ranged reads
    tls = make_tls(tmp_path / "tls", ["s3api-eu-ro-1.runpod.io"], ips=("127.0.0.1",))
    log: list[str] = []
    server = VolumeS3(lambda b: vol if b == "abcde12345" else None, "user_t", log.append)
    server.start("127.0.0.1", 0, tls[1], tls[2])
    v = S3Volume.__new__(S3Volume)
    v.zone, v.bucket = "EU-RO-1", "abcde12345"
    v.client = boto3.client("s3", endpoint_url=f"https://127.0.0.1:{server._server.server_address[1]}",
                            region_name="EU-RO-1", aws_access_key_id="user_t", aws_secret_access_key="rps_t",
                            verify=str(tls[0]))

    class Volume:  # the SkyPilot backend's two calls for a managed job, on this volume
        def list_files(self, run, roots):
            return v.list("runs/r1", roots)

        def copy_files(self, run, rels, into):
            v.copy("runs/r1", rels, into)

        def logs(self, run, follow, out, tail=None):
            return 0

    try:
        yield Volume(), v, files, log
    finally:
        server.close()


@pytest.mark.slow  # 3 s: a fetch from an S3 server
def test_s3_fetch_reads_in_ranges_and_goes_on_from_the_cut(s3_run, tmp_path):
    backend, v, files, log = s3_run
    run = Run(id="r1", profile="p", backend="skypilot", state="completed")
    report = fetch(backend, run, tmp_path / "a1", merged=True)  # whole: boto3's ranged parts
    assert report.ok, report.problems
    assert_home(tmp_path / "a1", files)
    assert sum(f"GET /abcde12345/runs/r1/{SHARD} 206" in line for line in log) == 3  # 40 MB in 16 MB parts
    log.clear()
    dest = tmp_path / "a2"
    left_by_a_cut(dest, files)
    assert fetch(backend, run, dest, merged=True).ok
    assert_home(dest, files)
    shard_gets = [line for line in log if f"/{SHARD} " in line]
    assert shard_gets == [shard_gets[0]] and " 206" in shard_gets[0], log  # one ranged read of the rest
    assert not any("adapter_model" in line and "GET" in line for line in log), log  # whole: not read again


def test_an_interrupted_s3_download_keeps_its_gap_free_start(tmp_path):
    """boto3 writes parts as they come (seek, write): cut off, the file keeps only what has no gap
    before it, so the next try's ranged read continues it byte-exactly."""
    from launcher.backends.skypilot.files import _Prefix

    with open(tmp_path / "f", "wb") as f:
        sink = _Prefix(f)
        for offset in (0, 20, 10, 40):  # the part at 30 never arrived
            sink.seek(offset)
            sink.write(bytes([offset]) * 10)
        assert sink.prefix() == 30
        f.truncate(sink.prefix())
    assert (tmp_path / "f").read_bytes() == b"\0" * 10 + b"\n" * 10 + b"\x14" * 10


# -------------------------------------------------------------------------------------- local


def test_local_fetch_goes_on_from_the_cut(tmp_path):
    from launcher.backends.local import LocalBackend

    volume = tmp_path / "volume"
    rd = layout.run_dir(volume, "r1")
    files = finished_run(rd)
    run = Run(id="r1", profile="local-demo", backend="local", state="completed",
              handle={"volume": str(volume), "run_dir": str(rd)})
    dest = tmp_path / "art"
    left_by_a_cut(dest, files)
    assert fetch(LocalBackend(), run, dest, merged=True).ok
    assert_home(dest, files)


# ------------------------------------------------------------------------------------ display


@pytest.mark.slow  # 4 s: a fetch over ssh
def test_terminal_shows_bytes_speed_and_time_left_and_a_pipe_one_line(ssh_run, tmp_path):
    from rich.console import Console

    from launcher.term.transfer import TransferView

    backend, run, files = ssh_run
    out = io.StringIO()
    view = TransferView(Console(file=out, force_terminal=True, width=80), "artifacts of r1")
    left_by_a_cut(tmp_path / "t", files)
    with view:
        assert fetch(backend, run, tmp_path / "t", merged=True, view=view).ok
    shown = out.getvalue()
    assert "artifacts of r1" in shown and "/3.0 MB" in shown and "0:00:00" in shown, shown  # done/total, time left
    assert "B/s)" in view.summary()  # the speed (the bar has it once it has samples: "?" before)
    assert "were here from an earlier try" in view.summary() and view.done == view.total
    piped = io.StringIO()
    view = TransferView(Console(file=piped, width=80), "artifacts of r1")
    with view:
        assert fetch(backend, run, tmp_path / "p", merged=True, view=view).ok
    assert piped.getvalue() == ""  # nothing moves in a pipe: the summary line says it once
    assert view.summary().startswith("3.0 MB moved in ") and "earlier" not in view.summary()


def test_without_rsync_sftp_goes_on_from_the_cut_too(ssh_run, tmp_path, monkeypatch):
    from launcher.backends import rsync

    backend, run, files = ssh_run
    monkeypatch.setattr(rsync.shutil, "which", lambda name: None)  # no rsync here (or on the host: the same path)
    dest = tmp_path / "art" / "r1"
    left_by_a_cut(dest, files)
    report = fetch(backend, run, dest, merged=True)
    assert report.ok, report.problems
    assert backend.last_fetch == {"via": "sftp", "why": "rsync is not installed here"}
    assert_home(dest, files)
