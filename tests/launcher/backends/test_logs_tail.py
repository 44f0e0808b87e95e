"""`launch logs --tail N`: the last N lines, read from the end of the log (local and ssh backends for
real, SkyPilot's `tail=` passed through its SDK, faked at the edge)."""

import io
import os
import tempfile

if "SKY_RUNTIME_DIR" not in os.environ:  # tests/conftest.py sets it; kept for a lone run of this file
    os.environ["SKY_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="sky-runtime-")

import pytest
from click.testing import CliRunner

from launcher.store import registry
from launcher.backends import tail_offset
from launcher.backends import skypilot as sp
from launcher.backends.local import LocalBackend
from launcher.backends.ssh import SSHBackend
from launcher.cli import cli
from launcher.store.registry import Run
from test_skypilot_backend import FakeSky, cluster_run

LOG = "".join(f"step {i} café\n" for i in range(1, 2001))


@pytest.mark.parametrize("text, n, want", [
    (b"a\nb\nc\n", 2, b"b\nc\n"), (b"a\nb\nc", 2, b"b\nc"), (b"a\nb\n", 5, b"a\nb\n"), (b"", 3, b""),
    (b"\n\n\n", 1, b"\n"), (b"only\n", 1, b"only\n"),
])
def test_tail_offset(text, n, want):
    for block in (1, 2, 3, 1 << 16):  # block boundaries anywhere
        assert text[tail_offset(io.BytesIO(text), len(text), n, block=block):] == want


def test_local_logs_tail(tmp_path):
    run = Run(id="local-demo-1", profile="local-demo", backend="local", state="completed")
    registry.save(run)
    log = LocalBackend.home(run) / "run.log"
    log.parent.mkdir(parents=True)
    log.write_text(LOG)
    r = CliRunner().invoke(cli, ["logs", "local-demo-1", "--tail", "3"])
    assert r.exit_code == 0, r.output
    assert r.output == "step 1998 café\nstep 1999 café\nstep 2000 café\n"
    assert CliRunner().invoke(cli, ["logs", "local-demo-1"]).output == LOG
    r = CliRunner().invoke(cli, ["logs", "local-demo-1", "--tail", "0"])
    assert r.exit_code == 2 and "--tail" in r.output



def test_ssh_logs_tail(sshd, tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text(sshd.known_hosts_line())
    log = tmp_path / "run.log"
    log.write_text(LOG)
    run = Run(id="fake-1", profile="fake", backend="ssh", state="completed",
              handle={"host": sshd.host, "identity_file": str(sshd.client_key), "known_hosts": str(known),
                      "log": str(log)})
    out = io.StringIO()
    assert SSHBackend().logs(run, False, out, tail=2) == 0
    assert out.getvalue() == "step 1999 café\nstep 2000 café\n"


def test_skypilot_logs_tail_is_skypilots_tail(monkeypatch):
    fake = FakeSky(monkeypatch)
    out = io.StringIO()
    sp.SkyPilotBackend().logs(cluster_run(), follow=False, out=out, tail=50)
    assert fake.one("tail_logs")[1:] == (("r1", 7, False), {"output_stream": out, "tail": 50})
