"""Run lifecycle commands: `launch up / logs / status / down / cost`."""

from __future__ import annotations

import hashlib
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
              help="Override a profile value (YAML), e.g. --set train.max_steps=10 or, for a list item, "
                   "--set data.sources.0.path=d.jsonl (local/ssh backends).")
@click.option("--follow", is_flag=True, help="Follow the logs after starting.")
def up(profile, backend, host, identity_file, accept_new_host_key, resume, force_new, nodes, sets, follow):
    """Render the SkyPilot task, upload the payload, start the run (detached).

    Example: launch up local-demo --follow
    """
    from . import registry
    from .backends import BackendError, LaunchSpec, get_backend
    from .profile import load_profile
    from .ui import console, esc, hints

    p = load_profile(profile) if not sets else _load_with_overrides(profile, sets)
    backend = backend or ("local" if p.cluster.is_local else "skypilot")
    if sets and backend == "skypilot":
        raise BackendError("--set works with the local and ssh backends; edit the profile for cloud runs")
    if backend == "ssh" and not host:
        raise BackendError("--backend ssh needs --host user@host[:port]")
    if backend == "local":
        _require_training_extras()
    run, resuming = _pick_run(p, backend, resume, force_new)
    source = "registry"
    if not resuming:
        run.price_per_hour, source = _price(p, backend)
    task_yaml, config_yaml = _render_for_run(p, run, backend, source)
    options = {"local": {"num_nodes": nodes}, "skypilot": {},
               "ssh": {"host": host, "accept_new_host_key": accept_new_host_key, "identity_file": identity_file}}
    be = get_backend(backend, **{k: v for k, v in options[backend].items() if v is not None})
    secrets = {k: os.environ[k] for k in SECRET_NAMES if os.environ.get(k)}
    envs = {"LAUNCH_RUN_ID": run.id, "LAUNCH_PRICE_PER_HOUR": f"{run.price_per_hour:.4f}",
            "LAUNCH_BUDGET_USD": f"{p.budget.max_usd:g}"}
    spec = LaunchSpec(run=run, profile=p, task_yaml=task_yaml, config_yaml=config_yaml, envs=envs,
                      secrets=secrets, resume=resuming)
    with console().status(f"starting {esc(run.id)} on {backend}..."):
        started = be.up(spec)
    started.state = "running"
    started.ended_at = None
    registry.save(started)
    verb = "resumed" if spec.resume else "started"
    console().print(f"[green]✓[/] {verb} [bold]{esc(run.id)}[/] ({esc(p.name)} on {backend}, "
                    f"${run.price_per_hour:.2f}/h, budget ${p.budget.max_usd:g})")
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


def _load_with_overrides(profile: str, sets: tuple[str, ...]):
    """The profile with KEY=VALUE overrides applied in memory (nothing is written)."""
    from .profile import load_profile

    return load_profile(profile, overrides=tuple(sets))


def _pick_run(p, backend: str, resume, force_new):
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
        if resume == "latest":
            candidates = [r for r in registry.all_runs() if r.profile == p.name]
            if not candidates:
                raise BackendError(f"nothing to resume: {p.name} has no earlier run (drop --resume)")
            old = candidates[0]
        else:
            old = registry.get(resume)
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
    return registry.Run(id=registry.new_run_id(p.name), profile=p.name, backend=backend,
                        config_hash=p.config_hash(), budget_usd=p.budget.max_usd), False


def _price(p, backend: str) -> tuple[float, str]:
    """($/h, source) for a new run: RunPod's API (skypilot backend), else the catalog snapshot, else
    the profile's price. Local profiles use their notional price."""
    if backend == "skypilot":
        from .backends.skypilot import hourly_price

        return hourly_price(p)
    from .render import plan_price

    return plan_price(p), "catalog or profile"


def _render_for_run(p, run, backend: str, price_source: str):
    """Cloud: the committed sky/ files (re-rendered if stale). Local/ssh: per-run copies."""
    from .render import config_path, render_text, task_path, write
    from .state import private_dir, state_dir, write_private

    if backend == "skypilot":
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
            changes["ended_at"] = time.time()
    if st.reason and st.reason != run.reason and not st.extra.get("unreachable"):
        changes["reason"] = st.reason
    if changes:
        run = registry.update(run.id, **changes)
    run._remote = st
    return run


def _row(run) -> dict:
    """One run for status/cost. `cost_usd` is what the machine bills: elapsed x price while the run
    was active (setup and downloads included); `train_cost_usd` is what the payload measured while
    training (accumulated across restarts), when known."""
    st = getattr(run, "_remote", None)
    row = {"id": run.id, "profile": run.profile, "backend": run.backend, "state": run.state,
           "reason": run.reason, "price_per_hour": run.price_per_hour, "budget_usd": run.budget_usd,
           "elapsed_s": round(run.elapsed_s(), 1),
           "cost_usd": round(run.elapsed_s() / 3600 * run.price_per_hour, 6),
           "train_cost_usd": st.cost_usd if st else None,
           "started_at": run.started_at, "ended_at": run.ended_at, "artifacts": run.artifacts}
    if st:
        row.update(step=st.step, max_steps=st.max_steps, loss=st.loss, eval_loss=st.eval_loss,
                   eta_s=st.eta_s, projected_cost_usd=st.projected_cost_usd)
    return row


# ----------------------------------------------------------------------------------- logs


@click.command()
@click.argument("run_id", required=False)
@click.option("--follow", "-f", is_flag=True, help="Keep streaming until the run ends.")
@click.option("--progress", is_flag=True, help="With --follow: a progress bar instead of raw log lines.")
def logs(run_id, follow, progress):
    """Show a run's log (default: the latest run).

    Example: launch logs --follow
    """
    from . import registry

    run = registry.get(run_id)
    return _follow(run, progress=progress) if follow else backend_for(run).logs(run, False, sys.stdout)


def _follow(run, progress: bool):
    if not progress:
        backend_for(run).logs(run, True, sys.stdout)
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
    from .ui import console, err_console, literal, status_table

    runs = registry.all_runs() if all_ and not run_id else [registry.get(run_id)]
    rows = []
    for run in runs:
        run = _refresh(run) if run.active else run
        row = _row(run)
        spent = max(row["cost_usd"], row["train_cost_usd"] or 0.0)
        if run.active and run.budget_usd and spent >= run.budget_usd:
            backend_for(run).down(run)
            run = registry.update(run.id, state="budget_exhausted", ended_at=time.time(),
                                  reason=f"spend ${spent:.2f} reached the ${run.budget_usd:g} budget")
            err_console().print(literal("[red]✗[/] ", f"{run.id}: spend reached the budget; torn down (resume "
                                        f"with a higher budget.max_usd and `launch up {run.profile} --resume`)"))
            row = _row(run)
        rows.append(row)
    if as_json:
        click.echo(json.dumps(rows if all_ else rows[0], indent=2, default=str))
    else:
        console().print(status_table(rows))


# ----------------------------------------------------------------------------------- cost


@click.command()
@click.option("--json", "as_json", is_flag=True)
def cost(as_json):
    """Spend per run and in total.

    Example: launch cost
    """
    from rich.table import Table

    from . import registry
    from .ui import cell, console, duration, money

    rows = [_row(_refresh(r) if r.active else r) for r in registry.all_runs()]
    total = round(sum(r["cost_usd"] for r in rows), 6)
    if as_json:
        click.echo(json.dumps({"runs": rows, "total_usd": total}, indent=2, default=str))
        return
    t = Table("run", "profile", "state", "$/h", "elapsed", "spent", "budget")
    for r in rows:
        t.add_row(cell(r["id"]), cell(r["profile"]), cell(r["state"]), money(r["price_per_hour"]),
                  duration(r["elapsed_s"]), money(r["cost_usd"]), money(r["budget_usd"]))
    console().print(t)
    console().print(f"[bold]total[/] {money(total)} over {len(rows)} run(s)")


# ----------------------------------------------------------------------------------- down


@click.command()
@click.argument("run_id", required=False)
@click.option("--fetch-artifacts", is_flag=True, help="Copy adapter, summary, metrics, plot home first.")
@click.option("--dest", type=click.Path(file_okay=False), default="artifacts", show_default=True)
def down(run_id, fetch_artifacts, dest):
    """Stop a run / tear down its cluster (default: the latest run), optionally fetching artifacts first.

    Example: launch down --fetch-artifacts
    """
    from payload import layout

    from . import registry
    from .backends import BackendError
    from .ui import console, esc, hints, literal

    run = registry.get(run_id)
    run = _refresh(run)
    be = backend_for(run)
    target = Path(dest) / run.id
    if fetch_artifacts:
        with console().status(f"fetching artifacts of {esc(run.id)}..."):
            got = be.fetch(run, target, layout.ARTIFACTS)
        problems = verify_artifacts(target)
        if problems:
            raise BackendError(f"not tearing down {run.id}: fetching artifacts failed ({'; '.join(problems)}); "
                               f"retry `launch down {run.id} --fetch-artifacts`, or tear down without --fetch-artifacts")
        registry.update(run.id, artifacts=str(target.resolve()))
        console().print(literal("[green]✓[/] ", f"{len(got)} artifacts in {target} (checksums in "
                                                f"{target}/MANIFEST.json)"))
    be.down(run)
    if run.active:
        run = registry.update(run.id, state="stopped", ended_at=time.time(), reason="stopped by launch down")
    console().print(literal("[green]✓[/] ", f"{run.id} is down ({run.state})"))
    if fetch_artifacts:
        print_summary(run, target)
    else:
        hints(f"launch status {run.id}")


def verify_artifacts(target: Path) -> list[str]:
    """Every artifact present and non-empty, the adapter loadable; writes MANIFEST.json (sha256)."""
    problems = []
    required = ("adapter", "training_summary.json", "metrics.jsonl")
    for name in required:
        p = target / name
        if not p.exists() or (p.is_file() and p.stat().st_size == 0):
            problems.append(f"{name} missing")
    weights = list((target / "adapter").glob("*.safetensors")) if (target / "adapter").exists() else []
    if (target / "adapter").exists() and not weights:
        problems.append("adapter has no .safetensors weights")
    for w in weights:
        try:
            header = int.from_bytes(w.read_bytes()[:8], "little")
            json.loads(w.read_bytes()[8:8 + header])
        except (ValueError, OSError):
            problems.append(f"{w.name} is not a valid safetensors file")
    if not problems:
        manifest = {str(f.relative_to(target)): {"bytes": f.stat().st_size,
                                                 "sha256": hashlib.sha256(f.read_bytes()).hexdigest()}
                    for f in sorted(target.rglob("*")) if f.is_file() and f.name != "MANIFEST.json"}
        (target / "MANIFEST.json").write_text(json.dumps(manifest, indent=2))
    return problems


def print_summary(run, target: Path) -> None:
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
    machine = money(run.elapsed_s() / 3600 * run.price_per_hour)
    c.print(literal("", f"  {duration(run.elapsed_s())} on the machine, {machine} at ${run.price_per_hour:.2f}/h "
                        f"({duration(_number(s.get('duration_s')))} and {money(_number(s.get('cost_usd')))} of it "
                        "training)"))
    plot = "  (loss plot: loss.png)" if (target / "loss.png").exists() else ""
    c.print(literal("", f"  artifacts: {target.resolve()}{plot}"))


def _number(value):
    """A number from remote JSON, or None (a string there must not crash the summary)."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
