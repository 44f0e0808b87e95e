"""Records and tokens of local data for `launch plan`, counted the way the data step will count them.

The payload's own data pipeline (payload/data/pipeline.py `prepare`) runs into a temporary
directory: the same `max_records`, filters, transforms, de-duplication and seeded split as
`python -m payload data`. The train split's records are then counted in tokens:
- text: with the model's tokenizer when its `tokenizer.json` is in the local Hugging Face cache
  (offline, `tokenizers` only), else ~CHARS_PER_TOKEN characters per token (an estimate, and the
  plan says so); each message adds CHAT_TOKENS_PER_MESSAGE template tokens (ChatML:
  `<|im_start|>role\\n ... <|im_end|>\\n`);
- images: the model's visual tokens for the image's pixels, capped at the processor's pixel limit:
  Qwen-VL processors cut images into 16x16 patches (14x14 for Qwen2/2.5-VL) merged 2x2 into one
  token, so tokens = min(pixels, max_pixels) / (2 x patch)^2 (Qwen3-VL's processor default
  max_pixels is 16,777,216; data.max_image_pixels lowers it).
The prompt of each record (up to its first assistant turn) is counted too: with assistant-only loss,
a prompt that fills train.max_seq_length leaves no token to train and TRL drops the record
(`untrained_records`: exact where the tokenizer and its chat template are cached).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from payload.errors import PayloadError

CHARS_PER_TOKEN = 4.0  # English text with a ~150k-token BPE (Qwen, Llama 3): ~4 characters per token
CHAT_TOKENS_PER_MESSAGE = 5
QWEN3_VL_MAX_PIXELS = 16_777_216


@dataclass
class Counted:
    records: int
    tokens: float
    test_records: int
    how: str
    lengths: Optional[list] = None
    """Tokens of each train record (what `launch plan` says packing would save is computed from them)."""
    untrained: int = 0
    """Train records whose prompt fills train.max_seq_length: TRL drops them (no trained token left)."""
    untrained_note: Optional[str] = None
    refusal: Optional[str] = None
    """Every train record loses its trained tokens, counted as SFTTrainer tokenizes them: the plan refuses."""


def count_local(p, base_dir: Path) -> Counted:
    """Prepare the profile's local data into a temporary directory and count the train split."""
    from payload.data.pipeline import prepare

    tok, how = _tokenizer(p.model)
    with tempfile.TemporaryDirectory(prefix="launch-plan-data-") as d:
        stats = prepare(p.data, d, base_dir=base_dir, log=lambda line: None)
        lengths, prompts, long = [], [], []
        masked = p.train.assistant_only_loss  # only then can a long prompt leave nothing to train
        with open(Path(d) / "train.jsonl", encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    rec = json.loads(line)
                    lengths.append(record_tokens(rec, tok, Path(d), p))
                    if masked:
                        prompts.append(record_tokens(_prompt_part(rec), tok, Path(d), p))
                        if prompts[-1] >= CANDIDATE_SHARE * p.train.max_seq_length - CANDIDATE_SLACK:
                            long.append(rec)
        untrained = untrained_records(p, prompts, long, tok is not None)
    return Counted(len(lengths), sum(lengths), int(stats["totals"].get("test") or 0),
                   f"counted like the data step (max_records, filters, split), {how}", lengths, *untrained)


# Records whose counted prompt comes this close to max_seq_length are tokenized exactly: the count
# approximates the chat template (a default system prompt, as Qwen2.5's, adds ~20 tokens).
CANDIDATE_SHARE, CANDIDATE_SLACK = 0.75, 64


def _prompt_part(rec: Any) -> Any:
    """The record up to its first assistant turn (what assistant-only loss masks before a trained token)."""
    if not isinstance(rec, dict) or not isinstance(rec.get("messages"), list):
        return rec
    msgs = rec["messages"]
    first = next((i for i, m in enumerate(msgs) if isinstance(m, dict) and m.get("role") == "assistant"), len(msgs))
    return {"messages": msgs[:first]}


def untrained_records(p, prompts: list, long: list, counted: bool) -> tuple[int, Optional[str], Optional[str]]:
    """(train records left without a trained token at train.max_seq_length, the plan's line about them,
    the refusal when that is every record and the count is exact: payload/data/preview.py's lines).

    The records whose counted prompt comes near the limit (`long`) are tokenized again as SFTTrainer
    does, with the model's tokenizer and chat template when they are cached here; else the counted
    prompts decide, an estimate said as one."""
    from payload.data import preview

    if not p.train.assistant_only_loss or not long:
        return 0, None, None
    exact = _exact_prompts(p, long)
    if exact is not None:
        return preview.untrained_lines(exact, len(prompts), p, "tokenized with the model's chat template", True)
    how = "counted with the model's tokenizer, chat template approximated" if counted else \
        f"estimated at ~{CHARS_PER_TOKEN:g} characters/token"
    return preview.untrained_lines(prompts, len(prompts), p, how + "; `launch data preview` tokenizes them "
                                   "exactly once the tokenizer is cached", False)


def _exact_prompts(p, records: list) -> Optional[list]:
    """Prompt tokens of `records` as SFTTrainer tokenizes them, or None without the cached tokenizer."""
    from payload.data import preview

    tokenizer, _why = preview.load_cached_tokenizer(p)
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        return None
    return preview.prompt_lengths(records, tokenizer, preview.training_template(tokenizer, True))


def record_tokens(rec: Any, tok, where: Path, p) -> float:
    """Tokens of one canonical record: its text, its images' visual tokens, the chat template."""
    texts, images, messages = [], [], 0
    _walk(rec, texts, images)
    if isinstance(rec, dict) and isinstance(rec.get("messages"), list):
        messages = len(rec["messages"])
    text = "\n".join(texts)
    n = len(tok.encode(text).ids) if tok is not None else len(text) / CHARS_PER_TOKEN
    return n + messages * CHAT_TOKENS_PER_MESSAGE + sum(image_tokens(ref, where, p) for ref in images)


def _walk(x: Any, texts: list, images: list) -> None:
    if isinstance(x, dict):
        if x.get("type") == "image" and "image" in x:
            images.append(x["image"])
            return
        for k, v in x.items():
            if k in ("role", "source", "type"):
                continue
            if k in ("image", "images") and v is not None:
                images.extend(v if isinstance(v, list) else [v])
                continue
            _walk(v, texts, images)
    elif isinstance(x, list):
        for v in x:
            _walk(v, texts, images)
    elif isinstance(x, str):
        texts.append(x)


def image_tokens(ref: Any, where: Path, p) -> float:
    """Visual tokens of one image at the processor's limit (module docstring)."""
    patch = 14 if any(v in p.model.name_or_path for v in ("Qwen2-VL", "Qwen2.5-VL")) else 16
    limit = min(QWEN3_VL_MAX_PIXELS, p.data.max_image_pixels)
    pixels = float(limit)
    if isinstance(ref, str):
        for path in (where / ref, Path(ref)):
            if path.is_file():
                try:
                    from PIL import Image

                    with Image.open(path) as im:
                        pixels = float(im.width * im.height)
                except (OSError, ValueError):
                    pass
                break
    return min(pixels, limit) / (2 * patch) ** 2


ESTIMATED = f"~{CHARS_PER_TOKEN:g} characters/token (estimate; the model's tokenizer is not cached here)"


def _tokenizer(model):
    """(tokenizers.Tokenizer or None, how the text is counted): the model's, from the local HF cache.
    A tiny model is built from config: its name is a label, no hub tokenizer of that name is the one it
    trains with, so none is looked up (the lookup imports huggingface_hub: ~0.1 s of every `launch up`,
    `plan` or `validate` of local-demo)."""
    if model.tiny is not None:
        return None, ESTIMATED
    name = model.name_or_path
    try:
        from huggingface_hub import try_to_load_from_cache
        from tokenizers import Tokenizer

        path = try_to_load_from_cache(name, "tokenizer.json")
        if isinstance(path, str):
            return Tokenizer.from_file(path), f"{name}'s tokenizer"
    except Exception:  # noqa: BLE001 - no cache, an odd model id: the estimate is used and labelled
        pass
    return None, ESTIMATED


_COUNTED: dict = {}  # (profile, base dir, its files' sizes and mtimes) -> Counted: counted once per command


def estimate_from_files(p, base_dir: Path) -> Optional[Counted]:
    """count_local, or None when a file cannot be read here (the plan falls back to file sizes).
    Data the run's data stage refuses (past the sample `validate` reads) is refused: one line. The
    same refusal for `plan` and for every check before `up` (launcher/profiles/checks.py `resolve`),
    counted once in a process that asks twice (`up`'s checks, then its plan)."""
    key = (p.model_dump_json(), str(base_dir), tuple(_stamp(base_dir, s.path) for s in p.data.sources))
    if key not in _COUNTED:
        _COUNTED[key] = _estimate_from_files(p, base_dir)
    return _COUNTED[key]


def _stamp(base_dir: Path, rel: Optional[str]) -> tuple:
    try:
        st = (base_dir / rel).stat() if rel else None
    except OSError:
        return (rel,)
    return (rel, st.st_size, st.st_mtime_ns) if st else (rel,)


def _estimate_from_files(p, base_dir: Path) -> Optional[Counted]:
    from launcher.profiles.profile import ProfileError

    try:
        counted = count_local(p, base_dir)
    except PayloadError as e:
        raise ProfileError([f"{p.name}: {e} (read in full to count its tokens; the run's data step would "
                            "refuse it the same way)"]) from None
    except (OSError, ValueError, KeyError):
        return None
    if counted.refusal:
        raise ProfileError([f"{p.name}: {counted.refusal}"])
    return counted
