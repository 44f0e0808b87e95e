"""What `launch plan` and `launch profiles` print: the plan as a table, its warnings, the profiles list."""

from __future__ import annotations

from pathlib import Path

from launcher import project
from launcher.store.state import StateError
from launcher.term.tables import Column, print_table
from launcher.term.ui import cell, console, esc, hints, note
from launcher.term.units import hours, hours_column, money

def print_plan(p, plan) -> None:
    from rich.table import Table

    t = Table(show_header=False, box=None, padding=(0, 2))
    t.add_column(style="bold", no_wrap=True)
    t.add_column()
    where = f"{plan.cloud} {plan.instance_type}" + (f" in {plan.region}" if plan.region else "")
    mode = "spot (managed job, auto-recovery)" if plan.use_spot else "on-demand"
    t.add_row("Profile", cell(f"{p.name}: {p.description or ''}"))
    t.add_row("Instance", cell(f"{where}  [{plan.num_nodes} x {plan.accelerators}, {mode}]"))
    t.add_row("Price", f"{money(plan.price_per_hour)}/h  ({plan.price_source})")
    for o in plan.any_of:  # any_of accelerators: the choice, then the fallbacks, cheapest first
        what = (f"{o['cloud']} {o['instance_type']} {money(o['price_per_hour'])}/h" if o.get("price_per_hour")
                is not None else f"not placeable: {o.get('error', '')}")
        t.add_row("Chosen" if o["chosen"] else "Fallback", cell(f"{o['accelerators']}: {what}"))
    if p.cluster.use_spot:
        from launcher.profiles.render import CONTROLLER_AUTOSTOP

        t.add_row("Controller", f"SkyPilot's jobs controller, a small CPU machine billed while up; torn "
                                f"down after {CONTROLLER_AUTOSTOP['idle_minutes']} idle min "
                                "(jobs.controller.resources.autostop, set by launch up)")
    elif not p.cluster.is_local:
        t.add_row("Autostop", f"the cluster is torn down {p.cluster.autostop_minutes} idle min after the job")
    t.add_row("Training", cell(f"{p.train.method} of {p.model.name_or_path}, {plan.train_tokens / 1e6:,.2f}M "
                               f"tokens ({plan.data_source})"))
    thr = plan.throughput or {}
    spread = f" ({thr['low']:,.0f}-{thr['high']:,.0f})" if thr.get("low") else ""
    t.add_row("Throughput", cell(f"~{plan.tokens_per_s_per_gpu:,.0f}{spread} tokens/s/GPU x {plan.gpus} GPU(s)  "
                                 f"({plan.throughput_source})"))
    if plan.speed.get("link"):
        t.add_row("Network", _network_line(plan.speed))
    rh = (plan.ranges or {}).get("hours")
    span = f" (range {rh['low']:.2f}-{rh['high']:.2f} h)" if rh else ""
    t.add_row("Duration", f"~{plan.train_hours:.2f} h training + {plan.overhead_hours:.2f} h other billed phases "
                          f"= ~{plan.total_hours:.2f} h{span}")
    t.add_row("Phases", ", ".join(f"{ph['name']} {hours(ph['hours'])}" for ph in plan.phases))
    for st in plan.stages:  # a profile with stages: time, cost and memory of each
        mem = f", {st['memory']} ~{st['memory_gb']:g} GiB" if st.get("memory_gb") else ""
        r = st.get("hours_range")
        span = f" ({hours(r['low'])}-{hours(r['high'])})" if r else ""
        t.add_row(f"Stage {esc(st['name'])}", f"{st['kind']}: {st['records']:,} records, ~{hours(st['hours'])}{span}, "
                                              f"~{money(st['usd'])}{mem}")
    ru = (plan.ranges or {}).get("usd")
    span = f" (range {money(ru['low'])}-{money(ru['high'])})" if ru else ""
    cap = f"[red]budget cap {money(plan.budget_usd)}[/]" if plan.budget_note else f"budget cap {money(plan.budget_usd)}"
    # at $0/h no number of hours reaches the cap: said in words, never "= inf h"
    reach = f"= {plan.budget_hours:.1f} h at this price" if plan.price_per_hour else "never reached at $0/h"
    t.add_row("Cost", f"~{money(plan.total_usd)}{span}  ({cap} {reach})")
    if plan.packing:
        t.add_row("Packing", cell(plan.packing))
    if plan.alternative:
        a = plan.alternative
        kind = "spot" if a["use_spot"] else "on-demand"
        own = f"~{a['total_hours']:.2f} h, " if a.get("total_hours") is not None else ""
        t.add_row("Alternative", f"{kind}: {a['cloud']} {a['instance_type']} {money(a['price_per_hour'])}/h "
                                 f"→ {own}~{money(a['total_usd'])}")
    if plan.layout:
        lo = plan.layout
        t.add_row("Layout", f"{lo['num_nodes']} x {lo['accelerators']} ({lo['instance_type']}, {lo['network']}) "
                            f"would be {lo['bound']}-bound: ~{lo['total_hours']:.1f} h, ~{money(lo['total_usd'])}")
    if plan.memory.get("status") not in (None, "n/a"):
        t.add_row("GPU memory", f"{plan.memory['status']}: {plan.memory['detail']}")
    for s in plan.storage:
        t.add_row("Storage", _storage_line(s))
    if plan.disk:
        t.add_row("Disk", f"{plan.disk['size_gb']} GB per node (needs ~{plan.disk['needed_gb']} GB)")
    if plan.secrets:
        t.add_row("Secrets", ", ".join(f"{k} ({v})" for k, v in plan.secrets.items())
                  + "  - passed at launch, never written")
    else:
        t.add_row("Secrets", "none needed")
    console().print(t)
    if plan.budget_note:
        note("[red]✗[/] ", plan.budget_note)
    if plan.spot_note:
        note("[yellow]![/] ", plan.spot_note)
    if plan.save_note:
        note("[yellow]![/] ", plan.save_note)
    for line in plan_warnings(plan):
        note("[yellow]![/] ", line)
    hints(f"launch up {p.name}")


def _network_line(speed: dict) -> str:
    link = speed["link"]
    return (f"{link['kind']} {link['gbps']:,.0f} Gb/s per node: {speed['bound']}-bound "
            f"({speed['network_s']:.1f} s network vs {speed['compute_s']:.1f} s compute per micro-step; "
            f"{link['source']})")


def _storage_line(s: dict) -> str:
    cost = "price unknown" if s["usd_per_month"] is None else f"{money(s['usd_per_month'])}/month"
    size = f"~{s['size_gb']:,.0f} GB (estimate)" if s["kind"] == "bucket" else \
        f"{s['size_gb']:,.0f} GB (~{s['needed_gb']:,.0f} GB used)"
    return (f"{s['kind']} {s['name']} ({s['type']}), {size}: {cost} while it exists, "
            f"also after `launch down` (delete: launch volumes rm {s['name']})")


def plan_warnings(plan) -> list[str]:
    out = []
    if plan.data_note:
        out.append(plan.data_note)
    if plan.snapshot_warning:
        out.append(plan.snapshot_warning)
    if plan.memory.get("status") == "does not fit":
        out.append(f"GPU memory: {plan.memory['detail']} does not fit: the payload's preflight will refuse "
                   "to train; lower train.per_device_batch_size or max_seq_length, or use a bigger GPU")
    elif plan.memory.get("status") == "tight":
        out.append(f"GPU memory: {plan.memory['detail']} is tight (estimate +-20%): may run out of memory")
    disk = plan.disk
    if disk and disk["size_gb"] < disk["needed_gb"]:
        out.append(f"cluster.disk_size {disk['size_gb']} GB is below the ~{disk['needed_gb']} GB the run "
                   "puts on each node's disk: raise it")
    elif disk and disk["size_gb"] > 1.5 * disk["needed_gb"] and "kubernetes" in plan.cloud.lower():
        out.append(f"cluster.disk_size {disk['size_gb']} GB is far above the ~{disk['needed_gb']} GB needed: "
                   "large disk requests exclude Kubernetes node pools")
    for s in plan.storage:
        if s["kind"] == "volume" and s["needed_gb"] > s["size_gb"]:
            out.append(f"volume {s['name']}: ~{s['needed_gb']:,.0f} GB to store but {s['size_gb']:,.0f} GB "
                       "provisioned: raise cluster.volume.size_gb")
    return out


def print_profiles(as_json: bool) -> None:
    from launcher.plan.estimate import plan_profile
    from launcher.profiles.profile import ProfileError, load_profile, profile_names

    rows = []
    for name in profile_names():
        try:
            p = load_profile(name)
            pl = plan_profile(p, compare_layouts=False, twin=False)  # the table shows no spot/on-demand twin
            monthly = [s["usd_per_month"] for s in pl.storage if s["usd_per_month"] is not None]
            rows.append({"profile": name, "accelerators": p.cluster.accelerators_label,
                         "nodes": p.cluster.num_nodes, "spot": p.cluster.use_spot,
                         "infra": ",".join(p.cluster.infra_list), "method": p.train.method,
                         "price_per_hour": pl.price_per_hour, "est_hours": pl.total_hours,
                         "est_usd": pl.total_usd, "gpu_memory": pl.memory.get("status"),
                         "storage_usd_per_month": round(sum(monthly), 2) if monthly else None, "error": None})
        except StateError:  # launch's own state dir, not this profile: said once, as every command does
            raise
        except (ProfileError, Exception) as e:  # noqa: BLE001 - one broken profile must not hide the others
            rows.append({"profile": name, "error": str(e).splitlines()[0]})
    if rows or as_json or project.find() is not None:
        print_table(rows, PROFILE_COLUMNS, as_json, console=console())
    for r in rows if not as_json else ():  # the error is a sentence with a path: whole, on a line of its own
        if r["error"]:
            note("[red]✗[/] ", f"{r['profile']}: {r['error']} (`launch validate {r['profile']}` "
                 "says every problem)")
    if not as_json:
        print_examples(project)


def print_examples(project) -> None:
    """The examples this install ships, apart from the project's own profiles (in launch's own checkout
    they are its profiles: nothing more to say), with the `launch init` that copies one."""
    found = project.find()
    if found is not None and project.examples_dir().resolve() == (found / project.MARKER).resolve():
        return
    names = project.example_names()
    where = "" if found is not None else f"no launch project in {Path.cwd()} or above it; "
    note("  ", f"{where}shipped examples: {', '.join(names)}")
    first = "local-demo" if "local-demo" in names else (names[0] if names else "EXAMPLE")
    note("  → ", f"launch init my-{first.removeprefix('local-')} --from {first}")


def _gpus(r: dict):
    if r["error"]:
        from rich.text import Text

        return Text("invalid (below)", style="red")
    return (f"{r['nodes']}x " if r["nodes"] > 1 else "") + r["accelerators"] + (" spot" if r["spot"] else "")


def _ok(fn):
    return lambda r: "" if r.get("error") else fn(r)


PROFILE_COLUMNS = [
    Column("profile", "profile", must_copy=True),
    Column("GPUs", _gpus, wrap_min=16),
    Column("$/h", _ok(lambda r: money(r["price_per_hour"])), must_copy=True, justify="right"),
    Column("hours", _ok(lambda r: hours_column(r["est_hours"])), priority=2, justify="right"),
    Column("est. $", _ok(lambda r: money(r["est_usd"])), must_copy=True, justify="right"),
    Column("memory", _ok(lambda r: r["gpu_memory"] or "-"), priority=3),
    Column("$/month", _ok(lambda r: money(r["storage_usd_per_month"])), priority=1, justify="right"),
]
