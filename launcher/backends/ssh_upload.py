"""The ssh backend's upload: the host's workdir made to mirror the files a run needs, sending only what
differs, so that a resume or a second run of a profile sends a few files, not the whole payload.

Size first, then mtime; a file of the same size but another mtime is compared by sha256 on both sides
and, when identical, only re-stamped. What the host has that the run does not is removed. What is sent
goes as one gzip'd tar over the SSH channel (no scp, no temp file on either side), retried as the
backend retries its commands.
"""

from __future__ import annotations

import gzip
import shlex
import tarfile
from pathlib import Path
from typing import Callable

from payload.volume.checksums import sha256_file

from ..errors import BackendError
from .ssh_scripts import SEED_AND_LIST
from .sshconn import TRANSFER_TIMEOUT, Connection, collect

HASH_TIMEOUT = 600.0  # sha256 of a whole workdir


def sync(conn: Connection, root: str, workdir: str, files: dict[str, Path], *, sh: Callable[..., str],
         retry: Callable) -> dict:
    """Make `workdir` mirror `files` (relative path -> local file); `sh(conn, command, stdin=...)` runs a
    command on the host, `retry(conn, fn)` retries a transfer. Returns what was sent, kept and removed."""
    listing = sh(conn, SEED_AND_LIST.format(w=shlex.quote(workdir), root=shlex.quote(root)))
    rows = [line.rsplit("\t", 2) for line in listing.splitlines() if line.count("\t") >= 2]
    remote = {rel: (int(size), int(float(mtime))) for rel, size, mtime in rows}
    local = {rel: (p, p.stat()) for rel, p in files.items()}
    send = [rel for rel, (p, st) in local.items() if rel not in remote or remote[rel][0] != st.st_size]
    maybe = [rel for rel, (p, st) in local.items()
             if rel in remote and rel not in send and remote[rel][1] != int(st.st_mtime)]
    if maybe:  # same size, other mtime: compare contents, re-stamp the identical ones
        sums = _remote_sha256(conn, workdir, maybe, sh)
        same = [rel for rel in maybe if sums.get(rel) == sha256_file(local[rel][0])]
        send += [rel for rel in maybe if rel not in same]
        if same:
            pairs = "".join(f"{rel}\0{int(local[rel][1].st_mtime)}\0" for rel in same)
            sh(conn, f"cd {shlex.quote(workdir)} && while IFS= read -r -d '' f && IFS= read -r -d '' t; "
                     'do touch -m -d "@$t" -- "$f"; done', stdin=pairs)
    stale = [rel for rel in remote if rel not in local]
    if stale:
        sh(conn, f"cd {shlex.quote(workdir)} && xargs -0 rm -f --", stdin="\0".join(stale))
    if send:
        retry(conn, lambda: _send_tar(conn, workdir, {r: local[r][0] for r in send}))
    return {"files_sent": len(send), "bytes_sent": sum(local[r][1].st_size for r in send),
            "files_unchanged": len(local) - len(send), "files_removed": len(stale)}


def _remote_sha256(conn: Connection, directory: str, rels: list[str], sh: Callable[..., str]) -> dict[str, str]:
    out = sh(conn, f"cd {shlex.quote(directory)} && xargs -0 -r sha256sum --", stdin="\0".join(rels),
             check=False, timeout=HASH_TIMEOUT)
    return {line[66:]: line[:64] for line in out.splitlines() if len(line) > 66}


def _send_tar(conn: Connection, workdir: str, files: dict[str, Path]) -> None:
    chan = conn.channel(f"mkdir -p {shlex.quote(workdir)} && tar -xzf - -C {shlex.quote(workdir)} "
                        "--no-same-owner", TRANSFER_TIMEOUT)
    with chan.makefile("wb") as raw:
        with gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=1) as gz:
            with tarfile.open(fileobj=gz, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                for rel, path in sorted(files.items()):
                    tar.add(str(path), arcname=rel, recursive=False)
    chan.shutdown_write()
    code, _, err = collect(chan, TRANSFER_TIMEOUT, "tar -x")
    if code != 0:
        raise BackendError(f"upload to {conn.target}:{workdir} failed: {err.strip()[-300:]}")
