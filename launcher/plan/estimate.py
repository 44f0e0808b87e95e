"""`launch plan`: instance, $/hour, every billed phase, dollars, GPU memory and storage - offline, before
money is spent.

One idea at ~430 lines: a profile's plan: the `Plan` and the steps that fill it (data, speed and
memory, stages, the optimizer's choice and its spot/on-demand twin, any_of, the other node layout). The
hours (`phases`), the dollars (`cost`), the throughput tables and storage stand apart.

Every billed phase's hours and sources: launcher/plan/phases.py; the dollars and their range:
launcher/plan/cost.py.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from payload.model.memory import (
    dims_from_name,
    estimate_stage_memory_gb,
    lora_trainable_params,
    planned_kernels,
)

from launcher import project
from launcher.catalog import SNAPSHOT_DATE, PlanError, Rental, fallback_choice, optimize, snapshot_warning
from launcher.profiles.schema import Profile, slurm_price, total_gpus
from launcher.profiles.render import profile_secrets
from launcher.plan.storage import disk_needed_gb, storage_for
from launcher.plan import cost as plan_ranges
from launcher.plan.calibration import calibrated
from launcher.plan.phases import LOCAL_OVERHEAD_H, Phase, measured, phases, tokens_per_sequence
from launcher.plan.speed import Throughput, estimate
from launcher.plan.throughput import (
    DPO_FACTOR,
    GPUS,
    GRPO_TRAIN_FACTOR,
    NO_BF16,
    cross_node_bytes_per_microstep,
    decode_steps_per_s,
    effective_speed,
    link_for,
    model_size_b,
    slurm_link,
)
from launcher.profiles.data_count import estimate_from_files

BYTES_PER_TOKEN = 4.0  # ~4 bytes of UTF-8 JSON per token for English chat data (documented guess)
TIGHT_FRACTION = 0.9  # as the payload's preflight: above 90% of GPU memory "tight, may OOM"


@dataclass
class DataEstimate:
    records: int
    tokens_per_record: float
    source: str
    test_records: Optional[int] = None
    lengths: Optional[list] = None
    untrained_note: Optional[str] = None  # records TRL will drop: max_seq_length leaves them no trained token


@dataclass
class Plan(Rental):
    """A profile's plan: what it rents (its choice's fields, `Rental`), then the hours and dollars."""
    profile: str
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
    phases: list = field(default_factory=list)
    speed: dict = field(default_factory=dict)
    memory: dict = field(default_factory=dict)
    storage: list = field(default_factory=list)
    disk: dict = field(default_factory=dict)
    snapshot_date: Optional[str] = None
    snapshot_warning: Optional[str] = None
    alternative: dict = field(default_factory=dict)
    layout: dict = field(default_factory=dict)
    secrets: dict = field(default_factory=dict)
    any_of: list = field(default_factory=list)
    """With a list of cluster.accelerators: each option's instance and price, cheapest first; the
    one SkyPilot's optimizer chose has `chosen: true`, the others are the fallbacks."""
    stages: list = field(default_factory=list)
    """Per stage of a profile with `stages:`: name, kind, records, hours, usd, memory."""
    throughput: dict = field(default_factory=dict)
    """tokens/s/GPU low/mid/high (compute-bound), its source and kind (launcher/plan/speed.py)."""
    ranges: dict = field(default_factory=dict)
    """{hours: {low, mid, high}, usd: {low, mid, high}} (launcher/plan/cost.py)."""
    spot_note: Optional[str] = None
    budget_note: Optional[str] = None
    packing: Optional[str] = None
    data_note: Optional[str] = None  # train records max_seq_length leaves without a trained token
    save_note: Optional[str] = None  # what the save cadence costs when saves are a large share (plan/cost.py)

    def to_dict(self) -> dict:
        d = asdict(self)
        return {"profile": d.pop("profile"), **d}  # the profile first, then what it rents, then the rest


# ------------------------------------------------------------------------------------------ data


def estimate_data(p: Profile) -> DataEstimate:
    """Train records and tokens per record: counted from local files, else the profile's estimate."""
    records, nbytes = 0, 0.0
    paths = [_local_path(s.path) if s.path else None for s in p.data.sources]
    if all(paths):
        counted = estimate_from_files(p, project.root())
        if counted is not None and counted.records:
            kept = counted.records - (0 if p.train.packing else counted.untrained)  # TRL drops them unpacked
            return DataEstimate(max(kept, 0), counted.tokens / counted.records, counted.how,
                                counted.test_records, counted.lengths, counted.untrained_note)
        test = 0
        for s, path in zip(p.data.sources, paths):
            n = _count_records(path)
            kept = min(n, s.max_records) if s.max_records else n  # the data step's max_records cap
            share = train_share(s)
            records += int(kept * share)
            nbytes += path.stat().st_size * (kept / max(n, 1)) * share
            test += int(kept * _share(s, "test"))
        tpr = (nbytes / max(records, 1)) / BYTES_PER_TOKEN
        return DataEstimate(records, tpr, f"counted in local files, ~{BYTES_PER_TOKEN:g} bytes/token (estimate)",
                            test)
    e = p.estimate
    if e.train_records:
        tpr = e.mean_tokens_per_record or p.train.max_seq_length / 2
        how = "profile estimate" if e.mean_tokens_per_record else "profile estimate; tokens/record = max_seq_length/2"
        return DataEstimate(e.train_records, float(tpr), how)
    return DataEstimate(0, 0.0, "unknown: add `estimate.train_records` to the profile")


def train_share(source) -> float:
    """The share of a data source's records that goes to the train split."""
    return _share(source, "train")


def _share(source, name: str) -> float:
    split = source.split
    return (1.0 if split == name else 0.0) if isinstance(split, str) else split.get(name, 0.0)


def _local_path(rel: str) -> Optional[Path]:
    """A source path as the payload will see it (relative to the workdir = repo root), if it exists."""
    for path in (project.root() / rel, Path(rel)):
        if path.exists():
            return path
    return None


def _count_records(path: Path) -> int:
    with open(path, "rb") as f:
        n = sum(1 for line in f if line.strip())
    return n - 1 if path.suffix == ".csv" else n


def train_tokens(p: Profile, data: DataEstimate) -> float:
    t = p.train
    if t.max_steps:
        return t.max_steps * t.per_device_batch_size * t.gradient_accumulation_steps * total_gpus(p) * \
            tokens_per_sequence(p, data)
    return data.records * min(data.tokens_per_record, t.max_seq_length) * t.epochs


# ------------------------------------------------------------------------------------ speed / memory


def throughput_of(p: Profile) -> Throughput:
    """Compute-bound tokens/s/GPU range: the user's own runs first, else the speed model."""
    size = model_size_b(p.model.name_or_path, tiny=p.model.tiny is not None)
    accel, method = p.cluster.accelerator_name, p.train.method
    return estimate(accel, method, size, calibrated(accel, method, p.model.name_or_path))


def training_speed(p: Profile, data: DataEstimate, instance_type: Optional[str], tps: Optional[float] = None):
    """Speed: the compute-bound figure (middle of the range unless `tps`), capped by the link between nodes."""
    tps = throughput_of(p).mid if tps is None else tps
    dims = None if p.model.tiny is not None else dims_from_name(p.model.name_or_path)
    params = dims.params if dims else 0.0
    trainable = lora_trainable_params(p, dims) if dims and p.train.method != "full" else params
    ds = p.train.deepspeed
    cross = cross_node_bytes_per_microstep(p.train.method, ds.zero_stage if ds else None, params, trainable,
                                           p.train.gradient_accumulation_steps)
    micro = p.train.per_device_batch_size * max(tokens_per_sequence(p, data), 1.0)
    link = slurm_link(p.cluster.slurm) if p.cluster.on_slurm else link_for(instance_type)
    return effective_speed(tps, micro, p.cluster.num_nodes, link, cross)


def memory_verdict(p: Profile, stage_cfg=None) -> dict:
    """GPU-memory estimate per GPU (payload.model.memory, as the payload's preflight computes it) vs the GPU.
    With stages: the largest of the stages' estimates (or the one of `stage_cfg`)."""
    if p.cluster.is_local or not p.cluster.accelerator_name:
        return {"status": "n/a", "detail": "CPU"}
    if p.stages and stage_cfg is None:
        from payload.config.stages import stage_run_config

        worst = max((dict(memory_verdict(p, stage_run_config(p, i)), stage=s.label) for i, s in enumerate(p.stages)),
                    key=lambda v: v.get("total_gb") or 0.0)
        if worst.get("detail") and worst.get("total_gb"):
            worst["detail"] += f", largest in stage {worst['stage']}"
        return worst
    gpu, cfg, bf16 = GPUS.get(p.cluster.accelerator_name), stage_cfg or p, p.cluster.accelerator_name not in NO_BF16
    est = estimate_stage_memory_gb(cfg, gpu.memory_gib if gpu else None, total_gpus(p), kernels=planned_kernels(cfg, bf16))
    if not est.get("known"):
        return {"status": "unknown", "detail": est.get("detail", "model size unknown")}
    if gpu is None:
        return {"status": "unknown", "total_gb": est["total_gb"],
                "detail": f"~{est['total_gb']:g} GiB per GPU; memory of {p.cluster.accelerator_name} unknown"}
    frac = est["total_gb"] / gpu.memory_gib
    status = "does not fit" if frac > 1 else ("tight" if frac > TIGHT_FRACTION else "fits")
    return {"status": status, "total_gb": est["total_gb"], "gpu_gb": gpu.memory_gib,
            "components_gb": est["components_gb"],
            "detail": f"~{est['total_gb']:g} of {gpu.memory_gib:g} GiB per GPU ({frac:.0%})"}


# ------------------------------------------------------------------------------------------ stages


def stage_plans(p: Profile, tps_per_gpu: float, price: float) -> list[dict]:
    """Records, tokens, hours, dollars and GPU memory of every stage (throughput.py's stage factors)."""
    from payload.config.stages import stage_dir_name, stage_run_config

    rows, gpus = [], total_gpus(p)
    size = model_size_b(p.model.name_or_path, tiny=p.model.tiny is not None)
    decode = decode_steps_per_s(p.cluster.accelerator_name, size)
    for i, stage in enumerate(p.stages):
        sc = stage_run_config(p, i)
        t = sc.train
        per_step = t.per_device_batch_size * t.gradient_accumulation_steps * gpus
        records = _stage_records(p, sc.data)
        tpr = min(p.estimate.mean_tokens_per_record or t.max_seq_length / 2, t.max_seq_length)
        if stage.kind == "grpo":
            g = stage.grpo
            prompts = t.max_steps * per_step // g.num_generations if t.max_steps else records * t.epochs
            seq = min(tpr + g.max_completion_length, t.max_seq_length)
            seconds = prompts * (g.num_generations * seq * GRPO_TRAIN_FACTOR / (tps_per_gpu * gpus)
                                 + g.max_completion_length / decode)
            n, tokens = prompts, prompts * g.num_generations * seq
        else:
            n = t.max_steps * per_step if t.max_steps else records * t.epochs
            tokens = n * tpr * (DPO_FACTOR if stage.kind == "dpo" else 1.0)
            seconds = tokens / (tps_per_gpu * gpus)
        hours = seconds / 3600
        mem = memory_verdict(p, sc)
        rows.append({"name": stage_dir_name(i, stage), "kind": stage.kind, "records": round(n),
                     "tokens": round(tokens), "hours": round(hours, 3), "usd": round(hours * price, 2),
                     "memory": mem.get("status"), "memory_gb": mem.get("total_gb")})
    return rows


def _stage_records(p: Profile, data) -> int:
    """Train records of a stage's data: counted in local files, capped by max_records, else the estimate."""
    total = 0.0
    for s in data.sources:
        path = _local_path(s.path) if s.path else None
        n = _count_records(path) if path else None
        if s.max_records:
            n = min(n, s.max_records) if n is not None else s.max_records
        if n is None:
            return p.estimate.train_records or 0
        total += n * train_share(s)
    return int(total)


MEMORY_FIX = ("lower train.per_device_batch_size or max_seq_length, use qlora, add train.deepspeed "
              "(zero_stage: 3), or pick a GPU with more memory")


# ------------------------------------------------------------------------------------------ plan


def make_plan(p: Profile, choice, alternative=None, price_source: str = "catalog") -> Plan:
    data = estimate_data(p)
    tokens = train_tokens(p, data)
    thr = throughput_of(p)
    speed = training_speed(p, data, choice.instance_type, thr.mid)
    steps = _steps(p, data, tokens, speed, choice.cloud)
    price = choice.price_per_hour
    train_h, total_h, total_usd = plan_ranges.billed(steps, price)
    plan = Plan(
        profile=p.name, **choice.rental(), price_per_hour=price, price_source=price_source, train_tokens=round(tokens),
        data_source=data.source, tokens_per_s_per_gpu=round(speed.tokens_per_s_per_gpu, 1),
        throughput_source=thr.source, gpus=total_gpus(p), train_hours=round(train_h, 3),
        overhead_hours=round(total_h - train_h, 3),
        total_hours=round(total_h, 3), total_usd=total_usd, budget_usd=p.budget.max_usd,
        budget_hours=round(p.budget.max_usd / price, 2) if price else math.inf,
        phases=[asdict(ph) for ph in steps], speed=speed.to_dict(), memory=memory_verdict(p),
        storage=[s.to_dict() for s in storage_for(p)],
        disk={"size_gb": p.cluster.disk_size, "needed_gb": disk_needed_gb(p)} if not p.cluster.is_local else {},
        secrets={s: ("set" if os.environ.get(s) else "not set") for s in profile_secrets(p)},
        stages=_stage_rows(p, speed, price), throughput=thr.to_dict(),
    )
    low = training_speed(p, data, choice.instance_type, thr.high).tokens_per_s_per_gpu
    high = training_speed(p, data, choice.instance_type, thr.low).tokens_per_s_per_gpu
    mid = speed.tokens_per_s_per_gpu
    plan.ranges = plan_ranges.ranged(steps, mid / low, mid / high, price)
    for row in plan.stages:  # each stage's hours take the same throughput range
        row["hours_range"] = {"low": round(row["hours"] * mid / low, 3), "mid": row["hours"],
                              "high": round(row["hours"] * mid / high, 3)}
    if alternative is not None:
        twin = p.model_copy(update={"cluster": p.cluster.model_copy(update={"use_spot": alternative.use_spot})})
        alt_h = sum(ph.hours for ph in _steps(twin, data, tokens, speed, alternative.cloud))
        plan.alternative = {
            "use_spot": alternative.use_spot, "instance_type": alternative.instance_type,
            "cloud": alternative.cloud, "price_per_hour": alternative.price_per_hour,
            "total_hours": round(alt_h, 3), "total_usd": round(alt_h * alternative.price_per_hour, 4),
        }
        plan.spot_note = plan_ranges.spot_note(plan.use_spot, price, plan.total_usd, plan.alternative)
    plan.budget_note, plan.packing = plan_ranges.over_budget(plan), plan_ranges.packing_note(p, data, train_h, price)
    plan.data_note = data.untrained_note
    plan.save_note = plan_ranges.save_note(p.train.checkpoints.save_steps, steps, total_h, price)
    return plan


def _steps(p: Profile, data: DataEstimate, tokens: float, speed, cloud: str) -> list[Phase]:
    """The billed phases; with stages, training is the stages' sum (each kind costs differently)."""
    gpus = total_gpus(p)
    if p.cluster.is_local:
        return [Phase("training", tokens / (speed.tokens_per_s_per_gpu * gpus) / 3600 if tokens else 0.0, "CPU"),
                Phase("setup", LOCAL_OVERHEAD_H, "local")]
    steps = measured(p, phases(p, cloud, data, tokens, speed))
    rows = _stage_rows(p, speed, 0.0)
    if rows:
        steps = [Phase("training", round(sum(r["hours"] for r in rows), 4), "sum of the stages")
                 if ph.name == "training" else ph for ph in steps]
    return steps


def _stage_rows(p: Profile, speed, price: float) -> list[dict]:
    return stage_plans(p, speed.tokens_per_s_per_gpu, price) if p.stages else []


def plan_profile(p: Profile, compare_layouts: bool = True, twin: bool = True) -> Plan:
    """Run SkyPilot's optimizer (offline catalog) for the profile and (`twin`) its spot/on-demand twin."""
    if len(p.cluster.accelerator_options) > 1 and not p.cluster.is_local:
        return plan_any_of(p, compare_layouts, twin)
    if p.cluster.is_local:
        return make_plan(p, local_choice(p), None, "profile (notional local price)")
    if p.cluster.on_slurm:  # your own cluster: its price and network are the profile's (cluster.slurm)
        return make_plan(p, *slurm_choice(p))
    try:
        choice, source = optimize(p), f"catalog snapshot {SNAPSHOT_DATE}"
    except PlanError:
        if p.budget.price_per_hour is None:
            raise
        # The catalog does not know this instance: the profile's price is the fallback.
        choice, source = fallback_choice(p), "profile budget.price_per_hour (fallback)"
    try:
        alternative = optimize(p, use_spot=not p.cluster.use_spot) if twin else None
    except PlanError:
        alternative = None
    plan = make_plan(p, choice, alternative, source)
    plan.snapshot_date, plan.snapshot_warning = SNAPSHOT_DATE, snapshot_warning()
    if compare_layouts and p.cluster.num_nodes > 1:
        plan.layout = layout_alternative(p) or {}
    return plan


def with_accelerator(p: Profile, spec: str) -> Profile:
    return p.model_copy(update={"cluster": p.cluster.model_copy(update={"accelerators": spec})})


def plan_any_of(p: Profile, compare_layouts: bool = True, twin: bool = True) -> Plan:
    """`any_of` accelerators: SkyPilot's optimizer picks among all options (the cheapest it can
    place); the plan is made for that choice and lists every option's price as the fallbacks."""
    rows = []
    for spec in p.cluster.accelerator_options:
        try:
            c = optimize(with_accelerator(p, spec))
            rows.append({"accelerators": spec, "cloud": c.cloud, "instance_type": c.instance_type,
                         "region": c.region, "price_per_hour": c.price_per_hour})
        except PlanError as e:
            # the option is named in its own row: say where it was not found, not SkyPilot's request repr
            where = f"{p.cluster.infra} in the catalog snapshot" if p.cluster.infra else "the catalog snapshot"
            rows.append({"accelerators": spec, "error": f"no instance on {where}", "detail": str(e),
                         "price_per_hour": None})
    rows.sort(key=lambda r: (r["price_per_hour"] is None, r["price_per_hour"] or 0.0))
    if rows[0]["price_per_hour"] is None:
        optimize(p)  # none fits: SkyPilot's own reason for the any_of task (PlanError)
    chosen = rows[0]["accelerators"]  # SkyPilot's any_of rule: the cheapest it can place (no 2nd run)
    plan = plan_profile(with_accelerator(p, chosen), compare_layouts, twin)
    plan.any_of = [{**r, "chosen": r["accelerators"] == chosen} for r in rows]
    return plan


def layout_alternative(p: Profile) -> Optional[dict]:
    """The same GPUs arranged 4 or 8 per node (the other one): its instance, network, hours, dollars."""
    gpus, per_node = total_gpus(p), p.cluster.gpus_per_node
    other = next((n for n in (8, 4) if n != per_node and gpus % n == 0), None)
    if other is None or not p.cluster.accelerator_name:
        return None
    cluster = p.cluster.model_copy(update={"accelerators": f"{p.cluster.accelerator_name}:{other}",
                                           "num_nodes": gpus // other})
    q = p.model_copy(update={"cluster": cluster})
    try:
        alt = plan_profile(q, compare_layouts=False)
    except PlanError:
        return None
    link = alt.speed.get("link") or {}
    return {"num_nodes": alt.num_nodes, "accelerators": alt.accelerators, "instance_type": alt.instance_type,
            "network": f"{link.get('kind', '-')} {link.get('gbps', 0):,.0f} Gb/s", "bound": alt.speed["bound"],
            "total_hours": alt.total_hours, "total_usd": alt.total_usd, "price_per_hour": alt.price_per_hour}


@dataclass
class LocalChoice(Rental):
    """This machine, at the profile's notional price (no catalog)."""
    price_per_hour: float


def slurm_choice(p: Profile) -> tuple[LocalChoice, None, str]:
    """(the profile's Slurm nodes at its own price, no alternative, where the price came from)."""
    price, source = slurm_price(p)
    name = p.cluster.infra_list[0].split("/", 1)[1]
    rental = LocalChoice("slurm", f"cluster {name}", None, p.cluster.accelerators_label, p.cluster.num_nodes,
                         False, price)
    return rental, None, source


def local_choice(p: Profile) -> LocalChoice:
    return LocalChoice("local", "this machine (CPU)", None, "CPU", p.cluster.num_nodes, False,
                       p.budget.price_per_hour or 0.0)
