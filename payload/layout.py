"""Where everything of a run lives on the volume: `{volume}/runs/{run_id}/`, and where each artifact
lands at home: `{dest}/{run_id}/`.

Both sides use these names: the payload writes the run directory and its MANIFEST, the launcher
fetches `ARTIFACTS` into the local layout and verifies them against that MANIFEST. Keep them here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

RESOLVED_CONFIG = "config.yaml"  # resolved run config, written at start of every stage
DATA_DIR = "data"  # train.jsonl, val.jsonl, test.jsonl, data_stats.json, .complete
CHECKPOINTS_DIR = "checkpoints"  # checkpoint-<step>/ with COMPLETE marker written last
COMPLETE_MARKER = "COMPLETE"
LOGS_DIR = "logs"  # run.log (launcher), rank_<N>_traceback.log
METRICS = "metrics.jsonl"
COST = "cost.json"  # accumulated seconds and dollars across restarts
LEASE = "lease.json"  # who trains the run now (payload/volume/lease.py)
STATUS = "status.json"  # state, step, loss, cost_usd, eta_s, updated_at: read by `launch status`
OUTPUTS_DIR = "outputs"
ADAPTER_DIR = "outputs/adapter"  # best adapter (or final full weights for method: full)
MERGED_DIR = "outputs/merged"
MLX_DIR = "outputs/mlx"
GGUF_DIR = "outputs/gguf"  # <profile>-<TYPE>.gguf per outputs.export_gguf type (payload/outputs/gguf.py)
STAGE_ADAPTERS = "outputs/stages"  # <i>-<name>/adapter: every stage's adapter of a run with `stages:`
SUMMARY = "outputs/training_summary.json"
LOSS_PLOT = "outputs/loss.png"
HIGH_LOSS = "outputs/high_loss_samples.jsonl"
CHECKPOINT_LISTING = "outputs/checkpoints.json"  # step, bytes, eval loss, complete: one row per checkpoint
MANIFEST = "outputs/MANIFEST.json"  # every artifact's bytes + sha256, written on the machine after `post`
DATA_STATS = "data/data_stats.json"
RUN_LOG = "logs/run.log"


@dataclass(frozen=True)
class Artifact:
    """One thing `launch down --fetch-artifacts` brings home."""

    name: str
    """Its path under `{dest}/{run_id}/` (the local layout)."""
    source: str
    """Its path under the run directory on the machine."""
    directory: bool = False
    on_request: bool = False
    """Fetched only when asked (`--merged`: a merged 32B model is 65 GB). Still in the MANIFEST."""
    live: bool = False
    """Still written after the MANIFEST (logs): copied as found, never checksummed."""
    grows: bool = False
    """Appended to while the run trains: a copy of a live run may be longer than its listing."""


ARTIFACTS = (
    Artifact("adapter", ADAPTER_DIR, directory=True),
    Artifact("merged", MERGED_DIR, directory=True, on_request=True),
    Artifact("mlx", MLX_DIR, directory=True),
    Artifact("gguf", GGUF_DIR, directory=True),
    Artifact("stages", STAGE_ADAPTERS, directory=True),
    Artifact("training_summary.json", SUMMARY),
    Artifact("metrics.jsonl", METRICS, grows=True),
    Artifact("loss.png", LOSS_PLOT),
    Artifact("data_stats.json", DATA_STATS),
    Artifact("high_loss_samples.jsonl", HIGH_LOSS),
    Artifact("checkpoints.json", CHECKPOINT_LISTING),
    Artifact("eval_test.json", "outputs/eval_test.json"),  # payload eval: scores + every prediction
    Artifact("eval_val.json", "outputs/eval_val.json"),
    Artifact("logs", LOGS_DIR, directory=True, live=True, grows=True),
)
LOCAL_MANIFEST = "MANIFEST.json"  # the machine's MANIFEST, as fetched and verified, at {dest}/{run_id}/

# What a completed run must have produced (the MANIFEST adds what its config asked for: mlx, merged).
REQUIRED_WHEN_COMPLETED = ("adapter", "training_summary.json", "metrics.jsonl")


def artifact_for(rel: str) -> tuple[Artifact, str] | None:
    """(artifact, local name) for a run-dir-relative file path, or None when no artifact holds it.
    `rel` must already be a normalized relative POSIX path (see `clean_relpath`)."""
    for a in ARTIFACTS:
        if rel == a.source and not a.directory:
            return a, a.name
        if a.directory and rel.startswith(a.source + "/"):
            return a, a.name + rel[len(a.source):]
    return None


def source_for(name: str) -> str | None:
    """The run-dir-relative source of a local-layout file name, or None outside the layout."""
    for a in ARTIFACTS:
        if name == a.name and not a.directory:
            return a.source
        if a.directory and name.startswith(a.name + "/"):
            return a.source + name[len(a.name):]
    return None


def clean_relpath(value: object) -> str | None:
    """`value` as a normalized relative POSIX path, or None when it is not one: absolute, empty,
    with `..`/`.`/empty parts, a backslash, or control characters. Paths from outside (a remote
    listing, bucket keys, a MANIFEST) go through this before anything is written for them."""
    if not isinstance(value, str) or not value or len(value) > 4096:
        return None
    if any(ord(c) < 32 or c == "\x7f" or c == "\\" for c in value):
        return None
    parts = value.split("/")
    if value.startswith("/") or any(p in ("", ".", "..") for p in parts):
        return None
    return str(PurePosixPath(value))


def run_dir(volume: str | Path, run_id: str) -> Path:
    return Path(volume) / "runs" / run_id


def read_json(path: str | Path) -> dict:
    """A run's JSON file (status.json, retries.json, a record beside an output) as a dict: {} when it
    is missing, unreadable, not JSON or not an object. The payload's readers and the local backend's
    `status` share it."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
