"""`launch plan PROFILE --compare`: what should I rent? Every GPU type/count and cloud in the catalog
snapshot that can hold the run in GPU memory, ranked by total dollars for this job (not $/h).

Each catalog row (cloud, instance type, GPU, count) is one option on one node, priced at its cheapest
region, on-demand and (where the catalog has a spot price) spot. The job stays the same: the
effective batch (per-device batch x accumulation x GPUs) is kept by changing gradient accumulation,
so a max_steps run trains the same tokens on every option. A multi-node profile also gets its GPU
count spread over each multi-node-capable instance (the network between nodes counted). Hours and dollars are the plan's own
(launcher/plan/estimate.py phases, launcher/plan/speed.py throughput range), memory is payload/model/memory.py's
estimate (as the payload's preflight computes it). No optimizer call per row: the rows are read from
the snapshot's CSVs, which is what SkyPilot's optimizer reads too. The profile's own choice (the
optimizer's) is marked.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from typing import Optional

from launcher.catalog import SNAPSHOT, Choice
from launcher.plan.estimate import Plan, make_plan, memory_verdict
from launcher.profiles.schema import Profile, total_gpus
from launcher.term.tables import Column, print_table
from launcher.term.ui import console, money

CLOUD_DIRS = {"runpod": "RunPod", "azure": "Azure"}


@dataclass(frozen=True)
class Offer:
    cloud: str
    instance_type: str
    accelerator: str
    count: int
    price: float
    spot_price: Optional[float]
    region: str


def offers() -> list[Offer]:
    """The cheapest region of every (cloud, instance type, GPU, count) in the snapshot."""
    best: dict[tuple, Offer] = {}
    for d, cloud in CLOUD_DIRS.items():
        path = SNAPSHOT / d / "vms.csv"
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                if not r.get("AcceleratorName") or not r.get("Price"):
                    continue
                key = (cloud, r["InstanceType"], r["AcceleratorName"], int(float(r["AcceleratorCount"])))
                price, spot = float(r["Price"]), float(r["SpotPrice"]) if r.get("SpotPrice") else None
                old = best.get(key)
                if old is not None:
                    spot = min((x for x in (old.spot_price, spot) if x is not None), default=None)
                    if old.price <= price:
                        price, r = old.price, {"Region": old.region}
                best[key] = Offer(*key, price, spot, r.get("Region") or "")
    return sorted(best.values(), key=lambda o: (o.cloud, o.accelerator, o.count))


def on(p: Profile, accelerator: str, count: int, nodes: int = 1, use_spot: Optional[bool] = None) -> Profile:
    """The same job on `nodes` x accelerator:count: the effective batch kept through accumulation."""
    t = p.train
    target = t.per_device_batch_size * t.gradient_accumulation_steps * total_gpus(p)
    accum = max(1, round(target / (t.per_device_batch_size * count * nodes)))
    cluster = p.cluster.model_copy(update={"accelerators": f"{accelerator}:{count}", "num_nodes": nodes,
                                           **({} if use_spot is None else {"use_spot": use_spot})})
    train = t.model_copy(update={"gradient_accumulation_steps": accum, "effective_batch_size": None})
    return p.model_copy(update={"cluster": cluster, "train": train})


def compare(p: Profile, own: Optional[Plan] = None) -> dict:
    """{rows: fitting options ranked by total $, cheapest first; dropped: how many do not fit}."""
    rows, dropped = [], 0
    for o in offers():
        for nodes in _node_counts(p, o):
            mem = memory_verdict(on(p, o.accelerator, o.count, nodes))
            if mem.get("status") == "does not fit":
                dropped += 1
                continue
            for spot, price in ((False, o.price), (True, o.spot_price)):
                if price is None:
                    continue
                qs = on(p, o.accelerator, o.count, nodes, use_spot=spot)
                choice = Choice(o.cloud, o.instance_type, o.region, f"{o.accelerator}:{o.count}", nodes, spot, price)
                rows.append(_row(make_plan(qs, choice), o, spot, mem, own))
    if own is not None and not any(r["chosen"] for r in rows):
        rows.append({**_plan_row(own), "chosen": True})
    rows.sort(key=lambda r: r["total_usd"])
    for i, r in enumerate(rows, 1):
        r["rank"] = i
    return {"profile": p.name, "rows": rows, "does_not_fit": dropped}


def _node_counts(p: Profile, o: Offer) -> list[int]:
    """One node, and for a multi-node profile the same GPU count over this instance (not on RunPod:
    SkyPilot 0.14 cannot network RunPod pods)."""
    gpus = total_gpus(p)
    out = [1]
    if p.cluster.num_nodes > 1 and o.cloud != "RunPod" and gpus % o.count == 0 and 1 < gpus // o.count <= 16:
        out.append(gpus // o.count)
    return out


def _row(plan: Plan, o: Offer, spot: bool, mem: dict, own: Optional[Plan]) -> dict:
    chosen = bool(own and own.num_nodes == plan.num_nodes and own.cloud == o.cloud
                  and own.instance_type == o.instance_type and own.use_spot == spot)
    row = _plan_row(plan)
    row.update(memory=mem.get("status"), chosen=chosen)
    if spot and o.spot_price is not None and o.spot_price >= o.price:
        row["note"] = "no spot discount"
    return row


def _plan_row(plan: Plan) -> dict:
    h, usd = plan.ranges["hours"], plan.ranges["usd"]
    return {"cloud": plan.cloud, "instance_type": plan.instance_type, "nodes": plan.num_nodes,
            "gpus": f"{plan.num_nodes}x {plan.accelerators}" if plan.num_nodes > 1 else plan.accelerators,
            "spot": plan.use_spot, "price_per_hour": plan.price_per_hour,
            "hours": h, "total_hours": plan.total_hours, "total_usd": plan.total_usd, "usd": usd,
            "memory": plan.memory.get("status"), "throughput_source": plan.throughput.get("kind"),
            "chosen": False, "note": None}



def columns():
    def hours(r):
        return f"{r['hours']['low']:.1f}-{r['hours']['high']:.1f}"

    return [
        Column("#", lambda r: f"{r['rank']}{' ◀' if r['chosen'] else ''}", justify="right"),
        Column("cloud", "cloud"),
        Column("instance", "instance_type", priority=4),
        Column("GPUs", "gpus", must_copy=True),
        Column("mode", lambda r: "spot" if r["spot"] else "on-demand"),
        Column("$/h", lambda r: money(r["price_per_hour"]), must_copy=True, priority=3, justify="right"),
        Column("hours", hours, priority=2, justify="right"),
        Column("total", lambda r: "~" + money(r["total_usd"]), must_copy=True, justify="right"),
        Column("range", lambda r: f"{money(r['usd']['low'])}-{money(r['usd']['high'])}", must_copy=True,
               priority=5, justify="right"),
        Column("memory", "memory", priority=6),
        Column("note", lambda r: r.get("note") or "", priority=7),
    ]


def print_compare(result: dict, as_json: bool) -> None:
    title = f"{result['profile']}: options that fit in GPU memory, by total $ for this job"
    print_table(result["rows"], columns(), as_json, console=console(), json_value=result, title=title)
    if not as_json:
        console().print("  ◀ the profile's own choice; total = the middle figure (range: --json)")
        if result["does_not_fit"]:
            console().print(f"  {result['does_not_fit']} catalog option(s) do not fit this run in GPU memory")
