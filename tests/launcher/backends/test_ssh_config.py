"""The ssh backend reaches a host as `ssh HOST` does from ~/.ssh/config: IdentityFile, IdentityAgent,
ProxyCommand and ProxyJump, for paramiko (commands), rsync (fetches) and `launch ssh` alike, with the host
key checked strictly on every hop. Real OpenSSH servers: one on 127.0.0.1 (tests/sshd.py), and for the
bastion a target in a network namespace of its own that only a second namespace (the bastion's) reaches;
the namespaced test needs root and is skipped without it."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

from launcher.backends.ssh import SSHBackend
from launcher.backends.sshconn import Target
from launcher.errors import BackendError
from launcher.store.registry import Run


def write_config(text: str) -> None:
    ssh = Path.home() / ".ssh"
    ssh.mkdir(mode=0o700, exist_ok=True)
    (ssh / "config").write_text(text)


def known(tmp_path, *lines) -> Path:
    path = tmp_path / "known_hosts"
    path.write_text("".join(lines))
    return path


def run_on(backend: SSHBackend, spec: str, run_dir: Path) -> Run:
    """A run whose record holds what `up` keeps: the resolved host and its route."""
    conn = backend._conn()
    return Run(id="r1", profile="p", backend="ssh", state="completed",
               handle={"host": str(conn.target), "ssh_route": conn.target.route(), "known_hosts": str(conn.known_hosts),
                       "identity_file": None, "run_dir": str(run_dir), "run_root": str(run_dir)})


def system_ssh(backend: SSHBackend, run: Run, command: str) -> subprocess.CompletedProcess:
    """`launch ssh`'s own argv (Access) with a command, as the user's terminal would run it."""
    argv = backend.access(run, None, False).argv[:-1]  # the run-dir `cd` replaced by the test's command
    return subprocess.run([*argv, command], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


def test_a_config_alias_with_its_identity_file_and_proxycommand(sshd, tmp_path):
    """No --identity, no port: the alias's HostName/Port/User/IdentityFile, through its ProxyCommand
    (ssh -W via the same server), for commands, rsync and the system ssh."""
    kh = known(tmp_path, sshd.known_hosts_line())
    write_config(f"""Host pod
  HostName 127.0.0.1
  Port {sshd.port}
  User {sshd.user}
  IdentityFile {sshd.client_key}
  IdentitiesOnly yes
  ProxyCommand ssh -F none -o BatchMode=yes -o UserKnownHostsFile={kh} -o StrictHostKeyChecking=yes -i {sshd.client_key} -p {sshd.port} -W %h:%p {sshd.user}@127.0.0.1
""")
    t = Target.parse("pod")
    assert (t.hostname, t.port, t.identity_files) == ("127.0.0.1", sshd.port, (str(sshd.client_key),))
    assert t.proxy_command and "-W 127.0.0.1:" in t.proxy_command  # tokens expanded once, at up
    backend = SSHBackend(host="pod", known_hosts=str(kh))
    assert backend.probe()["home"]
    rd = tmp_path / "rd"
    (rd / "outputs").mkdir(parents=True)
    (rd / "outputs" / "f.bin").write_bytes(b"x" * 1000)
    run = run_on(backend, "pod", rd)
    (Path.home() / ".ssh" / "config").unlink()  # the run goes as it went at up, not by a config read later
    again = SSHBackend()
    again.copy_files(run, ["outputs/f.bin"], tmp_path / "got")
    assert (tmp_path / "got" / "outputs/f.bin").read_bytes() == b"x" * 1000 and again.last_fetch["via"] == "rsync"
    done = system_ssh(again, run, "echo via-system-ssh")
    assert done.returncode == 0 and "via-system-ssh" in done.stdout, done.stderr
    resumed = SSHBackend(host=run.handle.host, known_hosts=str(kh))  # `up --resume`: the recorded host
    assert resumed._conn(run).target == t and resumed.probe(resumed._conn(run))["home"]


def test_identity_agent_from_the_config(sshd, tmp_path, monkeypatch):
    """IdentityAgent names an agent socket that is not $SSH_AUTH_SOCK: its key is offered."""
    if not shutil.which("ssh-agent"):
        pytest.skip("ssh-agent is not installed (openssh-client)")
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        for _ in range(100):
            if sock.exists():
                break
            time.sleep(0.05)
        subprocess.run(["ssh-add", str(sshd.client_key)], env={**os.environ, "SSH_AUTH_SOCK": str(sock)},
                       check=True, capture_output=True, timeout=30)
        kh = known(tmp_path, sshd.known_hosts_line())
        write_config(f"Host pod\n  HostName 127.0.0.1\n  Port {sshd.port}\n  IdentityAgent {sock}\n")
        monkeypatch.delenv("SSH_AUTH_SOCK", raising=False)  # only the config names the agent
        backend = SSHBackend(host="pod", known_hosts=str(kh))
        assert backend.probe()["home"]
        done = system_ssh(backend, run_on(backend, "pod", tmp_path), "echo agent-ok")
        assert "agent-ok" in done.stdout, done.stderr
        write_config(f"Host pod\n  HostName 127.0.0.1\n  Port {sshd.port}\n  IdentityAgent {tmp_path}/none.sock\n")
        with pytest.raises(BackendError, match="IdentityAgent .*none.sock .*does not answer"):
            SSHBackend(host="pod", known_hosts=str(kh)).probe()
    finally:
        agent.terminate()
        agent.wait(timeout=10)


def test_jump_argv_checks_every_hop_strictly(tmp_path):
    write_config("""Host pod
  HostName 10.9.0.2
  User root
  ProxyJump admin@bastion:2200,inner
Host inner
  HostName 10.9.0.1
Host bastion
  HostName bastion.example
""")
    t = Target.parse("pod")
    assert [str(j) for j in t.jumps] == ["admin@bastion.example:2200", f"{t.jumps[1].user}@10.9.0.1:22"]
    argv = t.ssh_argv(tmp_path / "kh", None, 10)
    proxy = next(a for a in argv if a.startswith("ProxyCommand="))
    assert argv[:3] == ["ssh", "-F", "none"] and "-W 10.9.0.2:22" in proxy and "-W 10.9.0.1:22" in proxy
    assert proxy.count("StrictHostKeyChecking=yes") == 2 and proxy.count(f"UserKnownHostsFile={tmp_path}/kh") == 2
    assert Target.from_route(str(t), t.route()) == t  # what the run keeps is what it reaches


# ----------------------------------------------------------------------------- a real bastion


class Namespaces:
    """Two network namespaces joined by a veth pair: the bastion's (10.a.b.1) and the target's
    (10.a.b.2). Nothing is added to the host's network; the bastion's sshd serves connections
    accepted on 127.0.0.1 here, as `sshd -i` inside its namespace, so only it reaches the target."""

    def __init__(self):
        tag = uuid.uuid4().hex[:6]
        self.bastion, self.target = f"lt-bastion-{tag}", f"lt-target-{tag}"
        n = int(tag[:2], 16)
        self.b_ip, self.t_ip = f"10.{200 + n % 50}.{n}.1", f"10.{200 + n % 50}.{n}.2"

    def up(self) -> "Namespaces":
        ip = ["ip"]
        for cmd in ([*ip, "netns", "add", self.bastion], [*ip, "netns", "add", self.target],
                    [*ip, "-n", self.bastion, "link", "add", "vb", "type", "veth", "peer", "name", "vt",
                     "netns", self.target],
                    [*ip, "-n", self.bastion, "addr", "add", f"{self.b_ip}/30", "dev", "vb"],
                    [*ip, "-n", self.target, "addr", "add", f"{self.t_ip}/30", "dev", "vt"],
                    [*ip, "-n", self.bastion, "link", "set", "vb", "up"], [*ip, "-n", self.target, "link", "set", "vt", "up"],
                    [*ip, "-n", self.bastion, "link", "set", "lo", "up"], [*ip, "-n", self.target, "link", "set", "lo", "up"]):
            subprocess.run(cmd, check=True, capture_output=True, timeout=30)
        return self

    def down(self) -> None:
        for ns in (self.bastion, self.target):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def _inetd(port_sock: socket.socket, argv: list[str], stop: threading.Event, served: list) -> None:
    """Each connection accepted on `port_sock` served by one `argv` (sshd -i) on its stdin/stdout."""
    port_sock.settimeout(0.2)
    while not stop.is_set():
        try:
            conn, _ = port_sock.accept()
        except OSError:
            continue
        served.append(subprocess.Popen(argv, stdin=conn, stdout=conn, stderr=subprocess.DEVNULL,
                                       start_new_session=True))
        conn.close()


@pytest.fixture
def bastion(tmp_path):
    from sshd import CONFIG, SSHServer, ensure_sshd

    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("a bastion in a network namespace needs root and iproute2 (`ip netns`)")
    ensure_sshd()
    ns = Namespaces()
    try:
        ns.up()
    except subprocess.CalledProcessError as e:
        ns.down()
        pytest.skip(f"cannot make network namespaces here: {e.stderr.decode().strip()}")
    procs, stop = [], threading.Event()
    try:
        target = SSHServer(tmp_path / "target")  # its keys and config; it listens in the target's namespace
        target.conf.write_text(CONFIG.format(port=22, host_key=target.host_key, pid_file=target.pid_file,
                                             authorized_keys=target.authorized_keys)
                               .replace("ListenAddress 127.0.0.1", f"ListenAddress {ns.t_ip}"))
        target._set_session_env()
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        procs.append(subprocess.Popen(["ip", "netns", "exec", ns.target, "/usr/sbin/sshd", "-D", "-f",
                                       str(target.conf), "-E", str(target.log)], start_new_session=True))
        jump = SSHServer(tmp_path / "bastion")
        jump.conf.write_text(jump.conf.read_text().replace(f"Port {jump.port}\nListenAddress 127.0.0.1\n", ""))
        listener = socket.create_server(("127.0.0.1", 0))
        jump.port = listener.getsockname()[1]
        inetd = ["ip", "netns", "exec", ns.bastion, "/usr/sbin/sshd", "-i", "-f", str(jump.conf), "-E", str(jump.log)]
        thread = threading.Thread(target=_inetd, args=(listener, inetd, stop, procs), daemon=True)
        thread.start()
        deadline = time.monotonic() + 15
        while "Server listening" not in (target.log.read_text() if target.log.exists() else ""):
            assert time.monotonic() < deadline, target.log.read_text() if target.log.exists() else "no log"
            time.sleep(0.05)
        yield ns, jump, target
    finally:
        stop.set()
        for p in procs:  # the target's sshd and each connection's `sshd -i` (their sessions die with them)
            if p.poll() is None:
                p.terminate()
            p.wait(timeout=10)
        ns.down()


def test_a_pod_behind_a_bastion_by_proxyjump(bastion, tmp_path):
    """~/.ssh/config says `ProxyJump bastion` for the pod: `launch up --backend ssh --host pod`'s
    connection, its fetch (rsync) and `launch ssh` all go through the bastion; the pod is not reachable
    from here without it; an unknown bastion key is refused as an unknown pod key is."""
    ns, jump, target = bastion
    kh = known(tmp_path, jump.known_hosts_line(), f"{ns.t_ip} " + " ".join(
        (target.root / "host_ed25519.pub").read_text().split()[:2]) + "\n")
    write_config(f"""Host pod
  HostName {ns.t_ip}
  User {target.user}
  IdentityFile {target.client_key}
  ProxyJump bastion
Host bastion
  HostName 127.0.0.1
  Port {jump.port}
  User {jump.user}
  IdentityFile {jump.client_key}
""")
    direct = SSHBackend(host=f"{target.user}@{ns.t_ip}:22", identity_file=str(target.client_key),
                        known_hosts=str(kh), connect_timeout=2, retries=1)
    with pytest.raises(BackendError, match="cannot reach"):  # not from here: the pod's network is apart
        direct.probe()
    backend = SSHBackend(host="pod", known_hosts=str(kh))
    info = backend.probe()
    assert info["home"] and info["host"] == f"{target.user}@{ns.t_ip}:22"
    rd = tmp_path / "rd"  # the target's filesystem is this one: only its network is apart
    (rd / "outputs").mkdir(parents=True)
    (rd / "outputs" / "w.bin").write_bytes(os.urandom(300_000))
    run = run_on(backend, "pod", rd)
    assert [j["host"] for j in run.handle.ssh_route["jumps"]] == [f"{jump.user}@127.0.0.1:{jump.port}"]
    fetcher = SSHBackend()
    fetcher.copy_files(run, ["outputs/w.bin"], tmp_path / "got")
    assert (tmp_path / "got/outputs/w.bin").read_bytes() == (rd / "outputs/w.bin").read_bytes()
    assert fetcher.last_fetch["via"] == "rsync"
    done = system_ssh(fetcher, run, "cat /proc/net/fib_trie | grep -c " + ns.t_ip)
    assert done.returncode == 0 and int(done.stdout.strip()) > 0, done.stderr  # it ran in the target's namespace
    bad = known(tmp_path, f"{ns.t_ip} " + " ".join((target.root / "host_ed25519.pub").read_text().split()[:2]) + "\n")
    with pytest.raises(BackendError, match=f"unknown host key for \\[127.0.0.1\\]:{jump.port}"):
        SSHBackend(host="pod", known_hosts=str(bad)).probe()
    stranger = SSHBackend()
    run.handle.known_hosts = str(bad)
    with pytest.raises(BackendError, match="host key"):
        stranger.copy_files(run, ["outputs/w.bin"], tmp_path / "got2")
