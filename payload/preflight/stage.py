"""The preflight stage: cheap checks before any GPU minute is spent.

    python -m payload preflight --config run.yaml

Each check gives `ok`, `warn` or `fail` with one line of detail; any `fail` raises PayloadError
listing the failing lines. Checks: data sources readable (local files exist and are non-empty; hub
ids checked for syntax), base model reference, run directory and HF cache writable, free disk
against what the run will write, HF_TOKEN present where needed (presence only, the value is never
shown), the installed packages against the payload's minimums (payload/preflight/versions.py), the
GPU-memory estimate against the GPU, and, over the network (runbook 002's pre-flight; skipped with
LAUNCH_PREFLIGHT_OFFLINE=1 or HF_HUB_OFFLINE=1): each Hub dataset reachable, the base model on the
Hub, WANDB_API_KEY valid (`remote`: when each is ok, fail or warn).

Model size comes from payload.model.dims.model_dims (tiny config, local or cached `config.json`, else
the name). The checks themselves are in `local` and `remote`; this module runs them in order.
"""

from __future__ import annotations

import os
from dataclasses import asdict

from payload.errors import PayloadError
from payload.model.dims import model_dims
from payload.preflight.base import Check, log
from payload.preflight.local import (
    check_cuda,
    check_data,
    check_disk,
    check_gpu_memory,
    check_model,
    check_token,
    check_versions,
    check_writable,
)
from payload.preflight.remote import check_remote


# ---------------------------------------------------------------------------------------- stage


def run_checks(cfg, env=None) -> tuple[list[Check], dict]:
    env = os.environ if env is None else env
    checks = [*check_data(cfg), check_model(cfg), *check_writable(cfg, env)]
    try:
        dims = model_dims(cfg, env)
    except Exception as e:  # noqa: BLE001 - a malformed config.json must not hide the other checks
        dims = None
        checks.append(Check("model_shape", "warn", f"could not read the model shape: {e}"))
    checks += [check_disk(cfg, dims, env), check_token(cfg, env), check_versions(cfg)]
    checks += [c for c in (check_cuda(env),) if c is not None]
    checks += check_remote(cfg, env)  # Hub datasets/model exist, W&B key valid (network; see below)
    if getattr(cfg, "stages", None):  # every stage must fit (DPO: pairs + reference, GRPO: generations)
        from payload.config.stages import stage_run_config

        estimate: dict = {}  # the largest stage's
        for i, stage in enumerate(cfg.stages):
            gpu_check, est = check_gpu_memory(stage_run_config(cfg, i), dims, env)
            checks.append(Check(f"gpu_memory[{stage.label}]", gpu_check.status, gpu_check.detail))
            estimate = est if i == 0 or est.get("total_gb", 0) > estimate.get("total_gb", 0) else estimate
        return checks, estimate
    gpu_check, estimate = check_gpu_memory(cfg, dims, env)
    checks.append(gpu_check)
    return checks, estimate


def main(cfg, env=None) -> dict:
    """Run every check, log one line each; raise PayloadError listing the failures."""
    checks, estimate = run_checks(cfg, env)
    for c in checks:
        (log.warning if c.status != "ok" else log.info)(c.line())
    failed = [c for c in checks if c.status == "fail"]
    if failed:
        # the stage runner names the stage (`payload preflight: ...`, the run's reason `preflight: ...`)
        raise PayloadError(f"{len(failed)} check(s) failed: " +
                           " | ".join(f"{c.name}: {c.detail}" for c in failed))
    return {"stage": "preflight", "ok": True, "warnings": sum(c.status == "warn" for c in checks),
            "checks": [asdict(c) for c in checks], "memory": estimate}
