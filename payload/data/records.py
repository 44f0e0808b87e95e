"""Raw record (a dict from any reader) -> canonical chat messages, validating as it goes.

Every problem raises `RecordError` whose text is one line saying what is wrong and where inside the
record (`messages[2].role ...`); the pipeline prefixes it with `file:line`. Three raw shapes are
understood:

- chat `messages` (runbook 000; ShareGPT `conversations` with `from`/`value` is accepted too),
- alpaca `instruction` / `input` / `output` (runbook 001; an optional `system` column is kept);
  `instruction_as: user` puts instruction and input together in the user turn, `instruction_as:
  system` makes the instruction the system turn and the input the user turn (runbook 001's layout),
- `prompt` / `question` / `response` (runbook 004 CSV; `prompt` becomes the system turn),
- `image` / `text` (format `image_text`, OCR sets such as runbook 002's well-log headers: the user
  turn is the image and the source's `instruction`, the assistant turn the text).

Vision-language content parts `{"type": "image", "image": ...}` reference a local file or carry the
image itself; `payload.data.images` checks and stores them. A part `{"type": "image"}` without a
reference takes the next entry of the record's `images` column (the Hugging Face convention). Image
paths in the output are absolute.
"""

from __future__ import annotations

import json
from typing import Any, Iterator, Optional

from .images import ImageContext, resolve_image
from .problems import Dropped, RecordError, tname

__all__ = ["Dropped", "ImageContext", "RecordError", "canonicalize", "first_required", "tname"]

ROLE_ALIASES = {
    "system": "system",
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "gpt": "assistant",
    "model": "assistant",
    "bot": "assistant",
}

# Columns (after `columns:` renames) each format needs; `auto` accepts any of these sets.
REQUIRED_COLUMNS = {
    "messages": ({"messages"}, {"conversations"}),
    "alpaca": ({"instruction", "output"},),
    "prompt_response": ({"question", "response"},),
    "image_text": ({"image", "text"},),
    "preference": ({"chosen", "rejected"}, {"text"}),
    "prompt_answer": ({"prompt", "answer"}, {"question", "answer"}),
}
REJECTED = "rejected"  # role of the extra last turn `canonicalize` returns for preference records


def detect_format(obj: dict) -> str:
    """Pick the record shape from its keys (format `auto`)."""
    if "messages" in obj or "conversations" in obj:
        return "messages"
    if "instruction" in obj:
        return "alpaca"
    if "question" in obj:
        return "prompt_response"
    keys = ", ".join(sorted(map(str, obj))[:8]) or "none"
    raise RecordError(
        "missing key",
        f"expected 'messages', 'instruction'/'output' or 'question'/'response'; found keys: {keys}",
    )


def canonicalize(obj: Any, fmt: str, images: ImageContext, instruction: str = "",
                 instruction_as: str = "user") -> list[dict]:
    """Validate one raw record and return its messages `[{role, content}, ...]` (not yet transformed)."""
    if not isinstance(obj, dict):
        raise RecordError("wrong type", f"record is {tname(obj)}, expected an object")
    if fmt == "auto":
        fmt = detect_format(obj)
    if fmt == "messages":
        msgs = from_messages(obj, images)
    elif fmt == "alpaca":
        msgs = from_alpaca(obj, instruction_as)
    elif fmt == "image_text":
        msgs = from_image_text(obj, images, instruction)
    elif fmt in ("preference", "prompt_answer"):
        return from_prompt_record(obj, fmt, images)
    else:
        msgs = from_prompt_response(obj)
    for m in msgs:
        if m["role"] == "assistant":
            c = m["content"]
            if (c and not c.isspace()) if type(c) is str else not is_empty(c):
                return msgs
    raise RecordError("no assistant turn", "a training record needs a non-empty assistant reply")


def _text(obj: dict, key: str, fmt: str, required: bool) -> str:
    if key not in obj or obj[key] is None:
        if required:
            raise RecordError("missing key", f"no '{key}'; {fmt} records need {_need(fmt)}")
        return ""
    v = obj[key]
    if not isinstance(v, str):
        raise RecordError("wrong type", f"'{key}' is {tname(v)}, expected a string")
    return v


def _need(fmt: str) -> str:
    return {"alpaca": "'instruction' and 'output'", "prompt_response": "'question' and 'response'",
            "image_text": "'image' and 'text'",
            "preference": "'prompt' (or 'question'), 'chosen' and 'rejected'",
            "prompt_answer": "'prompt' (or 'question') and 'answer'"}[fmt]


def from_alpaca(obj: dict, instruction_as: str = "user") -> list[dict]:
    """`instruction_as: user`: user = instruction + blank line + input. `system` (runbook 001, LLaMA-
    Factory `template: qwen` as the runbook describes it): system = instruction (after a `system`
    column when there is one), user = input; an empty input leaves an empty user turn (dropped)."""
    instruction = _text(obj, "instruction", "alpaca", True)
    output = _text(obj, "output", "alpaca", True)
    extra = _text(obj, "input", "alpaca", False)
    system = _text(obj, "system", "alpaca", False)
    if instruction_as == "system":
        system = f"{system}\n\n{instruction}" if system.strip() else instruction
        user = extra
    else:
        user = f"{instruction}\n\n{extra}" if extra.strip() else instruction
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": user},
        {"role": "assistant", "content": output},
    ]


def from_image_text(obj: dict, images: ImageContext, instruction: str) -> list[dict]:
    """An OCR pair: `image` (path, bytes or a decoded image) and its target `text`."""
    if obj.get("image") is None:
        raise RecordError("missing key", "no 'image'; image_text records need 'image' and 'text'")
    text = _text(obj, "text", "image_text", True)
    user = [{"type": "image", "image": resolve_image(obj["image"], "image", images)}]
    if instruction:
        user.append({"type": "text", "text": instruction})
    return [{"role": "user", "content": user}, {"role": "assistant", "content": text}]


def from_prompt_response(obj: dict) -> list[dict]:
    system = _text(obj, "prompt", "prompt_response", False)
    question = _text(obj, "question", "prompt_response", True)
    response = _text(obj, "response", "prompt_response", True)
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": question},
        {"role": "assistant", "content": response},
    ]


def from_prompt_record(obj: dict, fmt: str, images: ImageContext) -> list[dict]:
    """A preference record (DPO) or a prompt with its answer (GRPO) as chat turns: the user turn (the
    record's images first, then the prompt), the chosen reply / the answer as the assistant turn,
    and for preferences the rejected reply as a last turn of role `rejected` (the pipeline moves it
    to the record's `rejected` key). RLHF-V keeps question/chosen/rejected as JSON in `text`."""
    if fmt == "preference" and "chosen" not in obj and isinstance(obj.get("text"), str):
        try:
            inner = json.loads(obj["text"])
        except ValueError:
            raise RecordError("wrong type", "'text' is not JSON with question/chosen/rejected (RLHF-V)") from None
        if not isinstance(inner, dict):
            raise RecordError("wrong type", f"'text' holds {tname(inner)}, expected an object (RLHF-V)")
        obj = {**obj, **inner}
    key = "prompt" if "prompt" in obj else "question"
    prompt = _text(obj, key, fmt, True)
    pool = _image_pool(obj)
    parts = [{"type": "image", "image": resolve_image(ref, f"images[{i}]", images)} for i, ref in enumerate(pool)]
    user = parts + [{"type": "text", "text": prompt}] if parts else prompt
    msgs = [{"role": "system", "content": _text(obj, "system", fmt, False)}, {"role": "user", "content": user}]
    if fmt == "prompt_answer":
        answer = obj.get("answer")
        if isinstance(answer, (int, float)) and not isinstance(answer, bool):
            answer = str(answer)
        if not isinstance(answer, str) or not answer.strip():
            raise RecordError("missing key", "no non-empty 'answer'; prompt_answer records need 'prompt' and 'answer'")
        return msgs + [{"role": "assistant", "content": answer}]
    chosen, rejected = _text(obj, "chosen", fmt, True), _text(obj, "rejected", fmt, True)
    if not chosen.strip() or not rejected.strip():
        raise RecordError("no assistant turn", "a preference record needs non-empty 'chosen' and 'rejected'")
    return msgs + [{"role": "assistant", "content": chosen}, {"role": REJECTED, "content": rejected}]


def from_messages(obj: dict, images: ImageContext) -> list[dict]:
    key = "messages" if "messages" in obj or "conversations" not in obj else "conversations"
    msgs = obj.get(key)
    if msgs is None:
        keys = ", ".join(sorted(map(str, obj))[:8]) or "none"
        raise RecordError("missing key", f"no '{key}' list (found keys: {keys}); messages records need "
                          "'messages' (or ShareGPT 'conversations'), or set the source's format/columns")
    if isinstance(msgs, str):  # CSV / Parquet cells holding the list as JSON text
        try:
            msgs = json.loads(msgs)
        except ValueError:
            raise RecordError("wrong type", f"'{key}' is a string that is not a JSON list") from None
    if not isinstance(msgs, list):
        raise RecordError("wrong type", f"'{key}' is {tname(msgs)}, expected a list of turns")
    pool, out, aliases = None, [], ROLE_ALIASES
    for i, m in enumerate(msgs):
        if type(m) is dict:  # fast path: a plain text turn with a canonical role
            role, content = m.get("role"), m.get("content")
            role = aliases.get(role) if type(role) is str else None
            if role is not None and type(content) is str:
                out.append({"role": role, "content": content})
                continue
        where = f"{key}[{i}]"
        if not isinstance(m, dict):
            raise RecordError("wrong type", f"{where} is {tname(m)}, expected an object")
        if pool is None:
            pool = _image_pool(obj)
        out.append({"role": _role(m, where), "content": _content(m, where, images, pool)})
    return out


def _role(m: dict, where: str) -> str:
    raw = m.get("role", m.get("from"))
    if raw is None:
        raise RecordError("missing key", f"{where} has no 'role'")
    if not isinstance(raw, str):
        raise RecordError("wrong type", f"{where}.role is {tname(raw)}, expected a string")
    role = ROLE_ALIASES.get(raw) or ROLE_ALIASES.get(raw.strip().lower())
    if role is None:
        raise RecordError(
            "unknown role",
            f"{where}.role {raw[:40]!r}; expected system, user or assistant (or human, gpt, model, bot)",
        )
    return role


def _content(m: dict, where: str, images: ImageContext, pool: Iterator) -> Any:
    if "content" in m:
        c = m["content"]
    elif "value" in m:
        c = m["value"]
    else:
        raise RecordError("missing key", f"{where} has no 'content'")
    if isinstance(c, str):
        return c
    if c is None:
        return ""
    if isinstance(c, list):
        return _parts(c, f"{where}.content", images, pool)
    raise RecordError("wrong type", f"{where}.content is {tname(c)}, expected a string or a list of parts")


def _parts(parts: list, where: str, images: ImageContext, pool: Iterator) -> Any:
    out, has_image = [], False
    for j, p in enumerate(parts):
        pw = f"{where}[{j}]"
        if isinstance(p, str):
            p = {"type": "text", "text": p}
        if not isinstance(p, dict):
            raise RecordError("wrong type", f"{pw} is {tname(p)}, expected an object")
        kind = p.get("type")
        if kind == "text":
            text = p.get("text")
            if not isinstance(text, str):
                raise RecordError("wrong type", f"{pw}.text is {tname(text)}, expected a string")
            if text:
                out.append({"type": "text", "text": text})
        elif kind == "image":
            ref = p.get("image", p.get("path"))
            if ref is None:
                ref = next(pool, None)
                if ref is None:
                    raise RecordError("missing key", f"{pw} has no 'image' and the record has no images left")
            out.append({"type": "image", "image": resolve_image(ref, pw, images)})
            has_image = True
        else:
            raise RecordError("wrong type", f"{pw} has type {str(kind)[:30]!r}; supported: text, image")
    if not has_image:  # text-only lists become a plain string (what chat templates do with them anyway)
        return "".join(p["text"] for p in out)
    return out


def _image_pool(obj: dict) -> Iterator:
    col = obj.get("images", obj.get("image"))
    if col is None:
        return iter(())
    return iter(col if isinstance(col, list) else [col])


def is_empty(content: Any) -> bool:
    if type(content) is str:
        return not content or content.isspace()
    return not any(p["type"] == "image" or p["text"].strip() for p in content)


def first_required(fmt: str) -> Optional[tuple]:
    """The column sets a format needs (for file-level header checks)."""
    if fmt == "auto":  # image_text, preference and prompt_answer are never guessed: their sets say so
        return tuple(s for f, sets in REQUIRED_COLUMNS.items()
                     if f not in ("image_text", "preference", "prompt_answer") for s in sets)
    return REQUIRED_COLUMNS[fmt]
