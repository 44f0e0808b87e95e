"""One trainer per run: a lease file on the volume, `{run_dir}/lease.json`.

The lease names its holder (host, boot id, pid and the process's start time, so a reused pid is not
mistaken for the holder) and carries a heartbeat that a daemon thread refreshes every HEARTBEAT_S.
A second trainer (a resume while the first still runs, a recovered managed job beside a machine that
did not die) finds a live lease and stops at once with exit 4 (`LeaseHeld`), writing nothing. A lease
is stale, and is taken over, when its heartbeat is older than STALE_S, or when its holder was on this
machine (same host and boot) and that process is gone. A holder that finds its lease taken over
(`lost`) must stop writing: the training loop stops without saving.

Creation is atomic (the file is written aside and hard-linked into place, which fails if one
exists); a takeover happens under a `lease.json.takeover` directory used as a mutex, so two
contenders never both win. Multi-rank: rank 0 holds the lease for the job.

Heartbeats are wall-clock times of the holder's host: hosts whose clocks differ by more than STALE_S
would misjudge each other (cloud machines run NTP). Torch-free.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator, Optional

from payload import layout
from payload.errors import EXIT_LEASE_HELD, PayloadError

log = logging.getLogger("payload.train")

HEARTBEAT_S = 10.0
STALE_S = 60.0
MUTEX_STALE_S = 30.0


class LeaseHeld(PayloadError):
    """Another live trainer holds the run (exit 4)."""

    exit_code = EXIT_LEASE_HELD


@dataclass
class Holder:
    host: str
    boot_id: str
    pid: int
    start_ticks: Optional[int]
    token: str
    acquired_at: float
    heartbeat: float
    run_id: str = ""

    @classmethod
    def me(cls, run_id: str = "") -> "Holder":
        now = time.time()
        return cls(host=socket.gethostname(), boot_id=_boot_id(), pid=os.getpid(),
                   start_ticks=_start_ticks(os.getpid()), token=uuid.uuid4().hex, acquired_at=now,
                   heartbeat=now, run_id=run_id)

    @classmethod
    def parse(cls, text: str) -> Optional["Holder"]:
        try:
            d = json.loads(text)
            return cls(**{k: d.get(k) for k in cls.__dataclass_fields__})
        except (ValueError, TypeError):
            return None

    def dumps(self) -> str:
        return json.dumps(asdict(self), sort_keys=True) + "\n"

    def stale_because(self, now: Optional[float] = None) -> Optional[str]:
        """Why this lease no longer protects anything (None while its holder may be alive)."""
        age = (now or time.time()) - float(self.heartbeat or 0)
        if self.host == socket.gethostname() and self.boot_id == _boot_id():
            if not _alive(self.pid, self.start_ticks):
                return f"its process {self.pid} on this machine is gone"
            return None
        if age > STALE_S:
            return f"its heartbeat is {age:.0f} s old (stale after {STALE_S:.0f} s)"
        return None

    def describe(self, now: Optional[float] = None) -> str:
        age = (now or time.time()) - float(self.heartbeat or 0)
        return f"pid {self.pid} on {self.host}, heartbeat {max(age, 0):.0f} s ago"


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _start_ticks(pid: int) -> Optional[int]:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22); None if gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else int(fields[19])


def _alive(pid: int, start_ticks: Optional[int]) -> bool:
    now = _start_ticks(int(pid))
    if now is None:
        try:  # no /proc (not Linux): fall back to signal 0
            os.kill(int(pid), 0)
            return not Path("/proc").is_dir()
        except (ProcessLookupError, PermissionError):
            return False
    return start_ticks is None or now == start_ticks


def lease_path(run_dir: Path) -> Path:
    return Path(run_dir) / layout.LEASE


def read(run_dir: Path) -> Optional[Holder]:
    try:
        return Holder.parse(lease_path(run_dir).read_text())
    except OSError:
        return None


def _create(path: Path, holder: Holder) -> bool:
    """Create the lease file only if there is none: a complete file hard-linked into place, or, where
    the file system has no hard links (FUSE bucket mounts), an exclusive create then the write."""
    tmp = path.with_name(f".{path.name}.{holder.token}.tmp")
    tmp.write_text(holder.dumps(), encoding="utf-8")
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    except OSError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(holder.dumps())
        f.flush()
        os.fsync(f.fileno())
    return True


def _being_written(path: Path) -> bool:
    """An unreadable lease younger than MUTEX_STALE_S may be one an exclusive create is filling."""
    try:
        return time.time() - path.stat().st_mtime < MUTEX_STALE_S
    except OSError:
        return False


def _replace(path: Path, holder: Holder) -> None:
    tmp = path.with_name(f".{path.name}.{holder.token}.tmp")
    tmp.write_text(holder.dumps(), encoding="utf-8")
    os.replace(tmp, path)


@contextmanager
def _mutex(path: Path) -> Iterator[bool]:
    """A directory beside the lease as a cross-host mutex (yields False when another process holds it)."""
    m = path.with_name(path.name + ".takeover")
    try:
        if time.time() - m.stat().st_mtime > MUTEX_STALE_S:
            os.rmdir(m)  # left by a process killed mid-takeover
    except OSError:
        pass
    try:
        os.mkdir(m)
    except FileExistsError:
        yield False
        return
    try:
        yield True
    finally:
        os.rmdir(m)


def _await_mutex(path: Path) -> None:
    """Until the takeover mutex is released or old enough to be stale (MUTEX_STALE_S): a trainer
    killed in the middle of a takeover (a preemption at startup) must not make the next start fail."""
    m = path.with_name(path.name + ".takeover")
    while True:
        try:
            age = time.time() - m.stat().st_mtime
        except OSError:
            return
        if age > MUTEX_STALE_S:
            return
        time.sleep(min(0.5, MUTEX_STALE_S - age + 0.01))


class Lease:
    """A held lease: `lost` turns true when someone else's lease replaced it."""

    def __init__(self, run_dir: Path, holder: Holder):
        self.path = lease_path(run_dir)
        self.holder = holder
        self.lost = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="lease-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            self.refresh()

    def refresh(self) -> bool:
        """Write a new heartbeat if the lease is still ours; False (and `lost`) if it is not."""
        if self.lost:
            return False
        current = Holder.parse(_read_text(self.path))
        if current is None or current.token != self.holder.token:
            self.lost = True
            log.error("this run's lease was taken over (%s): stopping",
                      current.describe() if current else "lease file gone")
            return False
        self.holder.heartbeat = time.time()
        _replace(self.path, self.holder)
        return True

    def release(self) -> None:
        """Stop the heartbeat and remove the lease if it is still ours."""
        self._stop.set()
        current = Holder.parse(_read_text(self.path))
        if current is not None and current.token == self.holder.token:
            self.path.unlink(missing_ok=True)


def _read_text(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def ensure_free(run_dir: Path, run_id: str = "") -> None:
    """LeaseHeld when a live trainer holds the run (a stale lease is fine: the trainer takes it over)."""
    held = Holder.parse(_read_text(lease_path(run_dir)))
    if held is not None and held.stale_because() is None:
        raise LeaseHeld(_held_message(held, run_id or Path(run_dir).name))


def _held_message(held: Holder, run_id: str) -> str:
    return (f"run {run_id} is being trained by {held.describe()}: stop it first (`launch down {run_id}`), "
            f"or wait: a lease without heartbeat for {STALE_S:.0f} s is taken over")


def acquire(run_dir: Path, run_id: str = "", tries: int = 5) -> Lease:
    """Take the run's lease, taking over a stale one; LeaseHeld (exit 4) while a live one exists."""
    path = lease_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    me = Holder.me(run_id)
    for _ in range(tries):
        if _create(path, me):
            return Lease(run_dir, me)
        raw = _read_text(path)
        held = Holder.parse(raw)
        if held is not None and held.stale_because() is None:
            raise LeaseHeld(_held_message(held, run_id or Path(run_dir).name))
        if held is None and _being_written(path):
            time.sleep(0.5)
            continue
        why = held.stale_because() if held is not None else "the lease file is unreadable"
        with _mutex(path) as mine:
            if mine and _read_text(path) == raw:  # unchanged since judged stale
                _replace(path, me)
                log.warning("took over this run's stale lease (%s): %s",
                            held.describe() if held else "unreadable", why)
                return Lease(run_dir, me)
        if not mine:  # another process is taking over, or was killed doing it: wait it out, then judge again
            _await_mutex(path)
        time.sleep(0.2)
    raise LeaseHeld(f"could not take the lease of {path} after {tries} tries (another trainer is starting?): "
                    "run again in a minute")
