"""Checkpoints and exported adapters are verified before use: resume, export, merge.

A complete checkpoint's `COMPLETE` marker lists every file with its size and sha256
(`checkpoints.digest_checkpoint`). Before a checkpoint is resumed from or exported, its files are
checked against that list (sizes first, then the hashes, shared out over the ranks). One that does
not match (a torn network-volume write, a deleted optimizer.pt, flipped bytes) is moved to
`checkpoints/quarantine/checkpoint-<step>-<why>/` for inspection (retention never counts it: it is
no longer a `checkpoint-N` directory of the run), one line says which and why, and the next older
(resume) or next best (export) one is tried. If checkpoints exist and none verifies, the stage stops
with one line (exit 2) saying how to start fresh.

Markers written before checksums existed (no `files`) are used unverified, with a warning: refusing
them would throw away every checkpoint of a run started by an older version. The same goes for an
exported adapter without `SHA256SUMS`.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Optional

from payload import layout
from payload.volume import checksums
from payload.volume.checkpoints import checkpoints_dir, list_checkpoints, ranked, read_marker
from payload.volume.control import gather_objects
from payload.errors import PayloadError

log = logging.getLogger("payload.train")

QUARANTINE_DIR = "quarantine"


def verify_checkpoint(path: Path, rank: int = 0, world: int = 1) -> list[checksums.Problem]:
    """What is wrong with a complete checkpoint ([] when it matches its marker, or has a legacy
    marker without a file list). Every rank must call it (the hashing is shared)."""
    path = Path(path)
    marker = read_marker(path)
    if not marker:
        return [checksums.Problem("marker", f"{layout.COMPLETE_MARKER} is unreadable")]
    files = marker.get("files")
    if files is None:
        if rank == 0:
            log.warning("%s has a marker without checksums (saved by an older version): used unverified",
                        path.name)
        return []
    problems = checksums.check_sizes(path, files)  # cheap, and the same verdict on every rank
    if problems:
        return problems
    part = checksums.digest(path, checksums.share({k: v["bytes"] for k, v in files.items()}, rank, world))
    hashes: dict[str, dict] = {}
    for p in gather_objects(part):
        hashes.update(p)
    return checksums.check(path, files, hashes=hashes)


def quarantine(path: Path, why: str) -> Path:
    """Move a damaged checkpoint to `checkpoints/quarantine/<name>-<why>[-N]` (kept for inspection)."""
    path = Path(path)
    qdir = path.parent / QUARANTINE_DIR
    qdir.mkdir(exist_ok=True)
    dest, n = qdir / f"{path.name}-{why}", 1
    while dest.exists():
        n += 1
        dest = qdir / f"{path.name}-{why}-{n}"
    os.replace(path, dest)
    return dest


def _set_aside(path: Path, problems: list, rank: int, what: str) -> str:
    """Quarantine (rank 0) and log one line; returns the short description used in errors."""
    why = "; ".join(p.text for p in problems[:3])
    if rank == 0:
        dest = quarantine(path, problems[0].kind)
        log.warning("skipping %s for %s: %s; moved to %s", path.name, what, why,
                    dest.relative_to(path.parent.parent))
    return f"{path.name}: {why}"


def pick_resume(root: Path, rank: int = 0, world: int = 1) -> Optional[Path]:
    """The newest complete checkpoint that verifies; damaged ones are set aside on the way. None
    when there is no checkpoint at all; PayloadError (exit 2) when there are some and none verifies."""
    skipped = []
    for _, path, ok in reversed(list_checkpoints(root)):
        if not ok:
            continue
        problems = verify_checkpoint(path, rank, world)
        if not problems:
            return path
        skipped.append(_set_aside(path, problems, rank, "resume"))
    if skipped:
        raise PayloadError(
            f"no checkpoint of this run verifies ({' | '.join(skipped)}); they are in "
            f"{Path(root) / QUARANTINE_DIR} for inspection. Run again to train this run from step 0, "
            "or start a new run (`launch up PROFILE --new`)")
    return None


# DeepSpeed's checkpoint files are not weights: `latest` names its global_stepN shards (never exported) and
# zero_to_fp32.py / zero_to_torch.py rebuild weights from them; the exported model.safetensors is already
# whole (ZeRO-3 gathers it at save: stage3_gather_16bit_weights_on_model_save).
_NOT_ADAPTER = {"optimizer.pt", "scheduler.pt", "scaler.pt", "trainer_state.json", "training_args.bin",
                layout.COMPLETE_MARKER, layout.RESOLVED_CONFIG, "README.md",
                "latest", "zero_to_fp32.py", "zero_to_torch.py"}
_NOT_ADAPTER_PREFIXES = ("rng_state", "loss_state_", ".")


class Damaged(PayloadError):
    """A checkpoint's files do not match its marker (`problems` says how)."""

    def __init__(self, path: Path, problems: list):
        self.path, self.problems = Path(path), problems
        super().__init__(f"{Path(path).name}: " + "; ".join(p.text for p in problems[:3]))


def export_adapter(checkpoint: Path, dest: Path) -> Path:
    """Copy the weights + tokenizer files of a checkpoint (no optimizer/RNG state) to `dest`
    atomically, hashing while copying: each file must match the checkpoint's marker (else `Damaged`,
    and `dest` is left as it was). `dest/SHA256SUMS` lists what was exported."""
    checkpoint, dest = Path(checkpoint), Path(dest)
    listed = read_marker(checkpoint).get("files")
    tmp = dest.with_name(f".{dest.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    (tmp / "source_checkpoint.txt").write_text(checkpoint.name + "\n")
    sums = {"source_checkpoint.txt": {"sha256": checksums.sha256_file(tmp / "source_checkpoint.txt")}}
    problems = []
    for p in sorted(checkpoint.iterdir()):
        if not p.is_file() or p.name in _NOT_ADAPTER or p.name.startswith(_NOT_ADAPTER_PREFIXES):
            continue
        want = (listed or {}).get(p.name)
        if listed is not None and want is None:
            log.warning("%s/%s is not in its marker (added later?): not exported", checkpoint.name, p.name)
            continue
        sums[p.name] = {"sha256": checksums.copy_hashed(p, tmp / p.name)}
        if want is not None and want["sha256"] != sums[p.name]["sha256"]:
            problems.append(checksums.Problem("checksum", f"{p.name} does not match its sha256 (changed bytes)"))
    missing = [rel for rel in (listed or {}) if "/" not in rel and rel not in sums and
               rel not in _NOT_ADAPTER and not rel.startswith(_NOT_ADAPTER_PREFIXES)]
    problems += [checksums.Problem("missing", f"{rel} is missing") for rel in missing]
    if problems:
        shutil.rmtree(tmp, ignore_errors=True)
        raise Damaged(checkpoint, problems)
    checksums.write_sums(tmp, sums)
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(tmp, dest)
    return dest


def export_verified(root: Path, dest: Path, prefer: str = "best", key: str = "eval_loss",
                    greater: bool = False) -> Optional[Path]:
    """Export the best (`prefer="best"`: lowest eval loss, or best `key`) or newest (`"latest"`)
    checkpoint whose files match its marker; damaged ones are quarantined and the next candidate is
    tried. Returns the checkpoint exported (None when there is none). Rank 0 only."""
    done = [(s, p, read_marker(p)) for s, p, ok in list_checkpoints(root) if ok]
    order = [p for _, p, _ in reversed(done)]
    if prefer == "best":
        best = ranked(done, key, greater)
        order = best + [p for p in order if p not in set(best)]
    for path in order:
        try:
            export_adapter(path, dest)
            return path
        except Damaged as e:
            _set_aside(path, e.problems, 0, "export")
    return None


def verify_export(directory: Path) -> list[checksums.Problem]:
    """An exported adapter against its SHA256SUMS ([] also for an export without one: older version)."""
    sums = checksums.read_sums(directory)
    if sums is None:
        if Path(directory).is_dir():
            log.warning("%s has no %s (exported by an older version): used unverified", directory,
                        checksums.SUMS_FILE)
        return []
    return checksums.check(directory, {rel: {"sha256": h} for rel, h in sums.items()})


def ensure_export(run_dir: Path, prefer: str = "best") -> Path:
    """`outputs/adapter` verified before merge/export; a damaged one is moved aside and exported
    again from the best checkpoint that verifies. PayloadError when nothing good is left."""
    dest = Path(run_dir) / layout.ADAPTER_DIR
    if not dest.is_dir():
        raise PayloadError(f"no adapter in {dest}; run `python -m payload train` first")
    problems = verify_export(dest)
    if not problems:
        return dest
    why = "; ".join(p.text for p in problems[:3])
    aside = dest.with_name(f"{dest.name}.damaged-{problems[0].kind}")
    shutil.rmtree(aside, ignore_errors=True)
    os.replace(dest, aside)
    log.warning("%s is damaged (%s): moved to %s; exporting again from the checkpoints", dest, why, aside.name)
    if export_verified(checkpoints_dir(run_dir), dest, prefer) is None:
        raise PayloadError(f"{dest} was damaged ({why}) and no checkpoint verifies to export it again: "
                           "train again (`launch up PROFILE --new`)")
    return dest
