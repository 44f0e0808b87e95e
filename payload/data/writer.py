"""Output files of the data stage: split JSONL files, data_stats.json and the `.complete` marker.

Everything is written to a hidden temp file in the data directory and renamed into place, so a
killed job never leaves a half-written file under a final name. The marker is written last and holds
the cache key (hash of the data config, the input files' contents and the tokenizer) and the content
hashes of the image files the records use: when both match, the stage is already done and is not
redone on resume.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable, Optional

from .transforms import SPLITS

MARKER = ".complete"
STATS = "data_stats.json"
OUTPUTS = tuple(f"{s}.jsonl" for s in SPLITS)


class SplitWriter:
    """Buffered writers for train/val/test that only become visible on `commit()`."""

    def __init__(self, out_dir: Path):
        self.out_dir = out_dir
        # Per-process temp names: several nodes may prepare the same (deterministic) data on a shared
        # volume at once; each renames identical bytes into place, so the race is harmless.
        self.tmp = {s: out_dir / f".{s}.jsonl.{os.getpid()}.tmp" for s in SPLITS}
        self.files = {s: open(p, "wb", buffering=1 << 20) for s, p in self.tmp.items()}
        self.write = {s: f.write for s, f in self.files.items()}  # split -> bound write(bytes)

    def commit(self) -> None:
        for s, f in self.files.items():
            f.flush()
            os.fsync(f.fileno())
            f.close()
            os.replace(self.tmp[s], self.out_dir / f"{s}.jsonl")
        _fsync_dir(self.out_dir)

    def abort(self) -> None:
        for s, f in self.files.items():
            f.close()
            self.tmp[s].unlink(missing_ok=True)


def write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_stats(out_dir: Path, stats: dict) -> None:
    write_text_atomic(out_dir / STATS, json.dumps(stats, indent=2, sort_keys=False, ensure_ascii=False) + "\n")


def read_cached(out_dir: Path, key: str, still_valid: Optional[Callable[[dict], bool]] = None) -> Optional[dict]:
    """The stats of a finished run with the same cache key (and `still_valid(marker)`), or None (then
    the stage must run)."""
    try:
        marker = json.loads((out_dir / MARKER).read_text(encoding="utf-8"))
        if marker.get("key") != key:
            return None
        if still_valid is not None and not still_valid(marker):
            return None
        if not all((out_dir / name).is_file() for name in OUTPUTS):
            return None
        return json.loads((out_dir / STATS).read_text(encoding="utf-8"))
    except (OSError, ValueError, AttributeError):
        return None


def start_rebuild(out_dir: Path) -> None:
    """Invalidate a previous result before writing a new one (marker first, then outputs)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / MARKER).unlink(missing_ok=True)
    for name in (*OUTPUTS, STATS):
        (out_dir / name).unlink(missing_ok=True)


def write_marker(out_dir: Path, key: str, inputs: list, images: Optional[dict] = None) -> None:
    """The cache marker: the key, the inputs' content hashes and those of the image files used."""
    body = {"key": key, "inputs": inputs, "images": dict(sorted((images or {}).items()))}
    write_text_atomic(out_dir / MARKER, json.dumps(body, indent=1) + "\n")
    _fsync_dir(out_dir)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
