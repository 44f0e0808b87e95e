"""Following a run after it started: `launch logs / status / cost`, and the budget teardown that
`status` enforces. The refresh of a run's state and bill is launcher/runs/refresh.py; `launch down`
is launcher/runs/teardown.py; starting a run is launcher/runs/start.py."""

from __future__ import annotations

import sys
import time

import click

from launcher.runs.refresh import backend_for, refresh, refreshed, status_row
from launcher.runs.teardown import ask_final_checkpoint, say_others_live
from launcher.term.tables import Column, print_table
from launcher.term.ui import console, duration, err_console, esc, money, note, print_status

# ----------------------------------------------------------------------------------- logs


@click.command()
@click.argument("run_id", required=False)
@click.option("--follow", "-f", is_flag=True, help="Keep streaming until the run ends.")
@click.option("--progress", is_flag=True, help="With --follow: a progress bar instead of raw log lines.")
@click.option("--tail", "tail", type=click.IntRange(min=1), metavar="N",
              help="Start with the last N lines (with --follow: then keep streaming).")
def logs(run_id, follow, progress, tail):
    """Show a run's log (default: the latest run).

    Example: launch logs --follow --tail 50
    """
    from launcher.store import registry

    if progress and not follow:  # a bar needs a run to follow: never the raw log without a word
        raise click.BadParameter("--progress shows a progress bar while following: add --follow",
                                 param_hint="--progress")
    run = registry.get(run_id)
    if follow:
        return follow_run(run, progress=progress, tail=tail)
    return _stream_log(run, False, tail)


def _stream_log(run, follow: bool, tail) -> int:
    """The raw log to a terminal; into a pipe or a file without terminal codes (launcher/term/logtext.py)."""
    if sys.stdout.isatty():
        return backend_for(run).logs(run, follow, sys.stdout, tail=tail)
    from launcher.term.logtext import CleanWriter

    out = CleanWriter(sys.stdout)
    try:
        return backend_for(run).logs(run, follow, out, tail=tail)
    finally:
        out.close_pending()


def follow_run(run, progress: bool, tail=None):
    if not progress:
        _stream_log(run, True, tail)
    else:
        _progress(run)
    run = refresh(run)
    mark = "[green]✓[/] " if run.state == "completed" else "[yellow]![/] "
    note(mark, f"{run.id}: {run.state}" + (f" ({run.reason})" if run.reason else ""))
    if run.state != "completed":
        sys.exit(1)


def _progress(run):
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=console()) as bar:
        task = bar.add_task(esc(run.id), total=None, info="starting")
        while True:
            run = refresh(run)
            st = run.remote
            if st.max_steps:
                bar.update(task, total=st.max_steps)
            if st.step is not None:
                loss = f"loss {st.loss:.4f}" if isinstance(st.loss, (int, float)) else ""
                bar.update(task, completed=st.step, info=f"{loss}  ${st.cost_usd or 0:.4f}")
            if not run.active:
                break
            time.sleep(1.0)


# --------------------------------------------------------------------------------- status


@click.command()
@click.argument("run_id", required=False)
@click.option("--all", "all_", is_flag=True, help="Every run, not just the latest.")
@click.option("--json", "as_json", is_flag=True)
def status(run_id, all_, as_json):
    """State, step, loss, elapsed, dollars, ETA (default: the latest run). Enforces budgets.

    --json: the run's object ({} when there are no runs); with --all, a list.

    Example: launch status --json
    """
    from launcher.store import registry

    if not run_id and not registry.all_runs():  # no runs yet: said, not an error, as with --all
        if as_json:  # one type with or without runs: the latest run's object ({}: none), --all's list
            click.echo("[]" if all_ else "{}")
            return
        note("", "no runs yet: start one with `launch up PROFILE` (`launch profiles` lists them)")
        return
    runs = registry.all_runs() if all_ and not run_id else [registry.get(run_id)]
    rows = []
    for run in runs:
        run = refreshed(run)
        row = status_row(run)
        spent = max(row["cost_usd"], row["train_cost_usd"] or 0.0)
        if run.active and run.budget_usd and spent >= run.budget_usd and _budget_teardown(run, spent):
            row = status_row(registry.get(run.id))
        rows.append(row)
    print_status(rows, as_json, json_value=rows if all_ else rows[0])
    if not as_json:
        say_notices(rows)
    if not as_json and all_:  # one line per run whose trainer dropped records (`status RUN` says the rest)
        from launcher.runs.experiment import dropped_line

        for row in (r for r in rows if r.get("dropped_reason")):
            note("[yellow]![/] ", f"{row['id']}: {dropped_line(row)}")
    if not as_json and not all_:
        from launcher.runs.experiment import print_differences

        print_differences(rows[0])
        say_others_live(run_id, runs[0].id, "launch status --all")


def interactive() -> bool:
    return sys.stdin.isatty()


BUDGET_STOPPER = "the launcher's budget check (billed spend reached budget.max_usd)"  # the run's end line
BUDGET_SAVE_TIMEOUT_S = 600.0  # the final save of a run past its budget: billed too, so bounded, its price said


def _budget_teardown(run, spent: float) -> bool:
    """_stop_for_budget under the run's claim; a run another command acts on (a `down` of it already,
    launcher/store/claims.py) is left to it, said on stderr."""
    from launcher.store import claims, registry

    try:
        with claims.of_run(run.id):
            now = refresh(registry.get(run.id))  # as recorded now, under its claim
            return _stop_for_budget(now, spent) if now.active else True  # True: its row is read again
    except claims.Busy as e:
        note("[yellow]![/] ", f"{run.id} reached its budget; not torn down by this status: {e}", out=err_console())
        return False


def _stop_for_budget(run, spent: float) -> bool:
    """Tear down a run whose billed spend reached its budget the way `launch down` does: the final
    checkpoint first (asked through its run directory, waited for at most BUDGET_SAVE_TIMEOUT_S, whose
    price is said), then the teardown, saying what was kept. The launcher's bill counts setup, so it
    reaches the budget before the payload's own count (training only) would stop the run with a save.
    Where the backend cannot read the run's files, or the save fails, and no checkpoint exists, it says
    the work would be lost and asks (a script gets a warning: the payload stops itself, with a
    checkpoint, when its own count reaches the budget). Returns whether it was torn down."""
    from launcher.backends import final_save
    from launcher.store import registry

    be, st = backend_for(run), run.remote
    extra = st.extra if st else {}
    checkpoint = extra.get("checkpoint_step") or extra.get("resumed_from")
    said = f"{run.id}: billed spend {money(spent)} reached the {money(run.budget_usd)} budget"
    report = final_save.status_json(be, run)  # read once: the question below goes on from it
    trainer = report.get("state")
    saved = None
    if trainer == "training":
        wait = BUDGET_SAVE_TIMEOUT_S
        note("[yellow]![/] ", f"{said}: asking for a final checkpoint before tearing down "
             f"(waiting at most {duration(wait)}, {money(wait * run.price_per_hour / 3600)} "
             f"at {money(run.price_per_hour)}/h)", out=err_console())
        saved = ask_final_checkpoint(be, run, wait, out=err_console(), by=BUDGET_STOPPER, report=report)
    elif trainer is None:
        note("[yellow]![/] ", f"{said}: no final checkpoint was asked for (no status.json "
             "from the run: still setting up, or not readable from here)", out=err_console())
    if saved is not None and saved.saved:
        checkpoint = saved.checkpoint
    elif saved is not None:
        run = refresh(run)  # the trainer may have ended (its own save, or none) while it was asked
        extra = run.remote.extra
        checkpoint = extra.get("checkpoint_step") or extra.get("resumed_from") or checkpoint
    if not checkpoint:
        step = f"{st.step} steps" if st and st.step else "the work so far"
        question = f"{said} before its first checkpoint: tearing down now loses {step}. Tear down anyway?"
        if not (interactive() and click.confirm(question, default=False, err=True)):
            err_console().print(f"[yellow]![/] {said}; no checkpoint yet, so it keeps running until the payload "
                                f"saves one and stops (`launch down {run.id}` stops it now, losing {step})",
                                soft_wrap=True)
            return False
    left = final_save.left(be, run, saved) if trainer is not None else None  # read on the machine, before it goes
    be.down(run)
    registry.accrue(run.id, False)
    kept = f"; it keeps {left}" if left else f" (checkpoint {checkpoint} kept)" if checkpoint else " (no checkpoint)"
    registry.update(run.id, state="budget_exhausted", ended_at=time.time(), reason=f"{said}; torn down{kept}")
    from launcher.runs.experiment import profile_arg

    note("[red]✗[/] ", f"{said}; torn down{kept}: continue with `launch up {profile_arg(run)} "
         f"--resume {run.id} --set budget.max_usd=...`", out=err_console())
    return True


# ----------------------------------------------------------------------------------- cost


@click.command()
@click.option("--json", "as_json", is_flag=True)
def cost(as_json):
    """Spend per run and in total.

    Example: launch cost
    """
    from launcher.store import registry

    rows = [status_row(refreshed(r)) for r in registry.all_runs()]
    total = round(sum(r["cost_usd"] for r in rows), 6)
    columns = [Column("run", "id", must_copy=True), Column("profile", "profile", must_copy=True, priority=1),
               Column("state", "state", priority=3),
               Column("$/h", lambda r: money(r["price_per_hour"]), must_copy=True, justify="right"),
               Column("elapsed", lambda r: duration(r["elapsed_s"]), priority=4, justify="right"),
               Column("spent", lambda r: money(r["cost_usd"]), must_copy=True, justify="right"),
               Column("budget", lambda r: money(r["budget_usd"]), must_copy=True, priority=2, justify="right")]
    print_table(rows, columns, as_json, console=console(), json_value={"runs": rows, "total_usd": total})
    if not as_json:
        console().print(f"[bold]total[/] {money(total)} over {len(rows)} run(s)")
        say_notices(rows)


def say_notices(rows: list[dict]) -> None:
    """A `!` line per run whose backend has something its state does not say (RemoteStatus.notice)."""
    for row in (r for r in rows if r.get("notice")):
        note("[yellow]![/] ", f"{row['id']}: {row['notice']}")
