"""A profile's schema: the payload's RunConfig plus the launcher-owned sections of `clusters/<name>.yaml`
(`cluster:` with its volume or bucket, `budget:`, `estimate:`) and `envs:`, each field's rules, and what
follows from the schema alone (`total_gpus`, the runtime volume). Reading a profile file into one of
these, with `--set` and file:line messages, is launcher/profiles/profile.py.
"""

from __future__ import annotations

import re
from typing import Literal, Optional, Union

from pydantic import Field, field_validator, model_validator

from launcher.profiles.boundary import PASSED_BY_NAME, secret_refusal, secret_shape
from launcher.profiles.cloud_names import bucket_name_problem, volume_name_problem
from payload.config import RunConfig, Strict

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


class SlurmConfig(Strict):
    """Your own Slurm cluster, used when `cluster.infra` is `slurm/<name>` (the `Host` of SkyPilot's
    `~/.slurm/config`); ignored on every other infra, so a profile can carry it beside its clouds."""

    shared_dir: str = "/shared/launch"
    """A directory every node sees (the cluster's shared filesystem): the run's checkpoints, outputs
    and GPU environment live under it, as on a volume, so a run resumes on any node. An absolute
    path, not `~/...`: SkyPilot runs each job with HOME set to a per-cluster directory that `sky down`
    removes (sky/provision/slurm/instance.py:723, :1256)."""
    price_per_gpu_hour: Optional[float] = Field(default=None, ge=0)
    """What one GPU-hour of your cluster costs you (your centre's rate, or hardware and power
    amortized): `launch plan`, the budget and `launch cost` bill it x the run's GPUs. No catalog
    knows your cluster's price; unset, the run is billed at budget.price_per_hour, else $0."""

    network_gbps: float = Field(default=25, gt=0)
    """Each node's link to the others, all NICs together (8 x 200 Gb/s HDR InfiniBand: 1600): the plan's
    network time per step comes from it (ZeRO-3 moves ~3 x the model's bf16 weights per micro-step)."""
    infiniband: bool = False
    """The nodes talk over InfiniBand (RDMA: NCCL's IB transport), not Ethernet."""

    _dir = field_validator("shared_dir")(mount_point)


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
    slurm: Optional[SlurmConfig] = None
    """Where runs keep their files on a Slurm cluster and what its GPU-hour costs (`infra: slurm/...`)."""
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
        self._slurm_rules()
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

    def _slurm_rules(self) -> None:
        """On a Slurm cluster the run's files live on its shared filesystem (cluster.slurm.shared_dir):
        a profile's bucket or volume, there for its clouds, is not mounted."""
        slurm = [i for i in self.infra_list if i.split("/")[0].lower() == "slurm"]
        if not slurm:
            return
        if len(slurm) != len(self.infra_list):
            raise ValueError(f"{slurm[0]} cannot be listed with other infra: a run on Slurm keeps its files on "
                             "the cluster's shared filesystem, elsewhere on a volume or bucket; give one")
        if "/" not in slurm[0] or not slurm[0].split("/", 1)[1]:
            raise ValueError(f"infra {slurm[0]!r}: name the cluster, `slurm/<name>` (a `Host` of ~/.slurm/config)")
        if self.use_spot:
            raise ValueError("use_spot on Slurm: a Slurm cluster has no spot machines "
                             "(sky/clouds/slurm.py); set use_spot: false")
        if self.volume is not None:
            raise ValueError(f"a {self.volume.type} volume cannot be mounted on a Slurm cluster: drop cluster.volume "
                             "(runs keep their files in cluster.slurm.shared_dir)")
        self.slurm = self.slurm or SlurmConfig()
        self.bucket = None

    @property
    def infra_list(self) -> list[str]:
        return [self.infra] if isinstance(self.infra, str) else list(self.infra)

    @property
    def on_slurm(self) -> bool:
        """Every infra is a Slurm cluster (`slurm/<name>`): the run's files are on its shared filesystem."""
        return all(i.split("/")[0].lower() == "slurm" for i in self.infra_list)

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
        if c.on_slurm:
            return c.slurm.shared_dir
        if c.volume:
            return c.volume.mount
        if c.bucket:
            return c.bucket.mount
        return "~/launch-volume" if not c.is_local else ".launch/volume"


def total_gpus(p: Profile) -> int:
    return max(1, p.cluster.gpus_per_node) * p.cluster.num_nodes


def slurm_price(p: Profile) -> tuple[float, str]:
    """A Slurm cluster's $/h for the run: the profile's cluster.slurm.price_per_gpu_hour x its GPUs, else
    budget.price_per_hour (the whole cluster), else 0 (your own cluster: no catalog or API knows it)."""
    c = p.cluster
    if c.slurm.price_per_gpu_hour is not None:
        gpus = max(1, c.gpus_per_node) * c.num_nodes
        return round(c.slurm.price_per_gpu_hour * gpus, 4), "profile cluster.slurm.price_per_gpu_hour"
    if p.budget.price_per_hour is not None:
        return float(p.budget.price_per_hour), "profile"
    return 0.0, "unknown"
