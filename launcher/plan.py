"""`launch plan`: instance, $/hour, hours and dollars for a profile, offline, before money is spent."""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from .profile import REPO_ROOT, Profile, total_gpus
from .render import profile_secrets
from .throughput import model_size_b, tokens_per_second_per_gpu

BYTES_PER_TOKEN = 4.0  # ~4 bytes of UTF-8 JSON per token for English chat data (documented guess)
OVERHEAD_HOURS_CLOUD = 0.3  # setup (~1 min uv), model download (~65 GB at ~200 MB/s), merge/export
OVERHEAD_HOURS_LOCAL = 0.01


@dataclass
class DataEstimate:
    records: int
    tokens_per_record: float
    source: str


@dataclass
class Plan:
    profile: str
    cloud: str
    instance_type: str
    region: Optional[str]
    accelerators: str
    num_nodes: int
    use_spot: bool
    price_per_hour: float
    price_source: str
    train_tokens: float
    data_source: str
    tokens_per_s_per_gpu: float
    throughput_source: str
    gpus: int
    train_hours: float
    overhead_hours: float
    total_hours: float
    total_usd: float
    budget_usd: float
    budget_hours: float
    alternative: dict = field(default_factory=dict)
    secrets: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def estimate_data(p: Profile) -> DataEstimate:
    """Train records and tokens per record: counted from local files, else the profile's estimate."""
    records, nbytes = 0, 0.0
    paths = [_local_path(s.path) if s.path else None for s in p.data.sources]
    if all(paths):
        for s, path in zip(p.data.sources, paths):
            share = (1.0 if s.split == "train" else 0.0) if isinstance(s.split, str) else s.split.get("train", 0.0)
            records += int(_count_records(path) * share)
            nbytes += path.stat().st_size * share
        tpr = (nbytes / max(records, 1)) / BYTES_PER_TOKEN
        return DataEstimate(records, tpr, f"counted in local files, ~{BYTES_PER_TOKEN:g} bytes/token")
    e = p.estimate
    if e.train_records:
        tpr = e.mean_tokens_per_record or p.train.max_seq_length / 2
        how = "profile estimate" if e.mean_tokens_per_record else "profile estimate; tokens/record = max_seq_length/2"
        return DataEstimate(e.train_records, float(tpr), how)
    return DataEstimate(0, 0.0, "unknown: add `estimate.train_records` to the profile")


def _local_path(rel: str) -> Optional[Path]:
    """A source path as the payload will see it (relative to the workdir = repo root), if it exists."""
    for path in (REPO_ROOT / rel, Path(rel)):
        if path.exists():
            return path
    return None


def _count_records(path: Path) -> int:
    with open(path, "rb") as f:
        n = sum(1 for line in f if line.strip())
    return n - 1 if path.suffix == ".csv" else n


def train_tokens(p: Profile, data: DataEstimate) -> float:
    t = p.train
    per_record = min(data.tokens_per_record, t.max_seq_length)
    if t.max_steps:
        seqs = t.max_steps * t.per_device_batch_size * t.gradient_accumulation_steps * total_gpus(p)
        return seqs * (t.max_seq_length if t.packing else per_record)
    return data.records * per_record * t.epochs


def make_plan(p: Profile, choice, alternative=None, price_source: str = "catalog") -> Plan:
    data = estimate_data(p)
    tokens = train_tokens(p, data)
    size = model_size_b(p.model.name_or_path, tiny=p.model.tiny is not None)
    tps, tps_src = tokens_per_second_per_gpu(p.cluster.accelerator_name, p.train.method, size)
    gpus = total_gpus(p)
    train_h = tokens / (tps * gpus) / 3600 if tokens else 0.0
    overhead = OVERHEAD_HOURS_LOCAL if p.cluster.is_local else OVERHEAD_HOURS_CLOUD
    total_h = train_h + overhead
    price = choice.price_per_hour
    plan = Plan(
        profile=p.name, cloud=choice.cloud, instance_type=choice.instance_type, region=choice.region,
        accelerators=choice.accelerators, num_nodes=choice.num_nodes, use_spot=choice.use_spot,
        price_per_hour=price, price_source=price_source, train_tokens=round(tokens),
        data_source=data.source, tokens_per_s_per_gpu=round(tps, 1), throughput_source=tps_src,
        gpus=gpus, train_hours=round(train_h, 3), overhead_hours=overhead, total_hours=round(total_h, 3),
        total_usd=round(total_h * price, 2), budget_usd=p.budget.max_usd,
        budget_hours=round(p.budget.max_usd / price, 2) if price else math.inf,
        secrets={s: ("set" if os.environ.get(s) else "not set") for s in profile_secrets(p)},
    )
    if alternative is not None:
        plan.alternative = {
            "use_spot": alternative.use_spot, "instance_type": alternative.instance_type,
            "cloud": alternative.cloud, "price_per_hour": alternative.price_per_hour,
            "total_usd": round(total_h * alternative.price_per_hour, 2),
        }
    return plan


def plan_profile(p: Profile) -> Plan:
    """Run SkyPilot's optimizer (offline catalog) for the profile and its spot/on-demand twin."""
    if p.cluster.is_local:
        return make_plan(p, _LocalChoice(p), None, "profile (notional local price)")
    from .catalog import SNAPSHOT_DATE, Choice, PlanError, optimize

    try:
        choice, source = optimize(p), f"catalog snapshot {SNAPSHOT_DATE}"
    except PlanError:
        if p.budget.price_per_hour is None:
            raise
        # The catalog does not know this instance: the profile's price is the fallback.
        choice = Choice(cloud=",".join(p.cluster.infra_list), instance_type="(not in the catalog snapshot)",
                        region=p.cluster.region, accelerators=p.cluster.accelerators or "CPU",
                        num_nodes=p.cluster.num_nodes, use_spot=p.cluster.use_spot,
                        node_price_per_hour=p.budget.price_per_hour / p.cluster.num_nodes)
        source = "profile budget.price_per_hour (fallback)"
    try:
        alternative = optimize(p, use_spot=not p.cluster.use_spot)
    except PlanError:
        alternative = None
    return make_plan(p, choice, alternative, source)


class _LocalChoice:
    def __init__(self, p: Profile):
        self.cloud, self.instance_type, self.region = "local", "this machine (CPU)", None
        self.accelerators, self.num_nodes, self.use_spot = "CPU", p.cluster.num_nodes, False
        self.price_per_hour = p.budget.price_per_hour or 0.0
