"""Readers: one opened source (a `Source`) -> a stream of (location, raw record), whatever its format.

One idea at ~440 lines: one source read as a stream of (location, record or RecordError), whatever its
format. The readers (JSONL, JSON array, CSV, Parquet, Hugging Face) share the capped line reading and the
error shape, and only `Source.records` calls them: apart they would be five small modules read together.
`Source` lives here with them, since every reader takes one and its `records` picks the reader by kind;
opening a source (the checks before any record is read) is payload/data/sources.py, which makes it.

A reader never raises for a bad record: it yields a `RecordError` in place of the record, with the
location (line number, or `row N`) it came from, so the pipeline can report `file:line: what`.
What makes the rest of the source unusable (a CSV header or Parquet file that cannot be read, a JSON
array broken past a point, an unreachable dataset) raises `PayloadError` with the fix.

Files are read as bytes and decoded line by line, so a non-UTF-8 line is reported with its number;
lines are read with a cap (`data.max_record_bytes`) so an over-long line is skipped in chunks
without ever holding more than the cap in memory. Everything streams: memory does not grow with the
file (a JSON array is parsed element by element).
"""

from __future__ import annotations

import csv
import json
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

from payload.config import SourceConfig
from payload.errors import PayloadError, edge_error, transient_cause

from .images import ImageContext, file_digest
from .records import RecordError

_SKIP_CHUNK = 1 << 20


@dataclass
class Source:
    """An opened (checked) source. `label` prefixes locations in messages: `label:line`."""

    cfg: SourceConfig
    index: int
    label: str
    kind: str  # jsonl | json | csv | parquet | hf
    path: Optional[Path]
    images: ImageContext
    max_bytes: int

    @property
    def key(self) -> str:
        return f"data.sources[{self.index}]"

    def records(self) -> Iterator[tuple[Any, Any]]:
        """(location, dict | RecordError) pairs, after `columns:` renames and `max_records`."""
        reader = {"jsonl": _iter_jsonl, "json": _iter_json, "csv": _iter_csv, "parquet": _iter_parquet,
                  "hf": _iter_hf}[self.kind]
        renames, limit, n = self.cfg.columns, self.cfg.max_records, 0
        for loc, rec in reader(self):
            if renames and isinstance(rec, dict):
                rec = {renames.get(k, k): v for k, v in rec.items()}
            yield loc, rec
            n += 1
            if limit and n >= limit:
                return

    def fingerprint(self) -> dict:
        """What identifies the input for the cache marker: a local file by its content (sha256)."""
        if self.path is None:
            return {"hf": self.cfg.hf_dataset, "config": self.cfg.hf_config, "split": self.cfg.hf_split}
        return {"path": str(self.path), "sha256": file_digest(self.path)}


# ------------------------------------------------------------------------------------ line reading


def _lines(fh, cap: int, n: int = 0, mark=None) -> Iterator[tuple[int, Any]]:
    """(line number, str | RecordError) for every physical line after line `n`, decoded one by one.
    `mark(line, offset)`, when given, is told where each line starts (CSV resynchronisation)."""
    while True:
        if mark is not None:
            mark(n + 1, fh.tell())
        raw = fh.readline(cap + 1)
        if not raw:
            return
        n += 1
        if len(raw) > cap and not raw.endswith(b"\n"):
            size = len(raw)
            del raw
            while True:
                chunk = fh.readline(_SKIP_CHUNK)
                size += len(chunk)
                if not chunk or chunk.endswith(b"\n"):
                    break
            yield n, RecordError("line too long", f"{size} bytes > data.max_record_bytes {cap}")
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            yield n, RecordError("not UTF-8", f"byte 0x{raw[e.start]:02x} at column {e.start + 1}")
            continue
        if n == 1 and text.startswith("\ufeff"):
            text = text[1:]
        yield n, text


@contextmanager
def _open_lines(path: Path):
    """The file in binary mode for `_lines`; a file whose lines end in a bare CR (old Mac/Excel
    exports) is read as if they ended in LF (universal newlines, without decoding the whole file)."""
    with open(path, "rb") as fh:
        head = fh.read(1 << 16)
        fh.seek(0)
        yield _CRLines(fh) if b"\r" in head and b"\n" not in head else fh


class _CRLines:
    """`readline`/`tell`/`seek` over a binary file whose line ends are `\\r`, returning them as `\\n`."""

    def __init__(self, fh):
        self.fh, self.buf, self.i, self.pos = fh, b"", 0, 0  # pos: file offset of buf[i]

    def readline(self, limit: int) -> bytes:
        while True:
            end = self.buf.find(b"\r", self.i, self.i + limit)
            if end >= 0:
                return self._take(end - self.i, b"\n", 1)
            if len(self.buf) - self.i >= limit:
                return self._take(limit, b"", 0)
            chunk = self.fh.read(1 << 16)
            if not chunk:
                return self._take(len(self.buf) - self.i, b"", 0)
            self.buf, self.i = self.buf[self.i:] + chunk, 0

    def _take(self, size: int, ending: bytes, skip: int) -> bytes:
        line = self.buf[self.i:self.i + size] + ending
        self.i += size + skip
        self.pos += size + skip
        return line

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int) -> None:
        self.fh.seek(offset)
        self.buf, self.i, self.pos = b"", 0, offset


def _iter_jsonl(src: Source) -> Iterator[tuple[Any, Any]]:
    loads = json.loads
    with _open_lines(src.path) as fh:
        for n, text in _lines(fh, src.max_bytes):
            if isinstance(text, RecordError):
                yield n, text
                continue
            if not text.strip():
                continue  # a blank line is not a record
            try:
                yield n, loads(text)
            except ValueError as e:
                yield n, _json_error(e, text)
            except RecursionError:
                yield n, RecordError("invalid JSON", "nested too deeply")


def _json_error(e: ValueError, text: str) -> RecordError:
    """One-line reason; the line is re-parsed without its newline so positions and messages are exact."""
    if not isinstance(e, json.JSONDecodeError):
        return RecordError("invalid JSON", str(e)[:120])
    text = text.rstrip("\r\n")
    try:
        json.loads(text)
    except json.JSONDecodeError as exact:
        e = exact
    except ValueError:
        pass
    detail = f"{e.msg.removesuffix(' at')} at column {e.pos + 1}"
    if e.msg.startswith("Unterminated string") or e.pos >= len(text.rstrip()):
        detail += "; the line looks truncated"
    return RecordError("invalid JSON", detail)


# ------------------------------------------------------------------------------------- JSON array


def _iter_json(src: Source) -> Iterator[tuple[Any, Any]]:
    """A `.json` file: a top-level array read element by element; anything else is read as JSONL."""
    with open(src.path, "rb") as fh:
        head = fh.read(4096).lstrip(b"\xef\xbb\xbf \t\r\n")
    if not head.startswith(b"["):
        yield from _iter_jsonl(src)
        return
    yield from _JsonArray(src).elements()


class _JsonArray:
    """Incremental parser for `[ {...}, {...} ]` that keeps only the current element in memory."""

    def __init__(self, src: Source):
        self.src, self.buf, self.pos, self.line, self.eof = src, "", 0, 1, False
        self.decoder = json.JSONDecoder()

    def elements(self) -> Iterator[tuple[int, Any]]:
        with open(self.src.path, "rb") as fh:
            import codecs

            self.fh, self.utf8 = fh, codecs.getincrementaldecoder("utf-8")()
            self._more(1 << 16)
            self.pos = self.buf.index("[") + 1
            while True:
                ch = self._next_char()
                if ch == "]":
                    return
                if ch == ",":
                    self.pos += 1
                    self._next_char()
                start_line = self._line_at(self.pos)
                yield start_line, self._element(start_line)

    def _next_char(self) -> str:
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in " \t\r\n":
                self.pos += 1
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if self.eof:
                self._fail(self._line_at(self.pos), "file ends before the closing ']'")
            self._more(1 << 16)

    def _element(self, line: int) -> Any:
        want, error = 1 << 16, None
        while True:
            try:
                obj, end = self.decoder.raw_decode(self.buf, self.pos)
                if end < len(self.buf) or self.eof:
                    self.pos = end
                    return obj
            except json.JSONDecodeError as e:
                error = (self.line + e.lineno - 1, f"invalid JSON ({e.msg})")
                if self.eof:
                    self._fail(*error)
            except RecursionError:
                self._fail(line, "invalid JSON (nested too deeply)")
            if len(self.buf) - self.pos > self.src.max_bytes:
                big = f"element larger than data.max_record_bytes {self.src.max_bytes}"
                self._fail(error[0], f"{error[1]}, or {big}") if error else self._fail(line, big)
            self._more(want)
            want *= 2

    def _more(self, size: int) -> None:
        if self.pos > 0:  # drop what is consumed, keeping the line count right
            self.line += self.buf.count("\n", 0, self.pos)
            self.buf, self.pos = self.buf[self.pos:], 0
        chunk = self.fh.read(size)
        try:
            self.buf += self.utf8.decode(chunk, final=not chunk)
        except UnicodeDecodeError:
            self._fail(self.line + self.buf.count("\n"), "not UTF-8")
        self.eof = not chunk

    def _line_at(self, pos: int) -> int:
        return self.line + self.buf.count("\n", 0, pos)

    def _fail(self, line: int, what: str) -> None:
        raise PayloadError(
            f"{self.src.cfg.name}: {self.src.label}:{line}: {what}; a JSON array cannot be read past this "
            "point: fix the file (or convert it to JSONL, one record per line, so bad lines are skipped)"
        )


# -------------------------------------------------------------------------------------------- CSV


def _csv_header(src: Source) -> list[str]:
    with _open_lines(src.path) as fh:
        for n, text in _lines(fh, src.max_bytes):
            if isinstance(text, RecordError):
                raise PayloadError(f"{src.cfg.name}: {src.label}:{n}: CSV header: {text}; fix the file")
            if text.strip():
                try:
                    return [c.strip() for c in next(csv.reader([text], strict=True))]
                except csv.Error as e:
                    raise PayloadError(f"{src.cfg.name}: {src.label}:{n}: CSV header is not valid CSV ({e}); "
                                       "fix the first line of the file") from None
    raise PayloadError(f"{src.cfg.name}: {src.label} has no CSV header (only blank lines); fix the file")


class _CsvCursor:
    """Physical lines for the csv module, restartable at a line: a quote that never closes properly
    swallows the lines after it into one field; those lines are then read again as rows."""

    def __init__(self, src: Source, fh):
        self.src, self.fh = src, fh
        self.bad: dict[int, RecordError] = {}
        self.n = 0  # last physical line handed to the csv reader
        self.want, self.want_offset = 0, None

    def reader(self, offset: int = 0, n: int = 0):
        self.fh.seek(offset)
        self.n = n
        return csv.reader(self._physical(n), strict=True)

    def _physical(self, n: int):
        for n, text in _lines(self.fh, self.src.max_bytes, n, self._mark):
            self.n = n
            if isinstance(text, RecordError):
                self.bad[n] = text
                text = "\n"
            yield text

    def _mark(self, line: int, offset: int) -> None:
        if line == self.want:
            self.want_offset = offset


def _iter_csv(src: Source) -> Iterator[tuple[Any, Any]]:
    """Rows as dicts by the header, numbered by their first physical line. The csv module runs in
    strict mode, so a stray quote is an error rather than a silent merge of the lines that follow."""
    csv.field_size_limit(max(csv.field_size_limit(), src.max_bytes))
    with _open_lines(src.path) as fh:
        cur = _CsvCursor(src, fh)
        reader = cur.reader()
        header: list[str] = []
        while not header:
            try:
                header = [c.strip() for c in next(reader)]
            except (csv.Error, StopIteration):
                raise PayloadError(f"{src.cfg.name}: {src.label}:{cur.n}: CSV header is not valid CSV; fix the "
                                   "first line of the file") from None
        end = cur.n
        while True:
            start = end + 1
            cur.want, cur.want_offset = start + 1, None
            error = None
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as e:
                row, error = None, str(e)
            end = cur.n
            if end > start and (error or len(row) != len(header)):
                detail = error or f"{len(row)} fields, header has {len(header)}"
                to = "the end of the file" if error == "unexpected end of data" else f"line {end}"
                yield start, RecordError("unclosed quote", f"a quoted field opened on this line runs to {to} "
                                         f"({detail}); this line is skipped and the {end - start} lines after it "
                                         "are read again as rows")
                if cur.want_offset is not None:
                    reader, end = cur.reader(cur.want_offset, start), start
                continue
            if error:
                yield start, RecordError("invalid CSV", error)
                continue
            if cur.bad:
                problem = _pop_bad(cur.bad, start, end)
                if problem is not None:
                    yield start, problem
                    continue
            if not row or (len(row) == 1 and not row[0].strip()):
                continue
            if len(row) != len(header):
                yield start, RecordError("wrong number of fields", f"{len(row)} fields, header has {len(header)}")
                continue
            yield start, dict(zip(header, row))


def _pop_bad(bad: dict, start: int, end: int) -> Optional[RecordError]:
    found = None
    for n in sorted(k for k in bad if k <= end):
        err = bad.pop(n)
        if found is None and n >= start:
            found = err
    return found


# ---------------------------------------------------------------------------------------- Parquet


def _parquet_columns(src: Source) -> list[str]:
    import pyarrow.parquet as pq

    try:
        return list(pq.ParquetFile(src.path).schema_arrow.names)
    except Exception as e:  # noqa: BLE001 - pyarrow raises several types for damaged files
        raise PayloadError(f"{src.cfg.name}: {src.label} is not a readable Parquet file ({_one_line(e)}); "
                           "fix or re-export the file") from None


def _iter_parquet(src: Source) -> Iterator[tuple[Any, Any]]:
    import pyarrow.parquet as pq

    n = 0
    try:
        for batch in pq.ParquetFile(src.path).iter_batches(batch_size=1024):
            for row in batch.to_pylist():
                n += 1
                yield f"row {n}", row
    except OSError as e:
        raise PayloadError(f"{src.cfg.name}: {src.label}: reading failed after row {n} ({_one_line(e)}); "
                           "fix or re-export the file") from None


# ----------------------------------------------------------------------------------- Hugging Face


def _iter_hf(src: Source) -> Iterator[tuple[Any, Any]]:
    """Stream rows of `hf_dataset` (a hub id, or a local dataset directory) with `datasets`."""
    c = src.cfg
    try:
        import datasets

        from payload.retry import with_retries

        # retried only when the network failed: a dataset, config or split that is not there is an answer
        ds = with_retries(f"loading dataset {c.hf_dataset}[{c.hf_split}]", lambda: datasets.load_dataset(
            c.hf_dataset, name=c.hf_config, split=c.hf_split, streaming=True), retry_if=transient_cause)
    except Exception as e:  # noqa: BLE001 - network edge: anything `datasets` raises becomes one line with the fix
        raise edge_error(
            f"{c.name}: cannot load Hugging Face dataset {c.hf_dataset!r} (config {c.hf_config}, split "
            f"{c.hf_split}): {_one_line(e)}; check {src.key}.hf_dataset/hf_config/hf_split, HF_TOKEN for "
            "private datasets, and network access", e
        ) from None
    yield from iter_rows(ds, src)


def iter_rows(rows, src: Source) -> Iterator[tuple[str, Any]]:
    """Number the rows of any iterable of dicts (a streaming dataset) as `row N` locations."""
    it, n = iter(rows), 0
    while True:
        try:
            row = next(it)
        except StopIteration:
            return
        except Exception as e:  # noqa: BLE001 - network edge, as above
            raise edge_error(f"{src.cfg.name}: reading {src.label} failed after row {n}: {_one_line(e)}; "
                             "retry, or check network access and HF_TOKEN", e) from None
        n += 1
        yield f"row {n}", row


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:200]}" if text else type(e).__name__
