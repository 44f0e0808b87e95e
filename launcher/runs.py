"""Run lifecycle commands: `launch up / logs / status / down / cost`."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import click

SECRET_NAMES = ("HF_TOKEN", "WANDB_API_KEY")
TRAIN_MODULES = ("torch", "transformers", "peft", "trl", "datasets")


# ------------------------------------------------------------------------------------- up


@click.command()
@click.argument("profile")
@click.option("--backend", type=click.Choice(["local", "ssh", "skypilot"]), default=None,
              help="Default: local for `infra: local` profiles, skypilot otherwise.")
@click.option("--host", help="ssh backend: user@host[:port] of an existing GPU machine.")
@click.option("--identity", "identity_file", help="ssh backend: private key file.")
@click.option("--accept-new-host-key", is_flag=True, help="ssh backend: trust a host seen for the first time.")
@click.option("--resume", "resume", default=None, is_flag=False, flag_value="latest",
              help="Continue RUN (default: this profile's latest) from its newest complete checkpoint.")
@click.option("--new", "force_new", is_flag=True, help="Start a fresh run even if an earlier one could resume.")
@click.option("--nodes", type=int, help="local backend: number of local node processes.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE",
              help="Override a profile value (YAML) for this run, e.g. --set train.learning_rate=1e-4 or, for a "
                   "list item, --set data.sources.0.path=d.jsonl; the task is rendered for the run and the "
                   "overrides recorded with it (`launch status RUN` shows them).")
@click.option("--env", "env_items", multiple=True, metavar="KEY=VALUE",
              help="Extra environment for the run's processes (on top of the profile's `envs:`); never a "
                   "secret: secrets stay in your environment and are passed by name.")
@click.option("--allow-change", "allow", multiple=True, metavar="KEY",
              help="With --resume: accept a change of KEY that changes the math of the run in flight (model, "
                   "data, method, lora, learning rate, schedule, sequence length, batch shape, seed); recorded.")
@click.option("--follow", is_flag=True, help="Follow the logs after starting.")
@click.option("--dry-run", is_flag=True, help="Render and check, print what would be uploaded and started; start nothing.")
@click.option("--rehearse", is_flag=True, help="Quick validation: the same profile and backend with max_steps 10 "
              "on at most 100 records per source; the run id says `rehearsal`.")
def up(profile, backend, host, identity_file, accept_new_host_key, resume, force_new, nodes, sets, env_items, follow,
       dry_run, rehearse=False, allow=()):
    """Render the SkyPilot task, upload the payload, start the run (detached).

    Example: launch up local-demo --follow
    """
    from . import registry
    from .backends import BackendError, LaunchSpec, get_backend
    from .checks import load_checked
    from .profile import load_profile
    from .ui import console, esc, hints, money

    if allow and not resume:
        raise click.BadParameter("--allow-change goes with --resume (a new run takes any config)",
                                 param_hint="--allow-change")
    # Config and local data files first, all in one report: nothing starts, nothing bills before.
    extra_env = _env_option(env_items)
    from . import experiment

    prior = experiment.resume_target(load_profile(profile).name, resume) if resume and not force_new else None
    new_sets = sets
    if prior is not None:  # a resume keeps the run's config: its recorded --set and --env, this command's on top
        sets, extra_env = experiment.carried(prior, sets, extra_env)
    p = load_checked(profile, backend)[0] if not sets else _load_with_overrides(profile, sets, backend)
    rehearsal = ()
    if rehearse:  # the rehearsal's cuts are overrides too, allowed on every backend (launcher/rehearse.py)
        from .rehearse import overrides

        if resume:
            raise BackendError("--rehearse starts a fresh short run; drop --resume")
        rehearsal = overrides(p)
        p = _load_with_overrides(profile, (*sets, *rehearsal), backend)
    backend = backend or ("local" if p.cluster.is_local else "skypilot")
    if backend == "ssh" and not host:
        raise BackendError("--backend ssh needs --host user@host[:port]")
    if backend == "local":
        _require_training_extras()
    run, resuming = _pick_run(p, backend, resume, force_new or rehearse, rehearse)
    entry = experiment.check_resume(run, p, profile, new_sets, allow) if resuming else \
        experiment.start_entry((*sets, *rehearsal))
    source = "registry"
    if not resuming:
        run.price_per_hour, source = _price(p, backend)
    # cloud: sky/ stays the profile's render; --set and a rehearsal's cuts render into the run's directory
    per_run = any(not item.startswith("budget.") for item in (*sets, *rehearsal))
    if dry_run:
        return _dry_run(p if per_run or backend != "skypilot" else load_profile(profile), run, backend, source,
                        per_run)
    if not resuming:  # issue 24: a run planned over its own budget cap is started only when confirmed
        from .budget_gate import confirm_over_budget

        confirm_over_budget(p, backend, interactive())
    run.budget_usd = p.budget.max_usd  # a `--resume --set budget.max_usd=...` is the run's budget from now
    if run.billed_s is None:  # new, or recorded before billing was accrued: what it billed so far
        run.billed_s, run.billed_usd = run.billed()
    run.billing_since = time.time()  # billed from here: provisioning and setup included
    task_yaml, config_yaml = _render_for_run(load_profile(profile) if backend == "skypilot" and not per_run else p,
                                             run, backend, source, per_run=per_run)
    options = {"local": {"num_nodes": nodes}, "skypilot": {},
               "ssh": {"host": host, "accept_new_host_key": accept_new_host_key, "identity_file": identity_file}}
    be = get_backend(backend, **{k: v for k, v in options[backend].items() if v is not None})
    secrets = {k: os.environ[k] for k in SECRET_NAMES if os.environ.get(k)}
    envs = {**extra_env, **experiment.allow_env(allow), "LAUNCH_RUN_ID": run.id,
            "LAUNCH_PRICE_PER_HOUR": f"{run.price_per_hour:.4f}",
            "LAUNCH_BUDGET_USD": f"{p.budget.max_usd:g}"}
    spec = LaunchSpec(run=run, profile=p, task_yaml=task_yaml, config_yaml=config_yaml, envs=envs,
                      secrets=secrets, resume=resuming)
    with console().status(f"starting {esc(run.id)} on {backend}..."):
        started = be.up(spec)
    started.state = "running"
    started.ended_at = None
    # What this start differs from its profile by (values only: secrets are never --env or --set).
    provenance = None if resuming else experiment.provenance(p, profile, run.id)
    started.handle = experiment.recorded(started, p, (*sets, *rehearsal), extra_env, entry, provenance)
    registry.save(started)
    verb = "resumed" if spec.resume else "started"
    spent = f", {money(run.billed()[1])} spent so far" if spec.resume else ""
    console().print(f"[green]✓[/] {verb} [bold]{esc(run.id)}[/] ({esc(p.name)} on {backend}, "
                    f"{money(run.price_per_hour)}/h, budget {money(p.budget.max_usd)}{spent})")
    if follow:
        return _follow(started, progress=False)
    hints(f"launch logs {run.id} --follow", f"launch status {run.id}", f"launch down {run.id} --fetch-artifacts")


def _require_training_extras():
    import importlib.util

    missing = [m for m in TRAIN_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        from .backends import BackendError

        raise BackendError(f"the local backend trains on this machine and needs {', '.join(missing)}: "
                           "run `make install` (or pip install -e '.[train]' with torch==2.13.0 for CPU)")


def _env_option(items: tuple[str, ...]) -> dict[str, str]:
    from .profile import parse_env_items

    from .backends import BackendError

    try:
        return parse_env_items(items)
    except ValueError as e:
        raise BackendError(f"--env: {e}") from None


def _load_with_overrides(profile: str, sets: tuple[str, ...], backend=None):
    """The profile with KEY=VALUE overrides applied in memory (nothing is written), checked like
    `launch up` checks every profile (config and data files in one report)."""
    from .checks import load_checked

    return load_checked(profile, backend, overrides=tuple(sets))[0]


def _pick_run(p, backend: str, resume, force_new, rehearse: bool = False):
    """(run, resuming): a new Run or the one to resume; refuses a second active run of a profile."""
    from . import registry
    from .backends import BackendError

    active = registry.active_for_profile(p.name)
    if active and not resume:
        state = _refresh(active)
        if state.active:
            raise BackendError(f"{p.name} already has an active run {active.id} ({state.state}): follow it with "
                               f"`launch logs {active.id} --follow`, stop it with `launch down {active.id}`, "
                               f"or start another with --new")
    if resume and not force_new:
        from .experiment import resume_target

        old = resume_target(p.name, resume)
        if old.state == "completed":
            raise BackendError(f"run {old.id} already completed; use --new for a fresh run")
        old.state, old.reason = "starting", None
        return old, True
    if not force_new:
        latest = next((r for r in registry.all_runs() if r.profile == p.name), None)
        if latest is not None and _refresh(latest).state in ("preempted", "failed", "stopped", "budget_exhausted"):
            from .ui import console, literal

            console().print(literal("[yellow]![/] ", f"last run {latest.id} ended {latest.state}; starting a new "
                                    f"one (continue it instead with `launch up {p.name} --resume {latest.id}`)"))
    from .rehearse import run_id_prefix

    return registry.Run(id=registry.new_run_id(run_id_prefix(p.name) if rehearse else p.name), profile=p.name,
                        backend=backend,
                        config_hash=p.config_hash(), budget_usd=p.budget.max_usd), False


def _price(p, backend: str) -> tuple[float, str]:
    """($/h, source) for a new run: RunPod's API (skypilot backend), else the catalog snapshot, else
    the profile's price. Local profiles use their notional price."""
    if backend == "skypilot":
        from .backends.skypilot import hourly_price

        return hourly_price(p)
    from .catalog import plan_price

    return plan_price(p), "catalog or profile"


def _render_for_run(p, run, backend: str, price_source: str, per_run: bool = False):
    """Cloud: the committed sky/ files (re-rendered if stale), or with `--set` overrides (`per_run`) a
    copy in the run's own directory, as local/ssh runs always get: sky/ stays the profile's render."""
    from .render import config_path, render_text, task_path, write
    from .state import private_dir, state_dir, write_private

    if backend == "skypilot" and not per_run:
        # sky/ is committed and CI runs `launch render --check`: render it with the offline price, as
        # `launch render` does. A live price reaches the run through LAUNCH_PRICE_PER_HOUR instead.
        price = run.price_per_hour
        if price_source in ("runpod-api", "registry"):
            from .backends.skypilot import hourly_price

            price = hourly_price(p, live=False)[0]
        task_text, config_text = render_text(p, price)
        write({task_path(p.name): task_text, config_path(p.name): config_text})
        return task_path(p.name), config_path(p.name)
    task_text, config_text = render_text(p, run.price_per_hour)
    d = private_dir(private_dir(state_dir() / "rendered") / run.id)
    return write_private(d / "task.yaml", task_text), write_private(d / f"{p.name}.yaml", config_text)


def _dry_run(p, run, backend: str, price_source: str, per_run: bool = False) -> None:
    """`up --dry-run`: the task rendered (cloud: the committed sky/ file, as `launch render` writes
    it; otherwise, or with --set overrides, into a temp dir), parsed by SkyPilot for the skypilot
    backend, and the upload list."""
    import tempfile

    import yaml

    from .render import render_text
    from .uploads import print_dry_run

    if backend == "skypilot" and not per_run:
        task_yaml, config_yaml = _render_for_run(p, run, backend, price_source)
        from .catalog import import_sky_offline

        config = yaml.safe_load(task_yaml.read_text())
        config.pop("workdir", None)
        import_sky_offline().Task.from_yaml_config(config)  # SkyPilot's parser: schema errors raise
        checked = f"{task_yaml.relative_to(Path.cwd()) if task_yaml.is_relative_to(Path.cwd()) else task_yaml}, parsed by SkyPilot"
    else:
        d = Path(tempfile.mkdtemp(prefix="launch-dry-run-"))
        task_text, config_text = render_text(p, run.price_per_hour)
        task_yaml, config_yaml = d / "task.yaml", d / f"{p.name}.yaml"
        task_yaml.write_text(task_text)
        config_yaml.write_text(config_text)
        checked = f"rendered from {p.name}'s profile for the {backend} backend (a per-run copy)"
        if backend == "skypilot":
            from .catalog import import_sky_offline

            config = yaml.safe_load(task_text)
            config.pop("workdir", None)
            import_sky_offline().Task.from_yaml_config(config)  # SkyPilot's parser: schema errors raise
            checked += ", parsed by SkyPilot"
    try:
        print_dry_run(p, backend, run.id, task_yaml, config_yaml, checked)
    finally:
        if backend != "skypilot" or per_run:
            import shutil

            shutil.rmtree(task_yaml.parent, ignore_errors=True)


def backend_for(run):
    from .backends import get_backend

    options = {}
    if run.backend == "ssh":
        options = {"host": run.handle.get("host")}
    if run.backend == "local":
        options = {"num_nodes": run.handle.get("num_nodes")}
    return get_backend(run.backend, **{k: v for k, v in options.items() if v is not None})


def _refresh(run):
    """Ask the backend for the run's state; record changes (and end time) in the registry."""
    from . import registry

    st = backend_for(run).status(run)
    changes = {}
    if st.state != run.state and st.state not in ("unknown", "unreachable"):
        changes["state"] = st.state
        if st.state not in registry.ACTIVE_STATES and not run.ended_at:
            changes["ended_at"] = st.ended_at or time.time()
    if st.reason and st.reason != run.reason and not st.extra.get("unreachable"):
        changes["reason"] = st.reason
    if changes:
        run = registry.update(run.id, **changes)
    # A run settled from its own status.json (its controller gone) billed until it ended, not until now.
    run = registry.accrue(run.id, billing_now(run, st), now=st.ended_at if st.ended_at and not st.billing else None)
    run._remote = st
    return run


def current_row(run) -> dict:
    """A run's status row, refreshed from its backend first while it is active (`_run`: the run)."""
    run = _refresh(run) if run.active else run
    return {**_row(run), "_run": run}


def billing_now(run, st) -> bool:
    """Whether a machine bills for the run now: the backend's word when it has one (a recovering managed
    job does not bill), else while the run is active; unknown/unreachable keeps what was last known."""
    if st.state in ("unknown", "unreachable"):
        return run.billing_since is not None
    if st.billing is not None:
        return bool(st.billing)
    return run.active


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
                   eta_s=st.eta_s, projected_cost_usd=st.projected_cost_usd)
        if isinstance(st.extra.get("stage"), dict):  # a run with stages: which one trains (name, index, of)
            row["stage"] = st.extra["stage"]
        if isinstance(st.extra.get("budget_warning"), str):  # the payload passed budget.warn_fraction
            row["budget_warning"] = st.extra["budget_warning"]
    return row


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
    from . import registry

    run = registry.get(run_id)
    if follow:
        return _follow(run, progress=progress, tail=tail)
    return _stream_log(run, False, tail)


def _stream_log(run, follow: bool, tail) -> int:
    """The raw log to a terminal; into a pipe or a file without terminal codes (launcher/logtext.py)."""
    if sys.stdout.isatty():
        return backend_for(run).logs(run, follow, sys.stdout, tail=tail)
    from .logtext import CleanWriter

    out = CleanWriter(sys.stdout)
    try:
        return backend_for(run).logs(run, follow, out, tail=tail)
    finally:
        out.close_pending()


def _follow(run, progress: bool, tail=None):
    if not progress:
        _stream_log(run, True, tail)
    else:
        _progress(run)
    run = _refresh(run)
    from .ui import console, literal

    mark = "[green]✓[/] " if run.state == "completed" else "[yellow]![/] "
    console().print(literal(mark, f"{run.id}: {run.state}" + (f" ({run.reason})" if run.reason else "")))
    if run.state != "completed":
        sys.exit(1)


def _progress(run):
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from .ui import console, esc

    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=console()) as bar:
        task = bar.add_task(esc(run.id), total=None, info="starting")
        while True:
            run = _refresh(run)
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
    from . import registry
    from .ui import print_status

    runs = registry.all_runs() if all_ and not run_id else [registry.get(run_id)]
    rows = []
    for run in runs:
        run = _refresh(run) if run.active else run
        row = _row(run)
        spent = max(row["cost_usd"], row["train_cost_usd"] or 0.0)
        if run.active and run.budget_usd and spent >= run.budget_usd and _stop_for_budget(run, spent):
            row = _row(registry.get(run.id))
        rows.append(row)
    print_status(rows, as_json, json_value=rows if all_ else rows[0])
    if not as_json and not all_:
        from .experiment import print_differences

        print_differences(rows[0])


def interactive() -> bool:
    return sys.stdin.isatty()


def _stop_for_budget(run, spent: float) -> bool:
    """Tear down a run whose billed spend reached its budget - once a checkpoint exists; before the
    first one, say the work would be lost and ask (a script gets a warning: the payload stops itself,
    with a checkpoint, when its own count reaches the budget). Returns whether it was torn down."""
    from . import registry
    from .ui import err_console, money

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
    from . import registry
    from .tables import Column, print_table
    from .ui import console, duration, money

    rows = [_row(_refresh(r) if r.active else r) for r in registry.all_runs()]
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
def down(run_id, fetch_artifacts, merged, dest):
    """Stop a run / tear down its cluster (default: the latest run), optionally fetching artifacts first.

    Example: launch down --fetch-artifacts
    """
    from . import registry
    from .ui import console, hints, literal

    if merged and not fetch_artifacts:
        raise click.BadParameter("--merged goes with --fetch-artifacts", param_hint="--merged")
    run = registry.get(run_id)
    run = _refresh(run)
    be = backend_for(run)
    target = Path(dest) / run.id
    if fetch_artifacts:
        report = _fetch(be, run, target, merged)
        registry.update(run.id, artifacts=str(report.dest))
    from .backends import final_save

    with console().status(f"stopping {run.id} (asking the trainer for a final checkpoint first)..."):
        saved = final_save.request(be, run)
        be.down(run)
    run = registry.accrue(run.id, False)
    if run.active:
        run = registry.update(run.id, state="stopped", ended_at=time.time(), reason="stopped by launch down")
    console().print(literal("[green]✓[/] ", f"{run.id} is down ({run.state})"))
    if saved is not None:
        console().print(literal("[green]✓[/] " if saved.saved else "[yellow]![/] ", saved.line), soft_wrap=True)
    from .volumes import still_billing_lines

    for line in still_billing_lines(run):
        console().print(literal("[yellow]![/] ", f"still billing: {line}"), soft_wrap=True)
    if fetch_artifacts:
        print_summary(run, report.dest)
    else:
        hints(f"launch status {run.id}")


def _fetch(be, run, target: Path, merged: bool):
    """Fetch and verify (launcher.artifacts); one ✓ line and its notes, or refuse to tear down."""
    from rich.markup import escape

    from .artifacts import fetch
    from .units import human_size
    from .backends import BackendError
    from .ui import console

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

    from .ui import console, duration, literal, money

    try:
        s = json.loads((target / "training_summary.json").read_text())
    except (OSError, ValueError):
        s = {}
    if not isinstance(s, dict):
        s = {}
    c = console()  # the summary comes from the remote machine: every value is printed literally
    c.print(literal("", run.id, ": ", s.get("state", run.state)))
    c.print(literal("", f"  steps {s.get('global_step', s.get('steps', '-'))}, final loss "
                        f"{s.get('final_train_loss', s.get('final_loss', '-'))}, eval loss "
                        f"{s.get('final_eval_loss', s.get('best_eval_loss', '-'))}"))
    billed_s, billed_usd = run.billed()
    c.print(literal("", f"  {duration(billed_s)} billed, {money(billed_usd)} at {money(run.price_per_hour)}/h "
                        f"({duration(_number(s.get('duration_s')))} and {money(_number(s.get('cost_usd')))} of it "
                        "training)"))
    names = [a.name + ("/" if a.directory else "") for a in layout.ARTIFACTS if (target / a.name).exists()]
    names += [layout.LOCAL_MANIFEST] if (target / layout.LOCAL_MANIFEST).exists() else []
    c.print(literal("", f"  artifacts: {target.resolve()}"), soft_wrap=True)
    c.print(literal("", f"    {' '.join(names) or '(none)'}"), soft_wrap=True)


def _number(value):
    """A number from remote JSON, or None (a string there must not crash the summary)."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
