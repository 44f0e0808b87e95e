"""Preflight stage: cheap checks before any GPU minute is spent.

    python -m payload preflight --config run.yaml

Each check gives `ok`, `warn` or `fail` with one line of detail; any `fail` raises PayloadError
listing the failing lines (`stage`: `main(cfg)` runs them all; its docstring lists them).

The group: `stage` (the stage: every check, one line each), `local` (this machine), `remote` (Hub,
W&B), `base` (the check type), `versions` (the installed packages against the payload's minimums).
It may import config/, model/ (memory, attention, dims) and the base; it runs as its own stage.
This face re-exports the checks and the memory estimate they use.
"""

from __future__ import annotations

from payload.model.memory import (  # noqa: F401  (re-exported: preflight's public face)
    GIB,
    ModelDims,
    dims_from_config,
    dims_from_name,
    estimate_gpu_memory_gb,
    estimate_stage_memory_gb,
    lora_trainable_params,
)
from payload.preflight.base import Check, log  # noqa: F401  (re-exported)
from payload.preflight.local import (  # noqa: F401  (re-exported)
    check_cuda,
    check_data,
    check_disk,
    check_gpu_memory,
    check_model,
    check_token,
    check_versions,
    check_writable,
    disk_needs,
    gpu_info,
)
from payload.preflight.remote import check_remote, offline_reason  # noqa: F401  (re-exported)
from payload.preflight.stage import main, run_checks  # noqa: F401  (re-exported)
