"""The contract every backend implements (`Backend`), what it is given (`LaunchSpec`) and what it
reports (`RemoteStatus`, `Access`), and the helpers all of them share: reading a log's tail and where
following it starts (the restart mark of a log appended across attempts), quoting
a remote path or command, and the one mapping from a driver's exit code to a run's end state.
The backends import this module, never their package (whose `__init__` is their public face and
their factory)."""

from __future__ import annotations

import abc
import shlex
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Optional, TextIO

from payload.errors import EXIT_CRASH, EXIT_INTERRUPTED, state_for_exit

from ..errors import BackendError
from launcher.store.handle import Handle
from launcher.store.registry import Run


@dataclass
class LaunchSpec:
    """Everything a backend needs to start a run."""

    run: Run
    profile: object  # launcher.profiles.schema.Profile
    task_yaml: Path  # rendered sky/<profile>.yaml
    config_yaml: Path  # rendered sky/config/<profile>.yaml (resolved run config)
    envs: dict[str, str] = field(default_factory=dict)
    """Overrides/additions to the task's envs (LAUNCH_RUN_ID, price...). Never secrets."""
    secrets: dict[str, str] = field(default_factory=dict)
    """Secret values from the user's environment; passed through, never written to disk."""
    resume: bool = False
    placed: Optional[Callable[[Run], None]] = None
    """Called with the run once the backend knows where it lives (host, directories, cluster name), before
    it starts anything there that bills: the run's record then holds what `status` and `down` need."""

    def place(self, run: Run) -> None:
        if self.placed is not None:
            self.placed(run)


@dataclass
class RemoteStatus:
    """What the run itself reports (its status.json on the volume), merged with backend state."""

    state: str  # one of registry.STATES
    step: Optional[int] = None
    max_steps: Optional[int] = None
    loss: Optional[float] = None
    eval_loss: Optional[float] = None
    cost_usd: Optional[float] = None
    eta_s: Optional[float] = None
    projected_cost_usd: Optional[float] = None
    reason: Optional[str] = None
    extra: dict = field(default_factory=dict)
    billing: Optional[bool] = None
    """Whether a machine bills for this run right now, when the backend knows (False while a managed
    job waits for capacity or recovers from a preemption, and once its machines are gone). None:
    unknown; the launcher then counts the run's active time as billed."""
    ended_at: Optional[float] = None
    """When the run's machines stopped billing (epoch seconds), where the backend knows it better than
    "now": a managed run settled from its own status.json after the jobs controller went away, or a
    live one whose spot pod RunPod reports interrupted (it bills again once a new pod runs)."""
    notice: Optional[str] = None
    """A line for the user that the run's state alone does not say (`launch status` and `launch cost`
    print it with a `!`): e.g. RunPod reports the spot pod interrupted while SkyPilot says RUNNING."""
    handle: Handle = field(default_factory=Handle)
    """What the backend learnt of the run to keep in its record's handle: the keys set here are merged
    in by the refresh (Handle.merged)."""

    METRICS = ("step", "max_steps", "loss", "eval_loss", "cost_usd", "eta_s", "projected_cost_usd")

    @classmethod
    def from_report(cls, state: str, reported: Optional[dict], reason: Optional[str] = None) -> "RemoteStatus":
        """The backend's `state`/`reason` plus the run's own status.json: numeric metrics as fields,
        everything else in `extra` (the payload's own state as `payload_state`)."""
        rs = reported or {}
        extra = {k: v for k, v in rs.items() if k not in cls.METRICS and k not in ("state", "reason")}
        if "state" in rs:
            extra["payload_state"] = rs["state"]
        metrics = {k: rs[k] for k in cls.METRICS if isinstance(rs.get(k), (int, float))}
        return cls(state=state, reason=reason, extra=extra, **metrics)


@dataclass
class Access:
    """How to reach a run's machine from here (`launch ssh` / `launch exec`): a process to start,
    with its working directory and environment additions (local backend)."""

    argv: list[str]
    cwd: Optional[str] = None
    env: dict[str, str] = field(default_factory=dict)


class Backend(abc.ABC):
    name: str = "base"

    def access(self, run: Run, command: Optional[str], tty: bool) -> Access:
        """The process that opens a shell in the run's directory on its machine (`command` None) or
        runs the shell command line `command` there; its exit code is the command's. `tty`: the user
        is at a terminal (ask for one on the far side)."""
        raise BackendError(f"the {self.name} backend cannot open a shell on a run's machine")

    @abc.abstractmethod
    def up(self, spec: LaunchSpec) -> Run:
        """Start the run detached; return the run with `cluster`/`job_id`/`handle` filled in."""

    @abc.abstractmethod
    def logs(self, run: Run, follow: bool, out: TextIO, tail: Optional[int] = None) -> int:
        """Write the run's log to `out` (following until the run ends if asked); return an exit code.
        `tail`: start with the log's last `tail` lines instead of its beginning. Without `tail`,
        the whole log, except when following: then the run's current attempt only. A log appended
        across restarts (local, ssh) has a RESTART_MARK line where each later attempt begins; following
        starts at the last one, after `skipped_note` and the CONTEXT_LINES lines before it (`log_start`).
        A log that is per attempt already (SkyPilot's jobs) starts at its beginning."""

    @abc.abstractmethod
    def status(self, run: Run) -> RemoteStatus:
        """Current state of the run (never raises for an unreachable machine: state says so)."""

    @abc.abstractmethod
    def down(self, run: Run) -> None:
        """Stop the run and release what bills (cluster, pod process, managed job)."""

    def read_run_file(self, run: Run, rel: str) -> Optional[str]:
        """The text of one small run-dir-relative file where the run is, read the way `status` reads
        the run's status.json (`launch checkpoints` reads the live checkpoint index so); None when
        the file is not there or the machine cannot be reached."""
        return None

    def write_run_file(self, run: Run, rel: str, text: str) -> bool:
        """Write one small run-dir-relative file where the run is (the save-and-exit request of
        `launch down`, launcher/backends/final_save.py); False when this backend cannot reach it."""
        return False

    # Files: backends only move bytes. Layout, confinement and verification are launcher.store.artifacts'.

    @abc.abstractmethod
    def list_files(self, run: Run, roots: tuple[str, ...]) -> dict[str, int]:
        """{path: bytes} of the regular files at or under the run-dir-relative `roots` on the machine
        (symlinks left out; roots that do not exist give nothing). Paths are reported as the machine
        says them: the caller confines them."""

    @abc.abstractmethod
    def copy_files(self, run: Run, rels: list[str], into: Path) -> None:
        """Copy each run-dir-relative file in `rels` (clean relative paths) to `into/<rel>` as a regular
        file, never creating or following a symlink on this side; raise BackendError if one fails."""


# The line a backend appends to a run's log (local, ssh) before the run restarts into it (`launch up
# --resume`), so the log says where each attempt begins and following it starts there.
RESTART_MARK = "── launch: the run restarts here"
CONTEXT_LINES = 3  # lines of the attempt before that `logs --follow` shows above the mark


def restart_line(when: Optional[float] = None) -> str:
    """The RESTART_MARK line with its UTC time, newline-terminated (the ssh driver echoes it)."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(when))
    return f"{RESTART_MARK} ({stamp}) ──\n"


def mark_restart(log: Path) -> None:
    """Append the restart line to a run's log that has something in it, on a line of its own (an
    attempt killed mid-line leaves no newline)."""
    try:
        with open(log, "rb+") as f:
            size = f.seek(0, 2)
            if size == 0:
                return
            f.seek(size - 1)
            gap = b"" if f.read(1) == b"\n" else b"\n"
            f.write(gap + restart_line().encode())
    except FileNotFoundError:
        return


def log_start(f, size: int, follow: bool, tail: Optional[int]) -> tuple[int, bool]:
    """(offset, skipped) where `logs` starts in the binary log `f` of `size` bytes: the last `tail`
    lines; else following, the last RESTART_MARK's line with CONTEXT_LINES lines before it (skipped:
    earlier lines are left out, `skipped_note` says so); else the beginning."""
    if tail is not None:
        return tail_offset(f, size, tail), False
    mark = _last_mark(f, size) if follow else None
    if mark is None:
        return 0, False
    offset = tail_offset(f, mark, CONTEXT_LINES)
    return offset, offset > 0


def skipped_note(run_id: str) -> str:
    return f"… earlier attempts not repeated (`launch logs {run_id}` shows them)\n"


def _last_mark(f, size: int, block: int = 1 << 16) -> Optional[int]:
    """The offset of the last line that starts with RESTART_MARK, reading backwards in blocks."""
    needle = b"\n" + RESTART_MARK.encode()
    pos, carry = size, b""
    while pos > 0:
        start = max(0, pos - block)
        f.seek(start)
        chunk = f.read(pos - start) + carry  # `carry`: a mark split across the block boundary
        i = chunk.rfind(needle)
        if i >= 0:
            return start + i + 1
        if start == 0 and chunk.startswith(needle[1:]):
            return 0
        carry, pos = chunk[:len(needle) - 1], start
    return None


def tail_offset(f, size: int, lines: int, block: int = 1 << 16) -> int:
    """The byte offset at which the last `lines` lines of the binary file `f` (seek/read; `size` bytes
    long) begin: read backwards in blocks, so a long log is not read whole. A final newline ends the
    last line rather than starting an empty one."""
    if lines <= 0:
        return size
    pos, seen = size, 0
    while pos > 0:
        start = max(0, pos - block)
        f.seek(start)
        chunk = f.read(pos - start)
        i = len(chunk)
        while (i := chunk.rfind(b"\n", 0, i)) >= 0:
            if start + i != size - 1:
                seen += 1
                if seen == lines:
                    return start + i + 1
        pos = start
    return 0


def command_line(args: tuple[str, ...] | list[str]) -> str:
    """`launch exec RUN -- ARGS`: one argument is a shell command line as given (pipes and all, as
    `ssh host 'a | b'` takes it); several are quoted one by one (`ls "a b"` stays two words)."""
    return args[0] if len(args) == 1 else shlex.join(args)


def remote_path(path: str) -> str:
    """A path on a machine, quoted for its shell, `~/` kept expandable."""
    return '"$HOME"/' + shlex.quote(path[2:]) if path.startswith("~/") else shlex.quote(path)


def remote_command(run_dir: str, command: Optional[str]) -> str:
    """The shell line `launch ssh`/`exec` runs on a run's machine: into the run's directory (`~/`
    expanded there), LAUNCH_RUN_DIR set, then `command` or a login shell. A missing directory stops it."""
    d = remote_path(run_dir)
    rest = 'exec "${SHELL:-bash}" -l' if command is None else command
    return f'cd {d} || exit 1; export LAUNCH_RUN_DIR="$PWD"; {rest}'


_DEFAULT_REASONS = {
    1: "crashed (exit 1): see `launch logs`",
    2: "config or data error (exit 2): see `launch logs`",
    3: "budget exhausted (exit 3): raise the budget and `launch up --resume`",
    4: "another trainer holds this run's lease (exit 4): see `launch logs`",
    75: "transient failure (exit 75: network, NCCL): `launch up --resume` continues it",
}


def end_state(code: Optional[int], reported: Optional[dict], asked_to_stop: bool) -> tuple[str, Optional[str]]:
    """(state, reason) of a run whose driver has ended: one mapping for the local and ssh backends.

    `code` is the exit code the driver recorded (None: it was killed before it could record one,
    a machine lost or a process group SIGKILLed), `reported` the run's status.json, where the payload
    records `exit_code` and `reason` on every end (torchrun exits 1 whatever its worker did, so a 1
    from the driver defers to the payload's own code). `asked_to_stop`: `launch down` stopped it.
    A SIGTERM nobody here asked for (143) is a preemption.
    """
    rs = reported or {}
    if code is None:
        if asked_to_stop:
            return "stopped", "stopped by launch down"
        return "preempted", ("the run's processes are gone without an exit code (machine lost or processes "
                             "killed): `launch up --resume` continues from the last checkpoint")
    own = rs.get("exit_code")
    if code == EXIT_CRASH and isinstance(own, int) and own != 0:
        code = own
    reason = rs.get("reason") if own == code and rs.get("reason") else None
    if code == 0:
        return "completed", reason
    if asked_to_stop:
        return "stopped", reason if code == EXIT_INTERRUPTED and reason else "stopped by launch down"
    if code == EXIT_INTERRUPTED:
        return "preempted", (reason or "stopped by SIGTERM") + " (SIGTERM not sent by launch: host shutting " \
            "down?); `launch up --resume` continues it"
    return state_for_exit(code), reason or _DEFAULT_REASONS.get(code, f"exit code {code}: see `launch logs`")


def run_end(marker_mtime: Optional[float], reported: Optional[dict]) -> Optional[float]:
    """When a run on a machine of its own (local, ssh) ended, as the run itself says it: its driver's exit
    marker (exit_code, written last, after the post phase), else its status.json's `ended_at` or last
    `updated_at` (a driver killed before it could write one). None: nothing says (the bill closes now)."""
    if marker_mtime:
        return marker_mtime
    rs = reported or {}
    return _epoch(rs.get("ended_at")) or _epoch(rs.get("updated_at"))


def _epoch(stamp) -> Optional[float]:
    """Seconds since the epoch of the payload's `now_iso()` stamps (YYYY-mm-ddTHH:MM:SSZ)."""
    try:
        return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc).timestamp()
    except (TypeError, ValueError):
        return None


def lost_log(run: Run, target, why: str) -> str:
    """`launch logs` without its host (ssh): a live run goes on there, an ended one's log waits on that host."""
    if run.active:
        return (f"lost {target} ({why}); {run.id} was {run.state} when last seen and goes on there: "
                f"`launch logs {run.id} --follow` to watch it again")
    fetched = f", or read the fetched copy in {run.artifacts}/logs/" if run.artifacts else ""
    return (f"cannot reach {target} ({why}); {run.id} ended ({run.state}) and its log is on that host: "
            f"`launch logs {run.id}` once it answers{fetched}")
