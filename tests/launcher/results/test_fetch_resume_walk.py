"""`launch down --fetch-artifacts` interrupted (Ctrl-C: SIGINT to its process group) half-way through an
ssh run's merged model, then run again: the second one finishes the fetch, moving only what had not
arrived, verified against the machine's MANIFEST, and tears down. The installed `launch` in a
subprocess (tests/walk.py), a real sshd on 127.0.0.1 behind a relay that holds the connection to
20 MB/s, so that half-way is a moment a test can catch, and counts the bytes that cross it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time

from launcher.store import registry
from launcher.store.artifacts import INCOMING

from test_fetch_resume import SHARD, finished_run

try:
    from walk import LAUNCH, REPO, fresh_env, launch
except ImportError:  # pragma: no cover
    from tests.walk import LAUNCH, REPO, fresh_env, launch

RATE = 20e6  # bytes/s through the relay


class Relay:
    """127.0.0.1:port -> 127.0.0.1:target at RATE per connection, counting the bytes sent to the client."""

    def __init__(self, target: int):
        self.target, self.down = target, 0
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self._pipe, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, True), daemon=True).start()

    def _pipe(self, a, b, counted):
        start, sent = time.monotonic(), 0
        try:
            while data := a.recv(1 << 16):
                b.sendall(data)
                sent += len(data)
                if counted:
                    self.down += len(data)
                time.sleep(max(0.0, sent / RATE - (time.monotonic() - start)))
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def test_down_fetch_interrupted_then_rerun_finishes_without_moving_bytes_twice(sshd, tmp_path):
    relay = Relay(sshd.port)
    known = tmp_path / "known_hosts"
    known.write_text(sshd.known_hosts_line().replace(f"]:{sshd.port} ", f"]:{relay.port} "))
    root = tmp_path / "host" / "launch" / "r1"
    rd = tmp_path / "host" / "volume" / "runs" / "local-demo-20261202-000001"
    files = finished_run(rd, shard_bytes=40_000_000)
    root.mkdir(parents=True)
    (root / "exit_code").write_text("0\n")
    (rd / "status.json").write_text('{"state": "completed"}')
    run = registry.Run(id=rd.name, profile="local-demo", backend="ssh", state="completed",
                       started_at=time.time() - 100, ended_at=time.time() - 10,
                       handle={"host": f"{sshd.user}@127.0.0.1:{relay.port}", "known_hosts": str(known),
                               "identity_file": str(sshd.client_key), "run_root": str(root), "run_dir": str(rd),
                               "volume": str(rd.parent.parent), "log": str(rd / "logs" / "run.log"), "pid": 1,
                               "pgid": 1})
    registry.save(run)
    env = {"LAUNCH_HOME": os.environ["LAUNCH_HOME"]}
    dest = tmp_path / "art"
    argv = [str(LAUNCH), "down", run.id, "--fetch-artifacts", "--merged", "--dest", str(dest)]
    first = subprocess.Popen(argv, cwd=REPO, env=fresh_env(tmp_path, env), stdin=subprocess.DEVNULL,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    part = dest / run.id / INCOMING / SHARD
    deadline = time.monotonic() + 120
    while (not part.exists() or part.stat().st_size < 20_000_000) and first.poll() is None:
        assert time.monotonic() < deadline, "the fetch never reached half the shard"
        time.sleep(0.02)
    os.killpg(first.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole foreground group
    out1, _ = first.communicate(timeout=60)
    assert first.returncode != 0, out1
    flat1 = " ".join(out1.split())
    assert "fetch interrupted at" in flat1 and f"launch down {run.id} --fetch-artifacts goes on from there" in \
        flat1.replace("`", ""), out1
    assert "Traceback" not in out1 and registry.get(run.id).artifacts is None  # not torn down, nothing placed
    had = part.stat().st_size
    wire_before = relay.down

    second = launch(tmp_path, "down", run.id, "--fetch-artifacts", "--merged", "--dest", str(dest), env=env)
    out2 = second.stdout + second.stderr
    assert second.returncode == 0 and "Traceback" not in out2, out2
    moved = relay.down - wire_before
    left = len(files[SHARD]) - had
    assert left <= moved < left + 2_000_000, (moved, left)  # the shard's rest, the MANIFEST, the log, ssh's own
    flat2 = " ".join(out2.split())
    assert "sha256-verified against the machine's MANIFEST" in flat2 and "were here from an earlier try" in flat2, out2
    assert (dest / run.id / "merged" / SHARD.rsplit("/", 1)[1]).read_bytes() == files[SHARD]
    assert not (dest / run.id / INCOMING).exists()
