"""The local run registry: one SQLite database under the launch state dir (`$LAUNCH_HOME/runs.db`).

One idea at ~480 lines: the run registry, the `Run` record and the SQLite file that keeps it,
with the rules every write follows (a state only moves forward, billed time accrues, a damaged database
is moved aside). Opening, migrating and writing are the one place those rules hold. The run's handle,
one JSON column, is typed in launcher/store/handle.py.

SQLite gives atomic writes and safe concurrent access from two `launch` commands at once (WAL mode,
a busy timeout, each change in its own transaction). No secret is ever stored here.
"""

from __future__ import annotations

import copy
import fcntl
import json
import os
import sqlite3
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from typing import Iterator, Optional

from launcher.store.handle import Handle
from launcher.store.state import state_dir, tighten

ACTIVE_STATES = ("starting", "running")
STATES = ("starting", "running", "completed", "failed", "preempted", "stopped", "budget_exhausted")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY,
    profile TEXT NOT NULL,
    backend TEXT NOT NULL,
    cluster TEXT,
    job_id TEXT,
    config_hash TEXT,
    started_at REAL NOT NULL,
    ended_at REAL,
    price_per_hour REAL NOT NULL DEFAULT 0,
    budget_usd REAL,
    state TEXT NOT NULL,
    reason TEXT,
    artifacts TEXT,
    handle TEXT NOT NULL DEFAULT '{}',
    billed_s REAL,
    billed_usd REAL,
    billing_since REAL,
    seen_at REAL
)
"""
# Columns added after the first release: (name, SQL type). Older databases get them on open; a NULL
# billed_s marks a run recorded before billing was accrued (its cost falls back to elapsed x price).
_ADDED_COLUMNS = (("billed_s", "REAL"), ("billed_usd", "REAL"), ("billing_since", "REAL"), ("seen_at", "REAL"))
# The layout a database has (`PRAGMA user_version`): 0, a database of a launch before it was kept
# (its columns as that launch had them), is migrated on open to 1: the table above, every added column
# in it, the handle one JSON object (launcher/store/handle.py). A database of a newer launch (a higher
# version) is used as it is: columns it added are left alone, keys its handles added are kept.
SCHEMA_VERSION = 1


@dataclass
class Run:
    id: str
    profile: str
    backend: str
    started_at: float = field(default_factory=time.time)
    cluster: Optional[str] = None
    job_id: Optional[str] = None
    config_hash: Optional[str] = None
    ended_at: Optional[float] = None
    price_per_hour: float = 0.0
    budget_usd: Optional[float] = None
    state: str = "starting"
    reason: Optional[str] = None
    artifacts: Optional[str] = None
    handle: Handle = field(default_factory=Handle)
    """What its backend, its start and its refreshes learnt of it (pids, host, run dir, managed job
    name...: launcher/store/handle.py). A dict given here is read as a stored one (Handle.from_dict),
    so a Run is built from a plain handle as before."""
    billed_s: Optional[float] = None
    """Seconds a machine billed for this run, accrued on every refresh across restarts (setup included,
    time down between a preemption and `--resume`, or while a managed job recovers, excluded). None:
    not accrued (a run recorded before accrual existed): its cost is elapsed time x price."""
    billed_usd: Optional[float] = None
    """Dollars of billed_s, each interval at the price of the session it belongs to."""
    billing_since: Optional[float] = None
    """Start of the interval billing now, not yet in billed_s (None: nothing bills)."""
    seen_at: Optional[float] = None
    """When its backend last answered for it (a refresh that saw a state, not `unreachable`)."""
    remote: Optional[object] = field(default=None, repr=False, compare=False, metadata={"column": False})
    """The launcher.backends.base.RemoteStatus its backend gave at the refresh that returned it
    (launcher/runs/refresh.py), None for a run as recorded; never stored, not in `to_dict`. Typed
    `object`: store sits below backends and imports nothing of theirs, not even for a type."""

    def __post_init__(self) -> None:
        if not isinstance(self.handle, Handle):
            self.handle = Handle.from_dict(self.handle)

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    @property
    def watched(self) -> bool:
        """Asked of its backend on every look: live, or a machine of it bills still (a cluster idling
        until its autostop after the job ended), so that the bill closes once the machine is gone."""
        return self.active or self.billing_since is not None

    def elapsed_s(self, now: Optional[float] = None) -> float:
        end = self.ended_at or (now or time.time())
        return max(0.0, end - self.started_at)

    def billed(self, now: Optional[float] = None) -> tuple[float, float]:
        """(billed seconds, billed dollars) up to `now`, the open interval included."""
        if self.billed_s is None:  # recorded before billing was accrued: elapsed time, as it was
            return self.elapsed_s(now), self.elapsed_s(now) / 3600 * self.price_per_hour
        open_s = max(0.0, (now or time.time()) - self.billing_since) if self.billing_since else 0.0
        return self.billed_s + open_s, (self.billed_usd or 0.0) + open_s / 3600 * self.price_per_hour

    def to_dict(self) -> dict:
        """The record as stored and as `--json` prints it: its columns, the handle a plain dict."""
        return {c: copy.deepcopy(self.handle.to_dict() if c == "handle" else getattr(self, c)) for c in COLUMNS}


COLUMNS = tuple(f.name for f in fields(Run) if f.metadata.get("column", True))


def db_path():
    return state_dir() / "runs.db"


# Run ids handed out, each reserved by an INSERT in the transaction that picks it, so two `launch up`
# at the same second never get the same id (a reservation outlives a launch that failed).
_SCHEMA_IDS = "CREATE TABLE IF NOT EXISTS run_ids (id TEXT PRIMARY KEY)"
_CHECKED: set[str] = set()  # registries quick_check-ed by this process
_LOCKED: set[str] = set()  # registries whose setup lock this process holds


class RegistryError(Exception):
    """The registry cannot be opened (permissions, a full disk): one line with the path."""


@contextmanager
def _connect() -> Iterator[sqlite3.Connection]:
    path = db_path()
    try:
        try:
            con = _open(path)
        except sqlite3.DatabaseError as e:
            if not _corrupt(e):
                raise
            _move_aside(path, e)
            con = _open(path)
    except (sqlite3.Error, OSError) as e:
        raise RegistryError(f"run registry {path}: {e}; check that LAUNCH_HOME ({path.parent}) is a "
                            "writable directory") from None
    try:
        yield con
    finally:
        con.close()


def _open(path) -> sqlite3.Connection:
    """Connect (creating the file 0600 first, so SQLite's -wal/-shm files get 0600 too) and check the
    file once per process."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.close(fd)
    for p in (path, *(path.with_name(path.name + s) for s in ("-wal", "-shm"))):
        tighten(p)
    con = sqlite3.connect(path, timeout=30, isolation_level=None)
    try:
        con.execute("PRAGMA busy_timeout=30000")
        # Switching a new file to WAL answers "database is locked" at once (no busy wait) when another
        # process is switching it too: the setup runs one process at a time.
        with _setup_lock(path):
            con.execute("PRAGMA journal_mode=WAL")
            if str(path) not in _CHECKED:
                result = con.execute("PRAGMA quick_check").fetchone()
                if result and result[0] != "ok":
                    raise sqlite3.DatabaseError(f"database disk image is malformed ({result[0]})")
                _CHECKED.add(str(path))
            con.execute(_SCHEMA)
            con.execute(_SCHEMA_IDS)
            _migrate(con)
    except BaseException:
        con.close()
        raise
    return con


def _corrupt(e: sqlite3.DatabaseError) -> bool:
    """SQLITE_CORRUPT / SQLITE_NOTADB (not a lock or a permission problem)."""
    code = getattr(e, "sqlite_errorcode", None)
    if code is not None and code & 0xFF in (11, 26):
        return True
    text = str(e).lower()
    return "not a database" in text or "malformed" in text


@contextmanager
def _setup_lock(path) -> Iterator[None]:
    """The registry's setup lock (`runs.db.lock`, flock): opening a registry (WAL switch, schema,
    migration) and moving a corrupt one aside happen one process at a time. Re-entrant within a
    process (moving aside opens the registry again under it)."""
    key = str(path)
    if key in _LOCKED:
        yield
        return
    lock = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _LOCKED.add(key)
        yield
    finally:
        _LOCKED.discard(key)
        os.close(lock)  # releases the flock


def _move_aside(path, err: Exception) -> None:
    """Rename a corrupt registry (and its -wal/-shm) to `runs.db.corrupt-<UTC time>`, under the setup
    lock so concurrent commands move it once; say so in one line on stderr."""
    with _setup_lock(path):
        try:
            _open(path).close()  # another process may have replaced it while we waited
            return
        except sqlite3.DatabaseError as e:
            if not _corrupt(e):
                raise
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
        aside, n = path.with_name(f"{path.name}.corrupt-{stamp}"), 1
        while aside.exists():
            n += 1
            aside = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
        for suffix in ("", "-wal", "-shm"):
            src = path.with_name(path.name + suffix)
            if src.exists():
                os.replace(src, aside.with_name(aside.name + suffix))
    _CHECKED.discard(str(path))
    sys.stderr.write(f"! run registry {path} was unreadable ({err}); moved it to {aside.name} and started an "
                     "empty one: runs it listed are no longer tracked, so check your provider (`sky status`, "
                     "the RunPod console) for machines still running\n")


def _migrate(con: sqlite3.Connection) -> None:
    """Bring a database of an older launch to SCHEMA_VERSION in one transaction: add the columns it
    lacks (no data changes), then stamp the version."""
    if con.execute("PRAGMA user_version").fetchone()[0] >= SCHEMA_VERSION:
        return
    con.execute("BEGIN IMMEDIATE")
    try:
        have = {r[1] for r in con.execute("PRAGMA table_info(runs)")}
        for name, sql_type in _ADDED_COLUMNS:
            if name not in have:
                con.execute(f"ALTER TABLE runs ADD COLUMN {name} {sql_type}")
        con.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")


def _row_to_run(row: sqlite3.Row) -> Run:
    d = dict(row)
    try:
        handle = json.loads(d.get("handle") or "{}")
    except ValueError:
        handle = None
    d["handle"] = Handle.from_dict(handle)  # not an object: an empty handle
    return Run(**{k: v for k, v in d.items() if k in COLUMNS})


def save(run: Run) -> None:
    """Insert or replace a run, atomically. A live run is seen when it is recorded (its backend just
    started or answered for it)."""
    if run.active and run.seen_at is None:
        run.seen_at = time.time()
    d = run.to_dict()
    d["handle"] = json.dumps(d["handle"], sort_keys=True)
    with _connect() as con:
        con.execute("BEGIN IMMEDIATE")
        con.execute(f"INSERT OR REPLACE INTO runs ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})",
                    [d[c] for c in COLUMNS])
        con.execute("COMMIT")


def delete(run_id: str) -> None:
    """Remove a run that never started (`launch up` failed before anything of it ran); its id stays
    reserved."""
    with _connect() as con:
        con.execute("BEGIN IMMEDIATE")
        con.execute("DELETE FROM runs WHERE id = ?", (run_id,))
        con.execute("COMMIT")


def update(run_id: str, **changes) -> Run:
    """Change some fields of a run in one transaction (read-modify-write under a write lock); `handle`
    (a Handle, or a dict of its keys) is merged into the run's, key by key (Handle.merged)."""
    with _write(run_id) as run:
        for k, v in changes.items():
            if k == "handle":
                run.handle = run.handle.merged(v)
            else:
                setattr(run, k, v)
    return run


def accrue(run_id: str, billing: bool, now: Optional[float] = None) -> Run:
    """Close the run's open billing interval into billed_s/billed_usd (at the run's current price),
    then open a new one if a machine bills now. A run not accrued before starts from its elapsed time."""
    with _write(run_id) as run:
        _accrue(run, billing, now or time.time())
    return run


def observe(run_id: str, state: str, reason: Optional[str] = None, billing: Optional[bool] = None,
            ended_at: Optional[float] = None) -> Run:
    """Merge what a backend saw of a run (a refresh) into the registry, forward only. This is the one
    place the rule lives, for every backend:

    - a live run takes the state seen (and ends then, or at the backend's `ended_at`);
    - a run that has ended keeps its state, reason and end: no report turns it back into a live one
      (a host we cannot reach, a pid reused on it, a cluster of the same name relaunched by hand);
      only `launch up --resume` starts it again, as a new session;
    - a state outside STATES (`unreachable`, `unknown`) changes nothing: a live run keeps billing as
      it did when last seen (a machine we cannot reach may still bill), an ended one does not;
    - a live run whose machine no longer bills closes its bill at the backend's `ended_at` when it
      knows one (a spot pod RunPod reports interrupted while SkyPilot still says RUNNING), else now;
    - a run that ends now bills on only while its backend says so itself (`billing` True: its
      cluster idles before autostop, or until `launch down` tears it down), at this refresh and every
      later one: RunPod bills the pod until it is gone, whoever looks meanwhile; once its bill is
      closed (the backend says nothing bills, or `down`) it never opens again (nothing accrues after
      `down`): a refresh only closes what is open, at the backend's `ended_at` when it knows one.
    """
    now = time.time()
    with _write(run_id) as run:
        if ended_at:  # the run's own word (another machine's clock, a status.json of an earlier session):
            ended_at = min(max(ended_at, run.billing_since or run.started_at), now)  # within this session
        known, was_live = state in STATES, run.state in ACTIVE_STATES
        if known:
            run.seen_at = now
        if was_live and known:
            if state != run.state:
                run.state = state
                if state not in ACTIVE_STATES and not run.ended_at:
                    run.ended_at = ended_at or now
            if reason and reason != run.reason:
                run.reason = reason
        if not was_live:
            bills = billing is True and run.billing_since is not None
        elif run.state not in ACTIVE_STATES:
            bills = billing is True
        elif not known:
            bills = run.billing_since is not None
        else:
            bills = True if billing is None else bool(billing)
        # A run settled from its own status.json (its machine gone) billed until it ended, not until now.
        _accrue(run, bills, ended_at if ended_at and not bills else now)
    return run


FORGOTTEN = "forgotten by launch down --forget: the machine was not reached; check your cloud console"


def forget(run_id: str, now: Optional[float] = None) -> Run:
    """End a live run here only (`launch down --forget`), its machine not reached: `stopped`, with
    FORGOTTEN as its reason, ended and billed up to when its backend last answered for it (what
    accrued while it was `unreachable` is taken back: nothing shows that it billed on, nor that it
    did not). A run never seen answering (recorded before `seen_at` existed) closes now."""
    now = now or time.time()
    with _write(run_id) as run:
        if run.state not in ACTIVE_STATES:
            return run
        billing = run.billing_since is not None
        _accrue(run, False, now)
        seen = run.seen_at if run.seen_at and run.seen_at <= now else now
        if billing and run.billed_s is not None:
            gone = min(now - seen, run.billed_s)
            run.billed_s -= gone
            run.billed_usd = max(0.0, (run.billed_usd or 0.0) - gone / 3600 * run.price_per_hour)
        run.state, run.reason, run.ended_at = "stopped", FORGOTTEN, max(seen, run.started_at)
    return run


@contextmanager
def _write(run_id: str) -> Iterator[Run]:
    """The run, read and written back in one write transaction (what the body changes is saved)."""
    with _connect() as con:
        con.row_factory = sqlite3.Row
        con.execute("BEGIN IMMEDIATE")
        row = con.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            con.execute("ROLLBACK")
            raise RunNotFound(run_id)
        run = _row_to_run(row)
        try:
            yield run
        except BaseException:
            con.execute("ROLLBACK")
            raise
        d = run.to_dict()
        d["handle"] = json.dumps(d["handle"], sort_keys=True)
        sets = ", ".join(f"{k} = ?" for k in d if k != "id")
        con.execute(f"UPDATE runs SET {sets} WHERE id = ?", [d[k] for k in d if k != "id"] + [run_id])
        con.execute("COMMIT")


def _accrue(run: Run, billing: bool, now: float) -> None:
    if run.billed_s is None:  # not accrued yet: what it cost so far is its elapsed time
        run.billed_s, run.billed_usd = run.billed(now)
    elif run.billing_since is not None:
        dt = max(0.0, now - run.billing_since)
        run.billed_s += dt
        run.billed_usd = (run.billed_usd or 0.0) + dt / 3600 * run.price_per_hour
    run.billing_since = now if billing else None


def all_runs() -> list[Run]:
    with _connect() as con:
        con.row_factory = sqlite3.Row
        rows = con.execute("SELECT * FROM runs ORDER BY started_at DESC, id DESC").fetchall()
    return [_row_to_run(r) for r in rows]


def get(run_id: Optional[str] = None) -> Run:
    """A run by id (or unique id prefix); None means the most recent run."""
    runs = all_runs()
    if not runs:
        raise RunNotFound(None)
    if run_id is None:
        return runs[0]
    exact = [r for r in runs if r.id == run_id]
    if exact:
        return exact[0]
    prefixed = [r for r in runs if r.id.startswith(run_id)]
    if len(prefixed) == 1:
        return prefixed[0]
    raise RunNotFound(run_id, [r.id for r in runs[:5]])


def active_for_profile(profile: str) -> Optional[Run]:
    return next((r for r in all_runs() if r.profile == profile and r.active), None)


def new_run_id(profile: str) -> str:
    """`PROFILE-YYYYmmdd-HHMMSS[-N]`, unique even when several processes ask at the same second: the id
    is picked and reserved in one write transaction."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    base = f"{profile}-{stamp}"
    with _connect() as con:
        con.execute("BEGIN IMMEDIATE")
        taken = {r[0] for r in con.execute("SELECT id FROM runs WHERE id = ? OR id LIKE ? ESCAPE '!' "
                                           "UNION SELECT id FROM run_ids WHERE id = ? OR id LIKE ? ESCAPE '!'",
                                           (base, _like(base), base, _like(base)))}
        rid, n = base, 1
        while rid in taken:
            n += 1
            rid = f"{base}-{n}"
        con.execute("INSERT INTO run_ids (id) VALUES (?)", (rid,))
        con.execute("COMMIT")
    return rid


def _like(base: str) -> str:
    return base.replace("!", "!!").replace("%", "!%").replace("_", "!_") + "-%"


class RunNotFound(Exception):
    def __init__(self, run_id: Optional[str], recent: Optional[list[str]] = None):
        self.run_id = run_id
        if run_id is None:
            msg = "no runs yet: start one with `launch up PROFILE`"
        else:
            msg = f"no run `{run_id}`"
            if recent:
                msg += f"; recent runs: {', '.join(recent)} (see `launch status`)"
        super().__init__(msg)
