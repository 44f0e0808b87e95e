"""Fetch throughput and resume: `launch down --fetch-artifacts`'s path (store/artifacts.fetch) over the ssh
backend (a real OpenSSH server on 127.0.0.1, tests/sshd.py) and over S3 (the emulated RunPod S3 API,
tests/cloud/emulator/runpod_s3.py, TLS on 127.0.0.1). No root needed beyond what sshd's install takes.

    python bench/bench_fetch.py [--mb 64] [--files 2] [--transports ssh,s3] [--stream-mbps N] [--code DIR]
    python bench/bench_fetch.py resume [--mb 1000] [--files 1] [--cut 0.5]
    python bench/bench_fetch.py cli [--mb 1000] [--files 1] [--cut 0.5]

A run directory with `--files` merged-model shards (valid safetensors, random bytes; `--mb` in all) and
its MANIFEST is fetched with merged=True. `--code DIR` runs the launcher found in DIR (e.g. an older
commit's `git archive` unpacked there) for a before/after figure. `--stream-mbps` holds each TCP
connection to N MB/s through a relay, as a long path to a provider does (one stream's ceiling), where
loopback has none and the CPU is the limit. `resume` fetches over ssh in a child
process, interrupts it with SIGINT (Ctrl-C) once `--cut` of the bytes have arrived, runs it again, and
prints what a terminal showed both times and the bytes that crossed the wire the second time (counted by
a TCP relay in front of sshd, both directions). `cli` does the same with the installed `launch down
RUN --fetch-artifacts --merged` of a finished ssh run on a pseudo-terminal, Ctrl-C typed into it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def make_run(run_dir: Path, mb: float, files: int) -> int:
    """Shards of `mb` MB in all under outputs/merged/, and the MANIFEST the payload writes."""
    from payload import layout
    from payload.outputs import manifest

    merged = run_dir / layout.MERGED_DIR
    merged.mkdir(parents=True, exist_ok=True)
    (run_dir / layout.ADAPTER_DIR).mkdir(parents=True, exist_ok=True)
    block = os.urandom(4 << 20)
    per = int(mb * 1e6 / files)
    for i, d in enumerate([merged] * files):
        header = json.dumps({"w": {"dtype": "U8", "shape": [per], "data_offsets": [0, per]}}).encode()
        with open(d / f"model-{i:05d}-of-{files:05d}.safetensors", "wb") as f:
            f.write(len(header).to_bytes(8, "little") + header)
            left = per
            while left:
                f.write(block[:min(left, len(block))])
                left -= min(left, len(block))
    m = manifest.build(run_dir, [], "bench", "completed")
    (run_dir / layout.MANIFEST).write_text(json.dumps(m))
    return sum(e["bytes"] for e in m["files"].values())


class Relay:
    """127.0.0.1:port -> 127.0.0.1:target, counting the bytes each way; with `rate` (bytes/s) each
    connection is held to it, as a long path holds one TCP stream (latency, its provider's cap)."""

    def __init__(self, target: int, rate: float = 0):
        self.target, self.up, self.down, self.rate = target, 0, 0, rate
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            client, _ = self.sock.accept()
            server = socket.create_connection(("127.0.0.1", self.target))
            threading.Thread(target=self._pipe, args=(client, server, "up"), daemon=True).start()
            threading.Thread(target=self._pipe, args=(server, client, "down"), daemon=True).start()

    def _pipe(self, a, b, way):
        start, sent = time.monotonic(), 0
        try:
            while data := a.recv(1 << 16):
                b.sendall(data)
                setattr(self, way, getattr(self, way) + len(data))
                sent += len(data)
                if self.rate:
                    time.sleep(max(0.0, sent / self.rate - (time.monotonic() - start)))
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def ssh_env(root: Path):
    sys.path.append(str(REPO / "tests"))
    import pytest
    from sshd import SSHServer, ensure_sshd  # the suite's test server

    try:
        ensure_sshd()
    except pytest.skip.Exception as e:
        raise SystemExit(f"no sshd: {e}") from None
    return SSHServer(root / "sshd").start()


def fetch_ssh(run_dir: Path, dest: Path, host: str, known: Path, key: Path, show: bool) -> float:
    from launcher.backends.ssh import SSHBackend
    from launcher.store.artifacts import fetch
    from launcher.store.registry import Run

    run = Run(id="bench", profile="p", backend="ssh", state="completed",
              handle={"host": host, "known_hosts": str(known), "identity_file": str(key), "run_dir": str(run_dir),
                      "run_root": str(run_dir), "log": str(run_dir / "logs" / "run.log")})
    return _timed(lambda view: fetch(SSHBackend(), run, dest, merged=True, **view), show, "bench")


def _timed(call, show: bool, what: str) -> float:
    import inspect

    from launcher.store.artifacts import fetch

    view = {}
    if show and "view" in inspect.signature(fetch).parameters:
        from rich.console import Console

        from launcher.term.transfer import TransferView

        console = Console(force_terminal=True, width=80)
        view = {"view": TransferView(console, f"artifacts of {what}")}
    t = time.perf_counter()
    if view:
        with view["view"]:
            report = call(view)
        print(view["view"].summary(), flush=True)
    else:
        report = call({})
    dt = time.perf_counter() - t
    if not report.ok:
        raise SystemExit(f"fetch failed: {report.problems}")
    return dt


def throughput(args) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-fetch-") as tmp:
        tmp = Path(tmp)
        total = make_run(tmp / "vol" / "runs" / "bench", args.mb, args.files)
        cap = f", each connection held to {args.stream_mbps:g} MB/s" if args.stream_mbps else ""
        print(f"{args.files} files, {total / 1e6:.0f} MB, launcher from {args.code or REPO}{cap}")
        if "ssh" in args.transports:
            server = ssh_env(tmp)
            known = tmp / "known_hosts"
            port = Relay(server.port, args.stream_mbps * 1e6).port if args.stream_mbps else server.port
            known.write_text(server.known_hosts_line().replace(f"]:{server.port} ", f"]:{port} "))
            try:
                dt = fetch_ssh(tmp / "vol" / "runs" / "bench", tmp / "art-ssh", f"{server.user}@127.0.0.1:{port}",
                               known, server.client_key, False)
                print(f"  ssh backend: {dt:.2f} s, {total / dt / 1e6:.0f} MB/s")
            finally:
                server.stop()
        if "s3" in args.transports:
            dt = fetch_s3(tmp, tmp / "art-s3", args.stream_mbps)
            print(f"  S3 (emulated RunPod, TLS): {dt:.2f} s, {total / dt / 1e6:.0f} MB/s")


def fetch_s3(tmp: Path, dest: Path, stream_mbps: float = 0) -> float:
    sys.path.append(str(REPO))  # after --code's checkout: its launcher, this one's emulator
    from tests.cloud.emulator.runpod_s3 import VolumeS3, make_tls

    from launcher.backends.skypilot.files import S3Volume
    from launcher.store.artifacts import fetch
    from launcher.store.registry import Run

    import boto3

    vol = tmp / "vol"
    tls = make_tls(tmp / "tls", ["s3api-eu-ro-1.runpod.io"], ips=("127.0.0.1",))
    server = VolumeS3(lambda b: vol if b == "abcde12345" else None, "user_bench", lambda line: None)
    server.start("127.0.0.1", 0, tls[1], tls[2])
    port = server._server.server_address[1]
    url = f"https://127.0.0.1:{Relay(port, stream_mbps * 1e6).port if stream_mbps else port}"
    v = S3Volume.__new__(S3Volume)
    v.zone, v.bucket = "EU-RO-1", "abcde12345"
    v.client = boto3.client("s3", endpoint_url=url, region_name="EU-RO-1", aws_access_key_id="user_bench",
                            aws_secret_access_key="rps_bench", verify=str(tls[0]))

    class Backend:
        def list_files(self, run, roots):
            return v.list("runs/bench", roots)

        def copy_files(self, run, rels, into):
            v.copy("runs/bench", rels, into)

        def logs(self, run, follow, out, tail=None):
            return 0

    try:
        return _timed(lambda view: fetch(Backend(), Run(id="bench", profile="p", backend="skypilot",
                                                       state="completed"), dest, merged=True, **view), False, "")
    finally:
        server.close()


# ------------------------------------------------------------------------------------ resume


def resume(args) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-resume-") as tmp:
        tmp = Path(tmp)
        run_dir = tmp / "vol" / "runs" / "bench"
        total = make_run(run_dir, args.mb, args.files)
        server = ssh_env(tmp)
        relay = Relay(server.port)
        known = tmp / "known_hosts"
        known.write_text(server.known_hosts_line().replace(f"]:{server.port} ", f"]:{relay.port} "))
        host = f"{server.user}@127.0.0.1:{relay.port}"
        dest = tmp / "art"
        child = [sys.executable, __file__, "_fetch", str(run_dir), str(dest), host, str(known), str(server.client_key)]
        try:
            print(f"1 file set, {total / 1e6:.0f} MB over ssh (relay 127.0.0.1:{relay.port} -> sshd :{server.port})")
            proc = subprocess.Popen(child, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
            out = bytearray()
            threading.Thread(target=lambda: out.extend(proc.stdout.read()), daemon=True).start()
            incoming = dest / ".incoming" / "outputs" / "merged"
            while proc.poll() is None:
                got = sum(p.stat().st_size for p in incoming.glob("*")) if incoming.is_dir() else 0
                if got >= args.cut * total:
                    os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C: the terminal signals the whole group
                    break
                time.sleep(0.05)
            proc.wait(timeout=60)
            time.sleep(0.2)
            first = relay.down
            print(f"try 1: interrupted (SIGINT) at {got / 1e6:.0f} MB, exit {proc.returncode}; "
                  f"wire bytes to the client {first / 1e6:.1f} MB")
            for line in last_frames(bytes(out)):
                print("  terminal: " + line)
            relay.down = relay.up = 0
            t = time.perf_counter()
            done = subprocess.run(child, capture_output=True, timeout=3600)
            dt = time.perf_counter() - t
            print(f"try 2: exit {done.returncode} in {dt:.1f} s; wire bytes to the client {relay.down / 1e6:.1f} MB "
                  f"(from the client {relay.up / 1e6:.2f} MB) for {(total - got) / 1e6:.0f} MB left")
            for line in last_frames(done.stdout):
                print("  terminal: " + line)
        finally:
            server.stop()


# -------------------------------------------------------------- the real command, on a terminal


def on_a_pty(argv: list[str], env: dict, out: Path) -> subprocess.Popen:
    """`argv` on a pseudo-terminal of its own (80x24, its controlling terminal, as a shell runs it),
    everything it writes to `out`; `proc.master` is the terminal's side, to type Ctrl-C into."""
    import fcntl
    import struct
    import termios

    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    proc = subprocess.Popen(argv, env=env, cwd=REPO, stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
                            preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0))
    os.close(slave)

    def pump():
        with open(out, "wb") as f:
            while True:
                try:
                    data = os.read(master, 65536)
                except OSError:
                    return
                if not data:
                    return
                f.write(data)
                f.flush()

    threading.Thread(target=pump, daemon=True).start()
    proc.master = master
    return proc


def cli(args) -> None:
    """`launch down RUN --fetch-artifacts --merged` of a finished ssh run, Ctrl-C typed at half, again."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-cli-"))
    try:
        env = {**os.environ, "LAUNCH_HOME": str(tmp / "launch-home"), "HOME": str(tmp / "home"), "COLUMNS": "80",
               "TERM": "xterm-256color"}
        (tmp / "home").mkdir()
        os.environ["LAUNCH_HOME"] = env["LAUNCH_HOME"]
        from launcher.store import registry

        root, rd = tmp / "host" / "launch" / "r1", tmp / "host" / "volume" / "runs" / "local-demo-20261202-000002"
        total = make_run(rd, args.mb, args.files)
        root.mkdir(parents=True)
        (root / "exit_code").write_text("0\n")
        (rd / "status.json").write_text('{"state": "completed"}')
        server = ssh_env(tmp)
        relay = Relay(server.port)
        known = tmp / "known_hosts"
        known.write_text(server.known_hosts_line().replace(f"]:{server.port} ", f"]:{relay.port} "))
        registry.save(registry.Run(
            id=rd.name, profile="local-demo", backend="ssh", state="completed", started_at=time.time() - 100,
            ended_at=time.time() - 10, handle={
                "host": f"{server.user}@127.0.0.1:{relay.port}", "known_hosts": str(known), "run_root": str(root),
                "identity_file": str(server.client_key), "run_dir": str(rd), "volume": str(rd.parent.parent),
                "log": str(rd / "logs" / "run.log"), "pid": 1, "pgid": 1}))
        argv = [str(Path(sys.executable).parent / "launch"), "down", rd.name, "--fetch-artifacts", "--merged",
                "--dest", str(tmp / "art")]
        incoming = tmp / "art" / rd.name / ".incoming" / "outputs" / "merged"
        try:
            proc = on_a_pty(argv, env, tmp / "try1.txt")
            got = 0
            while proc.poll() is None and got < args.cut * total:
                got = sum(p.stat().st_size for p in incoming.glob("*")) if incoming.is_dir() else 0
                time.sleep(0.01)
            os.write(proc.master, b"\x03")  # Ctrl-C typed at the terminal: SIGINT to its foreground group
            proc.wait(timeout=60)
            time.sleep(0.5)
            print(f"{total / 1e6:.0f} MB; try 1: Ctrl-C at {got / 1e6:.1f} MB, exit {proc.returncode}, "
                  f"{relay.down / 1e6:.1f} MB on the wire to the client")
            for line in last_frames((tmp / "try1.txt").read_bytes(), 5):
                print("  | " + line)
            had = sum(p.stat().st_size for p in incoming.glob("*"))
            relay.down = relay.up = 0
            t = time.perf_counter()
            proc = on_a_pty(argv, env, tmp / "try2.txt")
            proc.wait(timeout=3600)
            time.sleep(0.5)
            print(f"try 2: exit {proc.returncode} in {time.perf_counter() - t:.1f} s, {relay.down / 1e6:.1f} MB on "
                  f"the wire to the client ({relay.up / 1e6:.2f} MB from it) for the {(total - had) / 1e6:.1f} MB left")
            for line in last_frames((tmp / "try2.txt").read_bytes(), 30):
                if "━" in line or line[:1] in "✓!✗" or " moved in " in line:
                    print("  | " + line)
        finally:
            server.stop()
    finally:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


def last_frames(raw: bytes, tail: int = 2) -> list[str]:
    """The text lines a terminal last showed: ANSI sequences dropped, each \\r-rewritten line's last state."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", raw.decode(errors="replace"))  # colours
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "\n", text)  # cursor moves and erasures: a new frame
    lines = [seg.rstrip("\r").split("\r")[-1].strip() for seg in text.split("\n")]  # a pty ends lines \r\n
    lines = [x for x in lines if x]
    bars = [x for x in lines if "━" in x]
    return bars[-2:] + [x for x in lines[-tail:] if "━" not in x]


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_fetch":  # the child of `resume`
        sys.path.insert(0, str(REPO))
        run_dir, dest, host, known, key = sys.argv[2:7]
        try:
            fetch_ssh(Path(run_dir), Path(dest), host, Path(known), Path(key), True)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            sys.exit(130)
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", nargs="?", default="throughput", choices=("throughput", "resume", "cli"))
    ap.add_argument("--mb", type=float, default=64.0, help="bytes of artifacts in all, MB (default 64)")
    ap.add_argument("--files", type=int, default=2)
    ap.add_argument("--transports", default="ssh,s3")
    ap.add_argument("--cut", type=float, default=0.5, help="resume: interrupt when this share has arrived")
    ap.add_argument("--stream-mbps", type=float, default=0,
                    help="hold each TCP connection to this many MB/s, as a long path does (default: loopback)")
    ap.add_argument("--code", help="a launcher checkout to run instead of this one (before/after)")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(args.code).resolve()) if args.code else str(REPO))
    {"resume": resume, "cli": cli}.get(args.mode, throughput)(args)


if __name__ == "__main__":
    main()
