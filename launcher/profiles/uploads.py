"""What goes to the GPU machine: an allowlist, not a denylist.

Exactly these files are uploaded as the task's workdir, at their project-relative paths, each inside the
project by the boundary rule (launcher/profiles/boundary.py: no `..`, no link out of it at any level):
- the payload's code, from this install of launch (not the project): `payload/**/{*.py, *.sh, *.txt,
  *.lock, *.jinja}` (no caches, dotfiles or symlinks);
- the resolved run config, at the path the task's LAUNCH_CONFIG names (`sky/config/<profile>.yaml`);
- the local data files the profile names (`data.sources[].path`), plus the image files under a
  source's `image_root` (or beside the data file, for vision-language models);
- the user reward modules a GRPO stage names (`grpo.rewards: [FILE.py:FUNCTION]`).

Nothing else travels: a `.env`, a key file or a notebook beside a profile stays home. The local and
ssh backends copy this list; for SkyPilot, `stage_workdir` builds a directory holding exactly this
list (hard links where possible) that `launch up` hands to SkyPilot as the workdir. The committed
`.skyignore` only serves a plain `sky launch sky/<p>.yaml`: SkyPilot 0.14.1 reads it as exclude
patterns only (no `!` re-includes: sky/utils/command_runner.py, sky/data/storage_utils.py).
"""

from __future__ import annotations

import os
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Optional

from launcher import project
from launcher.profiles.boundary import inside
from launcher.store.state import state_dir
from launcher.term.ui import console
from launcher.term.units import human_size

PAYLOAD_DIR = "payload"
PAYLOAD_SUFFIXES = (".py", ".sh", ".txt", ".lock", ".jinja")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp", ".tif", ".tiff")
STAGED_SKYIGNORE = "# launch: this directory holds exactly the upload allowlist; nothing to exclude.\n"
STAGE_KEEP_S = 24 * 3600  # a staged workdir left by a detached launch is removed after a day


@dataclass
class Upload:
    files: dict[str, Path] = field(default_factory=dict)
    """Workdir-relative POSIX path -> local file."""
    not_uploaded: list[tuple[str, str]] = field(default_factory=list)
    """(path as the profile names it, why it is not uploaded)."""

    @property
    def bytes(self) -> int:
        return sum(p.stat().st_size for p in self.files.values())


def upload_plan(profile, config_yaml: Path, config_rel: str) -> Upload:
    """The allowlist for one run (`profile` may be None: payload and config only)."""
    up = Upload()
    # the payload this install ships (site-packages, or the checkout), at payload/ in the workdir
    up.files.update(_tree(project.payload_dir(), PAYLOAD_SUFFIXES, base=project.PACKAGE_ROOT))
    for source in getattr(getattr(profile, "data", None), "sources", None) or []:
        if source.path:
            _add_data(up, source, profile)
    for stage in getattr(profile, "stages", None) or []:
        for spec in (stage.grpo.rewards if stage.grpo else []):
            module = spec.rpartition(":")[0]
            if module.endswith(".py"):  # a user reward FILE.py:FUNCTION, loaded from the workdir
                _add_file(up, module, "reward module")
    up.files[PurePosixPath(config_rel).as_posix()] = Path(config_yaml)
    up.files = dict(sorted(up.files.items()))
    return up


def _add_file(up: Upload, named: str, what: str) -> Optional[str]:
    """A file the profile names, uploaded at its repo path when it is inside the repo by the boundary
    rule; its repo path, or None (said in `not_uploaded`)."""
    rel = repo_relative(named)
    if rel is None:
        up.not_uploaded.append((named, " ".join(filter(None, (what, "outside the project: the machine must have "
                                                                      "it at that path")))))
        return None
    root = project.root()
    if not (root / rel).is_file():
        up.not_uploaded.append((named, "not found here"))
        return None
    up.files[rel] = root / rel
    return rel


def _add_data(up: Upload, source, profile) -> None:
    rel = _add_file(up, source.path, "")
    if rel is None:
        return
    images = source.image_root
    if images is None and getattr(profile.model, "kind", None) == "image_text_to_text":
        images = str(PurePosixPath(rel).parent)
    if images is not None:
        root = repo_relative(images) if images not in ("", ".") else None
        if root is None:
            up.not_uploaded.append((images, "image root outside the project (or the project root itself)"))
        else:
            up.files.update(_tree(project.root() / root, IMAGE_SUFFIXES, base=project.root()))


def repo_relative(value: str) -> Optional[str]:
    """`value` as a clean path inside the project (relative paths are relative to its root), else None:
    the boundary rule (launcher/profiles/boundary.py `inside`: `..`, absolute paths and links out of the
    project, at any level, are outside) with the project's root as its root."""
    return inside(project.root(), value)


def _tree(top: Path, suffixes: tuple[str, ...], base: Path) -> dict[str, Path]:
    """Regular files under `top` with one of `suffixes`, by their path from `base`; no dot/cache
    directories, never a symlink."""
    found: dict[str, Path] = {}
    if not top.is_dir() or top.is_symlink():
        return found
    for dirpath, dirnames, filenames in os.walk(top, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "__pycache__")
        for name in filenames:
            p = Path(dirpath) / name
            if not name.startswith(".") and p.suffix.lower() in suffixes and not p.is_symlink() and p.is_file():
                found[p.relative_to(base).as_posix()] = p
    return found


def stage_workdir(run_id: str, files: dict[str, Path]) -> Path:
    """A directory holding exactly `files` (hard links, or copies across filesystems) for SkyPilot to
    upload as the workdir. It must outlive the launch request (a local API server reads it while the
    request runs): `remove_staged` after the launch returns; stale ones go after a day."""
    base = state_dir() / "workdirs"
    base.mkdir(mode=0o700, exist_ok=True)
    for old in base.iterdir():
        if old.name != run_id and time.time() - old.stat().st_mtime > STAGE_KEEP_S:
            shutil.rmtree(old, ignore_errors=True)
    root = base / run_id
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(mode=0o700)
    for rel, src in files.items():
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.link(src, target)
        except OSError:
            shutil.copy2(src, target)
    (root / ".skyignore").write_text(STAGED_SKYIGNORE)  # so SkyPilot applies no .gitignore rules here
    return root


def remove_staged(run_id: str) -> None:
    shutil.rmtree(state_dir() / "workdirs" / run_id, ignore_errors=True)


# ----------------------------------------------------------------------------- `up --dry-run`


def print_dry_run(p, backend: str, run_id: str, task_yaml: Path, config_yaml: Path, checked: str) -> None:
    """What `launch up` would upload and start, without starting anything."""
    import yaml
    from rich.markup import escape

    task = yaml.safe_load(Path(task_yaml).read_text())
    config_rel = (task.get("envs") or {}).get("LAUNCH_CONFIG") or f"sky/config/{Path(config_yaml).name}"
    up = upload_plan(p, config_yaml, config_rel)
    c = console()
    c.print(f"[bold]dry run[/]: nothing started, nothing uploaded ({escape(p.name)} on {backend}, "
            f"would be run {escape(run_id)})", soft_wrap=True)
    c.print(f"  task      {checked}", markup=False, soft_wrap=True)
    where = "this machine" if p.cluster.is_local and backend == "local" else \
        f"{p.cluster.num_nodes} node(s) x {p.cluster.accelerators_label}"
    stages = {k: re.findall(r"-m payload (\w+)", task.get(k) or "") for k in ("setup", "run")}
    c.print(f"  starts    on {where}: setup ({', '.join(stages['setup']) or '-'}), then run "
            f"({', '.join(stages['run']) or '-'}) with python -m payload", markup=False, soft_wrap=True)
    c.print(f"  upload    {len(up.files)} files, {human_size(up.bytes)}: payload code, run config, data", markup=False)
    for rel, path in up.files.items():
        c.print(f"    {rel}  {human_size(path.stat().st_size)}", markup=False, soft_wrap=True)
    for named, why in up.not_uploaded:
        c.print(f"  [yellow]![/] not uploaded: {escape(named)} ({escape(why)})", soft_wrap=True)
    c.print("  → the same command without --dry-run starts it", markup=False)

