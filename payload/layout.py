"""Where everything of a run lives on the volume: `{volume}/runs/{run_id}/`.

The launcher fetches artifacts by these relative paths; keep them in one place.
"""

from __future__ import annotations

from pathlib import Path

RESOLVED_CONFIG = "config.yaml"  # resolved run config, written at start of every stage
DATA_DIR = "data"  # train.jsonl, val.jsonl, test.jsonl, data_stats.json, .complete
CHECKPOINTS_DIR = "checkpoints"  # checkpoint-<step>/ with COMPLETE marker written last
COMPLETE_MARKER = "COMPLETE"
LOGS_DIR = "logs"  # run.log (launcher), rank_<N>_traceback.log
METRICS = "metrics.jsonl"
COST = "cost.json"  # accumulated seconds and dollars across restarts
LEASE = "lease.json"  # who trains the run now (payload/lease.py)
STATUS = "status.json"  # state, step, loss, cost_usd, eta_s, updated_at: read by `launch status`
OUTPUTS_DIR = "outputs"
ADAPTER_DIR = "outputs/adapter"  # best adapter (or final full weights for method: full)
MERGED_DIR = "outputs/merged"
MLX_DIR = "outputs/mlx"
SUMMARY = "outputs/training_summary.json"
LOSS_PLOT = "outputs/loss.png"
HIGH_LOSS = "outputs/high_loss_samples.jsonl"
DATA_STATS = "data/data_stats.json"

# What `launch down --fetch-artifacts` brings home (directories are copied whole).
ARTIFACTS = (ADAPTER_DIR, SUMMARY, METRICS, LOSS_PLOT, DATA_STATS)


def run_dir(volume: str | Path, run_id: str) -> Path:
    return Path(volume) / "runs" / run_id
