"""Synthetic data and a three-stage (sft -> dpo -> grpo) config for tests/payload/train/test_stages.py."""

from __future__ import annotations

import json
import random
from pathlib import Path

REWARD_MODULE = '''
import json, os

def counting(prompts, completions, answer=None, **kwargs):
    """Records every call (how many completions, the answers) in $REWARD_LOG, rewards length."""
    path = os.environ.get("REWARD_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"n": len(completions), "answers": list(answer or [])}) + "\\n")
    return [(sum(map(ord, str(c))) % 7) / 7.0 for c in completions]
'''


def write_stage_data(root: Path, n: int = 16, seed: int = 0) -> dict:
    """SFT (messages), DPO (preference: flat and RLHF-V `text` rows), GRPO (prompt_answer) JSONL."""
    rnd = random.Random(seed)
    root.mkdir(parents=True, exist_ok=True)
    sft, pref, grpo = [], [], []
    for i in range(n):
        a, b = rnd.randint(1, 50), rnd.randint(1, 50)
        q = f"What is {a} plus {b}?"
        sft.append({"messages": [{"role": "user", "content": q},
                                 {"role": "assistant", "content": f"<think>add</think> {a + b}"}]})
        row = {"question": q, "chosen": f"{a + b}", "rejected": f"{a + b + rnd.randint(1, 9)}"}
        pref.append({"text": json.dumps(row), "ds_name": "synthetic"} if i % 2 else row)
        grpo.append({"prompt": q, "answer": a + b})
    paths = {}
    for name, rows in (("sft", sft), ("dpo", pref), ("grpo", grpo)):
        paths[name] = root / f"{name}.jsonl"
        paths[name].write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "my_rewards.py").write_text(REWARD_MODULE)
    paths["rewards"] = root / "my_rewards.py"
    return paths


def stage_config(volume: Path, data: dict, run_id: str = "staged", steps=(4, 4, 2), save_steps: int = 2):
    """A RunConfig from local-demo with three stages of a few steps each on `data`."""
    from payload.config import RunConfig
    from train_fixtures import demo_dict

    d = demo_dict()
    d["train"].update({"max_seq_length": 64, "per_device_batch_size": 2, "max_steps": steps[0],
                       "logging_steps": 1, "warmup_ratio": 0.0, "high_loss_samples": 0,
                       "checkpoints": {"save_steps": save_steps, "keep_best": 0, "keep_recent": 2}})
    d["data"] = {"sources": [{"name": "sft", "path": str(data["sft"]), "format": "messages"}]}
    d["stages"] = [
        {"kind": "sft"},
        {"kind": "dpo", "data": {"sources": [{"name": "pairs", "path": str(data["dpo"]), "format": "preference"}]},
         "train": {"max_steps": steps[1], "learning_rate": 5e-3}, "dpo": {"beta": 0.1}},
        {"kind": "grpo", "name": "rl",
         "data": {"sources": [{"name": "qa", "path": str(data["grpo"]), "format": "prompt_answer"}]},
         "train": {"max_steps": steps[2], "learning_rate": 5e-3},
         "grpo": {"num_generations": 2, "max_completion_length": 8, "beta": 0.04,
                  "rewards": ["number_match", "format", f"{data['rewards']}:counting"]}},
    ]
    d["runtime"] = {"volume": str(volume), "run_id": run_id}
    d["outputs"] = {"merge": False, "export_mlx": False}
    return RunConfig.model_validate(d)
