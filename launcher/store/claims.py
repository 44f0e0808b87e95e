"""One command at a time acts on a run: a claim is an exclusive flock on a file in `$LAUNCH_HOME/claims/`,
held for the whole check-then-act of `launch up` (the profile's claim: one start of a profile at a time,
and with `--resume` the run's too), `launch down` and status's budget teardown (the run's claim).

A claim is never waited for: the command that finds it held says in one line which command holds it
(its pid and command line, which the holder writes into the file) and does nothing. The kernel drops
an flock when its holder exits, however it exits (Ctrl-C, SIGKILL), so a claim never outlives its
command; the descriptor is not inherited (a trainer started under the claim does not hold it).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shlex
import sys
import time
from contextlib import contextmanager
from hashlib import sha256
from typing import Iterator, Optional

from launcher.errors import BackendError
from launcher.store.state import private_dir, state_dir

READ_TRIES_S = 1.0  # how long a loser waits for the holder to write who it is (it writes right after the flock)


class Busy(BackendError):
    """The claim is held by another launch command (one `✗` line, like every BackendError)."""


def _path(key: str):
    safe = key if re.fullmatch(r"[A-Za-z0-9._-]{1,120}", key) else sha256(key.encode()).hexdigest()[:32]
    return private_dir(state_dir() / "claims") / f"{safe}.lock"


def command_line() -> str:
    """This command as the user typed it (`launch up local-demo --resume RUN`), at most 200 characters."""
    line = " ".join(["launch", *(shlex.quote(a) for a in sys.argv[1:])])
    return line if len(line) <= 200 else line[:197] + "..."


@contextmanager
def claim(key: str, refused) -> Iterator[None]:
    """Hold the claim `key` for the body, or raise Busy(refused(holder)) at once: `holder` is the
    holding command's `` `CMD` (pid N) `` as it wrote it."""
    fd = os.open(_path(key), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise Busy(refused(_holder(fd))) from None
        me = json.dumps({"pid": os.getpid(), "command": command_line(), "since": time.time()}).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, me, 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)  # a file with a holder in it is held: the next holder writes its own
    finally:
        os.close(fd)  # releases the flock


def _holder(fd: int) -> str:
    """`` `launch up ...` (pid N) `` of the command holding the claim; it writes that right after taking
    it, so an empty file is read again for a moment."""
    deadline = time.monotonic() + READ_TRIES_S
    while True:
        found = _read(fd)
        if found is not None or time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    if found is None:
        return "another launch command"
    return f"`{found['command']}` (pid {found['pid']})"


def _read(fd: int) -> Optional[dict]:
    try:
        found = json.loads(os.pread(fd, 4096, 0) or b"null")
    except (OSError, ValueError):
        return None
    if not isinstance(found, dict) or not isinstance(found.get("pid"), int) \
            or not isinstance(found.get("command"), str):
        return None
    try:
        os.kill(found["pid"], 0)
    except ProcessLookupError:  # a holder killed before it could clear the file: the new one writes soon
        return None
    except OSError:
        pass
    return found


def of_run(run_id: str):
    """The run's claim (`up --resume`, `down`, the budget teardown)."""
    return claim(f"run-{run_id}", lambda holder: (
        f"{holder} is acting on run {run_id} right now (resuming or stopping it): one command at a time, so "
        f"this one changed nothing; `launch status {run_id}` shows where it got once it is done"))


def of_profile(profile: str):
    """A profile's claim (`up`): its check for an active run, and the start, one command at a time."""
    return claim(f"profile-{profile}", lambda holder: (
        f"{holder} is starting or resuming a run of {profile} right now: one at a time, so this one changed "
        f"nothing; `launch status` shows that run once it is done"))
