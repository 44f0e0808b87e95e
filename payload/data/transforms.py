"""Per-source transforms on canonical messages, the content hash, and the split assignment.

Order (fixed): strip `<think>` from assistant turns -> inject the named system prompt where the
system turn is missing or empty -> drop empty turns. The content hash is taken after that, over the
messages only (not the source name), so the same conversation from two sources is one duplicate.
The split of a record is a function of (seed, content hash) alone: it does not depend on the order
of the records or of the other sources, and identical records always land in the same split.
"""

from __future__ import annotations

import hashlib
import json
import re
from array import array
from typing import Any, Optional

from .records import Dropped, RecordError, is_empty

SPLITS = ("train", "val", "test")

_encode = json.JSONEncoder(ensure_ascii=False, sort_keys=True).encode  # == json.dumps(..., same flags)
_THINK_BLOCK = re.compile(r"<think>.*?</think>\s*", re.S)


def strip_think(text: str) -> str:
    """Remove reasoning blocks. A lone `</think>` (opening tag left in the prompt) drops everything
    before it; a lone `<think>` (unclosed, truncated reasoning) drops everything after it."""
    if "<think>" not in text and "</think>" not in text:
        return text
    text = _THINK_BLOCK.sub("", text)
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    if "<think>" in text:
        text = text.split("<think>", 1)[0]
    return text.strip()


def _strip_content(content: Any) -> Any:
    if isinstance(content, str):
        return strip_think(content)
    parts = []
    for p in content:
        if p["type"] == "text":
            text = strip_think(p["text"])
            if text:
                parts.append({"type": "text", "text": text})
        else:
            parts.append(p)
    return parts


def apply_transforms(msgs: list[dict], strip: bool, system_prompt: Optional[str]) -> list[dict]:
    """Return the transformed messages; raises `Dropped` when no assistant content is left."""
    if strip:
        for m in msgs:
            if m["role"] == "assistant":
                m["content"] = _strip_content(m["content"])
    if system_prompt is not None:
        if msgs and msgs[0]["role"] == "system":
            if is_empty(msgs[0]["content"]):
                msgs[0]["content"] = system_prompt
        else:
            msgs.insert(0, {"role": "system", "content": system_prompt})
    kept, replied = [], False
    for m in msgs:
        c = m["content"]
        if (c and not c.isspace()) if type(c) is str else not is_empty(c):
            kept.append(m)
            replied = replied or m["role"] == "assistant"
    if not replied:
        raise Dropped("empty after transforms", "the assistant turns held only <think> blocks")
    return kept


def encode_messages(msgs: list[dict]) -> tuple[bytes, bytes]:
    """Canonical JSON bytes of the messages and their 16-byte content hash."""
    text = _encode(msgs)
    try:
        body = text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise RecordError("invalid unicode", f"lone surrogate {text[e.start]!r} in a string") from None
    return body, hashlib.blake2b(body, digest_size=16).digest()


def record_line(body: bytes, source_tail: bytes) -> bytes:
    """The output line; equals json.dumps({"messages":..., "source":...}, sort_keys=True, ensure_ascii=False)."""
    return b'{"messages": ' + body + source_tail


def source_tail(name: str) -> bytes:
    return b', "source": ' + json.dumps(name, ensure_ascii=False).encode("utf-8") + b"}\n"


class Splitter:
    """Deterministic split from (seed, content hash) with per-source ratios."""

    def __init__(self, seed: int, split: Any):
        self.key = str(seed).encode()[:64]
        if isinstance(split, str):
            self.only: Optional[str] = split
            self.bounds: list[tuple[float, str]] = []
        else:
            self.only = None
            acc, self.bounds = 0.0, []
            for name in SPLITS:
                ratio = split.get(name, 0.0)
                if ratio > 0:
                    acc += ratio
                    self.bounds.append((acc, name))

    def __call__(self, digest: bytes) -> str:
        if self.only is not None:
            return self.only
        h = hashlib.blake2b(digest, digest_size=8, key=self.key).digest()
        u = int.from_bytes(h, "big") / 18446744073709551616.0  # 2**64
        for bound, name in self.bounds:
            if u < bound:
                return name
        return self.bounds[-1][1]


# ------------------------------------------------------------------------------------- tokenizer


def text_tokenizer(tokenizer):
    """A processor (vision-language) measures with its text tokenizer: fast and image-free; each
    image then counts as its placeholder tokens only, not the expanded image tokens."""
    if hasattr(tokenizer, "image_processor") and hasattr(tokenizer, "tokenizer"):
        return tokenizer.tokenizer
    return tokenizer


def token_length(tokenizer, msgs: list[dict]) -> int:
    """Length of the chat-templated record in tokens."""
    try:
        ids = tokenizer.apply_chat_template(msgs, tokenize=True, return_dict=False)
    except Exception as e:  # noqa: BLE001 - any template/tokenizer failure is reported on this record, not raised
        raise Dropped("tokenizer failed", f"{type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''}")
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    if ids and isinstance(ids[0], list):
        ids = ids[0]
    return len(ids)


def tokenizer_id(tokenizer) -> Optional[str]:
    """What identifies a tokenizer for the cache key (name, vocabulary size, template)."""
    if tokenizer is None:
        return None
    template = getattr(tokenizer, "chat_template", None) or ""
    name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
    size = len(tokenizer) if hasattr(tokenizer, "__len__") else 0
    tdig = hashlib.sha256(str(template).encode()).hexdigest()[:12]
    return f"{name}|{size}|{tdig}"


def percentiles(lengths: array) -> Optional[dict]:
    """Nearest-rank p50/p90/p99/max of token lengths (None when nothing was measured)."""
    if not lengths:
        return None
    s = sorted(lengths)
    n = len(s)

    def rank(p: float) -> int:
        return s[min(n - 1, max(0, int(-(-p * n // 100)) - 1))]

    return {"count": n, "p50": rank(50), "p90": rank(90), "p99": rank(99), "max": s[-1],
            "mean": round(sum(s) / n, 1)}
