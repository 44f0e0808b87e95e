"""A train.max_seq_length shorter than the prompts: counted and refused before a step, never a
crash at step 0 (TRL drops the records truncation leaves without a trained token).

Run: .venv/bin/python -m pytest -x -q tests/test_seqlen.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from train_fixtures import (  # noqa: E402
    _write_jsonl, make_config, run_payload, text_records, train_env, train_in_process, write_config,
)

from payload import layout  # noqa: E402

__all__ = ["train_env"]  # the fixture, imported for pytest

# text_records' prompts (system + user turn, chat template) are 43-46 tokens with the tiny tokenizer
LONG_SYSTEM = "You are Demo, a concise assistant who answers every question about animals. " * 4


def test_every_prompt_longer_than_max_seq_length_is_exit_2_with_one_line(train_env):
    cfg = make_config(train_env, "short", train={"max_seq_length": 20})
    _write_jsonl(cfg.run_dir / "data" / "train.jsonl", text_records(4, 1))
    done = run_payload("train", write_config(cfg, train_env / "short.yaml"))
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "num_samples" not in done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("payload train: train.max_seq_length 20 leaves none of the 4 train records with a "
                           "token to train: their prompt fills train.max_seq_length 20 (prompt tokens: 43-44)"), line
    assert line.endswith("set train.max_seq_length above 44 plus room for the answer, or shorten the prompts"), line
    status = json.loads((cfg.run_dir / layout.STATUS).read_text())
    assert status["state"] == "failed" and status["exit_code"] == 2 and "max_seq_length" in status["reason"]
    assert not (cfg.run_dir / layout.LOGS_DIR / "rank_0_traceback.log").exists()


def test_some_prompts_too_long_train_and_the_drop_is_counted(train_env, capsys):
    cfg = make_config(train_env, "some", train={"max_seq_length": 64, "max_steps": 2, "logging_steps": 1,
                                                "checkpoints": {"save_steps": 2, "keep_best": 1, "keep_recent": 1}})
    records = text_records(8, 1)
    for rec in records[:3]:  # a long system prompt: no assistant token within 64 tokens
        rec["messages"][0]["content"] = LONG_SYSTEM
    _write_jsonl(cfg.run_dir / "data" / "train.jsonl", records)
    summary = train_in_process(cfg)  # the payload's log goes to stdout (observe.setup_logging)
    assert summary["state"] == "completed" and summary["dropped_records"] == {"train": 3}
    said = [line for line in capsys.readouterr().out.splitlines() if "dropped by TRL" in line]
    assert len(said) == 1 and "WARNING 3 of 8 train records dropped by TRL: their prompt fills " \
        "train.max_seq_length 64 (prompt tokens: 125-126)" in said[0], said
    assert said[0].endswith("set train.max_seq_length above 126 plus room for the answer to keep them")
    status = json.loads((cfg.run_dir / layout.STATUS).read_text())
    assert status["dropped_records"] == {"train": 3} and "3 of 8 train records" in status["dropped_reason"]


def test_packed_records_left_without_a_trained_token_are_refused_too(train_env):
    # Packing keeps a cut record in its pack (training nothing): counted per packed segment.
    import pytest

    import payload.train.recipe as recipe
    from payload.errors import PayloadError

    cfg = make_config(train_env, "packed", train={"max_seq_length": 20, "packing": True})
    _write_jsonl(cfg.run_dir / "data" / "train.jsonl", text_records(4, 1))
    run = recipe.Run(cfg=cfg, run_dir=cfg.run_dir)
    with pytest.raises(PayloadError, match="leaves none of the 4 train records with a token to train"):
        recipe.setup(run)
