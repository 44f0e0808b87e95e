"""Regenerate the bundled demo data (deterministic; same bytes every run).

    .venv/bin/python bench/make_demo_samples.py   # writes payload/samples/demo_{chat,alpaca}.jsonl

demo_chat.jsonl is shaped like runbook 000's glm data: chat `messages`, many assistant turns with
`<think>...</think>` blocks, system prompts empty or missing (a few set), a few exact duplicates.
demo_alpaca.jsonl is runbook 001's alpaca shape, some records with an empty `input`.
The text is simple templated Q&A about numbers and colours, so a tiny model visibly learns it in a
few dozen steps.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "payload" / "samples"
THINGS = [("a banana", "yellow"), ("grass", "green"), ("the sky on a clear day", "blue"), ("snow", "white"),
          ("coal", "black"), ("a ripe tomato", "red"), ("an orange", "orange"), ("a violet", "purple"),
          ("a lemon", "yellow"), ("a fire truck", "red"), ("the sea", "blue"), ("milk", "white"),
          ("a frog", "green"), ("a crow", "black"), ("a strawberry", "red"), ("a lime", "green"),
          ("chocolate", "brown"), ("a pumpkin", "orange"), ("a cloud", "white"), ("soil", "brown"),
          ("a plum", "purple"), ("the sun", "yellow"), ("a pine tree", "green"), ("a flamingo", "pink"),
          ("a blueberry", "blue")]
COLOUR_QUESTIONS = ["What colour is {}?", "Which colour is {}?", "Tell me the colour of {}.",
                    "What is the colour of {}?"]


class Pools:
    """Shuffled pools of distinct (question, reasoning, answer) triples, one per template."""

    def __init__(self, rng: random.Random):
        plus = [(f"What is {a} plus {b}?", f"{a} plus {b} equals {a + b}.", f"{a} plus {b} is {a + b}.")
                for a in range(1, 13) for b in range(1, 13)]
        colour = [(q.format(t), f"{t.capitalize()} is {c}.", f"{t.capitalize()} is {c}.")
                  for t, c in THINGS for q in COLOUR_QUESTIONS]
        after = [(f"What number comes after {n}?", f"{n} plus one is {n + 1}.", f"After {n} comes {n + 1}.")
                 for n in range(150)]
        double = [(f"What is double {n}?", f"{n} times two is {2 * n}.", f"Double {n} is {2 * n}.")
                  for n in range(1, 101)]
        self.pools = [plus, colour, after, double]
        for pool in self.pools:
            rng.shuffle(pool)
        self.used = [0, 0, 0, 0]

    def take(self, i: int) -> tuple[str, str, str]:
        kind = i % 4
        pool, k = self.pools[kind], self.used[kind]
        self.used[kind] += 1
        return pool[k % len(pool)]


def chat_records(n: int = 294, duplicates: int = 6) -> list[str]:
    pools = Pools(random.Random(1234))
    lines = []
    for i in range(n):
        question, reasoning, answer = pools.take(i)
        reply = f"<think>{reasoning}</think>\n\n{answer}" if i % 2 == 0 else answer
        msgs = [{"role": "user", "content": question}, {"role": "assistant", "content": reply}]
        if i % 7 == 3:  # a second turn
            q2, _r, a2 = pools.take(i + 1)
            msgs += [{"role": "user", "content": q2}, {"role": "assistant", "content": a2}]
        system = ("", None, "You are a helpful assistant.")[0 if i % 5 < 2 else 1 if i % 5 < 4 else 2]
        if system is not None:
            msgs.insert(0, {"role": "system", "content": system})
        lines.append(json.dumps({"messages": msgs}, ensure_ascii=False))
    for k in range(duplicates):  # exact copies of earlier lines, spread through the file
        lines.insert(40 * (k + 1), lines[17 * k + 5])
    return lines


def alpaca_records(n: int = 150) -> list[str]:
    rng = random.Random(99)
    pairs = [(x, y) for x in range(1, 13) for y in range(1, 13)]
    colours = [(q.format(t), c) for t, c in THINGS for q in COLOUR_QUESTIONS]
    starts = list(range(1, 101))
    for pool in (pairs, colours, starts):
        rng.shuffle(pool)
    lines = []
    for i in range(n):
        k = i // 3
        if i % 3 == 0:
            x, y = pairs[k]
            rec = {"instruction": "Add the two numbers.", "input": f"{x} and {y}", "output": f"{x + y}."}
        elif i % 3 == 1:  # no input: the user turn is the instruction alone
            question, colour = colours[k]
            rec = {"instruction": question, "input": "", "output": f"{colour.capitalize()}."}
        else:
            seq = ", ".join(str(v) for v in range(starts[k], starts[k] + 4))
            rec = {"instruction": "Continue the count for four numbers.", "input": f"Start at {starts[k]}.",
                   "output": f"{seq}."}
        lines.append(json.dumps(rec, ensure_ascii=False))
    return lines


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, lines in (("demo_chat.jsonl", chat_records()), ("demo_alpaca.jsonl", alpaca_records())):
        path = OUT / name
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        print(f"{path}: {len(lines)} records, {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
