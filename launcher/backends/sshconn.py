"""The SSH connection layer of the ssh backend: host parsing, the host-key policy (known_hosts only;
new keys need explicit consent, changed keys are always refused), a reconnectable paramiko client,
and bounded command execution; and how a path or a failure on the host reads (`expand`, `why`).

One idea at ~370 lines: one SSH connection as ~/.ssh/config routes it (HostName, User, Port,
IdentityFile, IdentityAgent, ProxyCommand, ProxyJump), for paramiko and for the system ssh that rsync
runs, under one host-key policy. The route, the client and the key loading read the same config and
stand or fall together, so they stay in one module.
"""

from __future__ import annotations

import getpass
import re
import shlex
import socket
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Optional

import paramiko
import paramiko.agent
import paramiko.auth_strategy

from ..errors import BackendError

TRANSFER_TIMEOUT = 60.0  # no progress on an upload/download/SFTP channel for this long
DEFAULT_SSH_PORT = 22  # the SSH protocol's default, used only when `host` names no port


@dataclass(frozen=True)
class Target:
    """Where a run's host is and how it is reached, as `ssh HOST` reaches it from ~/.ssh/config:
    HostName, User, Port, IdentityFile, IdentitiesOnly, IdentityAgent, ProxyCommand and ProxyJump
    (each jump host resolved the same way). Resolved once, at `launch up`, and kept in the run's
    record (`route`), so every later command of the run (paramiko, rsync, `launch ssh`) goes the
    same way even if the config changes."""

    user: str
    hostname: str
    port: int
    identity_files: tuple[str, ...] = ()
    identities_only: bool = False
    identity_agent: Optional[str] = None  # a socket path, or "none"
    proxy_command: Optional[str] = None
    jumps: tuple["Target", ...] = ()  # ProxyJump's hosts, the first one reached first

    @classmethod
    def parse(cls, spec: str, route: Optional[dict] = None, _depth: int = 0) -> "Target":
        """`user@host[:port]`, `host`, `user@[::1]:2200`; ~/.ssh/config fills the gaps (as `ssh host`
        reads it). With `route` (a run's stored one) the config is not read again."""
        if route is not None:
            return cls.from_route(spec, route)
        user, _, hostport = spec.rpartition("@")
        m = re.fullmatch(r"\[(?P<h>[^\]]+)\](?::(?P<p>\d+))?|(?P<h2>[^:\[\]]+)(?::(?P<p2>\d+))?", hostport)
        if not m:
            raise BackendError(f"--host `{spec}`: expected user@host or user@host:port")
        host, port = m["h"] or m["h2"], m["p"] or m["p2"]
        conf = _ssh_config(host)
        jumps: tuple[Target, ...] = ()
        jump = conf.get("proxyjump")
        if jump and jump.lower() != "none" and not conf.get("proxycommand"):  # ssh: the first one set wins
            if _depth > 4:
                raise BackendError(f"~/.ssh/config: ProxyJump for {host} loops (more than 5 jumps)")
            jumps = tuple(hop for part in jump.split(",") for hop in _jump_route(part.strip(), _depth))
        command = conf.get("proxycommand")
        agent = conf.get("identityagent")
        return cls(user=user or conf.get("user") or getpass.getuser(), hostname=conf.get("hostname", host),
                   port=int(port or conf.get("port") or DEFAULT_SSH_PORT),
                   identity_files=tuple(f for f in conf.get("identityfile", []) if Path(f).expanduser().is_file()),
                   identities_only=conf.get("identitiesonly", "no").lower() == "yes",
                   identity_agent=None if not agent or agent == "SSH_AUTH_SOCK" else
                   "none" if agent.lower() == "none" else str(Path(agent).expanduser()),
                   proxy_command=None if not command or command.lower() == "none" else command, jumps=jumps)

    def route(self) -> dict:
        """What `parse` read from the config, for the run's record (empty when it read nothing)."""
        out = {k: v for k, v in (("identity_files", list(self.identity_files)),
                                 ("identities_only", self.identities_only), ("identity_agent", self.identity_agent),
                                 ("proxy_command", self.proxy_command)) if v}
        if self.jumps:
            out["jumps"] = [{"host": str(j), **j.route()} for j in self.jumps]
        return out

    @classmethod
    def from_route(cls, spec: str, route: dict) -> "Target":
        bare = cls.parse_plain(spec)
        return cls(bare.user, bare.hostname, bare.port, tuple(route.get("identity_files") or ()),
                   bool(route.get("identities_only")), route.get("identity_agent"), route.get("proxy_command"),
                   tuple(cls.from_route(j["host"], j) for j in route.get("jumps") or ()))

    @classmethod
    def parse_plain(cls, spec: str) -> "Target":
        user, _, hostport = spec.rpartition("@")
        m = re.fullmatch(r"\[(?P<h>[^\]]+)\]:(?P<p>\d+)|(?P<h2>[^:\[\]]+):(?P<p2>\d+)", hostport)
        if not m or not user:
            raise BackendError(f"the run's recorded host `{spec}` is not user@host:port")
        return cls(user, m["h"] or m["h2"], int(m["p"] or m["p2"]))

    def __str__(self) -> str:
        host = f"[{self.hostname}]" if ":" in self.hostname else self.hostname
        return f"{self.user}@{host}:{self.port}"

    def ssh_argv(self, known_hosts: Path, identity: Optional[str], connect_timeout: float,
                 batch: bool = True) -> list[str]:
        """The system ssh reaching this target the way paramiko does (`Connection.open`): no config
        file read (`-F none`: what it said is in this target), the backend's known_hosts, strictly
        checked on every hop, the same keys, agent, ProxyCommand and jumps. The destination follows."""
        argv = ["ssh", "-F", "none", "-p", str(self.port), "-o", f"UserKnownHostsFile={known_hosts}",
                "-o", "StrictHostKeyChecking=yes", "-o", f"BatchMode={'yes' if batch else 'no'}",
                "-o", f"ConnectTimeout={int(connect_timeout)}", "-o", "ServerAliveInterval=15"]
        keys = [str(Path(identity).expanduser())] if identity else list(self.identity_files)
        for key in keys:
            argv += ["-i", key]
        if identity or self.identities_only:
            argv += ["-o", "IdentitiesOnly=yes"]
        if self.identity_agent:
            argv += ["-o", f"IdentityAgent={self.identity_agent}"]
        if self.jumps:  # each hop an ssh of its own with these same rules (ProxyJump's would read the config)
            *before, last = self.jumps
            via = Target(last.user, last.hostname, last.port, last.identity_files, last.identities_only,
                         last.identity_agent, last.proxy_command, tuple(before))
            hop = via.ssh_argv(known_hosts, None, connect_timeout)  # literal -W: no %-token to re-expand
            argv += ["-o", "ProxyCommand=" + shlex.join([*hop, "-W", self.host_port(), via.destination()])]
        elif self.proxy_command:
            argv += ["-o", f"ProxyCommand={self.proxy_command}"]
        return argv

    def destination(self) -> str:
        return f"{self.user}@{self.hostname}"

    def host_port(self) -> str:
        return f"[{self.hostname}]:{self.port}" if ":" in self.hostname else f"{self.hostname}:{self.port}"


def _jump_route(hop: str, depth: int) -> tuple[Target, ...]:
    """One ProxyJump entry (`[user@]host[:port]`, a config alias too) with the jumps it needs itself."""
    t = Target.parse(hop, _depth=depth + 1)
    return (*t.jumps, Target(t.user, t.hostname, t.port, t.identity_files, t.identities_only,
                             t.identity_agent, t.proxy_command))


def _ssh_config(host: str) -> dict:
    path = Path("~/.ssh/config").expanduser()
    if not path.is_file():
        return {}
    try:
        return paramiko.SSHConfig.from_path(str(path)).lookup(host)
    except Exception:  # noqa: BLE001 - a config paramiko cannot parse: the user's ssh still reads it, we skip it
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
        self._hop: Optional[Connection] = None

    def open(self) -> paramiko.SSHClient:
        if self.client and self.client.get_transport() and self.client.get_transport().is_active():
            return self.client
        self.close()
        client = self._connect(self.target, self._sock())
        client.get_transport().set_keepalive(15)
        self.client = client
        return client

    def _sock(self):
        """How the TCP stream to the target is made: ProxyCommand's process, or a direct-tcpip channel
        through the last ProxyJump host (itself reached through the ones before it), else None (a plain
        connection)."""
        t = self.target
        if t.proxy_command:
            return paramiko.ProxyCommand(t.proxy_command)
        if not t.jumps:
            return None
        *before, last = t.jumps
        hop = Target(last.user, last.hostname, last.port, last.identity_files, last.identities_only,
                     last.identity_agent, last.proxy_command, tuple(before))
        self._hop = Connection(hop, self.known_hosts, None, self.accept, self.timeout)
        transport = self._hop.open().get_transport()
        try:
            return transport.open_channel("direct-tcpip", (t.hostname, t.port), ("127.0.0.1", 0), timeout=self.timeout)
        except paramiko.ChannelException as e:
            raise BackendError(f"jump host {hop} could not reach {t.hostname}:{t.port} ({e.text})") from None

    def _connect(self, target: Target, sock) -> paramiko.SSHClient:
        client = paramiko.SSHClient()
        if self.known_hosts.is_file():
            client.load_host_keys(str(self.known_hosts))
        client.set_missing_host_key_policy(_HostKeyPolicy(self.known_hosts, self.accept))
        t, ident = self.timeout, self.identity
        try:
            client.connect(target.hostname, target.port, target.user, sock=sock, timeout=t, banner_timeout=t,
                           auth_timeout=t, channel_timeout=t, **_auth(target, ident))
        except paramiko.BadHostKeyException as e:
            client.close()
            raise BackendError(
                f"HOST KEY CHANGED for {e.hostname}: it presents {key_description(e.key)} but "
                f"{self.known_hosts} has {key_description(e.expected_key)}. Someone may be intercepting "
                f"the connection (man-in-the-middle), or the host was rebuilt. Refusing to connect; if "
                f"you are sure, remove the old key with `{self.forget_command()}` and connect again") from None
        except paramiko.AuthenticationException as e:
            client.close()
            raise BackendError(f"{target} refused our key ({e}): add your public key to the host's "
                               f"~/.ssh/authorized_keys or pass --identity KEYFILE") from None
        except BaseException:
            client.close()
            raise
        return client

    def ssh_argv(self, batch: bool = True) -> list[str]:
        """The system ssh to this connection's target, the same way (Target.ssh_argv); the destination
        (`target.destination()`) follows."""
        return self.target.ssh_argv(self.known_hosts, self.identity, self.timeout, batch)

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
        for thing in (self._sftp, self.client, self._hop):
            try:
                if thing:
                    thing.close()
            except Exception:  # noqa: BLE001 - closing what may be half-open already
                pass
        self.client, self._sftp, self._hop = None, None, None

    def channel(self, command: str, timeout: float) -> paramiko.Channel:
        chan = self.open().get_transport().open_session(timeout=self.timeout)
        chan.settimeout(timeout)
        chan.exec_command(command)
        return chan


def _auth(target: Target, ident: Optional[str]) -> dict:
    """paramiko.connect's keyword arguments for the keys `ssh` would offer: --identity alone; else the
    config's IdentityAgent's keys and its IdentityFiles (as OpenSSH: agent first), then, unless
    IdentitiesOnly, the default agent and ~/.ssh keys; else paramiko's defaults (agent, ~/.ssh)."""
    if ident:
        return {"pkey": _load_key(ident), "look_for_keys": False, "allow_agent": False}
    if not (target.identity_files or target.identity_agent):
        return {}
    keys = _agent_keys(target.identity_agent) if target.identity_agent else []
    for path in target.identity_files:
        try:
            keys.append(paramiko.PKey.from_path(Path(path).expanduser()))
        except Exception:  # noqa: BLE001 - a key with a passphrase: ssh would ask, its agent may hold it
            continue
    if not target.identities_only:
        keys += _agent_keys(None)
    return {"auth_strategy": _Keys(target.user, keys)} if keys else {}


class _Keys(paramiko.auth_strategy.AuthStrategy):
    def __init__(self, user: str, keys: list):
        super().__init__(ssh_config=paramiko.SSHConfig())
        self.user, self.keys = user, keys

    def get_sources(self):
        for key in self.keys:
            yield paramiko.auth_strategy.InMemoryPrivateKey(self.user, key)


def _agent_keys(path: Optional[str]) -> list:
    """The keys an ssh-agent holds: the one at `path` (IdentityAgent), else $SSH_AUTH_SOCK's."""
    if path == "none":
        return []
    if path is None:
        return list(paramiko.Agent().get_keys())
    agent = paramiko.agent.AgentSSH()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        agent._connect(sock)  # noqa: SLF001 - paramiko's Agent takes $SSH_AUTH_SOCK only
    except (OSError, paramiko.SSHException) as e:
        sock.close()
        raise BackendError(f"IdentityAgent {path} (~/.ssh/config) does not answer: {e}") from None
    return list(agent.get_keys())


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


def why(e: Optional[BaseException]) -> str:
    """An SSH failure in a few words (a socket timeout has no message of its own)."""
    if isinstance(e, socket.timeout):
        return "timed out"
    return f"{type(e).__name__}: {e}" if e else "unknown error"


def expand(path: str, home: str) -> str:
    """A remote path made absolute (`~` and relative paths are under the remote $HOME)."""
    if not path.startswith("/") and not home.startswith("/"):
        raise BackendError(f"could not read $HOME on the host to place `{path}`: give an absolute path")
    if path == "~" or path.startswith("~/"):
        path = home.rstrip("/") + path[1:]
    if not path.startswith("/"):
        path = f"{home.rstrip('/')}/{path}"
    return str(PurePosixPath(path))
