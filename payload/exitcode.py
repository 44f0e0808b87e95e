"""The exit code a rendered `run` script ends with when a stage fails (torch-free, stdlib only).

    python -m payload.exitcode --config CFG --since EPOCH_S CODE

prints the code to `exit` with. torchrun exits 1 whatever its worker did (payload/train/torchrun.py
passes a deliberate code on, not a crash's), so the payload's own code (`exit_code` in the run's
status.json, written by rank 0 on every end) wins when status.json was written after `--since` (this
attempt) and says something more specific than success. Otherwise the
stage's own code stands (`python -m payload data` exits with its real code).

Only EXIT_TRANSIENT and EXIT_INTERRUPTED are retried (the rendered `job_recovery` lists them in
`recover_on_exit_codes`), and SkyPilot retries those without limit. So on node 0 this also counts
retryable ends that made no training progress (same `step` in status.json) in `retries.json` beside
it; past LAUNCH_MAX_RETRIES (the profile's cluster.max_restarts_on_errors) in a row it gives up with
EXIT_CRASH, which is not retried, and says why in status.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from payload.errors import EXIT_CRASH, RETRYABLE_EXIT_CODES
from payload.layout import read_json

DEFAULT_MAX_RETRIES = 3
CLOCK_SLACK_S = 30  # a network volume stamps mtimes with its own clock; recoveries take minutes
RETRIES = "retries.json"


def _write_json(path: Path, data: dict) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def recorded_code(run_dir: Path, since: float) -> Optional[int]:
    """status.json's `exit_code` if it was written at or after `since` (epoch seconds)."""
    path = run_dir / "status.json"
    try:
        if path.stat().st_mtime < since - CLOCK_SLACK_S:  # a previous attempt's end
            return None
    except OSError:
        return None
    code = read_json(path).get("exit_code")
    return code if isinstance(code, int) and not isinstance(code, bool) else None


def bound_retries(run_dir: Path, code: int, max_retries: int) -> tuple[int, Optional[str]]:
    """(code, reason): EXIT_CRASH with a reason once retryable ends repeat without progress."""
    status = read_json(run_dir / "status.json")
    step = status.get("step") if isinstance(status.get("step"), int) else None
    seen = read_json(run_dir / RETRIES)
    streak = seen.get("streak", 0) + 1 if seen.get("step") == step else 1
    _write_json(run_dir / RETRIES, {"step": step, "streak": streak, "last_code": code})
    if streak <= max_retries:
        return code, None
    reason = (f"exit {code} (retryable) {streak} times in a row without training progress (step {step}); "
              f"not retrying: see the log, fix, then `launch up --resume`")
    _write_json(run_dir / "status.json", {**status, "state": "failed", "exit_code": EXIT_CRASH, "reason": reason})
    return EXIT_CRASH, reason


def job_exit_code(run_dir: Path, stage_code: int, since: float, node_rank: int = 0,
                  max_retries: int = DEFAULT_MAX_RETRIES) -> tuple[int, Optional[str]]:
    """The code the job exits with after a stage exited `stage_code` (non-zero)."""
    recorded = recorded_code(run_dir, since)
    code = recorded if recorded else stage_code
    if code in RETRYABLE_EXIT_CODES and node_rank == 0:
        return bound_retries(run_dir, code, max_retries)
    return code, None


def _run_dir(config: str) -> Path:
    from payload.config import load_run_config

    return load_run_config(config).run_dir  # LAUNCH_VOLUME / LAUNCH_RUN_ID applied


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m payload.exitcode", description=__doc__.splitlines()[0])
    p.add_argument("code", type=int, help="the failed stage's exit code")
    p.add_argument("--config", required=True, help="resolved run config (sky/config/<profile>.yaml)")
    p.add_argument("--since", type=float, default=time.time(), help="when this attempt started (epoch s)")
    args = p.parse_args(argv)
    try:
        run_dir = _run_dir(args.config)
    except Exception as e:  # noqa: BLE001 - never hide the stage's own code behind a second failure
        print(f"payload.exitcode: {e}; exiting with the stage's code {args.code}", file=sys.stderr)
        print(args.code)
        return 0
    max_retries = int(os.environ.get("LAUNCH_MAX_RETRIES") or DEFAULT_MAX_RETRIES)
    rank = int(os.environ.get("SKYPILOT_NODE_RANK") or 0)
    code, reason = job_exit_code(run_dir, args.code, args.since, rank, max_retries)
    if reason:
        print(f"launch: {reason}", file=sys.stderr)
    print(code)
    return 0


if __name__ == "__main__":
    sys.exit(main())
