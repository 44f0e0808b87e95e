"""Profiles: `clusters/<name>.yaml` = the payload's RunConfig + the launcher-owned `cluster:` and
`budget:` sections. Loading reports every problem at once, each as `file:line: key: what; fix`.
"""

from __future__ import annotations

import copy
import csv
import difflib
import functools
import hashlib
import re
import reprlib
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Optional, Union

from pydantic import Field, ValidationError, field_validator, model_validator

from launcher.profiles.boundary import PASSED_BY_NAME, inside, secret_refusal, secret_shape
from launcher.profiles.cloud_names import bucket_name_problem, volume_name_problem
from payload.config import (
    ConfigError,
    RunConfig,
    Strict,
    format_validation_errors,
    load_yaml_with_lines,
    place,
)
from payload.config.yamlio import YamlProblem, parse_yaml, read_bounded

REPO_ROOT = Path(__file__).resolve().parents[2]
CLUSTERS_DIR = REPO_ROOT / "clusters"
CATALOG_DIR = Path(__file__).resolve().parents[1] / "catalog" / "v8"

# SkyPilot 0.14.1 clouds that cannot run a task on several nodes (clouds/*.py: MULTI_NODE unsupported).
NO_MULTI_NODE = {"runpod", "vast", "hyperbolic", "primeintellect", "seeweb", "shadeform", "verda",
                 "vsphere", "yotta"}


def mount_point(value: str) -> str:
    """A mount point on the GPU machine: the run directory lives under it, so it must be a plain
    absolute path (no `..`, not `/`), e.g. `/workspace`."""
    parts = value.split("/")
    if not value.startswith("/") or value == "/" or any(x in ("..", ".") for x in parts) or "\n" in value:
        raise ValueError(f"{value!r} is not a usable mount point: give an absolute path without `.`/`..` "
                         "components (not `/` itself), e.g. /workspace")
    return value


def cloud_name_rule(kind_field: str, default: str, problem_of, rules: str):
    """A `name` validator with the clouds' rules for the kind named by the model's `kind_field`
    (declared before `name`, so it is validated first): launcher/profiles/cloud_names.py."""
    def check(name: str, info):
        kind = info.data.get(kind_field, default)
        problem = problem_of(name, kind)
        if problem:
            raise ValueError(f"`{name}` {problem} ({kind} {rules}); choose another name")
        return name
    return check


class VolumeConfig(Strict):
    """A persistent network volume (created or reused with `sky volumes apply` before launch)."""

    type: Literal["runpod-network-volume", "k8s-pvc"] = "runpod-network-volume"
    """(Declared first: the name's rules depend on it.)"""
    name: str
    size_gb: int = Field(default=100, ge=10)
    """RunPod network volumes are at least 10 GB."""
    mount: str = "/workspace"

    _mount = field_validator("mount")(mount_point)
    _name = field_validator("name")(cloud_name_rule("type", "runpod-network-volume", volume_name_problem, "rules"))


class BucketConfig(Strict):
    """An object-store bucket mounted on every node (multi-node checkpoints, shared storage)."""

    store: Literal["s3", "gcs", "azure", "r2"] = "s3"
    """(Declared first: the name's rules depend on it.)"""
    name: str
    mount: str = "/checkpoints"
    mode: Literal["MOUNT", "MOUNT_CACHED"] = "MOUNT_CACHED"

    _mount = field_validator("mount")(mount_point)
    _name = field_validator("name")(cloud_name_rule("store", "s3", bucket_name_problem, "bucket rules"))


class ClusterConfig(Strict):
    infra: Union[str, list[str]] = "runpod"
    """Where to run: `runpod`, `azure`, `kubernetes`, ... or an ordered list to try in turn.
    `local` runs the task on this machine (local backend)."""
    accelerators: Optional[Union[str, list[str]]] = None
    """SkyPilot accelerator spec per node, e.g. `H100-SXM:2`; or a list of them, any of which will do
    (`[RTX4090:1, A100-80GB:1, H100:1]`): rendered as SkyPilot `any_of`, whose optimizer takes the
    cheapest available (`launch plan` shows the choice and the fallbacks). null = CPU only."""
    num_nodes: int = Field(default=1, ge=1)
    use_spot: bool = False
    """Spot/interruptible. Spot profiles run as SkyPilot managed jobs with automatic recovery."""
    disk_size: int = Field(default=256, ge=10)
    """Container/boot disk in GB (models live on the volume, not here)."""
    image_id: Optional[str] = None
    """e.g. `docker:runpod/pytorch:2.8.0-py3.11-cuda12.8.1-cudnn-devel-ubuntu22.04`: the GPU stack is
    the payload's own venv from its lock (payload/gpu_env.sh), so the image matters for its driver
    libraries, its nvcc and its Python; pick one with the lock's torch/CUDA/Python versions."""
    region: Optional[str] = None
    volume: Optional[VolumeConfig] = None
    bucket: Optional[BucketConfig] = None
    autostop_minutes: int = Field(default=10, ge=1)
    """Clusters (on-demand) tear themselves down after this many idle minutes after the job."""
    max_restarts_on_errors: int = Field(default=2, ge=0)
    """Managed jobs: how many times in a row a transient failure (exit 75) or a signal (143) is
    retried without training progress before the job fails. A crash (1), a config/data error (2) or
    a budget stop (3) is never retried (payload/errors.py; payload/exitcode.py bounds the retries)."""
    recovery_strategy: Literal["FAILOVER", "EAGER_NEXT_REGION"] = "EAGER_NEXT_REGION"

    @model_validator(mode="after")
    def _rules(self):
        if self.num_nodes > 1:
            bad = [i for i in self.infra_list if i.split("/")[0].lower() in NO_MULTI_NODE]
            if bad:
                raise ValueError(
                    f"num_nodes is {self.num_nodes} but {bad[0]} cannot run multi-node tasks in "
                    "SkyPilot 0.14 (no cluster networking between pods); use infra that can, e.g. "
                    "`infra: [kubernetes, azure]`, or set num_nodes: 1"
                )
        options = self.accelerator_options
        if len(options) != len(set(options)):
            raise ValueError(f"cluster.accelerators lists one accelerator twice: {options}")
        if len({_count(a) for a in options}) > 1:
            raise ValueError(f"cluster.accelerators options must have the same GPU count per node (the "
                             f"batch size and the plan depend on it): {options}")
        if len(options) > 1 and len(self.infra_list) > 1:
            raise ValueError("a list of cluster.accelerators cannot be combined with a list of cluster.infra "
                             "(SkyPilot's any_of and ordered do not mix); give one infra or one accelerator")
        if self.use_spot and self.volume is None and self.bucket is None:
            raise ValueError(
                "use_spot without cluster.volume or cluster.bucket: a preempted spot machine "
                "loses its disk, so checkpoints must live on a network volume or bucket; add one"
            )
        return self

    @property
    def infra_list(self) -> list[str]:
        return [self.infra] if isinstance(self.infra, str) else list(self.infra)

    @property
    def is_local(self) -> bool:
        return self.infra_list == ["local"]

    @property
    def accelerator_options(self) -> list[str]:
        """Every accelerator spec the profile accepts, in the profile's order ([] for CPU)."""
        if not self.accelerators:
            return []
        return [self.accelerators] if isinstance(self.accelerators, str) else list(self.accelerators)

    @property
    def accelerators_label(self) -> str:
        """`H100:1`, `RTX4090:1 | A100-80GB:1 | H100:1` (any of), or `CPU`: for messages and tables."""
        return " | ".join(self.accelerator_options) or "CPU"

    @property
    def gpus_per_node(self) -> int:
        options = self.accelerator_options
        return _count(options[0]) if options else 0

    @property
    def accelerator_name(self) -> Optional[str]:
        """The first (preferred) accelerator's name; see `accelerator_options` for all of them."""
        options = self.accelerator_options
        return options[0].partition(":")[0] if options else None


def _count(spec: str) -> int:
    _, _, count = spec.partition(":")
    try:
        return int(float(count or 1))
    except ValueError:
        raise ValueError(f"accelerator {spec!r}: the count after `:` must be a number, e.g. H100:1") from None


class BudgetConfig(Strict):
    max_usd: float = Field(gt=0)
    """Hard cap for the run in dollars: the payload checkpoints and stops there, `launch` tears down."""
    price_per_hour: Optional[float] = Field(default=None, ge=0)
    """$/hour for the whole cluster, the fallback: the price comes from RunPod's API (RUNPOD_API_KEY),
    else SkyPilot's catalog, else this. For `infra: local` it is the notional price of this machine."""
    warn_fraction: float = Field(default=0.9, gt=0, le=1)


class EstimateConfig(Strict):
    """Hints for `launch plan` when the data is not local (hub datasets)."""

    train_records: Optional[int] = Field(default=None, gt=0)
    mean_tokens_per_record: Optional[int] = Field(default=None, gt=0)


ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SECRET_ENV_RE = re.compile(r"^(HF_TOKEN|WANDB_API_KEY)$|_(TOKEN|KEY|SECRET|PAT)$|PASSWORD|CREDENTIAL", re.IGNORECASE)
SECRETS_BY_NAME = (f"secrets stay in your environment and are passed by name at launch ({', '.join(PASSED_BY_NAME)}), "
                   "never written to a profile, a task or the run registry")


def check_env(name: str, value: object = "") -> str:
    """An extra environment variable (profile `envs:`, `launch up --env`): its name, or ValueError with
    the fix. A secret is refused by its name or by its value's shape (launcher/profiles/boundary.py); the
    message names the variable, never the value."""
    if not ENV_NAME_RE.fullmatch(name):
        raise ValueError(f"`{name}` is not an environment variable name (letters, digits, `_`; not a digit first)")
    if SECRET_ENV_RE.search(name):
        raise ValueError(f"`{name}` looks like a secret: {SECRETS_BY_NAME}")
    if name.upper().startswith(("LAUNCH_", "SKYPILOT_")):
        raise ValueError(f"`{name}` is set by launch/SkyPilot for every run: pick another name")
    refusal = secret_refusal(name, value)
    if refusal:
        raise ValueError(refusal)
    return name


def parse_env_items(items: tuple[str, ...]) -> dict[str, str]:
    """`--env KEY=VALUE` options as a mapping; ValueError naming the bad one (never echoing a secret)."""
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep:
            shown = name if ENV_NAME_RE.fullmatch(name) and not secret_shape(name) else "an item"
            raise ValueError(f"`{shown}`: expected KEY=VALUE")
        out[check_env(name, value)] = value
    return out


class Profile(RunConfig):
    cluster: ClusterConfig
    budget: BudgetConfig
    estimate: EstimateConfig = Field(default_factory=EstimateConfig)
    envs: dict[str, Union[str, int, float]] = Field(default_factory=dict)
    """Extra environment variables for the run's processes, rendered into the SkyPilot task's `envs:`
    (and passed to local/ssh runs); `launch up --env KEY=VALUE` adds or replaces one for a run. Never
    secrets: those stay in your environment and are passed by name (HF_TOKEN, WANDB_API_KEY)."""

    @field_validator("envs")
    @classmethod
    def _env_names(cls, v: dict) -> dict:
        for name, value in v.items():
            check_env(name, value)
        return {k: str(x) for k, x in v.items()}

    @model_validator(mode="after")
    def _method_rules(self):
        if self.train.method == "full" and self.train.quantization is not None:
            raise ValueError("train.quantization (QLoRA) cannot be combined with method: full")
        return self

    def runtime_volume(self) -> str:
        c = self.cluster
        if c.volume:
            return c.volume.mount
        if c.bucket:
            return c.bucket.mount
        return "~/launch-volume" if not c.is_local else ".launch/volume"


class ProfileError(ConfigError):
    pass


def profile_names() -> list[str]:
    return sorted(p.stem for p in CLUSTERS_DIR.glob("*.yaml") if in_clusters(p))


def resolve_profile_path(name_or_path: str) -> Path:
    """A profile's file: a path to a .yaml file as given, else `clusters/<name>.yaml`, where the name
    must stay inside clusters/ (the boundary rule: `../x` or a link out of clusters/ is no profile name)."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") and p.exists():
        return p
    candidate = CLUSTERS_DIR / f"{name_or_path}.yaml"
    if candidate.exists() and in_clusters(candidate):
        return candidate
    names = profile_names()
    close = difflib.get_close_matches(name_or_path, names, n=1, cutoff=0.5)
    hint = f"did you mean `{close[0]}`? " if close else ""
    raise ProfileError([f"no profile `{name_or_path}`: {hint}known profiles: {', '.join(names)} "
                        f"(or give a path to a .yaml file)"])


def in_clusters(path: Path) -> bool:
    """Whether a profile file is one of clusters/ by the boundary rule (launcher/profiles/boundary.py: directly
    in clusters/, and no link leads out of it). Only those render into the committed sky/; a profile
    from anywhere else is rendered for its run, never over a committed render."""
    rel = inside(CLUSTERS_DIR, Path(path).absolute())
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


def total_gpus(p: Profile) -> int:
    return max(1, p.cluster.gpus_per_node) * p.cluster.num_nodes
