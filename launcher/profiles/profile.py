"""Profiles: `clusters/<name>.yaml` = the payload's RunConfig + the launcher-owned `cluster:` and
`budget:` sections (their schema: launcher/profiles/schema.py). This module takes a profile from its
name or path to a validated `Profile`: where the file is (clusters/ or a path), reading it once,
`--set` overrides applied to a copy, and every problem at once, each as `file:line: key: what; fix`
(or `--set KEY: ...` for a key an override gave), with the checks across sections.
"""

from __future__ import annotations

import copy
import csv
import difflib
import functools
import hashlib
import reprlib
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from launcher import project
from launcher.profiles.boundary import inside
from launcher.profiles.schema import Profile
from payload.config import ConfigError, format_validation_errors, load_yaml_with_lines, place
from payload.config.yamlio import YamlProblem, parse_yaml, read_bounded

CATALOG_DIR = Path(__file__).resolve().parents[1] / "catalog" / "v8"


class ProfileError(ConfigError):
    pass


def profile_names() -> list[str]:
    """The project's profiles (none outside a project)."""
    if project.find() is None:
        return []
    return sorted(p.stem for p in project.clusters_dir().glob("*.yaml") if in_clusters(p))


def resolve_profile_path(name_or_path: str) -> Path:
    """A profile's file: a path to a .yaml file as given, else the project's `clusters/<name>.yaml`, where
    the name must stay inside clusters/ (the boundary rule: `../x` or a link out of clusters/ is no
    profile name). A shipped example's name outside it is answered with the `launch init` that copies it."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") and p.exists():
        return p
    examples = project.example_names()
    if project.find() is None:
        if name_or_path in examples:
            raise ProfileError([f"`{name_or_path}` is a shipped example, and there is no launch project here: "
                                f"`launch init {name_or_path} --from {name_or_path}` copies it into a new "
                                f"project in {Path.cwd()}"])
        project.root()  # raises NoProject with its one line
    clusters = project.clusters_dir()
    candidate = clusters / f"{name_or_path}.yaml"
    if candidate.exists() and in_clusters(candidate):
        return candidate
    names = profile_names()
    if name_or_path in examples:
        raise ProfileError([f"no profile `{name_or_path}` in {clusters}; it is a shipped example: "
                            f"`launch init {name_or_path} --from {name_or_path}` copies it into this project"])
    close = difflib.get_close_matches(name_or_path, names, n=1, cutoff=0.5)
    hint = f"did you mean `{close[0]}`? " if close else ""
    known = f"known profiles: {', '.join(names)}" if names else f"{clusters} has no profiles yet"
    raise ProfileError([f"no profile `{name_or_path}`: {hint}{known} (or give a path to a .yaml file; "
                        f"`launch init NAME --from EXAMPLE` starts one)"])


def in_clusters(path: Path) -> bool:
    """Whether a profile file is one of clusters/ by the boundary rule (launcher/profiles/boundary.py: directly
    in clusters/, and no link leads out of it). Only those render into the committed sky/; a profile
    from anywhere else is rendered for its run, never over a committed render."""
    found = project.find()
    if found is None:
        return False
    rel = inside(found / project.MARKER, Path(path).absolute())
    return rel is not None and "/" not in rel and Path(path).is_file()


@dataclass(frozen=True)
class ProfileFile:
    """A profile file as read from disk, once (`read_profile`): where it lies, its bytes (the sha256
    a run's provenance records) and its YAML as written, with the line of every key for messages.
    Overrides are applied to copies (`overridden`): the value itself is the profile as written."""

    path: Path
    raw: bytes
    data: dict
    lines: dict

    @property
    def shown(self) -> Path:
        """The path as messages show it: relative to the working directory when inside it."""
        try:
            return self.path.resolve().relative_to(Path.cwd())
        except ValueError:
            return self.path

    @property
    def name(self) -> str:
        """The `name:` as written (the schema's default `run` when absent); validated by `validate`."""
        name = self.data.get("name", "run")
        return name if isinstance(name, str) else str(name)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.raw).hexdigest()

    def overridden(self, overrides: tuple[str, ...] = ()) -> tuple[dict, "Places"]:
        """(data, where each key came from) with `--set KEY=VALUE` overrides applied to a copy
        (ProfileError on a bad one)."""
        data = copy.deepcopy(self.data)
        sets = tuple((apply_override(data, item), item.partition("=")[0]) for item in overrides)
        return data, Places(self, sets)


@dataclass(frozen=True)
class Places:
    """Where each key of a profile with its overrides was given, as a message names it (`places(loc)`):
    `file:line: key` for the file's keys (a section of the file an override changed says so: `(with --set
    KEY)`), `--set KEY` for a key an override set, and `--set KEY: key` for a key inside one or a section
    an override made (`--set train.foo.bar=1`: `train.foo`)."""

    file: ProfileFile
    sets: tuple[tuple[tuple, str], ...]
    """(key path, KEY as typed) of each override, in order: the last one that set a key names it."""

    def __call__(self, loc: tuple) -> str:
        loc = tuple(loc)
        for path, typed in reversed(self.sets):
            if loc[:len(path)] == path or loc and path[:len(loc)] == loc and not _written(self.file.data, loc):
                return f"--set {typed}" if loc == path else f"--set {typed}: {'.'.join(map(str, loc))}"
        within = [typed for path, typed in self.sets if path[:len(loc)] == loc]
        return place(self.file.shown, self.file.lines, loc) + (f" (with --set {', '.join(within)})" if within else "")


def _written(data, loc: tuple) -> bool:
    """Whether the key path `loc` is in the profile as written."""
    for part in loc:
        if part not in (data if isinstance(data, dict) else range(len(data)) if isinstance(data, list) else ()):
            return False
        data = data[part]
    return True


def read_profile(name_or_path: str) -> ProfileFile:
    """Read a profile (a name in clusters/ or a path) from disk: the one place that does
    (bounded like every config file: payload/config/yamlio.py); ProfileError for a file that is not YAML."""
    path = resolve_profile_path(name_or_path)
    try:
        raw = read_bounded(path)
        data, lines = load_yaml_with_lines(path, raw)
    except YamlProblem as e:
        raise ProfileError([str(e)]) from None
    except ConfigError as e:
        raise ProfileError(e.problems) from None
    return ProfileFile(path, raw, data, lines)


def validate(file: ProfileFile, overrides: tuple[str, ...] = ()) -> Profile:
    """The profile of `file` with `overrides` applied, validated; every problem at once in a ProfileError."""
    data, where = file.overridden(overrides)
    problems: list[str] = []
    try:
        profile = Profile.model_validate(data)
    except ValidationError as e:
        problems = format_validation_errors(e, file.shown, file.lines, root=Profile, where=where)
        profile = None
    if profile is not None:
        problems += _semantic_checks(profile, where)
    if problems:
        raise ProfileError(problems)
    if profile.name != file.path.stem and in_clusters(file.path):
        raise ProfileError([f"{where(('name',))}: `{profile.name}` must match the file name `{file.path.stem}`"])
    return profile


def load_profile(name_or_path: str, overrides: tuple[str, ...] = ()) -> Profile:
    """Load and validate a profile; every problem is reported at once in a ProfileError.

    `overrides` are `KEY=VALUE` strings (`--set`), applied to the file's data before validation; the
    file itself is never copied or changed. A command that goes on with the profile (`launch up`)
    reads it once with `read_profile` and hands the value on (launcher/profiles/checks.py `resolve`)."""
    return validate(read_profile(name_or_path), overrides)


def apply_override(data: dict, item: str) -> tuple:
    """Apply one `--set KEY=VALUE` (KEY dotted, list items by index: `data.sources.0.path=x`) in place;
    the key's path (list indices as ints). VALUE is YAML."""
    key, sep, value = item.partition("=")
    parts = key.split(".")
    if not sep or not all(parts):
        raise ProfileError([f"--set {item}: expected KEY=VALUE with a dotted key, e.g. train.max_steps=10 "
                            "or data.sources.0.path=data.jsonl"])
    try:
        parsed, _ = parse_yaml(value, f"--set {key}")
    except YamlProblem as e:
        raise ProfileError([str(e)]) from None
    node, path = data, ()
    for i, part in enumerate(parts):
        where = ".".join(parts[:i]) or "the profile"
        if isinstance(node, list):
            if not (part.isdigit() and int(part) < len(node)):
                have = f"use an index from 0 to {len(node) - 1}, or" if node else "it is empty:"
                raise ProfileError([f"--set {key}: {where} is a list of {len(node)}; {have} set the whole list "
                                    f"with --set {where}=[...]"])
            part = int(part)
        elif not isinstance(node, dict):
            raise ProfileError([f"--set {key}: {where} is a value ({reprlib.repr(node)}), not a section; use "
                                f"--set {where}=... instead"])
        path += (part,)
        if i < len(parts) - 1:
            if isinstance(node, dict) and node.get(part) is None:
                node[part] = {}
            node = node[part]
    node[path[-1]] = parsed
    return path


def _semantic_checks(p: Profile, where: Places) -> list[str]:
    """Rules that need more than one section or outside knowledge (the accelerator catalog)."""
    out = []

    def err(loc, msg):
        out.append(f"{where(loc)}: {msg}")

    c = p.cluster
    if c.accelerators and not c.is_local:
        known = known_accelerators()
        for spec in c.accelerator_options:
            name = spec.partition(":")[0]
            if name not in known:
                close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.5)
                hint = f"did you mean `{close[0]}`?" if close else "see `sky show-gpus`"
                err(("cluster", "accelerators"), f"SkyPilot does not know accelerator `{name}`; {hint}")
    t = p.train
    gpus = max(1, c.gpus_per_node) * c.num_nodes
    if t.effective_batch_size is not None:
        per_step = t.per_device_batch_size * t.gradient_accumulation_steps * gpus
        if per_step != t.effective_batch_size:
            err(("train", "effective_batch_size"),
                f"{t.effective_batch_size} != per_device_batch_size {t.per_device_batch_size} x "
                f"gradient_accumulation_steps {t.gradient_accumulation_steps} x {gpus} GPUs = {per_step}; "
                f"set gradient_accumulation_steps to {t.effective_batch_size / (t.per_device_batch_size * gpus):g}"
                if t.effective_batch_size % (t.per_device_batch_size * gpus) == 0 else
                f"{t.effective_batch_size} is not divisible by per_device_batch_size x {gpus} GPUs; change one")
    if p.budget.price_per_hour:
        hours = p.budget.max_usd / p.budget.price_per_hour
        every = t.checkpoints.save_every_minutes
        if every and hours * 60 < every:
            err(("budget", "max_usd"),
                f"${p.budget.max_usd:g} buys {hours * 60:.0f} min at ${p.budget.price_per_hour:g}/h, less "
                f"than one checkpoint interval ({every:g} min): the run could stop with nothing saved; "
                "raise the budget or lower train.checkpoints.save_every_minutes")
    return out


@functools.lru_cache(maxsize=1)
def known_accelerators() -> frozenset[str]:
    """Accelerator names from the shipped catalog plus SkyPilot's canonical list (no network)."""
    names = set()
    with (CATALOG_DIR / "common" / "accelerators.csv").open() as f:
        names.update(row["AcceleratorName"] for row in csv.DictReader(f))
    names.update(_SKY_CANONICAL)
    return frozenset(names)


# SkyPilot's common GPU names (sky/utils/accelerator_registry.py, 0.14.1), for clouds whose catalog
# we do not ship; the optimizer still decides availability.
_SKY_CANONICAL = {
    "A10", "A10G", "A100", "A100-80GB", "A100-80GB-SXM", "A40", "A6000", "B200", "GB200", "H100",
    "H100-MEGA", "H100-NVL", "H100-SXM", "H200", "H200-SXM", "K80", "L4", "L40", "L40S", "M60",
    "P100", "P4", "RTX3090", "RTX4090", "RTX5090", "RTX6000", "RTXPRO6000", "T4", "V100", "V100-32GB",
    "MI300X", "MI250X",
}
