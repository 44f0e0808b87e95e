"""Manifest stage: what the run produced, with checksums computed here, on the machine that has the bytes.

    python -m payload manifest --config run.yaml    # also the last step of `post`

Writes `{run_dir}/outputs/checkpoints.json` (one row per checkpoint: step, bytes, eval loss,
complete) and then `{run_dir}/outputs/MANIFEST.json`: every file of every artifact in
`layout.ARTIFACTS` that exists (keyed by its local-layout name, e.g. `adapter/adapter_model.safetensors`)
with its size and sha256, streamed in 8 MiB blocks by a few threads (hashlib releases the GIL, and
the files were just written, so they are usually in the page cache), plus which artifacts the
launcher must find for this run (`required`). The launcher verifies every file it fetches against
this, by streaming as well, and refuses to tear down a machine whose artifacts did not come home intact.

A run that ends before `post` (stopped by `launch down`'s request, the budget, or a signal) gets the
same two files from the end of its training (`at_end`, called by payload/train/recipe.py; for a run
with `stages:`, by payload/train/stages.py after it gathered the stages' outputs so far): what it has
then (checkpoint listing, metrics, summary, plot, the adapters of finished stages) with its state and
nothing required, so a fetch after any stop is verified against the machine's checksums too. A
session that trains again removes it first (`forget`): a MANIFEST describes a run that ended, never
one that is training.

Symlinks are never followed nor listed: an artifact is a regular file inside the run directory.
Live artifacts (logs) are left out: they change after this is written. Torch-free.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional

from payload import layout
from payload.volume.checkpoints import checkpoint_listing
from payload.volume.checksums import file_digest, regular_files
from payload.volume.observe import atomic_write_json, now_iso

log = logging.getLogger("payload.manifest")

HASH_THREADS = 8
FORMAT = 1


def required_artifacts(cfg, state: Optional[str]) -> list[str]:
    """Artifact names the launcher must find for this run: none unless it completed."""
    if state != "completed":
        return []
    names = list(layout.REQUIRED_WHEN_COMPLETED)
    if cfg.outputs.export_mlx:
        names.append("mlx")
    if cfg.outputs.export_gguf:
        names.append("gguf")
    if cfg.outputs.merge:
        names.append("merged")
    return names


def build(run_dir: Path, required: list[str], run_id: Optional[str] = None, state: Optional[str] = None,
          threads: int = HASH_THREADS) -> dict:
    """The manifest of what exists under `run_dir` (does not write it)."""
    run_dir = Path(run_dir)
    files: dict[str, Path] = {}
    for a in layout.ARTIFACTS:
        if a.live or a.source == layout.MANIFEST:
            continue
        for rel, path in regular_files(run_dir, a.source).items():
            found = layout.artifact_for(rel)
            if found:
                files[found[1]] = path
    with ThreadPoolExecutor(max(1, threads)) as pool:
        sums = dict(zip(files, pool.map(file_digest, files.values())))
    present = {n.split("/")[0] for n in files}
    return {
        "format": FORMAT, "run_id": run_id, "state": state, "written_at": now_iso(), "algorithm": "sha256",
        "required": required, "missing": [n for n in required if n not in present],
        "files": {name: {"bytes": size, "sha256": digest} for name, (size, digest) in sums.items()},
    }


def main(cfg, state: Optional[str] = None) -> dict:
    """Write the checkpoint listing, then the manifest (last, atomically). Returns a short summary.
    `state` is the run's end (default: what its training summary says)."""
    rd = cfg.run_dir
    state = state or _summary_state(rd)
    atomic_write_json(rd / layout.CHECKPOINT_LISTING, checkpoint_listing(rd))
    manifest = build(rd, required_artifacts(cfg, state), cfg.runtime.run_id, state)
    atomic_write_json(rd / layout.MANIFEST, manifest)
    total = sum(f["bytes"] for f in manifest["files"].values())
    log.info("manifest: %d files, %.1f MB, sha256 in %s", len(manifest["files"]), total / 1e6,
             rd / layout.MANIFEST)
    if manifest["missing"]:
        log.warning("manifest: this run should have produced %s but did not", ", ".join(manifest["missing"]))
    return {"files": len(manifest["files"]), "bytes": total, "missing": manifest["missing"]}


def at_end(cfg, state: str) -> Optional[dict]:
    """The MANIFEST of a run whose training ended without `post` (rank 0; before its status.json says
    it ended, except after a signal, whose deadline the end's record comes first in): `main`'s, and a
    warning instead of an exception when the disk refuses (the stop itself and its checkpoint matter
    more; a fetch then checks sizes only)."""
    try:
        return main(cfg, state)
    except OSError as e:
        log.warning("manifest: could not write %s at the %s end (%s); a fetch checks sizes only",
                    cfg.run_dir / layout.MANIFEST, state, e.strerror or e)
        return None


def forget(run_dir: Path) -> None:
    """Remove the MANIFEST of an earlier end: this session trains on, and its files will change."""
    try:
        (Path(run_dir) / layout.MANIFEST).unlink()
        log.info("removed the MANIFEST of the run's earlier end: it is training again")
    except FileNotFoundError:
        pass


def _summary_state(run_dir: Path) -> Optional[str]:
    """The training state the summary recorded ("completed" once training finished)."""
    import json

    try:
        state = json.loads((run_dir / layout.SUMMARY).read_text()).get("state")
    except (OSError, ValueError, AttributeError):
        return None
    return "completed" if state in ("completed", "stopped_early") else state
