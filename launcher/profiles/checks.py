"""Everything checkable before money, checked before money: `validate`, `plan` and `up` load a
profile through `load_checked`, which reports the profile's config problems and its local data
files (missing, unreadable, empty, or where the upload will not take them) in one report, before
any credential, price lookup or SDK call. Once the files are there, their records are read the way
the run's data stage reads them (`record_report`: the payload's own check, the one `launch data
preview` runs, on the first SAMPLE_RECORDS of each local source): data the trainer would refuse
(binary, invalid JSON, missing or mistyped fields, a top-level array of lists...) is refused here
with the data stage's own line (file:line, what, fix), before anything starts or is rented.

The profile loader itself (`load_profile`) stays free of file-system checks: `render --all` and the
shipped-profile tests must work on a checkout without anyone's private data.

`launch up` reads the file once and checks it once (`resolve`, `checked`) into a ResolvedProfile (the
file as written, the overrides, the profile, what the checks found) and hands that value down its path.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Optional

from payload.config import ConfigError

from launcher import project
from launcher.profiles.data_count import estimate_from_files
from launcher.profiles.datahints import missing_file_hint
from launcher.profiles.profile import ProfileError, ProfileFile, read_profile, validate
from launcher.profiles.schema import Profile
from launcher.term.units import human_size
from launcher.profiles.uploads import repo_relative


def outside_problem(rel: str, what: str = "file") -> Optional[str]:
    """Why a local path a profile names (a data file, an image root, a reward file) cannot be used,
    by the boundary rule (launcher/profiles/boundary.py `inside`: inside the project by every route, links
    included), else None. The same rule on every backend, local included (launcher/profiles/boundary.py
    says why): a run reads its files from the project's copy, by their path from the project root. `~` is
    expanded first, as the boundary rule expands it: `~/x.jsonl` is a path in the user's home."""
    p = PurePosixPath(os.path.expanduser(rel))
    if p.is_absolute():
        inner = repo_relative(rel)
        if inner is not None:
            kind = "an absolute path" if PurePosixPath(rel).is_absolute() else "a path from your home directory"
            return (f"{rel} is {kind}: a run reads its {what} by its path from the project root, on "
                    f"every backend; write it as {inner}")
        hub = ", or use a Hub dataset (`hf_dataset:` instead of `path:`)" if what == "file" else ""
        return (f"{rel} is outside the project, and a run (on every backend, local included) gets only the "
                f"project's files: put the {what} under data/ in the project and give its path from the project "
                f"root, "
                f"e.g. data/{p.name}{hub}")
    if not p.parts or ".." in p.parts:
        return f"{rel} is outside the project, which is all that is uploaded to the machine; move it under data/"
    if repo_relative(rel) is None:
        return (f"{rel} leads out of the project through a symbolic link (to {(project.root() / rel).resolve()}); a link "
                f"out of the project is never followed or uploaded: copy the {what} under data/ instead of linking it")
    return None


def _check_file(rel: str) -> tuple[Optional[str], Optional[int]]:
    """(problem, size) of one data.sources[].path inside the project, as the run will read it."""
    target = project.root() / rel
    if not target.exists():
        return f"{rel} not found (looked for {target}); put the file there or fix the path", None
    if not target.is_file():
        return f"{rel} is not a file ({target})", None
    if not os.access(target, os.R_OK):
        return f"{rel} is not readable ({target}); fix its permissions", None
    size = target.stat().st_size
    if size == 0:
        return f"{rel} is empty ({target})", 0
    return None, size


def data_file_report(source, overrides: tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """(problems, present) for the local data files a profile names (`source`: its file as read, a
    ProfileFile, or its path; after `--set` overrides): problems as `file:line: key: what; fix`,
    present as `path (size)`. A path outside the project (`outside_problem`) is among the problems."""
    problems, _, present = _file_report(source, overrides)
    return problems, present


def _file_report(source, overrides: tuple[str, ...] = ()) -> tuple[list[str], list[str], list[str]]:
    """(problems, those of them that are paths outside the project, present) of `data_file_report`: a path
    outside the project can never reach a run, whereas a missing file can still be put in place before `up`."""
    try:
        file = source if isinstance(source, ProfileFile) else read_profile(str(source))
        data, where = file.overridden(overrides)
    except ConfigError:
        return [], [], []  # the profile's own loading reports it
    outside, problems, present, hints = [], [], [], []

    def refuse(loc: tuple, problem: str) -> None:
        outside.append(f"{where(loc)}: {problem}")
        problems.append(outside[-1])
        hints.append("")

    for prefix, i, src in ((pre, i, src) for pre, sources in _source_lists(data) for i, src in enumerate(sources)):
        images = src.get("image_root") if isinstance(src, dict) else None
        problem = outside_problem(images, "image directory") if isinstance(images, str) and images not in ("", ".") \
            else None
        if problem:
            refuse((*prefix, "data", "sources", i, "image_root"), problem)
        rel = src.get("path") if isinstance(src, dict) else None
        if not isinstance(rel, str) or not rel:
            continue
        loc = (*prefix, "data", "sources", i, "path")
        problem = outside_problem(rel)
        if problem:
            refuse(loc, problem)
            continue
        problem, size = _check_file(rel)
        if problem:
            problems.append(f"{where(loc)}: {problem}")
            hints.append(missing_file_hint(src) if problem.startswith(f"{rel} not found") else "")
        else:
            present.append(f"{rel} ({human_size(size)})")
    for loc, file in _reward_files(data):
        problem = outside_problem(file, "reward file")
        if problem:
            refuse(loc, problem)
        elif not (project.root() / file).is_file():
            problems.append(f"{where(loc)}: {file} not found "
                            f"(looked for {project.root() / file}); put the reward module there or fix the path")
            hints.append("")
    if problems and present:
        problems[-1] += f" (present: {', '.join(present)})"
    return [p + h for p, h in zip(problems, hints)], outside, present


def _source_lists(data: dict) -> list[tuple[tuple, list]]:
    """(key prefix, sources) of the run's `data:` and of each stage's own `data:` (`stages:`)."""
    out = []
    blocks = [((), data)] + [(("stages", j), st) for j, st in enumerate(data.get("stages") or [])
                             if isinstance(data.get("stages"), list)]
    for prefix, block in blocks:
        d = block.get("data") if isinstance(block, dict) else None
        sources = d.get("sources") if isinstance(d, dict) else None
        if isinstance(sources, list):
            out.append((prefix, sources))
    return out


def _reward_files(data: dict) -> list[tuple[tuple, str]]:
    """(key, file) of every user reward `FILE.py:FUNCTION` in the profile's GRPO stages."""
    out = []
    stages = data.get("stages") if isinstance(data.get("stages"), list) else []
    for j, st in enumerate(stages):
        grpo = st.get("grpo") if isinstance(st, dict) else None
        rewards = grpo.get("rewards") if isinstance(grpo, dict) else None
        for k, spec in enumerate(rewards if isinstance(rewards, list) else []):
            file = spec.rpartition(":")[0] if isinstance(spec, str) else ""
            if file.endswith(".py"):
                out.append((("stages", j, "grpo", "rewards", k), file))
    return out


@dataclass(frozen=True)
class ResolvedProfile:
    """A profile loaded and checked once, for a command that goes on with it (`launch up`): the file
    as written and where it came from (`file`), the overrides applied (`--set`, a resume's recorded
    ones, a rehearsal's cuts), the validated profile, and what the checks found (`present`: the data
    files there and their records read; `data_problems`, which `load_checked` refuses)."""

    file: ProfileFile
    overrides: tuple[str, ...]
    profile: Profile
    present: list[str]
    data_problems: list[str]

    def as_written(self) -> Profile:
        """The profile without the overrides (the committed sky/ render's): this one when there are none."""
        return validate(self.file) if self.overrides else self.profile


def resolve(source, overrides: tuple[str, ...] = ()) -> ResolvedProfile:
    """The profile (`source`: a name, a path or a ProfileFile already read) with `overrides`,
    validated and its local data checked: config problems (and data problems with them, so the user
    sees everything at once) raise one ProfileError, and so does a path outside the project (`plan`
    included: no backend can read it; the data rule is the same for every backend, `outside_problem`)."""
    file = source if isinstance(source, ProfileFile) else read_profile(str(source))
    problems: list[str] = []
    profile = None
    try:
        profile = validate(file, tuple(overrides))
    except ProfileError as e:
        problems = list(e.problems)
    data_problems, outside, present = _file_report(file, overrides)
    if problems or outside:  # a path outside the project never reaches a run: refused even by `plan`
        raise ProfileError(problems + data_problems)
    if not data_problems:  # every file is there: its records, as the data stage will read them
        record_problems, present = record_report(file, profile, overrides)
        if record_problems:
            raise ProfileError(record_problems)
        count_refusal(profile)
    return ResolvedProfile(file, tuple(overrides), profile, present, data_problems)


def count_refusal(p: Profile) -> None:
    """The local data counted in full, as `launch plan` counts it (launcher/profiles/data_count.py): what
    it refuses (no record keeps a token to train at train.max_seq_length, a record the data step refuses
    past the sample read above) is refused here, so no backend starts what `plan` refuses. Hub datasets
    are counted on the machine."""
    if p.data.sources and all(s.path and (project.root() / s.path).is_file() for s in p.data.sources):
        estimate_from_files(p, project.root())


def check_profile(name_or_path: str, overrides: tuple[str, ...] = ()) -> tuple[Profile, list[str], list[str]]:
    """(profile, present data files, data problems) of `resolve`."""
    r = resolve(name_or_path, overrides)
    return r.profile, r.present, r.data_problems


def record_report(file: ProfileFile, p: Profile, overrides: tuple[str, ...] = ()) -> tuple[list[str], list[str]]:
    """(problems, checked) for the records of the profile's local sources (its `data:` and each
    stage's own): the payload's data-stage check (`check_sample`) on the first SAMPLE_RECORDS of each,
    problems as `file:line: key: the data stage's line`, checked as `path: N records read ...`."""
    blocks = [((), p.data)] + [(("stages", j), st.data) for j, st in enumerate(p.stages) if st.data is not None]
    blocks = [(prefix, block) for prefix, block in blocks if not all(s.hf_dataset for s in block.sources)]
    if not blocks:  # hub datasets only: read on the machine (`launch data preview` says so)
        return [], []
    from payload.data.pipeline import SAMPLE_RECORDS, check_sample

    _, where = file.overridden(overrides)
    problems, checked = [], []
    for prefix, block in blocks:
        with tempfile.TemporaryDirectory(prefix="launch-data-check-") as tmp:
            stats, found = check_sample(block, tmp, base_dir=project.root())
        for i, line in found:
            loc = (*prefix, "data", "sources") + ((i, "path") if i is not None else ())
            first = f" (the first {SAMPLE_RECORDS:,} records were read)" if i is not None and \
                stats["sources"].get(block.sources[i].name, {}).get("in", 0) >= SAMPLE_RECORDS else ""
            problems.append(f"{where(loc)}: {line}{first}")
        for s in block.sources:
            st = stats["sources"].get(s.name)
            if st is not None and not found:
                checked.append(_checked_line(s.path, st, SAMPLE_RECORDS))
    return problems, checked


def _checked_line(rel: str, st: dict, limit: int) -> str:
    """`path (size): N records read like the data step, D dropped (first: file:line: why)`."""
    size = ""
    for target in (project.root() / rel, Path(rel)):
        if target.is_file():
            size = f" ({human_size(target.stat().st_size)})"
            break
    first = "the first " if st["in"] >= limit else ""
    line = f"{rel}{size}: {first}{st['in']:,} records read like the run's data step, {st['dropped']:,} dropped"
    if st["problems"]:
        line += f" (first: {st['problems'][0]['where']}: {st['problems'][0]['reason']})"
    return line


def load_checked(name_or_path, overrides: tuple[str, ...] = ()) -> tuple[Profile, list[str]]:
    """(profile, present data files) or one ProfileError with every config and data problem:
    what `validate` and `up` use (a run cannot start without its data). `launch up` keeps the whole
    ResolvedProfile: `checked`."""
    r = checked(name_or_path, overrides)
    return r.profile, r.present


def checked(source, overrides: tuple[str, ...] = ()) -> ResolvedProfile:
    """`resolve`, refusing data problems too (a run cannot start without its data)."""
    r = resolve(source, overrides)
    if r.data_problems:
        raise ProfileError(r.data_problems)
    return r
