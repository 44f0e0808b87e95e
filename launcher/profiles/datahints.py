"""What a missing data file must hold: its fields by `format:` and a 3-line example, for the one
line `launch validate` prints about it (runbook 003's SFT and GRPO sets are the user's own)."""

from __future__ import annotations

_CHAT = '{"messages": [{"role": "user", "content": "%s"}, {"role": "assistant", "content": "%s"}]}'
_VL_CHAT = ('{"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "%s"}]}, '
            '{"role": "assistant", "content": "%s"}], "images": ["%s"]}')
_QA = (("How many chairs are there?", "Three.", "room1.jpg"), ("Is the cup left of the plate?", "Yes.", "table2.jpg"),
       ("What is behind the sofa?", "A lamp.", "room3.jpg"))

FIELDS = {
    "messages": "JSONL, one object per line with `messages` (role system/user/assistant + content)",
    "alpaca": "JSONL with `instruction`, `output` and optional `input`",
    "prompt_response": "CSV with the columns `prompt` (system turn, may be empty), `question`, `response`",
    "image_text": "JSONL with `image` (a path under image_root) and its transcription `text`",
    "preference": "JSONL with `prompt`, `chosen`, `rejected` and optional `image`",
    "prompt_answer": "JSONL with `prompt`, `answer` and optional `image` (a path under image_root)",
    "auto": "JSONL/CSV in one of the formats `messages`, `alpaca` or `prompt_response` (set `format:`)",
}


def examples(fmt: str, images: bool) -> list[str]:
    """Three example lines of a file in `fmt` (with image references when the source has image_root)."""
    if fmt in ("messages", "auto"):
        return [_VL_CHAT % qa if images else _CHAT % qa[:2] for qa in _QA]
    if fmt == "alpaca":
        return ['{"instruction": "Write in the style of H.P. Lovecraft.", "input": "A harbour at night.", '
                '"output": "The fog crept in from the sea."}',
                '{"instruction": "Summarize the text.", "input": "The meeting moved to Friday.", '
                '"output": "Meeting on Friday."}',
                '{"instruction": "Name a prime number.", "output": "7"}']
    if fmt == "prompt_response":
        return ["prompt,question,response", 'You are concise.,What is 2+2?,4', ',Name a prime.,7']
    if fmt == "image_text":
        return [f'{{"image": "header{i}.png", "text": "WELL: A-{i}  FIELD: NORTH"}}' for i in (1, 2, 3)]
    if fmt == "preference":
        return [f'{{"prompt": "{q}", "chosen": "{a}", "rejected": "I cannot tell."'
                + (f', "image": "{img}"' if images else "") + "}" for q, a, img in _QA]
    return [f'{{"prompt": "{q}", "answer": "{a.rstrip(".")}"' + (f', "image": "{img}"' if images else "") + "}"
            for q, a, img in _QA]


def missing_file_hint(src: dict) -> str:
    """`; it holds FIELDS (...), e.g.:` and three indented example lines, for a source dict of a profile."""
    fmt = src.get("format") if isinstance(src.get("format"), str) else "auto"
    fmt = fmt if fmt in FIELDS else "auto"
    root = src.get("image_root") if isinstance(src.get("image_root"), str) else None
    where = f", images under {root}/" if root else ""
    lines = "".join(f"\n      {line}" for line in examples(fmt, bool(root)))
    return f"; it holds your data, format {fmt}: {FIELDS[fmt]}{where}, e.g.:{lines}"
