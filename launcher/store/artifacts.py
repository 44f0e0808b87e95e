"""One artifact contract for every backend: what `launch down --fetch-artifacts` leaves on disk.

One idea at ~400 lines: the fetch, from the machine's listing to verified files in
`{dest}/{run_id}/`: confinement, the plan from the MANIFEST or the listing, verification and the files
derived at home are its steps, written once for every backend.

    {dest}/{run_id}/  adapter/ [merged/] [mlx/] training_summary.json metrics.jsonl loss.png
                      data_stats.json high_loss_samples.jsonl checkpoints.json logs/ MANIFEST.json

(names and sources in `payload/layout.py` ARTIFACTS). Backends only move bytes: `list_files` says
which regular files exist under some run-dir-relative paths on the machine, `copy_files` copies
run-dir-relative files into a local directory. Everything else happens here, once:

- confinement: every path that comes from the machine (a `find` listing, bucket keys, the MANIFEST)
  must be a clean relative path inside an expected artifact; anything else is refused and reported,
  never written. Files arrive in `{dest}/.incoming/`, a fresh directory, and are moved into the
  layout only after verification; no symlink is ever created or written through;
- verification, streamed: each file against the MANIFEST the payload wrote on the machine (bytes +
  sha256, computed there: by `post`, or by the trainer when a stop or a budget ended it), or, for a
  run that never wrote one (it crashed, or was killed), against the listing's sizes; safetensors
  headers are checked too;
- the verdict: teardown is refused only when something the MANIFEST (or, without one, a completed
  run) says must exist is missing or damaged. Optional things never produced are fine;
- resuming: `.incoming/` outlives an interrupted fetch. The next one keeps what it holds of the files
  the MANIFEST checksums (whole: not copied again; cut off: the backend goes on from its last byte,
  rsync --append-verify, a ranged S3 read, an append), and any file already placed in `{dest}` with
  the MANIFEST's bytes and sha256; everything is verified as if it had just arrived.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from payload import layout
from payload.volume.checkpoints import checkpoint_row
from payload.volume.checksums import file_digest

from launcher.errors import BackendError
from launcher.term.logtext import CleanWriter, clean_file
from launcher.term.units import human_size

INCOMING = ".incoming"
MAX_MANIFEST_BYTES = 64 << 20
MAX_SAFETENSORS_HEADER = 100 << 20


@dataclass
class FetchReport:
    dest: Path
    files: dict[str, int] = field(default_factory=dict)
    """Local-layout name -> bytes, for everything that arrived and verified."""
    problems: list[str] = field(default_factory=list)
    """Something that must exist is missing or damaged: do not tear down."""
    notes: list[str] = field(default_factory=list)
    """One-line facts the user should see (refused paths, what was left on the machine...)."""
    checked: str = "sha256"
    """How the files were verified: "sha256" (the machine's MANIFEST) or "size" (no MANIFEST)."""

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass
class _Planned:
    rel: str  # run-dir-relative source
    name: str  # local-layout name
    size: int
    sha256: Optional[str] = None
    grows: bool = False


def fetch(backend, run, dest: Path, merged: bool = False, view=None) -> FetchReport:
    """Bring run `run`'s artifacts into `dest` (= {dest}/{run_id}) through `backend`, verified. `view`
    (launcher.term.transfer.TransferView) shows the bytes as they arrive. What an interrupted fetch
    left in `.incoming/` is kept and goes on from there; it is removed once a fetch has run through."""
    dest = _prepare(Path(dest))
    report = FetchReport(dest=dest)
    wanted = [a for a in layout.ARTIFACTS if merged or not a.on_request]
    roots = (layout.MANIFEST, *(a.source for a in wanted), layout.CHECKPOINTS_DIR)
    listing = _confine(backend.list_files(run, roots), roots, report)
    incoming = _kept(dest / INCOMING)
    manifest = _remote_manifest(backend, run, listing, incoming, report)
    if manifest is not None:
        plan = _plan_from_manifest(manifest, listing, wanted, report)
    else:
        plan = _plan_from_listing(listing, wanted, run, report)
    live = [_Planned(rel, found[1], size, grows=True) for rel, size in listing.items()
            if (found := layout.artifact_for(rel)) and found[0].live]
    home = [p for p in plan if _already_home(dest, p)]
    plan = [p for p in plan if p not in home]
    kept = _copy(backend, run, plan, live, incoming, view, sum(p.size for p in home))
    _refuse_links(incoming, report)
    for p in plan:
        problem = _verify(incoming / p.rel, p)
        if problem and p.rel in kept:  # what an earlier try left was not the machine's file: once again, whole
            (incoming / p.rel).unlink(missing_ok=True)
            _copy(backend, run, [p], [], incoming, view, 0)
            problem = _verify(incoming / p.rel, p)
        if problem:
            report.problems.append(f"{p.name}: {problem}")
            (incoming / p.rel).unlink(missing_ok=True)  # not resumed from next time
        else:
            _place(incoming / p.rel, dest, p.name)
            report.files[p.name] = p.size
    report.files.update({p.name: p.size for p in home})
    for p in live:  # logs: not checksummed (they may change while copied); terminal codes removed
        if (incoming / p.rel).is_file():
            clean_file(incoming / p.rel)
            _place(incoming / p.rel, dest, p.name)
            report.files[p.name] = (dest / p.name).stat().st_size
    if manifest is None:
        _write_checkpoint_listing(backend, run, listing, incoming, dest, report)
    _save_run_log(backend, run, dest, report)
    _write_manifest(manifest, incoming, dest, report, run)
    shutil.rmtree(incoming, ignore_errors=True)  # run through: nothing to go on from
    return report


def _copy(backend, run, plan: list[_Planned], live: list[_Planned], incoming: Path, view,
          home_bytes: int) -> set[str]:
    """Copy what is not in `incoming` yet; the files of which an earlier try had left bytes there. A
    file verified by sha256 is kept: whole, it is not copied again; cut off, the transport goes on
    from its last byte. Any other file (logs, a run without a MANIFEST) comes again whole."""
    _refuse_links(incoming, FetchReport(dest=incoming))  # nothing but files a transfer left is used
    todo, kept = [], set()
    for p in plan + live:
        path = incoming / p.rel
        have = path.stat().st_size if path.is_file() else 0
        if have and (not p.sha256 or have > p.size):
            path.unlink()
            have = 0
        kept |= {p.rel} if have else set()
        if not (have == p.size and p.sha256):
            todo.append(p)
    sizes = {p.rel: p.size for p in todo}
    total = home_bytes + sum(p.size for p in plan + live)
    had = home_bytes + sum(p.size for p in plan if p not in todo) + sum(_size(incoming / r) for r in sizes)
    if view is None:
        backend.copy_files(run, list(sizes), incoming)
    else:
        with view.watch(incoming, sizes, total, had):
            backend.copy_files(run, list(sizes), incoming)
    return kept


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _already_home(dest: Path, p: _Planned) -> bool:
    """A file an earlier fetch placed in `dest` that is still the machine's (same bytes and sha256 as
    the MANIFEST): kept, not fetched again (a fetch that stopped at a damaged file, a second fetch)."""
    if not p.sha256:
        return False
    try:
        target = confined_target(dest, p.name)
        st = target.lstat()
    except (BackendError, OSError):
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_size != p.size:
        return False
    return file_digest(target)[1] == p.sha256


# ------------------------------------------------------------------- listing a POSIX machine


def list_command(run_dir_expr: str, roots: tuple[str, ...]) -> str:
    """Shell for `Backend.list_files` over ssh: `bytes<TAB>path<NUL>` for each regular file at or
    under `roots` (symlinks are not `-type f`) in the run directory `run_dir_expr` (already quoted)."""
    quoted = " ".join(shlex.quote(r) for r in roots)
    return (f"cd {run_dir_expr} 2>/dev/null || exit 0; "
            f"find {quoted} -type f -printf '%s\\t%p\\0' 2>/dev/null; true")


def parse_listing(out: str) -> dict[str, int]:
    """The output of `list_command` as {path: bytes}; malformed entries are dropped (and paths are
    still only what the machine claims: `fetch` confines them)."""
    found = {}
    for entry in out.split("\0"):
        size, tab, rel = entry.partition("\t")
        if tab and size.isdigit() and rel:
            found[rel] = int(size)
    return found


# ------------------------------------------------------------------------------- confinement


def _prepare(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    return dest.resolve()


def _kept(path: Path) -> Path:
    """`path` as a directory, keeping what an earlier fetch left in it (anything else there removed)."""
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        path.unlink()
    path.mkdir(exist_ok=True)
    return path


def _confine(listing: dict, roots: tuple[str, ...], report: FetchReport) -> dict[str, int]:
    """The listing's entries that are clean relative paths under a requested root; the rest refused."""
    kept, refused = {}, []
    for raw, size in listing.items():
        rel = layout.clean_relpath(raw)
        inside = rel is not None and any(rel == r or rel.startswith(r + "/") for r in roots)
        if not inside or not isinstance(size, int) or size < 0:
            refused.append(repr(raw) if rel is None else raw)
            continue
        kept[rel] = size
    if refused:
        report.notes.append(_refused_line(refused, "listed by the machine"))
    return kept


def _refused_line(refused: list[str], where: str) -> str:
    shown = ", ".join(refused[:3]) + (f" and {len(refused) - 3} more" if len(refused) > 3 else "")
    return (f"refused {len(refused)} path(s) {where} outside the artifact layout ({shown}): "
            "nothing was written for them")


def _refuse_links(incoming: Path, report: FetchReport) -> None:
    """Remove anything but regular files and directories a transfer may have left (never followed)."""
    odd = []
    for dirpath, dirnames, filenames in os.walk(incoming, followlinks=False):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            mode = p.lstat().st_mode
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                odd.append(p.relative_to(incoming).as_posix())
                p.unlink()
    if odd:
        report.notes.append(f"removed {len(odd)} symlink(s)/special file(s) the transfer brought "
                            f"({', '.join(odd[:3])}): never followed")


def confined_target(dest: Path, name: str) -> Path:
    """`dest/name`, making its parent directories; refuses a path that would leave `dest` (through
    `..`, an absolute path, or a symlink already inside `dest`)."""
    rel = layout.clean_relpath(name)
    if rel is None:
        raise BackendError(f"{name!r} is not a relative path inside {dest}")
    cur = dest
    for part in rel.split("/")[:-1]:
        cur = cur / part
        if cur.is_symlink() or (cur.exists() and not cur.is_dir()):
            raise BackendError(f"{cur} is a symlink or a file, not a directory: remove it or use another --dest")
        cur.mkdir(exist_ok=True)
    target = dest / rel
    if not target.parent.resolve().is_relative_to(dest):
        raise BackendError(f"{name!r} resolves outside {dest}: use another --dest")
    return target


def _place(src: Path, dest: Path, name: str) -> None:
    target = confined_target(dest, name)
    if target.is_symlink() or target.is_file():
        target.unlink()  # replace a link, never write through it
    elif target.is_dir():
        shutil.rmtree(target)
    os.replace(src, target)


# ------------------------------------------------------------------------------------ plans


def _remote_manifest(backend, run, listing: dict[str, int], incoming: Path, report) -> Optional[dict]:
    if layout.MANIFEST not in listing:
        return None
    if listing[layout.MANIFEST] > MAX_MANIFEST_BYTES:
        report.problems.append(f"{layout.MANIFEST} on the machine is {listing[layout.MANIFEST]} bytes: not a manifest")
        return None
    (incoming / layout.MANIFEST).unlink(missing_ok=True)  # the machine's current one, never a kept one
    backend.copy_files(run, [layout.MANIFEST], incoming)
    try:
        manifest = json.loads((incoming / layout.MANIFEST).read_text(encoding="utf-8"))
        files = manifest["files"]
        assert isinstance(files, dict) and isinstance(manifest.get("required", []), list)
    except (OSError, ValueError, KeyError, TypeError, AssertionError):
        report.problems.append(f"{layout.MANIFEST} on the machine is not a valid manifest: run "
                               "`python -m payload manifest --config $LAUNCH_CONFIG` there, then fetch again")
        return None
    return manifest


def _plan_from_manifest(manifest: dict, listing: dict[str, int], wanted, report) -> list[_Planned]:
    wanted_names = {a.name for a in wanted}
    plan, refused, left, damaged = [], [], {}, set()
    for name, entry in manifest["files"].items():
        source = layout.source_for(layout.clean_relpath(name) or "")
        ok_entry = isinstance(entry, dict) and isinstance(entry.get("bytes"), int) \
            and isinstance(entry.get("sha256"), str)
        found = layout.artifact_for(source) if source else None
        if not found or not ok_entry or found[0].live:
            refused.append(name if isinstance(name, str) else repr(name))
            continue
        artifact = found[0]
        if artifact.name not in wanted_names:
            left[artifact.name] = left.get(artifact.name, 0) + entry["bytes"]
            continue
        if source not in listing or listing[source] != entry["bytes"]:
            damaged.add(artifact.name)
        if source not in listing:
            report.problems.append(f"{name}: in the MANIFEST but gone from the machine")
        elif listing[source] != entry["bytes"]:
            report.problems.append(f"{name}: {listing[source]} bytes on the machine, {entry['bytes']} in "
                                   "its MANIFEST (changed since it was written)")
        else:
            plan.append(_Planned(source, name, entry["bytes"], entry["sha256"]))
    if refused:
        report.notes.append(_refused_line(refused, "named by the MANIFEST"))
    for name, size in left.items():
        report.notes.append(f"{name}/ ({human_size(size)}) stays on the machine: add --merged to bring it")
    present = {p.name.split("/")[0] for p in plan} | damaged
    for name in manifest.get("required") or []:
        if name in wanted_names and name not in present:
            report.problems.append(f"{name}: the run should have produced it (its MANIFEST says so) "
                                   "but it is not on the machine")
    return plan


def _plan_from_listing(listing: dict[str, int], wanted, run, report) -> list[_Planned]:
    wanted_names = {a.name for a in wanted if not a.live}
    plan = []
    for rel, size in listing.items():
        found = layout.artifact_for(rel)
        if found and found[0].name in wanted_names:
            plan.append(_Planned(rel, found[1], size, grows=found[0].grows))
    state = getattr(run, "state", None)
    report.checked = "size"
    report.notes.append(f"the run wrote no MANIFEST (state {state}; `post` writes it when training "
                        "finished, the trainer when it stops or hits its budget): sizes checked, not checksums")
    if state == "completed":
        present = {p.name.split("/")[0] for p in plan}
        for name in layout.REQUIRED_WHEN_COMPLETED:
            if name not in present:
                report.problems.append(f"{name}: missing, yet the run completed")
    return plan


# ----------------------------------------------------------------------------- verification


def _verify(path: Path, p: _Planned) -> Optional[str]:
    """What is wrong with an arrived file, or None. Reads it in blocks, never whole."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return "did not arrive"
    if not stat.S_ISREG(st.st_mode):
        return "arrived as something other than a regular file"
    if st.st_size != p.size and not (p.grows and p.sha256 is None and st.st_size > p.size):
        return f"{st.st_size} bytes arrived, {p.size} on the machine (damaged in transfer: fetch again)"
    if p.sha256 is not None:
        _, digest = file_digest(path)
        if digest != p.sha256:
            return f"sha256 {digest[:12]}... differs from the MANIFEST's {p.sha256[:12]}... (damaged: fetch again)"
    if path.suffix == ".safetensors":
        return safetensors_problem(path)
    return None


def safetensors_problem(path: Path) -> Optional[str]:
    """None when the file's header parses and its tensors exactly cover the data (reads the header only)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if n < 2 or n > MAX_SAFETENSORS_HEADER or 8 + n > size:
            return "not a safetensors file (bad header length)"
        try:
            header = json.loads(f.read(n))
            ends = [t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"]
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            return "not a safetensors file (unreadable header)"
    if max(ends, default=0) != size - 8 - n:
        return f"safetensors data is {size - 8 - n} bytes but its tensors need {max(ends, default=0)} (truncated?)"
    return None


# ------------------------------------------------------------------------- derived files


def _write_checkpoint_listing(backend, run, listing, incoming: Path, dest: Path, report) -> None:
    """Without a MANIFEST there is no checkpoints.json from the machine: build it from the listing
    and the (tiny) COMPLETE markers."""
    steps: dict[str, dict] = {}
    prefix = layout.CHECKPOINTS_DIR + "/"
    for rel, size in listing.items():
        parts = rel[len(prefix):].split("/") if rel.startswith(prefix) else []
        if len(parts) >= 2 and parts[0].startswith("checkpoint-") and parts[0][11:].isdigit():
            row = steps.setdefault(parts[0], {"bytes": 0, "complete": False})
            row["bytes"] += size
            row["complete"] |= parts[1:] == [layout.COMPLETE_MARKER]
    markers = [f"{prefix}{name}/{layout.COMPLETE_MARKER}" for name, row in steps.items() if row["complete"]]
    if markers:
        for rel in markers:
            (incoming / rel).unlink(missing_ok=True)
        backend.copy_files(run, markers, incoming)
    rows = []
    for name, row in sorted(steps.items(), key=lambda kv: int(kv[0][11:])):
        marker = _read_small_json(incoming / prefix / name / layout.COMPLETE_MARKER)
        rows.append(checkpoint_row(int(name[11:]), name, row["bytes"], row["complete"], marker))
    target = confined_target(dest, "checkpoints.json")
    target.write_text(json.dumps(rows, indent=2) + "\n")
    report.files["checkpoints.json"] = target.stat().st_size


def _save_run_log(backend, run, dest: Path, report) -> None:
    """`logs/run.log`: from the run dir when the backend keeps it there (ssh), else the backend's log."""
    name = layout.artifact_for(layout.RUN_LOG)[1]
    if name in report.files:
        return
    target = confined_target(dest, name)
    tmp = target.with_name(".run.log.part")
    try:
        with open(tmp, "w", encoding="utf-8", errors="replace") as out:
            clean = CleanWriter(out)
            backend.logs(run, False, clean)
            clean.close_pending()
    except Exception as e:  # noqa: BLE001 - the log is a convenience: say so, do not block teardown
        tmp.unlink(missing_ok=True)
        report.notes.append(f"the run's log could not be saved ({str(e).splitlines()[0][:200]})")
        return
    os.replace(tmp, target)
    report.files[name] = target.stat().st_size


def _write_manifest(manifest: Optional[dict], incoming: Path, dest: Path, report, run) -> None:
    """MANIFEST.json at home: the machine's (verified), or one computed here for a run that wrote none."""
    target = confined_target(dest, layout.LOCAL_MANIFEST)
    if manifest is not None:
        os.replace(incoming / layout.MANIFEST, target)
        return
    files = {}
    for name in sorted(report.files):
        if not name.startswith(layout.LOGS_DIR + "/"):
            size, digest = file_digest(dest / name)
            files[name] = {"bytes": size, "sha256": digest}
    target.write_text(json.dumps({
        "format": 1, "run_id": run.id, "state": run.state, "algorithm": "sha256", "required": [],
        "missing": [], "origin": "computed at home: the run wrote no MANIFEST (it did not finish)",
        "files": files}, indent=2) + "\n")


def _read_small_json(path: Path) -> dict:
    try:
        if path.stat().st_size > 1 << 20:
            return {}
        value = json.loads(path.read_text(encoding="utf-8"))
        return value if isinstance(value, dict) else {}
    except (OSError, ValueError):
        return {}
