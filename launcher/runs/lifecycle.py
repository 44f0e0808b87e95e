"""Following a run after it started: `launch logs / status / cost / down`, and the refresh of a
run's state, bill and last step from its backend that they (and `launch up --resume`) share.
Starting one is launcher/runs/start.py."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import click

def backend_for(run):
    from launcher.backends import get_backend

    options = {"ssh": {"host": run.handle.get("host")}, "local": {"num_nodes": run.handle.get("num_nodes")}}
    return get_backend(run.backend, **{k: v for k, v in options.get(run.backend, {}).items() if v is not None})


def refresh(run):
    """Ask the backend for the run's state and merge it into the registry, forward only: an ended run
    stays ended, whatever its machine says now (registry.observe holds the rule for every backend)."""
    from launcher.store import registry

    st = backend_for(run).status(run)
    run = registry.observe(run.id, st.state, st.reason, billing=st.billing, ended_at=st.ended_at)
    run = remember(run, {**st.extra, **{k: getattr(st, k) for k in LAST_SEEN}})
    run._remote = st
    return run


LAST_SEEN = ("step", "max_steps", "loss", "eval_loss")


def remember(run, report: dict):
    """Keep where the run got to (step, loss, stage: its status.json `report`) in its registry record,
    so that its row still says so once it has ended, when nothing is asked of its machine any more (or
    the machine is gone, its status.json with it). Returns the run as recorded (without `_remote`)."""
    from launcher.store import registry

    seen = _seen(report)
    if not seen or seen == (run.handle or {}).get("last_status"):
        return run
    return registry.update(run.id, handle={"last_status": seen})


def _seen(report) -> dict:
    """The step, loss and stage of a status.json (or as recorded), each a number or None; {}: no step."""
    from launcher.term.units import number

    if not isinstance(report, dict) or number(report.get("step")) is None:
        return {}
    seen = {k: number(report.get(k)) for k in LAST_SEEN}
    if isinstance(report.get("stage"), dict):
        seen["stage"] = report["stage"]
    return seen


def current_row(run) -> dict:
    """A run's status row, refreshed from its backend first while it is active (`_run`: the run)."""
    run = refresh(run) if run.watched else run
    return {**_row(run), "_run": run}


def _row(run) -> dict:
    """One run for status/cost. `cost_usd` is what the machines billed: the billed seconds accrued on
    every refresh (setup and downloads included; time down after a preemption, or while a managed job
    recovers, excluded) at each session's price; `train_cost_usd` is what the payload measured while
    training (accumulated across restarts), when known."""
    st = getattr(run, "_remote", None)
    billed_s, billed_usd = run.billed()
    row = {"id": run.id, "profile": run.profile, "backend": run.backend, "state": run.state,
           "reason": run.reason, "price_per_hour": run.price_per_hour, "budget_usd": run.budget_usd,
           "elapsed_s": round(run.elapsed_s(), 1), "billed_s": round(billed_s, 1),
           "cost_usd": round(billed_usd, 6),
           "train_cost_usd": st.cost_usd if st else None,
           "started_at": run.started_at, "ended_at": run.ended_at, "artifacts": run.artifacts,
           "overrides": (run.handle or {}).get("overrides") or [], "envs": (run.handle or {}).get("envs") or {},
           "history": (run.handle or {}).get("history") or [], "provenance": (run.handle or {}).get("provenance")}
    if st:
        row.update(step=st.step, max_steps=st.max_steps, loss=st.loss, eval_loss=st.eval_loss,
                   **projection(run, st, billed_usd))
        if isinstance(st.extra.get("stage"), dict):  # a run with stages: which one trains (name, index, of)
            row["stage"] = st.extra["stage"]
        if isinstance(st.extra.get("budget_warning"), str):  # the payload passed budget.warn_fraction
            row["budget_warning"] = st.extra["budget_warning"]
        if isinstance(st.extra.get("attention"), str):  # the kernel the payload loaded, and why
            row["attention"] = st.extra["attention"]
    if (st is None or st.step is None) and (not run.active or (st and st.state == "unreachable")):
        last = _seen((run.handle or {}).get("last_status"))  # ended, or not answering: where it got to
        row.update({**last, "eta_s": None, "projected_cost_usd": None} if last else {})
    if st and st.state == "unreachable" and run.active:
        row.update(_unreachable(run, st))
    return row


def _unreachable(run, st) -> dict:
    """A live run whose machine does not answer shows as `unreachable`, never as running; its bill
    goes on as it was when last seen (registry.observe), and the row says so."""
    bills = ("still counted as billing: a machine we cannot reach may still bill (check it where you rented "
             "it)") if run.billing_since is not None else "not billing when last seen"
    return {"state": "unreachable", "last_state": run.state, "reason": f"{st.reason}; last seen {run.state}, {bills}"}


def projection(run, st, billed_usd: float) -> dict:
    """ETA and projected total of a run that is training now (none for one that ended, whatever its
    last status.json said): what it billed so far plus the remaining training time at its price, so
    projected >= spent (the payload's own projection counts training seconds only, no setup)."""
    if run.state != "running" or st.eta_s is None:
        return {"eta_s": None, "projected_cost_usd": None}
    spent = max(billed_usd, st.cost_usd or 0.0)
    return {"eta_s": st.eta_s, "projected_cost_usd": round(spent + st.eta_s * run.price_per_hour / 3600.0, 6)}


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
    from launcher.term.ui import console, literal

    mark = "[green]✓[/] " if run.state == "completed" else "[yellow]![/] "
    console().print(literal(mark, f"{run.id}: {run.state}" + (f" ({run.reason})" if run.reason else "")))
    if run.state != "completed":
        sys.exit(1)


def _progress(run):
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from launcher.term.ui import console, esc

    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=console()) as bar:
        task = bar.add_task(esc(run.id), total=None, info="starting")
        while True:
            run = refresh(run)
            st = run._remote
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

    Example: launch status --json
    """
    from launcher.store import registry
    from launcher.term.ui import print_status

    if as_json and not run_id and not registry.all_runs():
        click.echo("[]")  # no runs yet: an empty list for scripts, not an error
        return
    runs = registry.all_runs() if all_ and not run_id else [registry.get(run_id)]
    rows = []
    for run in runs:
        run = refresh(run) if run.watched else run
        row = _row(run)
        spent = max(row["cost_usd"], row["train_cost_usd"] or 0.0)
        if run.active and run.budget_usd and spent >= run.budget_usd and _stop_for_budget(run, spent):
            row = _row(registry.get(run.id))
        rows.append(row)
    print_status(rows, as_json, json_value=rows if all_ else rows[0])
    if not as_json and not all_:
        from launcher.runs.experiment import print_differences

        print_differences(rows[0])
        _say_others_live(run_id, runs[0].id, "launch status --all")


def interactive() -> bool:
    return sys.stdin.isatty()


def _stop_for_budget(run, spent: float) -> bool:
    """Tear down a run whose billed spend reached its budget - once a checkpoint exists; before the
    first one, say the work would be lost and ask (a script gets a warning: the payload stops itself,
    with a checkpoint, when its own count reaches the budget). Returns whether it was torn down."""
    from launcher.store import registry
    from launcher.term.ui import err_console, money

    st = getattr(run, "_remote", None)
    extra = st.extra if st else {}
    checkpoint = extra.get("checkpoint_step") or extra.get("resumed_from")
    said = f"{run.id}: billed spend {money(spent)} reached the {money(run.budget_usd)} budget"
    if not checkpoint:
        step = f"{st.step} steps" if st and st.step else "the work so far"
        question = f"{said} before its first checkpoint: tearing down now loses {step}. Tear down anyway?"
        if not (interactive() and click.confirm(question, default=False, err=True)):
            err_console().print(f"[yellow]![/] {said}; no checkpoint yet, so it keeps running until the payload "
                                f"saves one and stops (`launch down {run.id}` stops it now, losing {step})",
                                soft_wrap=True)
            return False
    backend_for(run).down(run)
    registry.accrue(run.id, False)
    registry.update(run.id, state="budget_exhausted", ended_at=time.time(), reason=f"{said}; torn down")
    kept = f"checkpoint {checkpoint} kept" if checkpoint else "no checkpoint"
    err_console().print(f"[red]✗[/] {said}; torn down ({kept}): continue with `launch up {run.profile} "
                        f"--resume {run.id} --set budget.max_usd=...`", soft_wrap=True)
    return True


# ----------------------------------------------------------------------------------- cost


@click.command()
@click.option("--json", "as_json", is_flag=True)
def cost(as_json):
    """Spend per run and in total.

    Example: launch cost
    """
    from launcher.store import registry
    from launcher.term.tables import Column, print_table
    from launcher.term.ui import console, duration, money

    rows = [_row(refresh(r) if r.watched else r) for r in registry.all_runs()]
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


# ----------------------------------------------------------------------------------- down


@click.command()
@click.argument("run_id", required=False)
@click.option("--fetch-artifacts", is_flag=True,
              help="First bring the adapter, MLX adapter, summary, metrics, plot, data stats, high-loss "
                   "samples, checkpoint listing and logs home, verified; refuse to tear down if that fails.")
@click.option("--merged", is_flag=True, help="With --fetch-artifacts: also the merged model (large: 65 GB for 32B).")
@click.option("--dest", type=click.Path(file_okay=False), default="artifacts", show_default=True,
              help="Artifacts go to DEST/<run>/.")
@click.option("--forget", is_flag=True,
              help="For a live run whose machine is gone for good (deleted at its provider): end it here only, "
                   "billed until it was last seen; launch cannot confirm the machine is gone.")
def down(run_id, fetch_artifacts, merged, dest, forget):
    """Stop a run / tear down its cluster (default: the latest run), optionally fetching artifacts first.

    Example: launch down --fetch-artifacts
    """
    from launcher.store import registry
    from launcher.term.ui import console, hints, literal

    if merged and not fetch_artifacts:
        raise click.BadParameter("--merged goes with --fetch-artifacts", param_hint="--merged")
    if forget and fetch_artifacts:
        raise click.BadParameter("--forget is for a machine that cannot be reached: nothing can be fetched "
                                 "from it", param_hint="--forget")
    run = refresh(registry.get(run_id))
    be = backend_for(run)
    if run.active and run._remote.state == "unreachable":
        return _forget(run, forget, run._remote.reason.removeprefix("unreachable: "))
    if forget:
        console().print(literal("[yellow]![/] ", f"--forget is for a machine launch cannot reach; {run.id}'s "
                                "answered, so `down` goes on as usual"), soft_wrap=True)
    from launcher.backends import final_save

    # The final checkpoint first, the fetch after it (and after the run's own end), the teardown last.
    with console().status(f"asking {run.id}'s trainer for a final checkpoint..."):
        saved = final_save.request(be, run)
    if saved is not None:
        console().print(literal("[green]✓[/] " if saved.saved else "[yellow]![/] ", saved.line), soft_wrap=True)
        remember(run, final_save.status_json(be, run))  # its last step, for `status` once the machine is gone
    if fetch_artifacts:
        run = _await_end(be, run, saved)
        report = _fetch(be, run, Path(dest) / run.id, merged)
        registry.update(run.id, artifacts=str(report.dest))
    left = final_save.left(be, run, saved)  # read on the machine, before it goes
    with console().status(f"stopping {run.id}..."):
        if _stop(be, run, forget):
            return
    run = registry.accrue(run.id, False)
    if run.active:
        run = registry.update(run.id, state="stopped", ended_at=time.time(), reason="stopped by launch down")
    console().print(literal("[green]✓[/] ", f"{run.id} is down ({run.state})"))
    from launcher.runs.volumes import still_billing_lines

    stores = [h["name"] for k in ("volume", "bucket") if isinstance(h := (run.handle or {}).get(k), dict)
              and h.get("name")]
    if left and not stores and run.backend != "skypilot":  # on the machine's own disk: local, or the ssh host
        where = (run.handle or {}).get("run_dir") or "the run's directory"
        host = f"{run.handle['host']}:" if run.backend == "ssh" and (run.handle or {}).get("host") else ""
        console().print(literal("  ", f"{left} is kept in {host}{where}"), soft_wrap=True)
    for line in still_billing_lines(run, left if stores else None):
        console().print(literal("[yellow]![/] ", f"still billing: {line}"), soft_wrap=True)
    if fetch_artifacts:
        print_summary(run, report.dest)
    _say_others_live(run_id, run.id, None)
    if left and (stores or run.backend != "skypilot"):
        hints(f"launch up {run.profile} --resume {run.id}", *(f"launch volumes rm {n}" for n in stores))
    elif not fetch_artifacts:
        hints(f"launch status {run.id}")


def _say_others_live(asked, shown: str, command) -> None:
    """Not `asked` a RUN, status/down take the latest: say each other live run, billing behind a newer one
    (as recorded: asking each machine would make `down` wait on hosts that may not answer)."""
    from launcher.store import registry
    from launcher.term.ui import console, literal

    for other in (r for r in registry.all_runs() if r.active and r.id != shown and not asked):
        console().print(literal("[yellow]![/] ", f"{other.id} was {other.state} when last seen and may be billing "
                                f"({other.backend}): {command or f'launch down {other.id}'}"), soft_wrap=True)


def _forget(run, forget: bool, why: str) -> None:
    """A live run whose machine does not answer (`why`): refused, naming --forget (it may still run and
    bill there), or, with --forget, ended in the registry only (registry.forget), with a warning that
    nothing was confirmed."""
    from launcher.errors import BackendError
    from launcher.store import registry
    from launcher.term.ui import console, duration, literal, money

    seen = f"{run.state} when last seen"
    if not forget:
        raise BackendError(f"{why}; {run.id} was {seen} and may still run and bill there: retry `launch down "
                           f"{run.id}` once it answers; if that machine is gone for good, `launch down {run.id} "
                           "--forget` ends the run here only") from None
    run = registry.forget(run.id)
    billed_s, billed_usd = run.billed()
    console().print(literal("[yellow]![/] ", f"launch could not confirm that {run.id}'s machine is gone: it was "
                            f"{seen} and was not reached now; check your cloud console (or the host) and stop it "
                            "there if it still runs"), soft_wrap=True)
    console().print(literal("[green]✓[/] ", f"{run.id} is down ({run.state}, here only): billed "
                            f"{duration(billed_s)}, {money(billed_usd)}, until it was last seen"), soft_wrap=True)


POST_TIMEOUT_S = 1800.0  # a finished run's post phase: evaluation, a 65 GB merge, the MANIFEST
EXIT_TIMEOUT_S = 120.0  # a trainer that ended otherwise (a final save, a budget stop): its script exits
SETTLE_POLL_S = 1.0


def _await_end(be, run, saved):
    """Before a fetch: once the trainer has ended, wait for the run's own end, so what comes home is
    its last word: after a final checkpoint, until its script exits; after finished training, until
    `post` has written the summary and MANIFEST. A trainer still training (its final save failed or
    was not asked for) is not waited for: the fetch takes what exists, and a line says why."""
    from payload import layout
    from payload.errors import END_STATES

    from launcher.backends.final_save import status_json
    from launcher.term.ui import console, literal

    if not run.active or (saved is not None and not saved.saved):
        return run
    said = status_json(be, run).get("state")
    if said not in (*END_STATES, "interrupted"):
        return run
    post = said == "completed"
    limit = POST_TIMEOUT_S if post else EXIT_TIMEOUT_S
    deadline = time.monotonic() + limit
    with console().status(f"waiting for {run.id} to finish ({said}; writing its summary and MANIFEST)..."):
        while run.active and time.monotonic() < deadline:
            if post and be.read_run_file(run, layout.MANIFEST) is not None:  # post's last write
                return run
            time.sleep(SETTLE_POLL_S)
            run = refresh(run)
            if run._remote.state in ("unreachable", "unknown"):
                break
    if run.active:
        why = {"unreachable": "its machine stopped answering", "unknown": "its processes cannot be seen from here"}\
            .get(run._remote.state, f"it had not ended after {limit:g} s")
        console().print(literal("[yellow]![/] ", f"fetching before {run.id} finished ({why}): what exists now "
                                "comes home, a MANIFEST only if the run wrote one (post, or its stop)"),
                        soft_wrap=True)
    return run


def _stop(be, run, forget: bool) -> bool:
    """The backend's teardown. A run that had ended whose machine cannot be reached any more is down
    here all the same: nothing of it runs there, and its bill closed when it ended. A live one is
    refused, or with --forget ended here only (True: nothing more to say)."""
    from launcher.errors import BackendError
    from launcher.term.ui import console, literal

    try:
        be.down(run)
    except BackendError as e:
        if not str(e).startswith("cannot reach"):
            raise
        if run.active:
            _forget(run, forget, str(e))
            return True
        console().print(literal("[yellow]![/] ", f"{e}: {run.id} had ended ({run.state}), so nothing of it runs "
                                "there; marked down here"), soft_wrap=True)
    return False


def _fetch(be, run, target: Path, merged: bool):
    """Fetch and verify (launcher.store.artifacts); one ✓ line and its notes, or refuse to tear down."""
    from rich.markup import escape

    from launcher.store.artifacts import fetch
    from launcher.term.units import human_size
    from launcher.errors import BackendError
    from launcher.term.ui import console

    retry = f"retry `launch down {run.id} --fetch-artifacts`, or tear down without --fetch-artifacts"
    try:
        with console().status(f"fetching artifacts of {run.id}..."):
            report = fetch(be, run, target, merged=merged)
    except BackendError as e:
        raise BackendError(f"not tearing down {run.id}: fetching artifacts failed ({e}); {retry}") from None
    for note in report.notes:
        console().print(f"[yellow]![/] {escape(note)}", soft_wrap=True)
    if not report.ok:
        raise BackendError(f"not tearing down {run.id}: {'; '.join(report.problems)}; {retry}")
    size = human_size(sum(report.files.values()))
    how = "sha256-verified against the machine's MANIFEST" if report.checked == "sha256" else "sizes checked"
    console().print(f"[green]✓[/] {len(report.files)} files ({size}) in {escape(str(report.dest))}, "
                    f"{how}", soft_wrap=True)
    return report


def print_summary(run, target: Path) -> None:
    """The run in four lines, and what its artifacts directory holds (the artifact layout's names)."""
    from payload import layout

    from launcher.term.ui import console, duration, literal, money
    from launcher.term.units import number

    try:
        s = json.loads((target / "training_summary.json").read_text())
    except (OSError, ValueError):
        s = {}
    if not isinstance(s, dict):
        s = {}
    c = console()  # the summary comes from the remote machine: every value is printed literally
    c.print(literal("", run.id, ": ", s.get("state", run.state)))
    loss, eval_loss = (number(s.get(k, s.get(alt))) for k, alt in (("final_train_loss", "final_loss"),
                                                                     ("final_eval_loss", "best_eval_loss")))
    c.print(literal("", f"  steps {s.get('global_step', s.get('steps', '-'))}, final loss "
                        f"{'-' if loss is None else f'{loss:.4g}'}, eval loss "
                        f"{'-' if eval_loss is None else f'{eval_loss:.4g}'}"))
    billed_s, billed_usd = run.billed()
    c.print(literal("", f"  {duration(billed_s)} billed, {money(billed_usd)} at {money(run.price_per_hour)}/h "
                        f"({duration(number(s.get('duration_s')))} and {money(number(s.get('cost_usd')))} of it "
                        "training)"))
    names = [a.name + ("/" if a.directory else "") for a in layout.ARTIFACTS if (target / a.name).exists()]
    names += [layout.LOCAL_MANIFEST] if (target / layout.LOCAL_MANIFEST).exists() else []
    c.print(literal("", f"  artifacts: {target.resolve()}"), soft_wrap=True)
    c.print(literal("", f"    {' '.join(names) or '(none)'}"), soft_wrap=True)
