"""The SSH connection layer of the ssh backend: host parsing, the host-key policy (known_hosts only;
new keys need explicit consent, changed keys are always refused), a reconnectable paramiko client,
and bounded command execution."""

from __future__ import annotations

import getpass
import re
import shlex
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import paramiko

from ..errors import BackendError

TRANSFER_TIMEOUT = 60.0  # no progress on an upload/download/SFTP channel for this long
DEFAULT_SSH_PORT = 22  # the SSH protocol's default, used only when `host` names no port


@dataclass(frozen=True)
class Target:
    user: str
    hostname: str
    port: int

    @classmethod
    def parse(cls, spec: str) -> "Target":
        """`user@host[:port]`, `host`, `user@[::1]:2200`; ~/.ssh/config aliases fill the gaps."""
        user, _, hostport = spec.rpartition("@")
        m = re.fullmatch(r"\[(?P<h>[^\]]+)\](?::(?P<p>\d+))?|(?P<h2>[^:\[\]]+)(?::(?P<p2>\d+))?", hostport)
        if not m:
            raise BackendError(f"--host `{spec}`: expected user@host or user@host:port")
        host, port = m["h"] or m["h2"], m["p"] or m["p2"]
        conf = _ssh_config(host)
        return cls(user=user or conf.get("user") or getpass.getuser(),
                   hostname=conf.get("hostname", host),
                   port=int(port or conf.get("port") or DEFAULT_SSH_PORT))

    def __str__(self) -> str:
        host = f"[{self.hostname}]" if ":" in self.hostname else self.hostname
        return f"{self.user}@{host}:{self.port}"


def _ssh_config(host: str) -> dict:
    path = Path("~/.ssh/config").expanduser()
    if not path.is_file():
        return {}
    try:
        return paramiko.SSHConfig.from_path(str(path)).lookup(host)
    except Exception:  # a config paramiko cannot parse: the user's ssh still reads it, we skip it
        return {}


def key_description(key: paramiko.PKey) -> str:
    return f"{key.get_name()} {key.fingerprint}"


class _HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Unknown host key: refuse with its fingerprint, or record it when the user said so."""

    def __init__(self, known_hosts: Path, accept: bool):
        self.known_hosts, self.accept = known_hosts, accept

    def missing_host_key(self, client, hostname, key):
        if not self.accept:
            raise BackendError(
                f"unknown host key for {hostname}: {key_description(key)}. Compare it with the host's "
                f"own (`ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub` there, or your provider's console), "
                f"then re-run with --accept-new-host-key to trust it")
        self.known_hosts.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        old = self.known_hosts.read_bytes() if self.known_hosts.is_file() else b""
        with open(self.known_hosts, "a") as f:
            f.write(("\n" if old and not old.endswith(b"\n") else "") +
                    f"{hostname} {key.get_name()} {key.get_base64()}\n")
        self.known_hosts.chmod(0o600)


class Connection:
    """One cached SSH connection (client + SFTP) to a target, reopened on demand."""

    def __init__(self, target: Target, known_hosts: Path, identity_file: Optional[str], accept: bool,
                 timeout: float):
        self.target, self.known_hosts, self.identity = target, known_hosts, identity_file
        self.accept, self.timeout = accept, timeout
        self.client: Optional[paramiko.SSHClient] = None
        self._sftp: Optional[paramiko.SFTPClient] = None

    def open(self) -> paramiko.SSHClient:
        if self.client and self.client.get_transport() and self.client.get_transport().is_active():
            return self.client
        self.close()
        client = paramiko.SSHClient()
        if self.known_hosts.is_file():
            client.load_host_keys(str(self.known_hosts))
        client.set_missing_host_key_policy(_HostKeyPolicy(self.known_hosts, self.accept))
        t, ident = self.timeout, self.identity
        key = _load_key(ident) if ident else None
        try:
            client.connect(self.target.hostname, self.target.port, self.target.user, pkey=key,
                           look_for_keys=ident is None, allow_agent=ident is None, timeout=t,
                           banner_timeout=t, auth_timeout=t, channel_timeout=t)
        except paramiko.BadHostKeyException as e:
            client.close()
            raise BackendError(
                f"HOST KEY CHANGED for {e.hostname}: it presents {key_description(e.key)} but "
                f"{self.known_hosts} has {key_description(e.expected_key)}. Someone may be intercepting "
                f"the connection (man-in-the-middle), or the host was rebuilt. Refusing to connect; if "
                f"you are sure, remove the old key with `{self.forget_command()}` and connect again") from None
        except paramiko.AuthenticationException as e:
            client.close()
            raise BackendError(f"{self.target} refused our key ({e}): add your public key to the host's "
                               f"~/.ssh/authorized_keys or pass --identity KEYFILE") from None
        except BaseException:
            client.close()
            raise
        client.get_transport().set_keepalive(15)
        self.client = client
        return client

    def forget_command(self) -> str:
        """The `ssh-keygen -R` that removes this target's known_hosts entry: OpenSSH (and paramiko)
        record a non-22 port as `[host]:port`, and `-R host` alone would not match it."""
        t = self.target
        entry = t.hostname if t.port == DEFAULT_SSH_PORT else f"[{t.hostname}]:{t.port}"
        return f"ssh-keygen -R {shlex.quote(entry)} -f {shlex.quote(str(self.known_hosts))}"

    def sftp(self) -> paramiko.SFTPClient:
        client = self.open()
        if self._sftp is None or self._sftp.get_channel().closed:
            self._sftp = client.open_sftp()
            self._sftp.get_channel().settimeout(TRANSFER_TIMEOUT)
        return self._sftp

    def close(self) -> None:
        for thing in (self._sftp, self.client):
            try:
                if thing:
                    thing.close()
            except Exception:
                pass
        self.client, self._sftp = None, None

    def channel(self, command: str, timeout: float) -> paramiko.Channel:
        chan = self.open().get_transport().open_session(timeout=self.timeout)
        chan.settimeout(timeout)
        chan.exec_command(command)
        return chan


def _load_key(ident: str) -> paramiko.PKey:
    """The --identity key, read here: a .pub file or a key with a passphrase is said as what it is (in
    paramiko's connect it was "cannot reach the host" after five tries, or "the host refused our key")."""
    path = Path(ident).expanduser()
    if not path.is_file():
        raise BackendError(f"identity file {ident} does not exist")
    try:
        return paramiko.PKey.from_path(path)
    except Exception as e:  # noqa: BLE001 - paramiko/cryptography raise ValueError, TypeError, SSHException...
        locked = any(w in str(e).lower() for w in ("password", "passphrase", "encrypted"))
        fix = "it has a passphrase: load it into ssh-agent (`ssh-add KEY`) and drop --identity" if locked else \
            "pass the private key file (not the .pub), in OpenSSH or PEM format"
        raise BackendError(f"identity file {ident} is not a private key launch can read: {fix}") from None


class CommandTimeout(BackendError):
    pass


def collect(chan: paramiko.Channel, timeout: float, what: str) -> tuple[int, str, str]:
    out, err = bytearray(), bytearray()
    deadline = time.monotonic() + timeout
    while True:
        if chan.recv_ready():
            out += chan.recv(65536)
        elif chan.recv_stderr_ready():
            err += chan.recv_stderr(65536)
        elif chan.exit_status_ready():
            break
        elif time.monotonic() > deadline:
            chan.close()
            raise CommandTimeout(f"remote `{what}` did not finish within {timeout:.0f} s")
        elif chan.closed or not chan.get_transport().is_active():
            raise EOFError("connection closed")
        else:
            chan.status_event.wait(0.01)
    while chan.recv_ready() or chan.recv_stderr_ready():  # drain what arrived with the exit status
        out += chan.recv(65536) if chan.recv_ready() else b""
        err += chan.recv_stderr(65536) if chan.recv_stderr_ready() else b""
    code, transport = chan.recv_exit_status(), chan.get_transport()
    chan.close()
    if code == -1 and not (transport and transport.is_active()):  # no exit status: the connection went
        raise EOFError("connection closed before the command's exit status")
    return code, out.decode(errors="replace"), err.decode(errors="replace")
