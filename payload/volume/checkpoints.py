"""Checkpoints on the volume: completion marker with checksums, verified resume, retention, the
checkpoint index, per-rank loss state.

One idea: what a save leaves on the volume and how it is read back. When a save happens (the
save-time policy, a SIGTERM's save, the RunControl callback, the ranks' agreement) is the run's
control while training, in `payload/volume/control.py`; this module uses only its `gather_objects`,
to share a save's hashing over the ranks.

Layout: `{run_dir}/checkpoints/checkpoint-<step>/` as the Trainer writes it, plus the resolved
`config.yaml`, one `loss_state_<rank>.json` per rank (the loss accumulated since the last log, so
the first loss logged after a resume is the uninterrupted run's), and a `COMPLETE` marker written
LAST: it lists every file with its size and sha256, computed while saving (each file is streamed
once after the Trainer wrote it, then fsynced; ranks share the work). A directory without the marker
is a save that was cut off: resume ignores it and removes it. Deleting a checkpoint removes its
marker first, so a kill during deletion never leaves a "complete" checkpoint with files missing.

Before use, a checkpoint is verified against its marker (`payload/volume/verify.py`); a damaged one is
moved to `checkpoints/quarantine/`, which nothing here lists, so retention never counts it.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Optional

from payload import layout
from payload.volume import checksums
from payload.volume.control import gather_objects

log = logging.getLogger("payload.train")

_CKPT_RE = re.compile(r"^checkpoint-(\d+)$")
LOSS_STATE = "loss_state_{rank}.json"


# ------------------------------------------------------------------------------------ on-disk state


def checkpoints_dir(run_dir: Path) -> Path:
    return Path(run_dir) / layout.CHECKPOINTS_DIR


def step_of(path: Path) -> Optional[int]:
    m = _CKPT_RE.match(Path(path).name)
    return int(m.group(1)) if m else None


def is_complete(path: Path) -> bool:
    return (Path(path) / layout.COMPLETE_MARKER).is_file()


def read_marker(path: Path) -> dict:
    try:
        return json.loads((Path(path) / layout.COMPLETE_MARKER).read_text())
    except (OSError, ValueError):
        return {}


def list_checkpoints(root: Path) -> list[tuple[int, Path, bool]]:
    """(step, path, complete) for every checkpoint-N directory, oldest first (quarantine excluded)."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = [(step_of(p), p) for p in root.iterdir() if p.is_dir() and step_of(p) is not None]
    return [(s, p, is_complete(p)) for s, p in sorted(found)]


def latest_complete(root: Path) -> Optional[Path]:
    done = [p for _, p, ok in list_checkpoints(root) if ok]
    return done[-1] if done else None


def clean_incomplete(root: Path) -> list[Path]:
    """Remove half-written checkpoints (no marker) and leftovers of interrupted deletions."""
    removed = []
    for _, path, ok in list_checkpoints(root):
        if not ok:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    if Path(root).is_dir():
        for p in Path(root).glob(".trash-*"):
            shutil.rmtree(p, ignore_errors=True)
    for p in removed:
        log.warning("removed incomplete checkpoint %s (its save was cut off)", p.name)
    return removed


def _fsync_path(path: Path, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: Path, files: bool = True) -> None:
    """fsync every file (unless `files` is False: already done) and directory under `path`."""
    for dirpath, _, names in os.walk(path):
        for f in names if files else ():
            _fsync_path(Path(dirpath) / f)
        _fsync_path(Path(dirpath), directory=True)


def write_marker(path: Path, info: dict) -> None:
    """Write the COMPLETE marker atomically and durably (tmp file, fsync, rename, fsync dir)."""
    path = Path(path)
    tmp = path / f".{layout.COMPLETE_MARKER}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps(info, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path / layout.COMPLETE_MARKER)
    _fsync_path(path, directory=True)
    _fsync_path(path.parent, directory=True)


def prepare_checkpoint(path: Path, config_yaml: str, base_model: Optional[str] = None) -> None:
    """Rank 0, after the Trainer wrote a checkpoint: the resolved config beside it, and a
    deterministic adapter_config.json (before anything is hashed)."""
    path = Path(path)
    (path / layout.RESOLVED_CONFIG).write_text(config_yaml, encoding="utf-8")
    if base_model is not None:
        normalize_adapter_config(path / "adapter_config.json", base_model)


def normalize_adapter_config(path: Path, base_model: str) -> bool:
    """PEFT writes `target_modules` from a set (order changes with the hash seed) and the base
    model's resolved path (absolute for local models): sort the lists, name the base model as the
    config gives it, sort the keys. Returns False when there is no adapter config."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return False
    data["base_model_name_or_path"] = base_model
    for key in ("target_modules", "modules_to_save", "exclude_modules"):
        if isinstance(data.get(key), list) and all(isinstance(x, str) for x in data[key]):
            data[key] = sorted(data[key])
    tmp = Path(path).with_name(f".{Path(path).name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return True


def digest_checkpoint(path: Path, rank: int = 0, world: int = 1) -> dict[str, dict]:
    """Every file of a checkpoint with size and sha256, each streamed once and fsynced; the files
    are shared out over the ranks (a ZeRO-3 checkpoint is hundreds of GB) and the parts gathered."""
    sizes = checksums.list_files(path, skip=(layout.COMPLETE_MARKER,))
    part = checksums.digest(path, checksums.share(sizes, rank, world), fsync=True)
    files: dict[str, dict] = {}
    for p in gather_objects(part):
        files.update(p)
    if rank == 0:
        fsync_tree(path, files=False)
    return dict(sorted(files.items()))


def finalize_checkpoint(path: Path, config_yaml: str, info: dict, base_model: Optional[str] = None) -> dict:
    """One process: config beside the checkpoint, checksums (+ fsync), then the marker listing them."""
    prepare_checkpoint(path, config_yaml, base_model)
    files = digest_checkpoint(path)
    write_marker(path, {**info, "files": files})
    write_index(Path(path).parent)
    return files


def remove_checkpoint(path: Path) -> None:
    """Marker first, then rename out of the way, then delete: never a marked, partial checkpoint."""
    path = Path(path)
    (path / layout.COMPLETE_MARKER).unlink(missing_ok=True)
    trash = path.parent / f".trash-{path.name}"
    os.replace(path, trash)
    shutil.rmtree(trash, ignore_errors=True)


def ranked(done: list[tuple[int, Path, dict]], key: str = "eval_loss", greater: bool = False) -> list[Path]:
    """Checkpoints that carry `key` in their marker, best first (earliest on ties). `key` is the
    eval loss or a generation metric (`eval_cer`: lower wins; `eval_exact_match`: higher wins)."""
    scored = [(-m[key] if greater else m[key], s, p) for s, p, m in done if m.get(key) is not None]
    return [p for _, _, p in sorted(scored)]


def apply_retention(root: Path, keep_best: int, keep_recent: int, key: str = "eval_loss",
                    greater: bool = False) -> list[Path]:
    """Keep the `keep_best` best by `key` (lowest eval loss by default) and the `keep_recent` newest
    complete checkpoints."""
    done = [(s, p, read_marker(p)) for s, p, ok in list_checkpoints(root) if ok]
    keep = {p for _, p, _ in done[-max(keep_recent, 1):]}
    keep |= set(ranked(done, key, greater)[:keep_best])
    removed = [p for _, p, _ in done if p not in keep]
    for p in removed:
        remove_checkpoint(p)
        log.info("retention: removed %s", p.name)
    write_index(root)
    return removed


# ------------------------------------------------------------------------------ checkpoint index


def checkpoint_row(step: int, name: str, size: int, complete: bool, marker: dict) -> dict:
    """One row of checkpoints.json (the launcher builds the same rows for a run without a MANIFEST)."""
    metrics = {k: v for k, v in marker.items() if k.startswith("eval_") and k != "eval_loss"
               and isinstance(v, (int, float))}  # generation metrics: eval_cer, eval_wer, eval_exact_match
    return {"step": step, "name": name, "bytes": size, "complete": complete, **metrics,
            "eval_loss": marker.get("eval_loss"), "loss": marker.get("loss"), "saved_at": marker.get("saved_at")}


def _tree_bytes(top: Path) -> int:
    """Bytes of the regular files under `top`, never through a symlink (checksums.regular_files)."""
    total = 0
    for p in checksums.regular_files(top.parent, top.name).values():
        try:
            total += p.stat().st_size
        except OSError:  # removed meanwhile (retention, a cut-off save)
            pass
    return total


def checkpoint_listing(run_dir: Path) -> list[dict]:
    """One row per `checkpoints/checkpoint-N`: step, bytes, complete, and the marker's eval/train loss."""
    return [checkpoint_row(step, path.name, _tree_bytes(path), complete, read_marker(path) if complete else {})
            for step, path, complete in list_checkpoints(checkpoints_dir(run_dir))]


def write_index(root: Path) -> Optional[Path]:
    """Rewrite the run's checkpoint index (`outputs/checkpoints.json`: step, eval loss, generation
    metrics, bytes, complete) atomically, so `launch checkpoints RUN` can read it while the run
    trains. Called after every save (the Trainer's save is followed by retention) and at retention;
    `payload manifest` writes the same rows at the end. Only for a run's own `checkpoints/` dir."""
    root = Path(root)
    if root.name != layout.CHECKPOINTS_DIR:
        return None
    target = root.parent / layout.CHECKPOINT_LISTING
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(checkpoint_listing(root.parent), indent=2, sort_keys=True) + "\n", encoding="utf-8")
        os.replace(tmp, target)
    except OSError as e:  # the index is a convenience: never stop training for it
        log.warning("could not write the checkpoint index %s: %s", target, e.strerror or e)
        tmp.unlink(missing_ok=True)
        return None
    return target


def best_checkpoint(root: Path, key: str = "eval_loss", greater: bool = False) -> Optional[Path]:
    """Best by `key` (lowest eval loss by default) among complete checkpoints (earliest on ties);
    the newest if none has one."""
    done = [(s, p, read_marker(p)) for s, p, ok in list_checkpoints(root) if ok]
    best = ranked(done, key, greater)
    if best:
        return best[0]
    return done[-1][1] if done else None


# ----------------------------------------------------------------------------- per-rank loss state


def write_loss_state(path: Path, rank: int, state: dict) -> None:
    """This rank's logging accumulators at save time (see LaunchTrainerMixin.loss_state)."""
    target = Path(path) / LOSS_STATE.format(rank=rank)
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(json.dumps(state, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp, target)


def read_loss_state(path: Path, rank: int) -> Optional[dict]:
    try:
        return json.loads((Path(path) / LOSS_STATE.format(rank=rank)).read_text())
    except (OSError, ValueError):
        return None
