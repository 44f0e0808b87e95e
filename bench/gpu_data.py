"""Synthetic chat records at real lengths: runbook 000's mix (bench_packing.lengths: ~84% persona
chats, median 450 tokens; ~16% long reasoning chats, median 1400), counted in tokens of the
tokenizer the model trains with. Text is random words; only the lengths matter for speed/memory."""

from __future__ import annotations

import json
import random
from pathlib import Path

from bench_packing import lengths

WORDS = ("the model reads data and learns to answer questions about numbers colours rivers and the sea "
         "a journey of a thousand miles begins with one step plants turn light into sugar checkpoints "
         "save the state so training can resume after the machine is gone budget time loss step").split()


def tokens_per_word(tokenizer, rnd: random.Random) -> float:
    sample = " ".join(rnd.choice(WORDS) for _ in range(2000))
    return len(tokenizer(sample, add_special_tokens=False)["input_ids"]) / 2000


def write_records(path: Path, tokenizer, n: int, max_length: int, seed: int = 42) -> dict:
    """Write `n` user/assistant records whose chat-template length follows the mix; returns stats."""
    rnd = random.Random(seed)
    per_word = tokens_per_word(tokenizer, rnd)
    overhead = len(tokenizer.apply_chat_template(
        [{"role": "user", "content": "x"}, {"role": "assistant", "content": "x"}], tokenize=True))
    targets = lengths(n, max_length, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for target in targets:
            words = max(2, int((target - overhead) / per_word))
            q = max(1, words // 10)
            text = [rnd.choice(WORDS) for _ in range(words)]
            rec = {"messages": [{"role": "user", "content": " ".join(text[:q])},
                                {"role": "assistant", "content": " ".join(text[q:])}]}
            f.write(json.dumps(rec) + "\n")
    return {"records": n, "target_mean_tokens": round(sum(targets) / n, 1), "max_length": max_length,
            "tokens_per_word": round(per_word, 3)}
