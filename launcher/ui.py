"""Terminal output: one rich Console, `✓`/`✗` lines, tables, and the next useful commands."""

from __future__ import annotations

import functools
import json

import click


@functools.lru_cache(maxsize=1)
def console():
    from rich.console import Console

    return Console(highlight=False)


@functools.lru_cache(maxsize=1)
def err_console():
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def esc(value) -> str:
    """User or remote text for use inside a markup string: shown exactly, never read as markup."""
    from rich.markup import escape

    return escape(str(value))


def literal(markup: str, *texts):
    """Our own markup (e.g. `[red]✗[/] `) followed by `texts` printed exactly as given."""
    from rich.text import Text

    out = Text.from_markup(markup)
    for t in texts:
        out.append(str(t))
    return out


def cell(value):
    """A table cell holding user or remote text (rich would read a plain `str` cell as markup)."""
    from rich.text import Text

    return value if isinstance(value, Text) else Text("-" if value is None else str(value))


def hints(*commands: str) -> None:
    c = console()
    for cmd in commands:
        c.print(f"  [dim]→[/] [bold]{esc(cmd)}[/]")


def money(x) -> str:
    if x is None:
        return "-"
    return f"${x:,.4f}" if 0 < abs(x) < 0.01 else f"${x:,.2f}"


def duration(seconds) -> str:
    if seconds is None:
        return "-"
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def print_plan(p, plan) -> None:
    from rich.table import Table

    t = Table(show_header=False, box=None, padding=(0, 2))
    t.add_column(style="bold")
    t.add_column()
    where = f"{plan.cloud} {plan.instance_type}" + (f" in {plan.region}" if plan.region else "")
    mode = "spot (managed job, auto-recovery)" if plan.use_spot else "on-demand"
    t.add_row("Profile", cell(f"{p.name}: {p.description or ''}"))
    t.add_row("Instance", cell(f"{where}  [{plan.num_nodes} x {plan.accelerators}, {mode}]"))
    t.add_row("Price", f"{money(plan.price_per_hour)}/h  ({plan.price_source})")
    t.add_row("Training", cell(f"{p.train.method} of {p.model.name_or_path}, {plan.train_tokens / 1e6:,.2f}M "
                               f"tokens ({plan.data_source})"))
    t.add_row("Throughput", f"~{plan.tokens_per_s_per_gpu:,.0f} tokens/s/GPU x {plan.gpus} GPU(s)  "
                            f"({plan.throughput_source})")
    t.add_row("Duration", f"~{plan.train_hours:.2f} h training + {plan.overhead_hours:.2f} h setup/download/merge "
                          f"= ~{plan.total_hours:.2f} h")
    t.add_row("Cost", f"~{money(plan.total_usd)}  (budget cap {money(plan.budget_usd)} = "
                      f"{plan.budget_hours:.1f} h at this price)")
    if plan.alternative:
        a = plan.alternative
        kind = "spot" if a["use_spot"] else "on-demand"
        t.add_row("Alternative", f"{kind}: {a['cloud']} {a['instance_type']} {money(a['price_per_hour'])}/h "
                                 f"→ ~{money(a['total_usd'])}")
    t.add_row("Secrets", ", ".join(f"{k} ({v})" for k, v in plan.secrets.items())
              + "  - passed at launch, never written")
    console().print(t)
    if plan.total_usd > plan.budget_usd:
        console().print(f"[yellow]![/] the estimate exceeds the budget: the run will stop at "
                        f"{money(plan.budget_usd)} with a resumable checkpoint")
    hints(f"launch up {p.name}")


def print_profiles(as_json: bool) -> None:
    from .plan import plan_profile
    from .profile import ProfileError, load_profile, profile_names

    rows = []
    for name in profile_names():
        try:
            p = load_profile(name)
            pl = plan_profile(p)
            rows.append({"profile": name, "accelerators": p.cluster.accelerators or "CPU",
                         "nodes": p.cluster.num_nodes, "spot": p.cluster.use_spot,
                         "infra": ",".join(p.cluster.infra_list), "method": p.train.method,
                         "price_per_hour": pl.price_per_hour, "est_hours": pl.total_hours,
                         "est_usd": pl.total_usd, "error": None})
        except (ProfileError, Exception) as e:  # one broken profile must not hide the others
            rows.append({"profile": name, "error": str(e).splitlines()[0]})
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    from rich.table import Table

    t = Table("profile", "infra", "GPUs/node", "nodes", "spot", "method", "$/h", "est. hours", "est. cost")
    for r in rows:
        if r["error"]:
            t.add_row(cell(r["profile"]), f"[red]invalid: {esc(r['error'])}[/]", "", "", "", "", "", "", "")
            continue
        t.add_row(cell(r["profile"]), cell(r["infra"]), cell(r["accelerators"]), str(r["nodes"]),
                  "yes" if r["spot"] else "no", r["method"], money(r["price_per_hour"]), f"{r['est_hours']:.1f}",
                  money(r["est_usd"]))
    console().print(t)


def status_table(rows: list[dict]):
    from rich.table import Table

    t = Table("run", "profile", "backend", "state", "step", "loss", "elapsed", "spent", "ETA", "projected")
    for r in rows:
        step = f"{r['step']}/{r['max_steps']}" if r.get("step") is not None and r.get("max_steps") else (
            str(r["step"]) if r.get("step") is not None else "-")
        loss = f"{r['loss']:.4f}" if isinstance(r.get("loss"), (int, float)) else "-"
        color = {"running": "cyan", "completed": "green", "failed": "red", "preempted": "yellow",
                 "budget_exhausted": "yellow"}.get(r["state"], "white")
        t.add_row(cell(r["id"]), cell(r["profile"]), cell(r["backend"]), f"[{color}]{esc(r['state'])}[/]", step, loss,
                  duration(r.get("elapsed_s")), money(r.get("cost_usd")), duration(r.get("eta_s")),
                  money(r.get("projected_cost_usd")))
    return t
