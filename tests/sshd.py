"""A real OpenSSH server on 127.0.0.1 for the SSH backend tests (not a conftest: import explicitly).

`SSHServer` runs `/usr/sbin/sshd -D -f CONF -E LOG` on a free loopback port with a throwaway host
key and a throwaway client key (FIELD-NOTES "An SSH server for tests"). Its sessions get
OMP_NUM_THREADS=1, as the suite's own processes do (tests/conftest.py says why). When sshd is missing it
is installed with apt (`openssh-server rsync`, as root); if that is impossible the tests are skipped
with the reason. Helpers kill the per-connection sshd processes or restart the listener, so a test
can drop a live connection.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from host_tools import ensure_apt

SSHD = Path("/usr/sbin/sshd")

CONFIG = """\
Port {port}
ListenAddress 127.0.0.1
HostKey {host_key}
AuthorizedKeysFile {authorized_keys}
PidFile {pid_file}
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PermitRootLogin prohibit-password
Subsystem sftp internal-sftp
X11Forwarding no
PrintMotd no
MaxStartups 50
LogLevel VERBOSE
"""
# What every session gets (tests/conftest.py says why), added to a test's own `SetEnv` line: sshd takes
# the first SetEnv line only.
SESSION_ENV = "OMP_NUM_THREADS=1"


def ensure_sshd() -> None:
    """Install openssh-server (+ rsync) if sshd is missing; skip the calling test if impossible."""
    ensure_apt(("openssh-server", "rsync"), lambda: SSHD.exists() and shutil.which("ssh-keygen") is not None,
               "the SSH backend's tests")


def keygen(path: Path, kind: str = "ed25519") -> Path:
    """A passphrase-less key pair at `path` / `path.pub`."""
    subprocess.run(["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", "launch-test", "-f", str(path)],
                   check=True, capture_output=True, timeout=60)
    return path


def fingerprint(pub: Path) -> str:
    """`SHA256:...` of a public key file, as OpenSSH prints it."""
    out = subprocess.run(["ssh-keygen", "-l", "-E", "sha256", "-f", str(pub)], check=True,
                         capture_output=True, text=True, timeout=30).stdout
    return out.split()[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SSHServer:
    def __init__(self, root: Path):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.user = getpass.getuser()
        self.port = free_port()
        self.host_key = keygen(root / "host_ed25519")
        self.client_key = keygen(root / "client_ed25519")
        self.authorized_keys = root / "authorized_keys"
        self.authorized_keys.write_text((root / "client_ed25519.pub").read_text())
        self.pid_file, self.log = root / "sshd.pid", root / "sshd.log"
        self.conf = root / "sshd_config"
        self.conf.write_text(CONFIG.format(port=self.port, host_key=self.host_key, pid_file=self.pid_file,
                                           authorized_keys=self.authorized_keys))
        self.proc: subprocess.Popen | None = None

    @property
    def host(self) -> str:
        return f"{self.user}@127.0.0.1:{self.port}"

    def known_hosts_line(self) -> str:
        kind, b64 = (self.root / "host_ed25519.pub").read_text().split()[:2]
        return f"[127.0.0.1]:{self.port} {kind} {b64}\n"

    def host_fingerprint(self) -> str:
        return fingerprint(self.root / "host_ed25519.pub")

    # ------------------------------------------------------------------------------ lifecycle

    def start(self) -> "SSHServer":
        self._set_session_env()
        if os.geteuid() == 0:
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation directory
        check = subprocess.run([str(SSHD), "-t", "-f", str(self.conf)], capture_output=True, text=True,
                               timeout=30)
        if check.returncode != 0:
            raise RuntimeError(f"sshd config rejected: {check.stderr.strip()}")
        self.proc = subprocess.Popen([str(SSHD), "-D", "-f", str(self.conf), "-E", str(self.log)],
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        self._wait_ready()
        return self

    def _set_session_env(self) -> None:
        lines = self.conf.read_text().splitlines()
        at = next((i for i, line in enumerate(lines) if line.startswith("SetEnv ")), None)
        if at is None:
            lines.append(f"SetEnv {SESSION_ENV}")
        elif SESSION_ENV.split("=")[0] + "=" not in lines[at]:
            lines[at] += f" {SESSION_ENV}"
        self.conf.write_text("\n".join(lines) + "\n")

    def _wait_ready(self, timeout: float = 15) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited with {self.proc.returncode}: {self.log.read_text()[-800:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=2) as s:
                    if s.recv(64).startswith(b"SSH-"):
                        return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"sshd did not answer on port {self.port} within {timeout} s")

    def stop_listener(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def session_pids(self) -> list[int]:
        """The sshd processes serving connections: `sshd...` processes descending from our listener."""
        if not self.proc:
            return []
        out = []
        for entry in Path("/proc").glob("[0-9]*"):
            try:
                pid = int(entry.name)
                if pid != self.proc.pid and (entry / "cmdline").read_bytes().startswith(b"sshd"):
                    if self._descends(pid, self.proc.pid):
                        out.append(pid)
            except (OSError, ValueError):
                continue
        return out

    @staticmethod
    def _descends(pid: int, ancestor: int) -> bool:
        for _ in range(32):
            try:
                pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                return False
            if pid == ancestor:
                return True
            if pid <= 1:
                return False
        return False

    def kill_sessions(self) -> list[int]:
        """SIGKILL every per-connection sshd: each client sees its connection drop."""
        pids = self.session_pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return pids

    def restart(self, down_for: float = 0.0) -> None:
        """Drop every connection and the listener; listen again after `down_for` seconds."""
        self.kill_sessions()
        self.stop_listener()
        time.sleep(down_for)
        self.start()

    def stop(self) -> None:
        self.kill_sessions()
        self.stop_listener()
