"""Terminal control text out of saved logs. A run's raw log is what its processes wrote for a
terminal: colour codes (`ESC[31m`), cursor moves, and progress bars that redraw one line with `\\r`
(tqdm, pip, huggingface downloads). A file or a pipe shows those as noise, so what `launch` writes to
disk (the fetched `logs/`) and `launch logs` into a pipe or a file keep the text a terminal would
have shown: escape sequences removed, each line as its last redraw left it.
"""

from __future__ import annotations

import io
import os
import re
from pathlib import Path

# CSI (ESC [ ... final byte), OSC (ESC ] ... BEL or ESC \), and two-byte escapes (ESC @ .. ESC _).
ESCAPES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[0-?@-Z\\^_]")


def clean_line(line: str) -> str:
    """One line (its `\\n` kept) as a terminal leaves it: no escapes, the last `\\r` redraw."""
    end = "\n" if line.endswith("\n") else ""
    text = ESCAPES.sub("", line[: len(line) - len(end)])
    if "\r" in text:
        text = next((seg for seg in reversed(text.split("\r")) if seg.strip()), "")
    return text + end


def clean_file(path: Path) -> None:
    """Rewrite a log file in place, line by line (a log can be large), atomically."""
    tmp = path.with_name(f".{path.name}.clean")
    with open(path, encoding="utf-8", errors="replace", newline="\n") as src, \
            open(tmp, "w", encoding="utf-8", newline="\n") as out:
        for line in src:
            out.write(clean_line(line))
    os.replace(tmp, path)


class CleanWriter(io.TextIOBase):
    """A text stream that passes whole lines through `clean_line` (a partial line waits for its end)."""

    def __init__(self, out):
        self._out, self._pending = out, ""

    def write(self, text: str) -> int:
        lines = (self._pending + text).split("\n")
        self._pending = lines.pop()
        for line in lines:
            self._out.write(clean_line(line + "\n"))
        return len(text)

    def flush(self) -> None:
        self._out.flush()

    def close_pending(self) -> None:
        if self._pending:
            self._out.write(clean_line(self._pending))
            self._pending = ""
        self._out.flush()
