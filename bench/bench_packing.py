"""Real-token fraction per step with and without packing, on a runbook-000-shaped length mix.

    .venv/bin/python bench/bench_packing.py
    .venv/bin/python bench/bench_packing.py --records 2000 --max-length 2048 --batch 4

Lengths (tokens after the chat template) are synthetic but shaped like runbook 000's data:
~84% Sonia persona chats (log-normal, median 450) and ~16% glm reasoning chats with `<think>`
stripped (log-normal, median 1400), clipped to [32, max_length]; 10,600 training records. The
batches are built by the same code the training uses: TRL's `DataCollatorForLanguageModeling`
(padding to the longest record of each batch) in the Trainer's seeded random order, and TRL's
`pack_dataset(..., "bfd")` + padding-free collation for packing. The fraction is computed exactly
as `LaunchTrainer.compute_loss` logs it: non-pad tokens / tokens in the batch tensor.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics


def lengths(n: int, max_length: int, seed: int) -> list[int]:
    rnd = random.Random(seed)
    out = []
    for _ in range(n):
        median, sigma = (1400, 0.6) if rnd.random() < 0.16 else (450, 0.55)
        out.append(int(min(max(rnd.lognormvariate(math.log(median), sigma), 32), max_length)))
    return out


def fraction(batch) -> float:
    if "attention_mask" in batch:
        return float(batch["attention_mask"].sum()) / batch["input_ids"].numel()
    return 1.0  # padding-free: one flat row of real tokens


def unpacked(lens: list[int], batch: int, seed: int) -> dict:
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    collate = DataCollatorForLanguageModeling(pad_token_id=0)
    order = list(range(len(lens)))
    random.Random(seed).shuffle(order)
    fracs, slots = [], 0
    for i in range(0, len(order), batch):
        ex = [{"input_ids": [1] * lens[j]} for j in order[i:i + batch]]
        b = collate(ex)
        fracs.append(fraction(b))
        slots += b["input_ids"].numel()
    return {"steps": len(fracs), "mean_fraction": statistics.mean(fracs), "overall_fraction": sum(lens) / slots,
            "tokens_computed": slots}


def packed(lens: list[int], batch: int, max_length: int) -> dict:
    from datasets import Dataset
    from datasets.utils.logging import disable_progress_bar
    from trl.data_utils import pack_dataset
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    disable_progress_bar()
    ds = Dataset.from_dict({"input_ids": [[1] * n for n in lens]})
    rows = pack_dataset(ds, max_length, "bfd")
    collate = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True)
    fracs, computed, fill = [], 0, []
    for i in range(0, len(rows), batch):
        ex = [rows[j] for j in range(i, min(i + batch, len(rows)))]
        b = collate(ex)
        fracs.append(fraction(b))
        computed += b["input_ids"].numel()
        fill += [sum(r["seq_lengths"]) / max_length for r in ex]
    return {"steps": len(fracs), "mean_fraction": statistics.mean(fracs), "overall_fraction": sum(lens) / computed,
            "tokens_computed": computed, "rows": len(rows), "row_fill": statistics.mean(fill)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=10_600)
    ap.add_argument("--max-length", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=2, help="per-device batch size (runbook 000: 2)")
    ap.add_argument("--seed", type=int, default=42)
    a = ap.parse_args()
    lens = lengths(a.records, a.max_length, a.seed)
    u, p = unpacked(lens, a.batch, a.seed), packed(lens, a.batch, a.max_length)
    print(f"{a.records} records, median {statistics.median(lens):.0f} tokens, mean {statistics.mean(lens):.0f}, "
          f"max_length {a.max_length}, per-device batch {a.batch}")
    print(f"  no packing : real-token fraction {u['mean_fraction']:.3f} per step (overall {u['overall_fraction']:.3f}), "
          f"{u['steps']} micro-batches")
    print(f"  packing bfd: real-token fraction {p['mean_fraction']:.3f} per step (overall {p['overall_fraction']:.3f}), "
          f"{p['steps']} micro-batches of {p['rows']} packed rows, rows {p['row_fill']:.1%} full")
    print(json.dumps({"records": a.records, "max_length": a.max_length, "batch": a.batch, "unpacked": u, "packed": p}))


if __name__ == "__main__":
    main()
