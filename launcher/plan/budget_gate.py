"""`launch up`'s question before a run whose plan is over its own budget cap, on every
backend: an ssh machine bills by the hour as a cloud one does, and a local run's budget stop ends it at
the cap at its notional price. (What `plan` refuses outright, `up` has refused before this, on every
backend and with --dry-run: launcher/profiles/checks.py `resolve`.)

The plan here is `launch plan`'s, made from the optimizer's answer that `launch up` already has for
the price (`catalog.choice_apart`, a child process): SkyPilot is never imported for offline planning
into the process that goes on to call the SDK (a process that had imported it for planning could not
launch at all)."""

from __future__ import annotations

import click

from launcher.catalog import PlanError, choice_apart, fallback_choice
from launcher.term.ui import err_console, note


def confirm_over_budget(p, backend: str, interactive: bool) -> None:
    """Before `launch up` starts a run planned over its budget cap (`backend`: any): say so in red and
    ask (a script, with no terminal to ask on, gets the red line: the budget stop still ends the run at
    the cap)."""
    from launcher.profiles.profile import ProfileError

    try:
        line = budget_note(p)
    except ProfileError:  # the data counted for the plan leaves nothing to train: refused before renting
        raise
    except Exception:  # noqa: BLE001 - planning is advice here; `up` reports its own errors
        return
    if not line:
        return
    note("[red]✗[/] ", line, out=err_console())
    if interactive and not click.confirm("Start it anyway?", default=False, err=True):
        raise PlanError("not started: the plan is over the budget cap (raise budget.max_usd with "
                        "--set budget.max_usd=N, or shorten the run)")


def budget_note(p):
    """The plan's over-budget line (None within the cap), as `launch plan PROFILE` prints it."""
    from launcher.plan.estimate import local_choice, make_plan, with_accelerator

    if p.cluster.is_local:  # planned as `launch plan` plans it: this machine at the notional price
        return make_plan(p, local_choice(p)).budget_note
    try:
        choice = choice_apart(p)
    except PlanError:
        if p.budget.price_per_hour is None:
            raise
        choice = fallback_choice(p)
    if len(p.cluster.accelerator_options) > 1:  # any_of: planned for the option SkyPilot takes
        p = with_accelerator(p, choice.accelerators)
    return make_plan(p, choice).budget_note
