"""The data stage: sources -> canonical records -> transforms -> dedup -> length filter -> splits.

One pass, streaming: each record is read, checked, transformed, hashed and written before the next
is read. Memory is the set of 16-byte content hashes (dedup) plus, with a tokenizer, one small int
per record (length percentiles). Per source, the stats satisfy `in = out + dropped + duplicates`;
`invalid` (bad input) is the part of `dropped` that counts against `data.max_invalid_fraction`.
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from array import array
from pathlib import Path
from typing import Callable, Optional

from payload.config import DataConfig
from payload.errors import PayloadError

from .images import ImageChecker
from .images import unchanged as images_unchanged
from .readers import Source
from .records import Dropped, RecordError, canonicalize
from .sources import open_source
from .transforms import (SPLITS, Splitter, apply_transforms, encode_messages, percentiles, record_line,
                         source_tail, text_tokenizer, token_length, tokenizer_id)
from .writer import SplitWriter, read_cached, start_rebuild, write_marker, write_stats

FORMAT_VERSION = 2  # bump when the output of the same inputs changes (invalidates caches)
PROGRESS_EVERY = 250_000


def _print(line: str) -> None:
    print(line, file=sys.stdout, flush=True)


def prepare(data: DataConfig, out_dir, *, tokenizer=None, base_dir=None,
            log: Optional[Callable[[str], None]] = None) -> dict:
    """Build `train/val/test.jsonl` and `data_stats.json` in `out_dir`; return the stats.

    Relative source paths resolve against `base_dir` (default: the current directory). With a
    `tokenizer`, token lengths are measured (percentiles in the stats) and `data.max_tokens` applies.
    When `out_dir` already holds a finished result for the same config and inputs, nothing is redone
    and the stored stats are returned (with `cached: true`). Raises PayloadError (one line) on bad input.
    """
    log = log or _print
    tokenizer = text_tokenizer(tokenizer) if tokenizer is not None else None
    base = Path(base_dir) if base_dir is not None else Path.cwd()
    out = Path(out_dir)
    started = time.perf_counter()
    try:
        checker = ImageChecker(data.max_image_pixels)
        sources = [open_source(s, i, base, out, data.max_record_bytes, checker) for i, s in enumerate(data.sources)]
        inputs = [s.fingerprint() for s in sources]
        key = cache_key(data, inputs, tokenizer)
        cached = read_cached(out, key, lambda marker: images_unchanged(marker.get("images") or {}))
        if cached is not None:
            t = cached.get("totals", {})
            log(f"data: cached ({out}: train {t.get('train')}, val {t.get('val')}, test {t.get('test')})")
            return dict(cached, cached=True)
        stats = _build(data, sources, out, tokenizer, log)
        write_marker(out, key, inputs, checker.used)
    except OSError as e:  # unreadable input, full or read-only volume: one line, not a traceback
        where = f"{e.filename}: " if e.filename else ""
        raise PayloadError(f"data: {where}{e.strerror or e}; check the file permissions and the free space "
                           f"on the volume holding {out}") from None
    log_summary(stats, out, time.perf_counter() - started, log)
    return dict(stats, cached=False)


SAMPLE_RECORDS = 2000  # per source: what `validate`, `plan`, `up` and `data preview` read before any GPU


def check_sample(data: DataConfig, out_dir, *, base_dir, tokenizer=None,
                 limit: int = SAMPLE_RECORDS) -> tuple[dict, list[tuple[Optional[int], str]]]:
    """The data stage's own record check on the first `limit` records of each local source (Hugging
    Face datasets are not downloaded), without the cache (no file is hashed): (stats, problems).
    `problems` holds every source's refusal at once as (index in data.sources or None, one line, as
    the run's data stage would print it); with none, `out_dir` holds the sample's train/val/test.jsonl."""
    data = data.model_copy(deep=True)
    local = [i for i, s in enumerate(data.sources) if not s.hf_dataset]
    data.sources = [data.sources[i] for i in local]
    for s in data.sources:
        s.max_records = min(s.max_records or limit, limit)
    out, base = Path(out_dir), Path(base_dir)
    out.mkdir(parents=True, exist_ok=True)
    checker, run, problems = ImageChecker(data.max_image_pixels), _Run(data, tokenizer, lambda _line: None), []
    writer = SplitWriter(out)
    try:
        for i, s in zip(local, data.sources):
            try:
                run.source(open_source(s, i, base, out, data.max_record_bytes, checker), writer)
            except PayloadError as e:
                problems.append((i, str(e)))
            except OSError as e:
                problems.append((i, f"{s.name}: {e.filename or s.path}: {e.strerror or e}; check the file"))
        if local and not problems:
            run.check_result()
    except PayloadError as e:
        problems.append((None, str(e)))
    except BaseException:
        writer.abort()
        raise
    writer.commit()
    return run.stats("sample"), problems


def _build(data: DataConfig, sources: list[Source], out: Path, tokenizer, log) -> dict:
    start_rebuild(out)
    run = _Run(data, tokenizer, log)
    writer = SplitWriter(out)
    try:
        for src in sources:
            run.source(src, writer)
        run.check_result()
    except BaseException as e:
        writer.abort()
        if isinstance(e, PayloadError):
            write_stats(out, run.stats("failed"))
        raise
    writer.commit()
    stats = run.stats("complete")
    write_stats(out, stats)
    return stats


def cache_key(data: DataConfig, inputs: list, tokenizer) -> str:
    body = {"version": FORMAT_VERSION, "data": data.model_dump(mode="json"), "inputs": inputs,
            "tokenizer": tokenizer_id(tokenizer)}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


class SourceStats:
    """Counts and the first problems of one source."""

    def __init__(self, src: Source, report_first: int):
        self.name, self.location, self.report_first = src.cfg.name, src.label, report_first
        self.n_in = self.invalid = self.dropped = self.duplicates = 0
        self.reasons: dict[str, int] = {}
        self.splits = {s: 0 for s in SPLITS}
        self.problems: list[dict] = []
        self.first_duplicates: list[str] = []
        self.first_invalid: Optional[str] = None

    @property
    def out(self) -> int:
        return sum(self.splits.values())

    def as_dict(self) -> dict:
        return {
            "location": self.location, "in": self.n_in, "out": self.out, "dropped": self.dropped,
            "invalid": self.invalid, "duplicates": self.duplicates,
            "dropped_by_reason": dict(sorted(self.reasons.items())), "splits": dict(self.splits),
            "problems": self.problems, "problems_not_listed": self.dropped - len(self.problems),
            "first_duplicates": self.first_duplicates,
        }


class _Run:
    def __init__(self, data: DataConfig, tokenizer, log: Callable[[str], None]):
        self.data, self.tokenizer, self.log = data, tokenizer, log
        self.seen: set[bytes] = set()
        self.lengths = array("I")
        self.per_source: list[SourceStats] = []
        self.n_total = 0
        if data.max_tokens and tokenizer is None:
            log(f"data: max_tokens {data.max_tokens} is set but no tokenizer was given here; "
                "records are not length-filtered in this stage")

    def source(self, src: Source, writer: SplitWriter) -> None:
        c = src.cfg
        st = SourceStats(src, self.data.report_first)
        self.per_source.append(st)
        prompt = self.data.system_prompts[c.system_prompt] if c.system_prompt else None
        split, tail, label = Splitter(self.data.seed, c.split), source_tail(c.name), src.label
        fmt, strip, images, splits, write = c.format, c.strip_think, src.images, st.splits, writer.write
        seen = self.seen if self.data.dedup else None
        tok, max_tokens = self.tokenizer, self.data.max_tokens
        for loc, raw in src.records():
            st.n_in += 1
            if st.n_in % PROGRESS_EVERY == 0:
                self.log(f"data: {c.name}: {st.n_in:,} records read")
            try:
                if isinstance(raw, RecordError):
                    raise raw
                msgs = canonicalize(raw, fmt, images, c.instruction, c.instruction_as)
                extra = rejected_tail(msgs) if fmt == "preference" else b""
                msgs = apply_transforms(msgs, strip, prompt)
                body, digest = encode_messages(msgs)
                if extra:  # the same prompt and chosen reply with another rejected one is another pair
                    digest = hashlib.blake2b(digest + extra, digest_size=16).digest()
                if seen is not None:
                    if digest in seen:
                        self._duplicate(st, f"{label}:{loc}")
                        continue
                    seen.add(digest)
                if tok is not None:
                    n = token_length(tok, msgs)
                    if max_tokens and n > max_tokens:
                        raise Dropped("too many tokens", f"{n} > data.max_tokens {max_tokens}")
                    self.lengths.append(n)
            except RecordError as e:
                self._drop(st, f"{label}:{loc}", e)
                continue
            name = split(digest)
            write[name](record_line(body, extra + tail if extra else tail))
            splits[name] += 1
        self._finish(st)

    def _duplicate(self, st: SourceStats, where: str) -> None:
        st.duplicates += 1
        if len(st.first_duplicates) < st.report_first:
            st.first_duplicates.append(where)

    def _drop(self, st: SourceStats, where: str, err: RecordError) -> None:
        st.dropped += 1
        st.reasons[err.kind] = st.reasons.get(err.kind, 0) + 1
        if err.invalid:
            st.invalid += 1
            if st.first_invalid is None:
                st.first_invalid = f"{where}: {err}"
            if self.data.strict:
                raise PayloadError(f"{st.name}: {where}: {err} (data.strict is on: fix the record, or set "
                                   "data.strict: false to skip and count invalid records)")
        if len(st.problems) < st.report_first:
            st.problems.append({"where": where, "reason": str(err)})
            self.log(f"data: {st.name}: {where}: {err}")

    def _finish(self, st: SourceStats) -> None:
        if st.n_in == 0:
            raise PayloadError(f"{st.name}: {st.location} holds no records (only blank lines or no rows); "
                               "point the source at the real data or remove it")
        hidden = st.dropped - len(st.problems)
        if hidden:
            reasons = ", ".join(f"{k} {v}" for k, v in sorted(st.reasons.items()))
            self.log(f"data: {st.name}: {hidden} more dropped records not listed (all dropped: {reasons})")
        limit = self.data.max_invalid_fraction
        if st.invalid and st.invalid / st.n_in > limit:
            raise PayloadError(
                f"{st.name}: {st.invalid} of {st.n_in} records invalid ({_pct(st.invalid / st.n_in)} > "
                f"max_invalid_fraction {_pct(limit)}); first: {st.first_invalid}; fix the file or raise "
                "data.max_invalid_fraction"
            )
        self.log(f"data: {st.name}: {st.n_in} in, {st.out} out "
                 f"({', '.join(f'{k} {v}' for k, v in st.splits.items() if v)}), "
                 f"{st.dropped} dropped, {st.duplicates} duplicates")

    def check_result(self) -> None:
        t = self.totals()
        if t["out"] == 0:
            first = next((s.first_invalid for s in self.per_source if s.first_invalid), None) or next(
                (f"{s.problems[0]['where']}: {s.problems[0]['reason']}" for s in self.per_source if s.problems), None)
            raise PayloadError(
                f"data: no valid records remain ({t['in']} read, {t['dropped']} dropped, {t['duplicates']} "
                f"duplicates){'; first problem: ' + first if first else ''}; fix the sources in data.sources"
            )
        if t["train"] == 0:
            raise PayloadError("data: the train split is empty; give at least one source a train share in "
                               "data.sources[*].split")

    def totals(self) -> dict:
        t = {k: sum(getattr(s, a) for s in self.per_source) for k, a in
             (("in", "n_in"), ("out", "out"), ("dropped", "dropped"), ("invalid", "invalid"),
              ("duplicates", "duplicates"))}
        for name in SPLITS:
            t[name] = sum(s.splits[name] for s in self.per_source)
        return t

    def stats(self, status: str) -> dict:
        return {
            "status": status,
            "format_version": FORMAT_VERSION,
            "seed": self.data.seed,
            "dedup": self.data.dedup,
            "tokenizer": tokenizer_id(self.tokenizer),
            "max_tokens": self.data.max_tokens,
            "max_tokens_applied": bool(self.data.max_tokens and self.tokenizer is not None),
            "totals": self.totals(),
            "sources": {s.name: s.as_dict() for s in self.per_source},
            "token_lengths": percentiles(self.lengths),
        }


def rejected_tail(msgs: list[dict]) -> bytes:
    """Take the `rejected` turn off a preference record; its bytes as the line's `"rejected"` key."""
    last = msgs.pop()
    return b', "rejected": ' + json.dumps(last["content"], ensure_ascii=False).encode("utf-8")


def log_summary(stats: dict, out: Path, seconds: float, log: Callable[[str], None]) -> None:
    t = stats["totals"]
    rate = t["in"] / seconds if seconds > 0 else 0.0
    log(f"data: wrote {out}: train {t['train']}, val {t['val']}, test {t['test']} "
        f"(in {t['in']}, dropped {t['dropped']}, duplicates {t['duplicates']}) "
        f"in {seconds:.1f}s, {rate:,.0f} records/s")


def _pct(x: float) -> str:
    return f"{x * 100:.3g}%"

