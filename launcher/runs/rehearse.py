"""Quick validation (runbook 002's `quick_val`): the same profile on the same backend, cut to
`max_steps` 10 on at most 100 records per source, so the whole path (provisioning, setup, data,
model, training, checkpoints, evaluation, W&B, artifacts) is checked for cents before the real run.

The cuts are `--set` overrides (launcher/profiles/profile.py `apply_override`) computed from the profile; the
run id carries `-rehearsal` so it never passes for the real run in the registry, status or W&B.
"""

from __future__ import annotations

REHEARSAL_STEPS = 10
REHEARSAL_RECORDS = 100
REHEARSAL_EVAL_SAMPLES = 8
SUFFIX = "-rehearsal"


def overrides(profile) -> tuple[str, ...]:
    """`KEY=VALUE` strings that turn `profile` (a loaded Profile) into its rehearsal."""
    steps = REHEARSAL_STEPS
    sets = [f"train.max_steps={steps}", f"train.eval_steps={max(steps // 2, 1)}",
            f"train.logging_steps={min(profile.train.logging_steps, 2)}",
            f"train.checkpoints.save_steps={max(steps // 2, 1)}"]
    for i, src in enumerate(profile.data.sources):
        limit = min(src.max_records or REHEARSAL_RECORDS, REHEARSAL_RECORDS)
        sets.append(f"data.sources.{i}.max_records={limit}")
    if profile.evaluation is not None:
        sets.append(f"evaluation.max_samples={min(profile.evaluation.max_samples, REHEARSAL_EVAL_SAMPLES)}")
        limit = profile.evaluation.max_test_samples or REHEARSAL_EVAL_SAMPLES
        sets.append(f"evaluation.max_test_samples={min(limit, REHEARSAL_EVAL_SAMPLES)}")
    if profile.wandb is not None:
        sets.append(f"wandb.tags={[*profile.wandb.tags, 'rehearsal']}")
    return tuple(sets)


def run_id_prefix(name: str) -> str:
    """`well-log-ocr-spot-rehearsal` (then the registry's `-YYYYmmdd-HHMMSS`)."""
    return f"{name}{SUFFIX}"


def is_rehearsal(run_id: str) -> bool:
    return SUFFIX + "-" in run_id
