"""SSH backend: run the rendered task on any machine you can ssh into (a pod, a lab box), via paramiko;
fetches by rsync over the system ssh. Both reach the host the way ~/.ssh/config said at `up` (sshconn).

One idea at ~460 lines: base.Backend's contract (up, logs, access, status, down, fetch) on one machine
reached over SSH: the class and the helpers only it uses (`_fits`, `_state`: the host's answer read as a
run state). The connection (`sshconn`), the scripts run on the host (`ssh_scripts`) and the incremental
upload of the workdir (`ssh_upload`) stand apart.

What SkyPilot does on one node, done by hand: the workdir is uploaded incrementally, the node script
and a small driver are written beside it and started detached (`setsid nohup`), so the run outlives
the connection. Secrets travel over the SSH channel's stdin into the driver's environment: they are
never in a file or on a command line. The host key is always checked against known_hosts; a new key
is only added with `--accept-new-host-key`, a changed one is always refused.

The run owns its processes: the driver is a session of its own, torchrun's workers die with their
agent (`payload.__main__.die_with_parent`), and `down` also signals every process whose environment
carries the run's LAUNCH_RUN_ID. The log on the volume is appended across restarts.

Remote layout:  {remote_root}/{run_id}/  workdir/ node.sh driver.sh start.sh pid exit_code [stopped]
                {volume}/runs/{run_id}/  the payload's run directory (payload/layout.py); the log is
                                         logs/run.log there.
"""

from __future__ import annotations

import codecs
import json
import re
import shlex
import time
from pathlib import Path, PurePosixPath
from typing import Callable, Optional, TextIO

import paramiko

from payload import layout

from launcher.store.artifacts import list_command, parse_listing
from ..errors import BackendError
from launcher.store.handle import Handle
from launcher.store.registry import Run
from .base import (Access, Backend, LaunchSpec, RemoteStatus, end_state, log_start, lost_log, remote_command,
                   restart_line, run_end, skipped_note)
from .ssh_scripts import DOWN_CMD, DRIVER, FREE_PORT, PROBE, START, STATUS_CMD
from . import rsync, ssh_upload
from .sshconn import CommandTimeout, Connection, Target, collect, expand as _expand, why as _why
from .tasks import export_lines, load_task, node_env, node_script, workdir_files

COMMAND_TIMEOUT = 60.0  # one remote command (listing, hashing, status...)
HASH_TIMEOUT = 600.0  # sha256 of a whole artifact set
POLL_S = 0.5  # log follow interval
TRANSIENT = (OSError, EOFError, paramiko.SSHException)  # socket.timeout is an OSError


class SSHBackend(Backend):
    name = "ssh"

    def __init__(self, host: Optional[str] = None, accept_new_host_key: bool = False,
                 identity_file: str | None = None, remote_root: str = "~/launch",
                 volume: str | None = None, known_hosts: str | None = None, connect_timeout: float = 10,
                 retries: int = 5):
        """`host` is `user@host[:port]`. Later calls (logs/status/down/fetch) read the host, key files
        and remote paths from `run.handle`, so they work with a backend built without arguments."""
        self.host, self.accept = host, accept_new_host_key
        self.identity_file, self.remote_root, self.volume = identity_file, remote_root, volume
        self.known_hosts = known_hosts
        self.connect_timeout, self.retries = connect_timeout, retries
        self._conns: dict[tuple, Connection] = {}
        self.last_upload: dict = {}
        self.last_fetch: dict = {}  # how the last copy_files moved its bytes (rsync's count, or sftp and why)

    # ---------------------------------------------------------------------------- connection

    def _conn(self, run: Optional[Run] = None) -> Connection:
        h = run.handle if run else Handle()
        spec = h.host or self.host
        if not spec:
            raise BackendError("no host: pass --host user@host[:port]")
        target = Target.parse(spec, route=(h.ssh_route or {}) if h.host else None)
        known = Path(h.known_hosts or self.known_hosts or "~/.ssh/known_hosts").expanduser()
        ident = h.identity_file or self.identity_file
        key = (target, str(known), ident)
        if key not in self._conns:
            self._conns[key] = Connection(target, known, ident, self.accept, self.connect_timeout)
        return self._conns[key]

    def _retry(self, conn: Connection, fn: Callable[[], object], tries: Optional[int] = None):
        """Run `fn` (which uses `conn`), reconnecting with exponential backoff on network errors."""
        tries = tries or self.retries
        delay, last = 0.5, None
        for attempt in range(1, tries + 1):
            try:
                conn.open()
                return fn()
            except BackendError:
                raise
            except TRANSIENT as e:
                last = e
                conn.close()
                if attempt < tries:
                    time.sleep(delay)
                    delay = min(delay * 2, 8.0)
        raise BackendError(f"cannot reach {conn.target} after {tries} tries: {_why(last)}")

    def _sh(self, conn: Connection, command: str, stdin: Optional[str] = None,
            timeout: float = COMMAND_TIMEOUT, check: bool = True, tries: Optional[int] = None) -> str:
        """Run a bash command remotely (retried on a dropped connection); return its stdout."""

        def once():
            chan = conn.channel(f"bash -c {shlex.quote(command)}", timeout)
            if stdin is not None:
                chan.sendall(stdin.encode())
            chan.shutdown_write()
            return collect(chan, timeout, command.split("\n")[0][:60])

        code, out, err = self._retry(conn, once, tries)
        if check and code != 0:
            raise BackendError(f"on {conn.target}: `{command.splitlines()[0][:80]}` failed ({code}): "
                               f"{(err or out).strip()[-500:]}")
        return out

    def probe(self, conn: Optional[Connection] = None) -> dict:
        """Connect (checking the host key) and describe the host: home, GPU count, python."""
        conn = conn or self._conn()
        out = self._sh(conn, PROBE)
        facts = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
        gpus, busy = (facts.get(k, "0").strip() for k in ("gpus", "busy"))
        return {"host": str(conn.target), "home": facts.get("home", ""),
                "gpus": int(gpus) if gpus.isdigit() else 0, "busy": int(busy) if busy.isdigit() else 0,
                "python": facts.get("python", "")}

    # ------------------------------------------------------------------------------------ up

    def up(self, spec: LaunchSpec) -> Run:
        run, task = spec.run, load_task(spec.task_yaml)
        # a resume on its host (--host not given, or the same) goes the way the run went, whatever the
        # config says now
        conn = self._conn(run if self.host and self.host == run.handle.host else None)
        run.handle.ssh_route = conn.target.route()  # how it was reached: every command goes so
        info = self.probe(conn)
        _fits(spec.profile, info, {**(task.get("envs") or {}), **spec.envs})  # the profile's envs: and --env
        home, here = info["home"], run.handle.host == str(conn.target)
        old = run.handle if here else Handle()
        root = old.remote_root or _expand(self.remote_root, home)  # a resumed run keeps its place
        run_root = f"{root}/{run.id}"
        volume = old.volume or _expand(self.volume or f"{root}/volume", home)
        run_dir = PurePosixPath(layout.run_dir(PurePosixPath(volume), run.id).as_posix())
        log = str(run_dir / layout.LOGS_DIR / "run.log")
        was = run.handle.host  # a resume on another host finds none of the run's checkpoints there
        if spec.resume and was and not here and self._sh(
                conn, f"test -d {shlex.quote(str(run_dir))} && echo y || true").strip() != "y":
            raise BackendError(f"run {run.id} ran on {was} and its checkpoints are there, not in "
                               f"{conn.target}:{run_dir}: resume it there (--resume without --host), or copy "
                               "that run directory over first (else it would train again from step 0); "
                               "a fresh run: --new")
        run.cluster = conn.target.hostname
        run.handle.update(host=str(conn.target), known_hosts=str(conn.known_hosts),
                          identity_file=conn.identity, remote_root=root, run_root=run_root, volume=volume,
                          run_dir=str(run_dir), log=log)
        spec.place(run)  # before the upload: `status` and `down` find it there whenever `up` stops
        config_rel = (task.get("envs") or {}).get("LAUNCH_CONFIG") or f"sky/config/{spec.config_yaml.name}"
        files = workdir_files(spec.profile, spec.config_yaml, config_rel)
        self.last_upload = ssh_upload.sync(conn, root, f"{run_root}/workdir", files, sh=self._sh,
                                           retry=self._retry)
        gpus = getattr(getattr(spec.profile, "cluster", None), "gpus_per_node", 0) or info["gpus"]
        env = node_env(task, self._overrides(spec, run, volume, f"{run_root}/workdir"), rank=0,
                       ips=["127.0.0.1"], gpus_per_node=gpus, task_id=run.id)
        node = (f"#!/usr/bin/env bash\n# launch node script for run {run.id} (no secrets here)\n"
                f"cd {shlex.quote(run_root)}/workdir || exit 1\n"
                + export_lines(env, skip=set(spec.secrets)) + FREE_PORT + node_script(task))
        driver = DRIVER.format(log_dir=shlex.quote(str(PurePosixPath(log).parent)), log=shlex.quote(log),
                               mark=shlex.quote(restart_line().rstrip("\n")))
        self._retry(conn, lambda: self._write_files(conn, run_root, {
            "node.sh": node, "driver.sh": driver, "start.sh": START}))
        pid = self._start(conn, run_root, spec.secrets)
        run.state, run.cluster, run.job_id = "running", conn.target.hostname, str(pid)
        run.handle.update(pid=pid, pgid=pid, gpus_per_node=gpus, upload=self.last_upload)
        return run

    @staticmethod
    def _overrides(spec: LaunchSpec, run: Run, volume: str, workdir: str) -> dict[str, str]:
        """The node's env on top of the task's: defaults, then `spec.envs`, then what this backend
        owns (the run id and volume, which status/fetch rely on). LAUNCH_LOCAL stays unset unless
        `spec.envs` sets it (tests do, to skip installing the GPU stack)."""
        # TMPDIR: what torchrun (torchelastic_*) and W&B leave in temp dirs stays the run's (the driver
        # makes it)
        base = {"PYTHONUNBUFFERED": "1", "PYTHONPATH": workdir, "HF_HOME": f"{volume}/.hf",
                "TMPDIR": f"{PurePosixPath(workdir).parent}/tmp"}
        return {**base, **spec.envs, "LAUNCH_RUN_ID": run.id, "LAUNCH_VOLUME": volume}

    def _write_files(self, conn: Connection, directory: str, files: dict[str, str]) -> None:
        sftp = conn.sftp()  # `directory` exists: the workdir sync made it
        for name, text in files.items():  # a new inode each: a running bash keeps reading the old one
            with sftp.open(f"{directory}/{name}.tmp", "w") as f:
                f.write(text)
            sftp.chmod(f"{directory}/{name}.tmp", 0o700)
            sftp.posix_rename(f"{directory}/{name}.tmp", f"{directory}/{name}")

    def _start(self, conn: Connection, run_root: str, secrets: dict[str, str]) -> int:
        lines = []
        for name, value in secrets.items():
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) or "\n" in value or "\0" in value:
                raise BackendError(f"secret {name}: names must be identifiers and values one line")
            lines += [name, value]
        out = self._sh(conn, f"bash {shlex.quote(run_root)}/start.sh", stdin="\n".join(lines + ["", ""]))
        pid = out.strip().splitlines()[-1] if out.strip() else ""
        if not pid.isdigit():
            raise BackendError(f"the run did not start on {conn.target} (no pid in {run_root}/pid): "
                               f"{out[-300:]}")
        return int(pid)

    # ---------------------------------------------------------------------------------- logs

    def logs(self, run: Run, follow: bool, out: TextIO, tail: Optional[int] = None) -> int:
        """Print the run's log; with `follow`, until the driver exits (its exit code is returned).
        A dropped connection is re-opened with backoff and the stream resumes at the byte offset
        already printed."""
        conn, h = self._conn(run), run.handle
        if not h.log:
            raise BackendError(f"run {run.id} never started on its host: no log")
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        offset, failures, started = None if tail is not None or follow else 0, 0, time.monotonic()
        while True:
            try:
                # --tail, or this attempt's start (base.log_start); 0 while there is no log
                if offset is None:
                    offset, skipped = self._start_offset(conn, h.log, follow, tail)
                    if skipped:
                        out.write(skipped_note(run.id))
                done = self._finished(conn, h) if follow else 0
                chunk = self._read_log(conn, h.log, offset)
                failures = 0
            except BackendError:
                raise
            except TRANSIENT as e:
                failures += 1
                conn.close()
                if failures > (self.retries if run.active else 1):  # an ended run: two tries, as `down` makes
                    raise BackendError(lost_log(run, conn.target, _why(e))) from None
                time.sleep(min(0.5 * 2 ** (failures - 1), 8.0))
                continue
            if chunk:
                offset += len(chunk)
                out.write(decoder.decode(chunk))
                out.flush()
            elif chunk is None and not follow:
                raise BackendError(f"run {run.id} has no log yet at {conn.target}:{h.log}")
            elif done is not None:
                out.write(decoder.decode(b"", final=True))
                out.flush()
                return done
            elif chunk is None and time.monotonic() - started > 120:
                raise BackendError(f"run {run.id} wrote no log in 2 min ({conn.target}:{h.log})")
            else:
                time.sleep(POLL_S)

    def _start_offset(self, conn: Connection, path: str, follow: bool,
                      tail: Optional[int]) -> tuple[int, bool]:
        conn.open()
        try:
            f = conn.sftp().open(path, "rb")
        except FileNotFoundError:
            return 0, False
        with f:
            return log_start(f, f.stat().st_size, follow, tail)

    def _read_log(self, conn: Connection, path: str, offset: int) -> Optional[bytes]:
        """Bytes of the log from `offset` (up to 1 MiB); None when the log does not exist yet."""
        conn.open()
        sftp = conn.sftp()
        try:
            f = sftp.open(path, "rb")
        except FileNotFoundError:
            return None
        with f:
            f.seek(offset)
            return f.read(1 << 20)

    def _finished(self, conn: Connection, h: Handle) -> Optional[int]:
        """The driver's exit code once it is done (143 if killed without one), None while running."""
        root = shlex.quote(h.run_root)
        chan = conn.channel(f"cat {root}/exit_code 2>/dev/null || {{ kill -0 -- -{int(h.pgid)} "
                            f"2>/dev/null && echo running || echo 143; }}", COMMAND_TIMEOUT)
        chan.shutdown_write()
        _, out, _ = collect(chan, COMMAND_TIMEOUT, "exit_code")
        out = out.strip()
        return None if out == "running" else int(out) if out.lstrip("-").isdigit() else None

    # -------------------------------------------------------------------------------- access

    def access(self, run: Run, command: Optional[str], tty: bool) -> Access:
        """OpenSSH to the run's stored connection: its host, port and key, and the known_hosts file
        the backend keeps (StrictHostKeyChecking: a changed or unknown key is refused); the command
        (or a login shell) runs in the run's directory on the volume."""
        h = run.handle
        if not h.host or not h.run_dir:
            raise BackendError(f"run {run.id} never started on its host: nothing to connect to")
        conn = self._conn(run)
        argv = conn.ssh_argv(batch=False)  # an interactive shell may ask for a key's passphrase
        return Access([*argv, "-t" if tty else "-T", conn.target.destination(),
                       remote_command(h.run_dir, command)])

    # -------------------------------------------------------------------------------- status

    def status(self, run: Run) -> RemoteStatus:
        """Never raises for an unreachable host: the last known state comes back with the reason
        and `extra["unreachable"]`. Host-key and authentication problems do raise (user fixes)."""
        h = run.handle
        if not h.run_root:  # a live one: `launch up` stopped before it reached the host
            return RemoteStatus(state="failed" if run.active else "unknown",
                                reason=run.reason or "never started on the host")
        conn = self._conn(run)
        command = STATUS_CMD.format(root=shlex.quote(h.run_root),
                                    status_json=shlex.quote(f"{h.run_dir}/{layout.STATUS}"))
        try:
            out = self._sh(conn, command, tries=2, timeout=30)
        except BackendError as e:
            if not str(e).startswith("cannot reach") and not isinstance(e, CommandTimeout):
                raise
            # Not a state of the run: what it was when last seen stands (registry.observe), never "running".
            return RemoteStatus(state="unreachable", reason=f"unreachable: {e}",
                                extra={"unreachable": True, "last_state": run.state})
        head, _, body = out.partition("---\n")
        facts = dict(line.split("=", 1) for line in head.splitlines() if "=" in line)
        try:
            reported = json.loads(body) if body.strip() else {}
        except ValueError:
            reported = {}
        state, reason = _state(facts, reported, run)
        st = RemoteStatus.from_report(state, reported, reason)
        if state != "running":  # billed until the run ended on the host, not until someone looked
            ended = facts.get("ended", "").strip()
            st.ended_at = run_end(float(ended) if ended.isdigit() else None, reported)
        return st

    def read_run_file(self, run: Run, rel: str) -> Optional[str]:
        """Over the run's stored connection, as `status` reads status.json; None when the file is
        missing or the host unreachable (host-key and authentication problems raise, as there)."""
        run_dir = run.handle.run_dir
        if not run_dir:
            return None
        try:
            out = self._sh(self._conn(run), f"cat {shlex.quote(run_dir + '/' + rel)} 2>/dev/null || true",
                           tries=2, timeout=30)
        except BackendError as e:
            if not str(e).startswith("cannot reach") and not isinstance(e, CommandTimeout):
                raise
            return None
        return out or None

    def write_run_file(self, run: Run, rel: str, text: str) -> bool:
        run_dir = run.handle.run_dir
        if not run_dir:
            return False
        target = shlex.quote(f"{run_dir}/{rel}")
        try:
            self._sh(self._conn(run), f"test -d {shlex.quote(run_dir)} && cat > {target}.part && "
                     f"mv {target}.part {target}", stdin=text, tries=2, timeout=30)
        except BackendError:
            return False
        return True

    # ---------------------------------------------------------------------------------- down

    def down(self, run: Run, grace_s: float = 10) -> None:
        """SIGTERM the run's process group, SIGKILL it after `grace_s`; mark the run stopped. For a run
        that has ended (only strays could be left) two tries, as `status` makes, not five."""
        h = run.handle
        if not h.run_root:  # never reached its host
            return
        conn = self._conn(run)
        ticks = max(1, int(grace_s / 0.5))
        marker = shlex.quote(f"LAUNCH_RUN_ID={run.id}")
        # with the volume too where known: run ids are unique per launch home, not per host (two users)
        volume = shlex.quote(f"LAUNCH_VOLUME={h.volume}") if h.volume else marker
        command = DOWN_CMD.format(root=shlex.quote(h.run_root), ticks=ticks, marker=marker, volume=volume)
        self._sh(conn, command, timeout=grace_s + COMMAND_TIMEOUT, tries=None if run.active else 2)

    # --------------------------------------------------------------------------------- fetch

    def list_files(self, run: Run, roots: tuple[str, ...]) -> dict[str, int]:
        conn, run_dir = self._conn(run), run.handle.run_dir
        if not run_dir or not roots:
            return {}
        return parse_listing(self._sh(conn, list_command(shlex.quote(run_dir), roots), timeout=HASH_TIMEOUT))

    def copy_files(self, run: Run, rels: list[str], into: Path) -> None:
        """rsync over the system ssh, reaching the host as every command of the run does (its route,
        key and known_hosts, strictly checked: Connection.ssh_argv); a file an earlier try left in
        `into` goes on from its last byte. SFTP, resuming too, where rsync is missing on either side."""
        conn, run_dir = self._conn(run), run.handle.run_dir
        if not rels or not run_dir:
            return
        try:
            got = rsync.pull(conn.ssh_argv(), conn.target.destination(), run_dir, rels, into,
                             tries=self.retries)
            self.last_fetch = {"via": "rsync", "bytes_received": got}
            return
        except rsync.Unavailable as e:
            self.last_fetch = {"via": "sftp", "why": str(e)}
        for rel in rels:
            self._retry(conn, lambda: self._get(conn, f"{run_dir}/{rel}", into / rel))

    @staticmethod
    def _get(conn: Connection, remote: str, local: Path) -> None:
        """Append to `local` what it lacks of `remote` (all of it for a new file), read ahead."""
        local.parent.mkdir(parents=True, exist_ok=True)
        try:
            f = conn.sftp().open(remote, "rb")
        except FileNotFoundError:  # vanished since the listing: verification says what is missing
            return
        with f, open(local, "ab") as out:
            have = out.tell()
            size = f.stat().st_size
            if have >= size:
                return
            f.seek(have)
            f.prefetch(size)
            for block in iter(lambda: f.read(1 << 20), b""):
                out.write(block)


# ------------------------------------------------------------------------------------ helpers


def _fits(profile, info: dict, envs: dict) -> None:
    """What one host runs, refused before any upload: the ssh backend starts one node, with torchrun's
    process per GPU the profile asks for (a node or GPU short failed after setup, or trained on one
    node of several without a word: another global batch, twice the hours), on GPUs nothing else
    computes on (a second run's model load takes the memory a live run's next step needs, and crashes
    it), unless --env CUDA_VISIBLE_DEVICES names the GPUs this run takes."""
    c = getattr(profile, "cluster", None)
    if c is None:
        return
    if c.num_nodes > 1:
        raise BackendError(f"{profile.name} asks for {c.num_nodes} nodes and the ssh backend runs on one "
                           f"machine ({info['host']}): run it with --backend skypilot, or on one node with "
                           "--set cluster.num_nodes=1 (a smaller global batch, more hours)")
    if c.gpus_per_node > info["gpus"]:
        fix = f"or --set cluster.accelerators={c.accelerator_name}:{info['gpus']}" if info["gpus"] else \
            "or check `nvidia-smi` there"
        raise BackendError(f"{info['host']} has {info['gpus']} GPU(s) (nvidia-smi -L) and {profile.name} "
                           f"asks for {c.accelerators_label} per node: use a host with {c.gpus_per_node}, "
                           f"{fix}")
    if c.gpus_per_node and info.get("busy") and "CUDA_VISIBLE_DEVICES" not in envs:
        raise BackendError(f"{info['host']}'s GPUs already run {info['busy']} process(es) (nvidia-smi): "
                           "a run started beside them shares their memory and can crash the one training "
                           "there; stop it first (`launch status --all`), or give this run other GPUs with "
                           "--env CUDA_VISIBLE_DEVICES=...")


def _state(facts: dict, reported: dict, run: Run) -> tuple[str, Optional[str]]:
    """(state, reason) from the driver's files and the run's own status.json (backends.end_state)."""
    if facts.get("nodir"):
        return "failed", ("the run's directory is gone from the host" if run.handle.pid else
                          "never started on the host (`launch up` stopped before its upload)")
    code, stopped = facts.get("exit", ""), facts.get("stopped") == "1" or run.state == "stopped"
    if facts.get("alive") == "1" and not code:
        return "running", None
    if not code and not stopped and not facts.get("pid"):
        return "failed", "the driver never started (no pid file)"
    return end_state(int(code) if code.lstrip("-").isdigit() else None, reported, stopped)
