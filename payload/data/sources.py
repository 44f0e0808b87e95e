"""Opening a source: one `data.sources` entry (a local file or a Hugging Face dataset id) checked
before any record is read, and handed on as a `Source` that payload/data/readers.py reads.

What makes the whole source unusable raises `PayloadError` naming the key and the fix: a missing
file, a directory, an unknown extension, an empty file, a CSV header or Parquet columns without the
columns the format needs (after `columns:` renames). Bad records are the readers' business.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from payload.config import SourceConfig
from payload.errors import PayloadError

from .images import ImageChecker, ImageContext
from .readers import Source, _csv_header, _parquet_columns
from .records import first_required

EXTENSIONS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".csv": "csv", ".parquet": "parquet"}


def open_source(cfg: SourceConfig, index: int, base: Path, out_dir: Path, max_bytes: int,
                checker: Optional[ImageChecker] = None) -> Source:
    """Check a source before any record is read; raise PayloadError naming the file and the fix.
    `checker` is shared by the sources of one run (each image is checked once)."""
    checker = checker or ImageChecker()
    save_dir = out_dir / "images"
    key = f"data.sources[{index}]"
    if cfg.hf_dataset:
        root = _under(base, cfg.image_root) if cfg.image_root else base
        label = f"{cfg.hf_dataset}[{cfg.hf_split}]"
        return Source(cfg, index, label, "hf", None, ImageContext(root, save_dir, checker), max_bytes)
    path = _under(base, cfg.path)
    if not path.exists():
        raise PayloadError(f"{cfg.name}: data file {cfg.path} not found (looked for {path}); "
                           f"fix {key}.path or put the file there")
    if not path.is_file():
        raise PayloadError(f"{cfg.name}: {cfg.path} is not a file; point {key}.path at a data file")
    kind = EXTENSIONS.get(path.suffix.lower())
    if kind is None:
        raise PayloadError(f"{cfg.name}: {cfg.path}: unknown file type {path.suffix!r}; "
                           f"use one of {', '.join(EXTENSIONS)} (or convert the file)")
    if path.stat().st_size == 0:
        raise PayloadError(f"{cfg.name}: {cfg.path} is empty (0 bytes); "
                           f"point {key}.path at the real file or remove the source")
    root = _under(base, cfg.image_root) if cfg.image_root else path.parent
    src = Source(cfg, index, cfg.path, kind, path, ImageContext(root, save_dir, checker), max_bytes)
    if kind == "csv":
        _check_columns(src, _csv_header(src), "CSV header")
    elif kind == "parquet":
        _check_columns(src, _parquet_columns(src), "Parquet columns")
    return src


def _under(base: Path, p: str) -> Path:
    path = Path(p).expanduser()
    return path if path.is_absolute() else base / path


def _check_columns(src: Source, columns: list[str], what: str) -> None:
    have = {src.cfg.columns.get(c, c) for c in columns}
    sets = first_required(src.cfg.format)
    if any(need <= have for need in sets):
        return
    head = f"{src.cfg.name}: {src.label}: {what} has [{', '.join(columns)}]"
    if src.cfg.format == "auto":
        options = ", ".join(f"[{', '.join(sorted(need))}]" for need in sets)
        raise PayloadError(f"{head}, none of the column sets {options}; rename the columns in the file, map "
                           f"them with {src.key}.columns, or set {src.key}.format")
    missing = sorted(sets[0] - have)
    raise PayloadError(
        f"{head}, missing [{', '.join(missing)}] for format {src.cfg.format}; rename the columns in the file "
        f"or map them with {src.key}.columns (e.g. {{your_column: {missing[0]}}})"
    )
