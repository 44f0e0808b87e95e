"""A run is one experiment: what may change when it resumes, and the check the payload makes itself.

Keys are dotted paths of the resolved config (`train.learning_rate`, `data.sources.0.path`; a list
of plain values is one key). A resume may change cadence and money (budget, logging/eval/save
steps, max_steps/epochs to extend training, outputs, evaluation, W&B); a key that changes the math
of the run in flight (model, data recipe, method, lora, learning rate or schedule, sequence length,
batch shape, seed) is refused unless the change was allowed on purpose (`launch up --resume
--allow-change KEY`, which reaches the payload as LAUNCH_ALLOW_CHANGE=KEY[,KEY...]).

The launcher checks before anything starts (launcher/runs/experiment.py); the payload checks again
against the resolved config it wrote into the run directory when the run started, so a resume by
plain `sky jobs launch` gets the same protection. Every accepted change is appended to the run's
`config_history.jsonl` (when, key, old -> new, allowed or cadence).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, Iterable

from payload import layout
from payload.errors import PayloadError

ALLOW_ENV = "LAUNCH_ALLOW_CHANGE"
HISTORY = "config_history.jsonl"

# Sections whose keys change what the run computes, and the few cluster keys that change batch shape.
MATH_SECTIONS = ("model", "data", "train", "stages")
MATH_KEYS = ("cluster.num_nodes",)
# Inside those sections: keys that only change cadence, bookkeeping, memory or speed, never the math.
# The attention kernel and padding-free batches compute the same loss on the same records per step
# (tests/payload/train/test_padding_free.py holds padded and padding-free to the same loss and gradients);
# `train.packing` changes which records share a step and stays a math key.
CADENCE_KEYS = ("train.max_steps", "train.epochs", "train.logging_steps", "train.eval_steps",
                "train.per_device_eval_batch_size", "train.early_stopping_patience", "train.high_loss_samples",
                "train.report_to", "train.checkpoints", "train.gradient_checkpointing",
                "model.attn_implementation", "train.padding_free")
# Never compared: where and as what the run lives, filled on the machine.
IGNORED_KEYS = ("runtime", "description")


def matches(key: str, prefixes: Iterable[str]) -> bool:
    """Whether `key` is one of `prefixes` or lies under one (`train.lora` covers `train.lora.r`)."""
    return any(key == p or key.startswith(p + ".") for p in prefixes)


def changes_math(key: str) -> bool:
    """Whether changing `key` on a run in flight changes what it computes (a stage's keys as train's)."""
    parts = key.split(".")
    if len(parts) > 3 and parts[0] == "stages" and parts[2] == "train":  # a stage's overrides of train:
        key = ".".join(parts[2:])
    if matches(key, CADENCE_KEYS):
        return False
    return parts[0] in MATH_SECTIONS or matches(key, MATH_KEYS)


def math_hash(cfg) -> str:
    """Hash of the keys that change what a run computes (`changes_math`; cadence keys such as
    train.max_steps left out), with the stage it trains: a checkpoint records it, so resuming with
    more steps is not "a different config"."""
    flat = {k: v for k, v in flatten(cfg.model_dump(mode="json")).items() if changes_math(k)}
    stage = cfg.stage_info() if hasattr(cfg, "stage_info") else None
    body = json.dumps({"config": flat, "stage": stage}, sort_keys=True, default=str)
    return hashlib.sha256(body.encode()).hexdigest()[:12]


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """{dotted key: value}; a list of plain values stays one value, a list of sections is indexed."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
        out = {}
        for i, v in enumerate(value):
            out.update(flatten(v, f"{prefix}.{i}"))
        return out
    return {prefix: value}


def diff(old: dict, new: dict) -> dict[str, tuple[Any, Any]]:
    """{key: (old, new)} for every flattened key that differs (a key only one side has included)."""
    a = {k: v for k, v in flatten(old).items() if not matches(k, IGNORED_KEYS)}
    b = {k: v for k, v in flatten(new).items() if not matches(k, IGNORED_KEYS)}
    return {k: (a.get(k), b.get(k)) for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)}


def allowed_from_env(environ=None) -> tuple[str, ...]:
    raw = (environ if environ is not None else os.environ).get(ALLOW_ENV, "")
    return tuple(k.strip() for k in raw.split(",") if k.strip())


def refused(changes: dict, allowed: Iterable[str]) -> list[str]:
    """The changed keys that change the math and were not allowed."""
    allowed = tuple(allowed)
    return [k for k in changes if changes_math(k) and not matches(k, allowed)]


def refusal(keys: list[str], changes: dict, how: str) -> str:
    """One line: the first refused key with old -> new, and the two ways out."""
    key = keys[0]
    old, new = changes[key]
    more = f" (and {len(keys) - 1} more: {', '.join(keys[1:])})" if len(keys) > 1 else ""
    return (f"{key}: {brief(old)} -> {brief(new)} would change the math of the run in flight{more}; "
            f"start a new run instead ({how} --new), or accept it on purpose with --allow-change {key} "
            "(recorded with the run)")


def entry(changes: dict, allowed: Iterable[str], by: str) -> dict:
    """One history record: when, by whom, each key old -> new, and which math changes were allowed."""
    allowed = tuple(allowed)
    return {"at": time.time(), "by": by,
            "changes": {k: [old, new] for k, (old, new) in changes.items()},
            "allowed": [k for k in changes if changes_math(k) and matches(k, allowed)]}


def brief(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) <= 40 else text[:37] + "..."


def check_resume(run_dir: Path, config: dict, environ=None) -> dict:
    """Compare the config this process is about to train with the run's recorded resolved config
    (none recorded: a new run, nothing to compare). Refuse (PayloadError, exit 2) a math change that
    LAUNCH_ALLOW_CHANGE does not name; append any accepted change to the run's history. Returns
    {key: (old, new)}."""
    import yaml

    path = Path(run_dir) / layout.RESOLVED_CONFIG
    try:
        old = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return {}
    if not isinstance(old, dict):
        return {}
    changes = diff(old, config)
    allowed = allowed_from_env(environ)
    bad = refused(changes, allowed)
    if bad:
        raise PayloadError(f"resume: {refusal(bad, changes, 'a new run id, or `launch up PROFILE`')}; "
                           f"the payload's flag is {ALLOW_ENV}={bad[0]}")
    if changes:
        with (Path(run_dir) / HISTORY).open("a", encoding="utf-8") as f:
            f.write(json.dumps(entry(changes, allowed, "payload"), default=str) + "\n")
    return changes


def write_resolved(run_dir: Path, text: str) -> None:
    """Write the resolved config (`dump_run_config`'s YAML) into the run directory, after checking
    it against the one recorded there (`check_resume`)."""
    import yaml

    check_resume(run_dir, yaml.safe_load(text))
    (Path(run_dir) / layout.RESOLVED_CONFIG).write_text(text, encoding="utf-8")
