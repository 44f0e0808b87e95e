"""A run is one experiment: `launch up --resume` keeps the run's config, and the record says what
produced it.

- Resume: the run's recorded `--set` overrides and `--env` are applied again; a `--set` given on the
  resume goes on top and into the run's history (when, which keys, old -> new). Cadence and money
  may change; a change of the math of the run in flight is refused in one line unless allowed with
  `--allow-change KEY` (the rules: payload/config/resume.py, which the payload applies again itself).
- Provenance, recorded at start: the project's git commit, whether the tree was dirty (the diff of
  tracked files stored beside the run in the state dir, untracked files named), sha256 of the
  profile file and of the payload lock, the launch version, the data sources' sha256.
"""

from __future__ import annotations

import hashlib
import subprocess
import time
from pathlib import Path
from typing import Optional

from payload.config import resume as runconfig

from launcher import __version__, project
from launcher.errors import BackendError
from launcher.profiles.uploads import repo_relative
from launcher.store import registry
from launcher.store.handle import Handle
from launcher.store.state import private_dir, state_dir, write_private
from launcher.term.ui import console, literal, note

PAYLOAD_LOCK = "payload/requirements-gpu.lock"


# ------------------------------------------------------------------------------------------ resume


def resume_target(profile_name: str, resume: str):
    """The run `--resume [RUN]` names (`latest`: the profile's newest run)."""
    if resume != "latest":
        return registry.get(resume)
    candidates = [r for r in registry.all_runs() if r.profile == profile_name]
    if not candidates:
        raise BackendError(f"nothing to resume: {profile_name} has no earlier run (drop --resume)")
    return candidates[0]


def profile_arg(run) -> str:
    """The PROFILE of `launch up PROFILE --resume RUN` for this run: its name, or for a run started from
    a file outside clusters/ (recorded with its provenance), that file's path."""
    from launcher.profiles.profile import in_clusters

    prov = run.handle.provenance or {}
    recorded = prov.get("profile_path")
    return _shown(Path(recorded)) if isinstance(recorded, str) and not in_clusters(Path(recorded)) else run.profile


def own_profile(run, written) -> None:
    """A resume continues a run from the profile file it started from (its path, recorded at start), or
    from a file with the same bytes: another file of the same `name:` (clusters/NAME.yaml for a run
    started from a copy given by path) would change the run without a word. BackendError names the
    run's own file and the command. A run recorded before its path was (no `profile_path`) is not held."""
    prov = run.handle.provenance or {}
    recorded = prov.get("profile_path")
    if not isinstance(recorded, str) or written.sha256 == prov.get("profile_sha256"):
        return
    if Path(written.path).resolve() == Path(recorded):
        return  # its own file, edited since: the resume rule (check_resume) says what may change
    own = _shown(Path(recorded))
    gone = "" if Path(recorded).is_file() else " (no longer there: put it back to resume the run)"
    raise BackendError(f"run {run.id} was started from {own}{gone}, not {written.shown}: a resume "
                       f"continues a run from its own profile; resume it with `launch up {own} --resume {run.id}`")


def _shown(path: Path) -> str:
    """A profile's path as a user types it here: relative below the working directory, else absolute."""
    path = path.resolve()
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)


def key_of(item: str) -> str:
    return item.partition("=")[0].strip()


def merge_overrides(old: list, new: tuple) -> list[str]:
    """The run's overrides with `new` on top: a key set again replaces its earlier value."""
    keys = {key_of(i) for i in new}
    return [i for i in old if key_of(i) not in keys] + list(new)


def carried(run, sets: tuple, envs: dict) -> tuple[tuple, dict]:
    """(overrides, environment) of a resume: the run's recorded ones with this command's on top."""
    return tuple(merge_overrides(run.handle.overrides or [], sets)), {**(run.handle.envs or {}), **envs}


def flat_config(p) -> dict:
    """The profile as resolved for a run (overrides applied), flattened to {dotted key: value}."""
    body = p.model_dump(mode="json")
    return {k: v for k, v in runconfig.flatten(body).items() if not runconfig.matches(k, runconfig.IGNORED_KEYS)}


def check_resume(run, resolved, sets: tuple, allow: tuple) -> dict:
    """The history entry of resuming `run` as `resolved` (launcher/profiles/checks.py ResolvedProfile, the
    overrides merged); BackendError (one line) when a key that changes the math changes without
    `--allow-change KEY`. The baseline is the config recorded when the run started (older runs: the
    profile as read now with the recorded overrides, validated from memory)."""
    baseline = run.handle.config
    if baseline is None:
        from launcher.profiles.profile import validate

        baseline = flat_config(validate(resolved.file, tuple(run.handle.overrides or [])))
    changes = runconfig.diff(baseline, flat_config(resolved.profile))
    bad = runconfig.refused(changes, allow)
    if bad:
        raise BackendError(f"--resume {run.id}: {runconfig.refusal(bad, changes, f'launch up {profile_arg(run)}')}")
    entry = runconfig.entry(changes, allow, "launch up --resume")
    return {**entry, "event": "resume", "set": list(sets)}


def start_entry(sets: tuple) -> dict:
    return {"at": time.time(), "by": "launch up", "event": "start", "set": list(sets)}


def recorded(run, p, sets: tuple, envs: dict, entry: dict, provenance: Optional[dict]) -> Handle:
    """The run's handle after a start or resume (a copy): overrides, env, resolved config, history,
    provenance."""
    handle = run.handle.copy()
    handle.update(overrides=list(sets), envs=envs, config=flat_config(p), history=[*(handle.history or []), entry])
    if provenance is not None:
        handle.provenance = provenance
    return handle


def allow_env(allow: tuple) -> dict:
    """The environment that tells the payload a math change was allowed on purpose."""
    return {runconfig.ALLOW_ENV: ",".join(allow)} if allow else {}


# -------------------------------------------------------------------------------------- provenance


def _git(*args: str) -> Optional[str]:
    """git in the project (the user's repository, when the project is one), or None."""
    try:
        done = subprocess.run(["git", "-C", str(project.root()), *args], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _sha256(path: Path) -> Optional[str]:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def provenance(resolved, run_id: str) -> dict:
    """What produced the run: code (commit, dirty + stored diff), profile (the bytes `launch up` read,
    launcher/profiles/checks.py ResolvedProfile), payload lock, data, version."""
    commit = (_git("rev-parse", "HEAD") or "").strip() or None
    changed = (_git("status", "--porcelain") or "").splitlines() if commit else []
    dirty = bool(changed) if commit else None
    untracked = [line[3:] for line in changed if line.startswith("?? ")]
    diff_path = None
    if dirty:
        diff = _git("diff", "HEAD") or ""
        d = private_dir(private_dir(state_dir() / "provenance") / run_id)
        diff_path = str(write_private(d / "code.diff", diff))
    data = {}
    for s in resolved.profile.data.sources:
        rel = repo_relative(s.path) if s.path else None
        data[s.name] = (_sha256(project.root() / rel) if rel else None) if s.path else \
            f"hf:{s.hf_dataset}" + (f"@{s.revision}" if getattr(s, "revision", None) else "")
    return {"commit": commit, "dirty": dirty, "diff": diff_path, "untracked": untracked[:50],
            "profile_sha256": resolved.file.sha256, "profile_path": str(Path(resolved.file.path).resolve()),
            "payload_lock_sha256": _sha256(project.PACKAGE_ROOT / PAYLOAD_LOCK), "launch_version": __version__,
            "data_sha256": data}


# ------------------------------------------------------------------------------------------ status


def _short(value) -> str:
    return str(value)[:12] if value else "-"


def _when(ts) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(ts)) if isinstance(ts, (int, float)) else "?"


def status_lines(row: dict) -> list[str]:
    """`launch status RUN`: what produced the run (one line) and its config history (a line each)."""
    lines = []
    prov = row.get("provenance")
    if isinstance(prov, dict):
        dirty = " (dirty: diff in " + str(prov.get("diff")) + ")" if prov.get("dirty") else ""
        lines.append(f"code {_short(prov.get('commit'))}{dirty}, profile sha256 {_short(prov.get('profile_sha256'))}, "
                     f"payload lock {_short(prov.get('payload_lock_sha256'))}, launch {prov.get('launch_version')}")
    for e in row.get("history") or []:
        if not isinstance(e, dict):
            continue
        if e.get("event") == "start":
            what = "with " + ", ".join(e.get("set") or []) if e.get("set") else "with the profile as is"
            lines.append(f"history: {_when(e.get('at'))} started {what}")
            continue
        changes = e.get("changes") or {}
        said = ", ".join(f"{k} {runconfig.brief(v[0])} -> {runconfig.brief(v[1])}" for k, v in changes.items()) \
            or "no config change"
        allowed = f" (allowed: {', '.join(e['allowed'])})" if e.get("allowed") else ""
        lines.append(f"history: {_when(e.get('at'))} resumed: {said}{allowed}")
    return lines


def dropped_line(row: dict) -> str:
    """The records the run's trainer dropped, and the fix (a larger train.max_seq_length keeps them)."""
    return f"{row['dropped_reason']}; a larger train.max_seq_length keeps them"


def tracking_lines(row: dict) -> list[str]:
    """Where the run's tracking is (W&B, TensorBoard) and its last step window's GPU figures."""
    lines = [f"W&B: {row['wandb_url']}"] if row.get("wandb_url") else []
    if row.get("tensorboard"):
        lines.append(f"TensorBoard: {row['tensorboard']}" + ("" if row.get("backend") == "local" else
                                                            "  (on the machine; fetched: logs/tensorboard)"))
    if row.get("gpu_not_measured") and row.get("gpu_peak_memory_gb") is None:
        lines.append(f"GPU: not measured ({row['gpu_not_measured']})")
    elif row.get("gpu_peak_memory_gb") is not None:
        util = (f", {row['gpu_util_mean_pct']:.0f}% mean utilisation" if row.get("gpu_util_mean_pct") is not None
                else f", {row.get('gpu_not_measured') or 'utilisation not measured'}")
        lines.append(f"GPU: {row['gpu_peak_memory_gb']:.1f} GB peak{util} (last step window)")
    return lines


def print_differences(row: dict) -> None:
    """Under `launch status RUN`'s table: the payload's budget warning, the attention kernel it loaded
    and why, the records its trainer dropped, then one line per way the run differs from its profile
    (`--set` overrides, `--env` additions), what produced it, its history."""
    if row.get("budget_warning"):
        note("[yellow]![/] ", row["budget_warning"])
    if row.get("attention"):
        console().print(literal("  ", "attention: " + row["attention"]), soft_wrap=True)
    for line in tracking_lines(row):
        console().print(literal("  ", line), soft_wrap=True)
    if row.get("dropped_reason"):
        note("[yellow]![/] ", dropped_line(row))
    if row.get("overrides"):
        console().print(literal("  ", "differs from profile: " + ", ".join(row["overrides"])), soft_wrap=True)
    if row.get("envs"):
        console().print(literal("  ", "extra environment: " + ", ".join(f"{k}={v}" for k, v in row["envs"].items())),
                        soft_wrap=True)
    for line in status_lines(row):
        console().print(literal("  ", line), soft_wrap=True)
