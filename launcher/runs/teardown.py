"""`launch down`: the final checkpoint first, then the fetch (verified), then the teardown, and what
keeps billing after; the same wait serves the budget teardown of `launch status`
(launcher/runs/lifecycle.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click

from payload import layout

from launcher import project
from launcher.errors import BackendError
from launcher.runs.refresh import backend_for, refresh, remember
from launcher.runs.volumes import still_billing_lines
from launcher.term.ui import console, duration, hints, money, note
from launcher.term.units import human_size, number

@click.command()
@click.argument("run_id", required=False)
@click.option("--fetch-artifacts", is_flag=True,
              help="First bring the adapter, MLX adapter, summary, metrics, plot, data stats, high-loss "
                   "samples, checkpoint listing and logs home, verified; refuse to tear down if that fails.")
@click.option("--merged", is_flag=True, help="With --fetch-artifacts: also the merged model (large: 65 GB for 32B).")
@click.option("--dest", type=click.Path(file_okay=False), default=project.artifacts_default,
              show_default="the project's artifacts/",
              help="Artifacts go to DEST/<run>/.")
@click.option("--forget", is_flag=True,
              help="For a live run whose machine is gone for good (deleted at its provider): end it here only, "
                   "billed until it was last seen; launch cannot confirm the machine is gone.")
def down(run_id, fetch_artifacts, merged, dest, forget):
    """Stop a run / tear down its cluster (default: the latest run), optionally fetching artifacts first.

    Example: launch down --fetch-artifacts
    """
    from launcher.store import claims, registry

    if merged and not fetch_artifacts:
        raise click.BadParameter("--merged goes with --fetch-artifacts", param_hint="--merged")
    if forget and fetch_artifacts:
        raise click.BadParameter("--forget is for a machine that cannot be reached: nothing can be fetched "
                                 "from it", param_hint="--forget")
    run = registry.get(run_id)
    with claims.of_run(run.id):  # from the first look to the record: an `up --resume` of it waits its turn
        _down(run_id, run.id, fetch_artifacts, merged, dest, forget)


def _down(asked, run_id: str, fetch_artifacts: bool, merged: bool, dest: str, forget: bool) -> None:
    from launcher.store import registry

    run = refresh(registry.get(run_id))  # as recorded now, under its claim
    be = backend_for(run)
    if run.active and run.remote.state == "unreachable":
        return _forget(run, forget, run.remote.reason.removeprefix("unreachable: "))
    if forget:
        note("[yellow]![/] ", f"--forget is for a machine launch cannot reach; {run.id}'s "
             "answered, so `down` goes on as usual")
    from launcher.backends import final_save

    # The final checkpoint first, the fetch after it (and after the run's own end), the teardown last.
    saved = ask_final_checkpoint(be, run)
    if fetch_artifacts:
        run = _await_end(be, run, saved)
        report = _fetch(be, run, Path(dest) / run.id, merged)
        registry.update(run.id, artifacts=str(report.dest))
    left = final_save.left(be, run, saved)  # read on the machine, before it goes
    said = final_save.status_json(be, run) if run.active else {}  # the run's own word on its end, as well
    with console().status(f"stopping {run.id}..."):
        if _stop(be, run, forget):
            return
    if run.backend != "skypilot":  # its disk outlives the stop: what a trainer saved on SIGTERM counts too
        left = final_save.left(be, run, saved) or left
    run = registry.accrue(run.id, False)
    if run.active:
        run = registry.update(run.id, ended_at=time.time(), **ended_by_down(said))
    note("[green]✓[/] ", f"{run.id} is down ({run.state})")
    stores = [h["name"] for h in (run.handle.volume, run.handle.bucket) if isinstance(h, dict) and h.get("name")]
    if left and not stores and run.backend != "skypilot":  # on the machine's own disk: local, or the ssh host
        where = run.handle.run_dir or "the run's directory"
        host = f"{run.handle.host}:" if run.backend == "ssh" and run.handle.host else ""
        note("  ", f"{left} is kept in {host}{where}")
    for line in still_billing_lines(run, left if stores or run.backend == "ssh" else None):
        note("[yellow]![/] ", f"still billing: {line}")
    if fetch_artifacts:
        print_summary(run, report.dest)
    say_others_live(asked, run.id, None)
    if left and run.state != "completed" and (stores or run.backend != "skypilot"):
        from launcher.runs.experiment import profile_arg

        hints(f"launch up {profile_arg(run)} --resume {run.id}", *(f"launch volumes rm {n}" for n in stores))
    elif not fetch_artifacts:
        hints(f"launch status {run.id}")


def ended_by_down(said: dict) -> dict:
    """The state and reason of a live run that `launch down` ended, from its status.json (`said`): a run
    whose training completed is `completed` (down came in its post phase: merge, export, MANIFEST), as a
    resume without more steps must be refused; any other is `stopped`."""
    if said.get("state") == "completed":
        return {"state": "completed", "reason": "training completed; ended by launch down after it"}
    return {"state": "stopped", "reason": "stopped by launch down"}


def ask_final_checkpoint(be, run, timeout_s=None, out=None, by="launch down", report=None):
    """Ask a training run for a final checkpoint and wait for it (final_save.request: until it is saved,
    the run's processes end, its machine stops answering, or `timeout_s`), say the outcome in one line
    and keep its last step. None: no trainer is training. `down` and status's budget teardown (which
    has read the run's status.json to decide, and passes it on as `report`)."""
    from launcher.backends import final_save

    out = out or console()  # status's budget teardown says it on stderr: `status --json` stays JSON
    with out.status(f"asking {run.id}'s trainer for a final checkpoint..."):
        saved = final_save.request(be, run, timeout_s, by=by, report=report)
    if saved is not None:
        note("[green]✓[/] " if saved.saved else "[yellow]![/] ", saved.line, out=out)
        remember(run, final_save.status_json(be, run))  # its last step, for `status` once the machine is gone
    return saved


def say_others_live(asked, shown: str, command) -> None:
    """Not `asked` a RUN, status/down take the latest: say each other live run, billing behind a newer one
    (as recorded: asking each machine would make `down` wait on hosts that may not answer)."""
    from launcher.store import registry

    for other in (r for r in registry.all_runs() if r.active and r.id != shown and not asked):
        note("[yellow]![/] ", f"{other.id} was {other.state} when last seen and may be billing "
             f"({other.backend}): {command or f'launch down {other.id}'}")


def _forget(run, forget: bool, why: str) -> None:
    """A live run whose machine does not answer (`why`): refused, naming --forget (it may still run and
    bill there), or, with --forget, ended in the registry only (registry.forget), with a warning that
    nothing was confirmed."""
    from launcher.store import registry

    seen = f"{run.state} when last seen"
    if not forget:
        raise BackendError(f"{why}; {run.id} was {seen} and may still run and bill there: retry `launch down "
                           f"{run.id}` once it answers; if that machine is gone for good, `launch down {run.id} "
                           "--forget` ends the run here only") from None
    run = registry.forget(run.id)
    billed_s, billed_usd = run.billed()
    note("[yellow]![/] ", f"launch could not confirm that {run.id}'s machine is gone: it was "
         f"{seen} and was not reached now; check your cloud console (or the host) and stop it "
         "there if it still runs")
    note("[green]✓[/] ", f"{run.id} is down ({run.state}, here only): billed "
         f"{duration(billed_s)}, {money(billed_usd)}, until it was last seen")


POST_TIMEOUT_S = 1800.0  # a finished run's post phase: evaluation, a 65 GB merge, the MANIFEST
EXIT_TIMEOUT_S = 120.0  # a trainer that ended otherwise (a final save, a budget stop): its script exits
SETTLE_POLL_S = 1.0


def _await_end(be, run, saved):
    """Before a fetch: once the trainer has ended, wait for the run's own end, so what comes home is
    its last word: after a final checkpoint, until its script exits; after finished training, until
    `post` has written the summary and MANIFEST. A trainer still training (its final save failed or
    was not asked for) is not waited for: the fetch takes what exists, and a line says why."""
    from payload.errors import END_STATES

    from launcher.backends.final_save import status_json

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
            if run.remote.state in ("unreachable", "unknown"):
                break
    if run.active:
        why = {"unreachable": "its machine stopped answering", "unknown": "its processes cannot be seen from here"}\
            .get(run.remote.state, f"it had not ended after {limit:g} s")
        note("[yellow]![/] ", f"fetching before {run.id} finished ({why}): what exists now "
             "comes home, a MANIFEST only if the run wrote one (post, or its stop)")
    return run


def _stop(be, run, forget: bool) -> bool:
    """The backend's teardown. A run that had ended whose machine cannot be reached any more is down
    here all the same: nothing of it runs there, and its bill closed when it ended. A live one is
    refused, or with --forget ended here only (True: nothing more to say)."""
    try:
        be.down(run)
    except BackendError as e:
        if not str(e).startswith("cannot reach"):
            raise
        if run.active:
            _forget(run, forget, str(e))
            return True
        note("[yellow]![/] ", f"{e}: {run.id} had ended ({run.state}), so nothing of it runs "
             "there; marked down here")
    return False


def _fetch(be, run, target: Path, merged: bool):
    """Fetch and verify (launcher.store.artifacts); one ✓ line and its notes, or refuse to tear down."""
    from rich.markup import escape

    from launcher.store.artifacts import fetch
    from launcher.term.transfer import TransferView

    retry = f"retry `launch down {run.id} --fetch-artifacts` (it goes on from what arrived), or tear down " \
        "without --fetch-artifacts"
    view = TransferView(console(), f"artifacts of {run.id}")
    try:
        with view:
            report = fetch(be, run, target, merged=merged, view=view)
    except BackendError as e:
        raise BackendError(f"not tearing down {run.id}: fetching artifacts failed ({e}); {retry}") from None
    except KeyboardInterrupt:
        console().print(f"[yellow]![/] fetch interrupted at {human_size(view.done)} of {human_size(view.total)}: "
                        f"`launch down {run.id} --fetch-artifacts` goes on from there", soft_wrap=True)
        raise
    for note in report.notes:
        console().print(f"[yellow]![/] {escape(note)}", soft_wrap=True)
    if not report.ok:
        raise BackendError(f"not tearing down {run.id}: {'; '.join(report.problems)}; {retry}")
    size = human_size(sum(report.files.values()))
    how = "sha256-verified against the machine's MANIFEST" if report.checked == "sha256" else "sizes checked"
    console().print(f"[green]✓[/] {len(report.files)} files ({size}) in {escape(str(report.dest))}, "
                    f"{how}", soft_wrap=True)
    if view.summary():
        console().print(f"  {view.summary()}", soft_wrap=True)
    return report


def print_summary(run, target: Path) -> None:
    """The run in four lines, and what its artifacts directory holds (the artifact layout's names)."""
    try:
        s = json.loads((target / "training_summary.json").read_text())
    except (OSError, ValueError):
        s = {}
    if not isinstance(s, dict):
        s = {}
    c = console()  # the summary comes from the remote machine: every value is printed literally
    note("", run.id, ": ", s.get("state", run.state), out=c)
    loss, eval_loss = (number(s.get(k, s.get(alt))) for k, alt in (("final_train_loss", "final_loss"),
                                                                     ("final_eval_loss", "best_eval_loss")))
    note("", f"  steps {s.get('global_step', s.get('steps', '-'))}, final loss "
             f"{'-' if loss is None else f'{loss:.4g}'}, eval loss "
             f"{'-' if eval_loss is None else f'{eval_loss:.4g}'}", out=c)
    billed_s, billed_usd = run.billed()
    note("", f"  {duration(billed_s)} billed, {money(billed_usd)} at {money(run.price_per_hour)}/h "
             f"({duration(number(s.get('duration_s')))} and {money(number(s.get('cost_usd')))} of it "
             "training)", out=c)
    names = [a.name + ("/" if a.directory else "") for a in layout.ARTIFACTS if (target / a.name).exists()]
    names += [layout.LOCAL_MANIFEST] if (target / layout.LOCAL_MANIFEST).exists() else []
    note("", f"  artifacts: {target.resolve()}", out=c)
    note("", f"    {' '.join(names) or '(none)'}", out=c)
