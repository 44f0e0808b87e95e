"""`launch up`'s question before a cloud run whose plan is over its own budget cap (issue 24)."""

from __future__ import annotations


def confirm_over_budget(p, backend: str, interactive: bool) -> None:
    """Before `launch up` starts a cloud run planned over its budget cap: say so in red and ask (a
    script, with no terminal to ask on, gets the red line: the budget stop still ends the run at the cap)."""
    if backend != "skypilot" or p.cluster.is_local:
        return
    import click

    from .catalog import PlanError
    from .plan import plan_profile
    from .ui import err_console, esc

    try:
        note = plan_profile(p, compare_layouts=False).budget_note
    except Exception:  # noqa: BLE001 - planning is advice here; `up` reports its own errors
        return
    if not note:
        return
    err_console().print(f"[red]✗ {esc(note)}[/]")
    if interactive and not click.confirm("Start it anyway?", default=False, err=True):
        raise PlanError("not started: the plan is over the budget cap (raise budget.max_usd with "
                                   "--set budget.max_usd=N, or shorten the run)")
