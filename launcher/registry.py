"""The local run registry: one SQLite database under the launch state dir (`$LAUNCH_HOME/runs.db`).

SQLite gives atomic writes and safe concurrent access from two `launch` commands at once (WAL mode,
a busy timeout, each change in its own transaction). No secret is ever stored here.
"""

from __future__ import annotations

import json
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from typing import Iterator, Optional

from .state import state_dir

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
    handle TEXT NOT NULL DEFAULT '{}'
)
"""


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
    handle: dict = field(default_factory=dict)
    """Backend-specific, JSON-serialisable (pids, host, remote run dir, managed job name...)."""

    @property
    def active(self) -> bool:
        return self.state in ACTIVE_STATES

    def elapsed_s(self, now: Optional[float] = None) -> float:
        end = self.ended_at or (now or time.time())
        return max(0.0, end - self.started_at)

    def to_dict(self) -> dict:
        return asdict(self)


def db_path():
    return state_dir() / "runs.db"


@contextmanager
def _connect() -> Iterator[sqlite3.Connection]:
    con = sqlite3.connect(db_path(), timeout=30, isolation_level=None)
    try:
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("PRAGMA busy_timeout=30000")
        con.execute(_SCHEMA)
        yield con
    finally:
        con.close()


def _row_to_run(row: sqlite3.Row) -> Run:
    d = dict(row)
    d["handle"] = json.loads(d.get("handle") or "{}")
    return Run(**d)


def save(run: Run) -> None:
    """Insert or replace a run, atomically."""
    d = run.to_dict()
    d["handle"] = json.dumps(d["handle"], sort_keys=True)
    cols = [f.name for f in fields(Run)]
    with _connect() as con:
        con.execute("BEGIN IMMEDIATE")
        con.execute(f"INSERT OR REPLACE INTO runs ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})",
                    [d[c] for c in cols])
        con.execute("COMMIT")


def update(run_id: str, **changes) -> Run:
    """Change some fields of a run in one transaction (read-modify-write under a write lock)."""
    with _connect() as con:
        con.row_factory = sqlite3.Row
        con.execute("BEGIN IMMEDIATE")
        row = con.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            con.execute("ROLLBACK")
            raise RunNotFound(run_id)
        run = _row_to_run(row)
        for k, v in changes.items():
            if k == "handle":
                run.handle = {**run.handle, **v}
            else:
                setattr(run, k, v)
        d = run.to_dict()
        d["handle"] = json.dumps(d["handle"], sort_keys=True)
        sets = ", ".join(f"{k} = ?" for k in d if k != "id")
        con.execute(f"UPDATE runs SET {sets} WHERE id = ?", [d[k] for k in d if k != "id"] + [run_id])
        con.execute("COMMIT")
    return run


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
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    base = f"{profile}-{stamp}"
    taken = {r.id for r in all_runs()}
    rid, n = base, 1
    while rid in taken:
        n += 1
        rid = f"{base}-{n}"
    return rid


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
