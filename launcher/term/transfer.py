"""What a fetch shows while its bytes move: bytes done of the total, speed and time left, on a terminal
(rich's progress bar, one line for the file now arriving and one for all of them); in a pipe or a
file nothing moves and the summary line says it all once.

The bytes are counted on this side's disk, whatever the transport (rsync, SFTP, boto3, a local
copy): the size of each expected file in the folder it arrives in, or of its transport's temporary
sibling (`.NAME.xyz` of rsync, `NAME.1a2b3c4d` of boto3). A watcher thread polls them; the
transport needs no callback, and a file an earlier try left counts as already here, not as speed.
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

from launcher.term.units import duration, human_size

POLL_S = 0.25


def arrived(into: Path, sizes: dict[str, int]) -> dict[str, int]:
    """{rel: bytes on disk so far (capped at its expected size)} for each expected file under `into`."""
    by_dir: dict[Path, list[str]] = {}
    for rel in sizes:
        by_dir.setdefault((into / rel).parent, []).append(rel)
    out = {}
    for folder, rels in by_dir.items():
        try:
            entries = {e.name: e.stat(follow_symlinks=False).st_size for e in os.scandir(folder) if e.is_file(
                follow_symlinks=False)}
        except OSError:
            entries = {}
        for rel in rels:
            name = rel.rsplit("/", 1)[-1]
            got = max((n for e, n in entries.items()
                       if e == name or e.startswith(name + ".") or e.startswith(f".{name}.")), default=0)
            out[rel] = min(got, sizes[rel])
    return out


class TransferView:
    """One fetch's display. `watch` brackets the copy; `summary()` is the line said after it."""

    def __init__(self, console, what: str):
        self.console, self.what = console, what
        self.total = self.had = self.done = 0
        self.files, self.seconds = 0, 0.0
        self._progress = None
        self._status = None

    def __enter__(self) -> "TransferView":
        """A spinner while the machine's files are listed, until the bytes move (`watch`)."""
        if self.console.is_terminal:
            self._status = self.console.status(f"listing the {self.what}...")
            self._status.start()
        return self

    def __exit__(self, *exc) -> None:
        self._close()

    @contextmanager
    def watch(self, into: Path, sizes: dict[str, int], total: int, had: int):
        """While the block runs, poll `sizes`' files under `into`. `total` is every byte the fetch
        brings (the files already home too), `had` what was here before it began."""
        self.total, self.had, self.files = total, had, self.files + len(sizes)
        start, base = time.monotonic(), arrived(into, sizes)
        stop = threading.Event()
        self._open()

        def poll():
            while not stop.wait(POLL_S):
                self._show(into, sizes, base)

        thread = threading.Thread(target=poll, daemon=True, name="fetch-progress")
        thread.start()
        try:
            yield self
        finally:
            stop.set()
            thread.join()
            self._show(into, sizes, base)
            self.seconds += time.monotonic() - start
            self._close()

    def _show(self, into: Path, sizes: dict[str, int], base: dict[str, int]) -> None:
        now = arrived(into, sizes)
        self.done = self.had + sum(now[r] - base[r] for r in sizes)
        if self._progress is None:
            return
        current = next((r for r in sizes if 0 < now[r] < sizes[r]), None) or \
            next((r for r in sizes if now[r] < sizes[r]), None)
        p, (all_task, file_task) = self._progress
        p.update(all_task, completed=self.done, total=max(self.total, 1))
        if current is not None:
            p.update(file_task, description=_short(current.rsplit("/", 1)[-1]), completed=now[current],
                     total=max(sizes[current], 1), visible=True)
        else:
            p.update(file_task, visible=False)

    def _open(self) -> None:
        self._stop_status()
        if not self.console.is_terminal or self._progress is not None:
            return
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, \
            TransferSpeedColumn

        p = Progress(TextColumn("{task.description}", style="bold"), BarColumn(bar_width=14), DownloadColumn(),
                     TransferSpeedColumn(), TimeRemainingColumn(), console=self.console, transient=True)
        p.start()
        all_task = p.add_task(_short(self.what), total=max(self.total, 1), completed=self.had)
        file_task = p.add_task("", total=1, visible=False)
        self._progress = p, (all_task, file_task)

    def _close(self) -> None:
        self._stop_status()
        if self._progress is not None:
            self._progress[0].stop()
            self._progress = None

    def _stop_status(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    def summary(self) -> Optional[str]:
        """`1.0 GB moved in 10s (104.3 MB/s); 512.0 MB were here from an earlier try`; None if nothing
        was to move."""
        if not self.total:
            return None
        moved = max(0, self.done - self.had)
        rate = f" ({human_size(moved / self.seconds)}/s)" if self.seconds >= 0.05 and moved else ""
        took = f"{self.seconds:.1f} s" if self.seconds < 60 else duration(self.seconds)
        line = f"{human_size(moved)} moved in {took}{rate}"
        if self.had:
            line += f"; {human_size(self.had)} of {human_size(self.total)} were here from an earlier try"
        if self.done < self.total:
            line += f"; {human_size(self.total - self.done)} did not arrive"
        return line


def _short(name: str, width: int = 24) -> str:
    """A label for the bar (the full paths are printed after the fetch): at most `width` characters."""
    return name if len(name) <= width else name[: width - 1] + "…"
