"""Where `launch` keeps its own state: `$LAUNCH_HOME`, default `~/.launch` (runs.db, rendered/,
sky-offline/). The run history names hosts, clusters and paths, so the directory is private (0700)
and the files `launch` writes there are 0600; an older, looser directory is tightened on first use (group
and other lose their access; the owner's bits are left as the owner set them)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from launcher.errors import StateError


def state_dir() -> Path:
    d = Path(os.environ.get("LAUNCH_HOME") or Path.home() / ".launch").expanduser()
    return private_dir(d)


def private_dir(path: Path) -> Path:
    """`path` as a directory only its owner can read (created 0700, tightened if group/other had access).
    A path that cannot be a directory (read-only, a file in the way) is a StateError naming it."""
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as e:
        raise unusable(path, e) from None
    tighten(path)
    return path


def unusable(path: Path, e: OSError) -> StateError:
    """The one line for a folder of launch's state that cannot be made or written."""
    why = "a file is in the way, not a directory" if isinstance(e, FileExistsError) else e.strerror or str(e)
    return StateError(f"cannot use {e.filename or path}: {why}; set LAUNCH_HOME to a writable directory "
                      "(launch keeps its state there, default ~/.launch)")


def tighten(path: Path) -> None:
    """Take group's and other's access away from `path` when it is ours and grants them anything; the
    owner's bits stay as they are (a LAUNCH_HOME made read-only, 0555, becomes 0500, never writable:
    privacy is the only reason launch changes a mode it did not create)."""
    try:
        st = os.stat(path)
        if st.st_mode & 0o077 and st.st_uid == os.getuid():
            os.chmod(path, stat.S_IMODE(st.st_mode) & ~0o077)
    except OSError:
        pass


def write_private(path: Path, text: str) -> Path:
    """Write a file readable by its owner only (0600), atomically (temp file + rename)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
