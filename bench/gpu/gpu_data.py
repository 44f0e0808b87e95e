"""Synthetic records at real lengths, and learnable, so the rows show the loss falling.

Text: runbook 000's mix (bench_packing.lengths: ~84% persona chats, median 450 tokens; ~16% long
reasoning chats, median 1400), counted in tokens of the tokenizer the model trains with. The user
turn is random words; the assistant turn (the only one in the loss) walks a fixed cycle of words from
a random start, so each next word follows from the last: a model learns it in a few steps.

Images (the images mode): runbook 002's well-log headers: PNG pages of text lines and rules at its
size (gpu_modes.IMAGES), each with its own fixed transcription, as `image` / `text` records.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from bench_packing import lengths

WORDS = ("the model reads data and learns to answer questions about numbers colours rivers and the sea "
         "a journey of a thousand miles begins with one step plants turn light into sugar checkpoints "
         "save the state so training can resume after the machine is gone budget time loss step").split()
CYCLE = list(dict.fromkeys(WORDS))  # each word once: its successor in the cycle is unique


def cycle_words(start: int, n: int) -> list[str]:
    return [CYCLE[(start + i) % len(CYCLE)] for i in range(n)]


def chat_len(tokenizer, messages: list[dict]) -> int:
    """Tokens of a chat after the template (transformers 5 returns a dict from apply_chat_template)."""
    return len(tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"])


def tokens_per_word(tokenizer, rnd: random.Random) -> float:
    sample = " ".join(rnd.choice(WORDS) for _ in range(2000))
    return len(tokenizer(sample, add_special_tokens=False)["input_ids"]) / 2000


def write_records(path: Path, tokenizer, n: int, max_length: int, seed: int = 42, text: str = "random") -> dict:
    """Write `n` user/assistant records whose chat-template length follows the mix; returns stats
    (the data description a result file keeps). `text="cycle"`: the learnable records the harness
    trains on now; `"random"` (the default): the random-word records of the tables committed before
    2026-11-27, rebuilt exactly (tests/payload/model/test_memory_measured.py rebuilds their batches)."""
    rnd = random.Random(seed)
    per_word = tokens_per_word(tokenizer, rnd)
    pair = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "x"}]
    # those tables counted the template's overhead as 2 tokens (the length of the dict that
    # transformers 5 returns), not its 12: kept for them, counted right for the learnable records
    overhead = chat_len(tokenizer, pair) if text == "cycle" else 2
    targets = lengths(n, max_length, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for target in targets:
            words = max(2, int((target - overhead) / per_word))
            q = max(1, words // 10)
            if text == "cycle":
                rec = {"messages": [{"role": "user", "content": " ".join(rnd.choice(WORDS) for _ in range(q))},
                                    {"role": "assistant",
                                     "content": " ".join(cycle_words(rnd.randrange(len(CYCLE)), words - q))}]}
            else:
                words_ = [rnd.choice(WORDS) for _ in range(words)]
                rec = {"messages": [{"role": "user", "content": " ".join(words_[:q])},
                                    {"role": "assistant", "content": " ".join(words_[q:])}]}
            f.write(json.dumps(rec) + "\n")
    return {"records": n, "target_mean_tokens": round(sum(targets) / n, 1), "max_length": max_length,
            "tokens_per_word": round(per_word, 3), "text": text}


def header_image(size: tuple[int, int], lines: list[str], seed: int):
    """A well-log-header-like page: a ruled grid and text lines, black on white (PIL)."""
    from PIL import Image, ImageDraw

    w, h = size
    rnd = random.Random(seed)
    img = Image.new("RGB", (w, h), "white")
    draw = ImageDraw.Draw(img)
    step = max(12, h // 24)
    for y in range(step, h, step * 4):
        draw.line([(0, y), (w, y)], fill=(40, 40, 40), width=2)
    for x in range(w // 3, w, w // 3):
        draw.line([(x, 0), (x, h)], fill=(40, 40, 40), width=2)
    for i, text in enumerate(lines):
        y = 4 + i * step
        if y > h - step:
            break
        draw.text((6 + rnd.randrange(20), y), text, fill=(0, 0, 0))
    return img


def write_image_records(path: Path, tokenizer, n: int, size: tuple[int, int], text_tokens: int,
                        distinct: int, seed: int = 42) -> dict:
    """`n` records {"image", "text"} over `distinct` PNG pages in PATH's folder `images/`."""
    rnd = random.Random(seed)
    per_word = tokens_per_word(tokenizer, rnd)
    folder = path.parent / "images"
    folder.mkdir(parents=True, exist_ok=True)
    pages = []
    for i in range(distinct):
        words = cycle_words(rnd.randrange(len(CYCLE)), max(4, int(text_tokens / per_word)))
        text = " ".join(words)
        img = folder / f"header-{i:02d}-{size[0]}x{size[1]}.png"
        if not img.is_file():
            header_image(size, [" ".join(words[j:j + 8]) for j in range(0, len(words), 8)], seed + i).save(img)
        pages.append({"image": str(img.resolve()), "text": text})
    with open(path, "w", encoding="utf-8") as f:
        for k in range(n):
            f.write(json.dumps(pages[k % distinct]) + "\n")
    return {"records": n, "image_size": list(size), "image_tokens": image_tokens(size),
            "text_tokens": text_tokens, "distinct_images": distinct}


def image_tokens(size: tuple[int, int]) -> int:
    """Qwen3-VL tokens of an image whose sides are multiples of 32 within the processor's pixel
    limits (patch 16, 2x2 merge: one token per 32x32 pixels)."""
    return (size[0] // 32) * (size[1] // 32)
