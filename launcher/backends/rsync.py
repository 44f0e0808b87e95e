"""Pulling a run's files with rsync over the system ssh, resuming what an earlier try left.

Shared by the ssh backend and SkyPilot clusters: the caller gives the ssh command line (its host
key checking, keys and hops already in it) and the run-dir-relative files. `--append-verify`
continues a file that was cut off from its last byte (what arrived is kept in place, never sent
again) and checks the whole file's checksum at the end, sending it again whole if the kept part
differs; artifacts.py verifies each file against the MANIFEST after that all the same.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import time
from pathlib import Path
from typing import Optional

from ..errors import BackendError

DROPPED = (10, 12, 30, 35, 255)  # socket/protocol/timeout errors, and ssh's own (the connection went)
IO_TIMEOUT_S = 120  # no data for this long: rsync gives up (a stalled link), not a cap on the whole transfer


class Unavailable(Exception):
    """rsync is missing here or on the machine: the caller moves the bytes another way."""


def pull(ssh: list[str], destination: str, remote_root: str, rels: list[str], into: Path,
         tries: int = 3) -> Optional[int]:
    """rsync exactly `rels` (NUL-separated --files-from) from `destination:remote_root/` into `into`,
    keeping their relative paths; the bytes rsync received (its --stats), None if it did not say.
    `--no-links`: a symlink on the machine is skipped, never recreated here. Files that vanished since
    the listing (exit 23/24) are left to verification to report. A dropped connection is retried
    (`tries` in all, with backoff), each try going on from the bytes the last one left."""
    if not rels:
        return 0
    if shutil.which("rsync") is None:
        raise Unavailable("rsync is not installed here")
    into.mkdir(parents=True, exist_ok=True)
    cmd = ["rsync", "-t", "--no-links", "--partial", "--append-verify", f"--timeout={IO_TIMEOUT_S}", "--stats",
           "--from0", "--files-from=-", "-e", shlex.join(ssh), f"{destination}:{remote_root}/", f"{into}/"]
    received, delay = 0, 1.0
    for attempt in range(1, tries + 1):
        done = _run(cmd, "\0".join(rels) + "\0")
        err = done.stderr.strip()
        m = re.search(r"Total bytes received: ([\d,.]+)", done.stdout)
        received += int(re.sub(r"[,.]", "", m[1])) if m else 0
        if done.returncode in (0, 23, 24):
            return received
        if done.returncode == 127 or "rsync: command not found" in err or "rsync: not found" in err:
            raise Unavailable(f"rsync is not installed on {destination}")
        if "Host key verification failed" in err or "REMOTE HOST IDENTIFICATION HAS CHANGED" in err:
            raise BackendError(f"ssh refused {destination}'s host key (rsync; the run's known_hosts is checked "
                               f"strictly): {err.splitlines()[-1]}")
        if done.returncode not in DROPPED or attempt == tries:
            break
        time.sleep(delay)
        delay = min(delay * 2, 8.0)
    raise BackendError(f"rsync from {destination} failed ({done.returncode}): {err[-300:]}")


def _run(cmd: list[str], stdin: str) -> subprocess.CompletedProcess:
    """rsync to its end; interrupted (Ctrl-C, a signal), its processes are told to stop and waited for:
    rsync's receiver is a process of its own that would go on writing into the files the next try
    continues (subprocess.run's SIGKILL reaches only the first one)."""
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(stdin)
    except BaseException:
        proc.terminate()  # rsync's own handler stops its receiver and keeps the partial file (--partial)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)
