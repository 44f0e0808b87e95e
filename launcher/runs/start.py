"""`launch up`: pick or resume a run, check it, render its task, ask before a run planned over its
budget, start it on its backend, and record it (launcher/runs/lifecycle.py follows it from there).

One idea at ~370 lines: `launch up` from the command to the run's record: pick or resume the run,
check it, price it, render its task, ask over budget, start it, record it; each step is a function, read
in that order.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import click

from launcher.runs.lifecycle import follow_run, interactive
from launcher.runs.refresh import refresh

SECRET_NAMES = ("HF_TOKEN", "WANDB_API_KEY")


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
@click.option("--nodes", type=click.IntRange(min=1), help="local backend: number of local node processes.")
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
    from contextlib import ExitStack

    from launcher.term.ui import hints

    recorded: list[str] = []  # the run's id once it is in the registry: an interrupt from then on names it
    try:
        # The claims taken (launcher/store/claims.py) are held from the first check to the run's record, and
        # let go before following: one `up` starts or resumes a run, a second one says who holds it.
        with ExitStack() as held:
            started = _up(held, recorded, profile, backend, host, identity_file, accept_new_host_key, resume,
                          force_new, nodes, sets, env_items, dry_run, rehearse, allow)
        if started is None:  # a dry run
            return
        if follow:
            return follow_run(started, progress=False)
        hints(f"launch logs {started.id} --follow", f"launch status {started.id}",
              f"launch down {started.id} --fetch-artifacts")
    except KeyboardInterrupt as e:  # Ctrl-C, SIGTERM, SIGHUP (launcher/cli.py says it)
        if recorded:
            e.run_id = recorded[0]
        raise


def _up(held, recorded, profile, backend, host, identity_file, accept_new_host_key, resume, force_new, nodes, sets, env_items,
        dry_run, rehearse, allow):
    """`launch up` up to the run's record (None: a dry run), its claims entered into `held`."""
    from launcher.store import claims, registry
    from launcher.backends import LaunchSpec, get_backend
    from launcher.errors import BackendError
    from launcher.profiles.checks import checked
    from launcher.profiles.profile import in_clusters, read_profile, validate
    from launcher.term.ui import money, note

    if allow and not resume:
        raise click.BadParameter("--allow-change goes with --resume (a new run takes any config)",
                                 param_hint="--allow-change")
    # Config and local data files first, all in one report: nothing starts, nothing bills before.
    # The profile is read from disk here, once, and checked once below: that value goes down the path.
    extra_env = _env_option(env_items)
    from launcher.runs import experiment

    written = read_profile(profile)
    # --new asks for a run of its own: it checks no other, so claims none. A resume claims before it reads
    # the run; a new run after its config is checked (a refusal never waits on, nor blocks, another `up`).
    claim_profile = not dry_run and not force_new
    if claim_profile and resume:
        held.enter_context(claims.of_profile(written.name))
    prior = None
    if resume and not force_new:
        try:
            prior = experiment.resume_target(written.name, resume)
        except Exception:  # no such run: the profile's own problems are said first, as ever
            validate(written)
            raise
        if prior.profile != written.name:  # a run id from the wrong line: never resumed with this profile
            raise BackendError(f"run {prior.id} is a run of {prior.profile}, not {written.name}: resume it with "
                               f"`launch up {experiment.profile_arg(prior)} --resume {prior.id}`, or start "
                               f"{written.name} with `launch up {written.name}`")
        if not dry_run:
            held.enter_context(claims.of_run(prior.id))  # a `down` of it may hold it without the profile's
            prior = registry.get(prior.id)  # as recorded now, under its claim
        experiment.own_profile(prior, written)  # never another file of the same name
    new_sets = sets
    if prior is not None:  # a resume keeps the run's config: its recorded --set and --env, this command's on top
        sets, extra_env = experiment.carried(prior, sets, extra_env)
        backend, host, identity_file = _resume_place(prior, backend, host, identity_file)
    resolved = checked(written, tuple(sets))
    rehearsal = ()
    if rehearse:  # the rehearsal's cuts are overrides too, allowed on every backend (launcher/runs/rehearse.py)
        from launcher.runs.rehearse import overrides

        if resume:
            raise BackendError("--rehearse starts a fresh short run; drop --resume")
        rehearsal = overrides(resolved.profile)
        resolved = checked(written, (*sets, *rehearsal))
    if claim_profile and not resume:
        held.enter_context(claims.of_profile(written.name))
    p = resolved.profile
    backend = backend or ("local" if p.cluster.is_local else "skypilot")
    if backend == "ssh" and not host:
        raise BackendError("--backend ssh needs --host user@host[:port]")
    if nodes and backend != "local":  # it sizes local node processes only: never dropped without a word
        raise BackendError(f"--nodes runs N node processes with --backend local; on {backend} the profile's "
                           f"cluster.num_nodes ({p.cluster.num_nodes}) is the node count: "
                           f"--set cluster.num_nodes={nodes}")
    if backend == "local":
        _require_training_extras()
    if backend == "skypilot" and not dry_run and not p.cluster.is_local:
        from launcher.backends.skypilot import check_credentials_here

        check_credentials_here(p)  # no credentials: said now, before seconds of planning and an API server
    run, resuming = _pick_run(p, backend, resume, force_new or rehearse, rehearse, explicit_new=force_new,
                              reserve=not dry_run, prior=prior)
    entry = experiment.check_resume(run, resolved, new_sets, allow) if resuming else \
        experiment.start_entry((*sets, *rehearsal))
    source = "registry"
    if not resuming:
        run.price_per_hour, source = price_for(p, backend)
    # cloud: sky/ stays the profile's render; --set, a rehearsal's cuts and a profile from outside
    # clusters/ (never over the committed render its `name:` names) render into the run's directory
    per_run = any(not item.startswith("budget.") for item in (*sets, *rehearsal)) or not in_clusters(written.path)
    # the committed sky/ file is the profile as written (only budget.* overrides differ from it)
    rendered = resolved.as_written() if backend == "skypilot" and not per_run else p
    if not resuming:  # issue 24: a run planned over its own budget cap is started only when confirmed
        from launcher.plan.budget_gate import confirm_over_budget

        confirm_over_budget(p, backend, interactive() and not dry_run)  # a dry run says it, asks nothing
    if dry_run:
        return _dry_run(rendered, run, backend, source, per_run)  # None
    run.budget_usd = p.budget.max_usd  # a `--resume --set budget.max_usd=...` is the run's budget from now
    if run.billed_s is None:  # new, or recorded before billing was accrued: what it billed so far
        run.billed_s, run.billed_usd = run.billed()
    run.billing_since = time.time()  # billed from here: provisioning and setup included
    task_yaml, config_yaml = render_for_run(rendered, run, backend, source, per_run=per_run)
    options = {"local": {"num_nodes": nodes}, "skypilot": {},
               "ssh": {"host": host, "accept_new_host_key": accept_new_host_key, "identity_file": identity_file}}
    be = get_backend(backend, **{k: v for k, v in options[backend].items() if v is not None})
    secrets = {k: os.environ[k] for k in SECRET_NAMES if os.environ.get(k)}
    envs = {**extra_env, **experiment.allow_env(allow), "LAUNCH_RUN_ID": run.id,
            "LAUNCH_PRICE_PER_HOUR": f"{run.price_per_hour:.4f}",
            "LAUNCH_BUDGET_USD": f"{p.budget.max_usd:g}"}
    before = registry.get(run.id) if resuming else None  # a resume that fails to start is put back as it was
    # The run is in the registry, `starting`, before anything that can bill starts: a signal, a closed
    # terminal or an error from here on leaves a record that `status`, `cost` and `down` find. What
    # produced it (git, data hashes: work that can fail) is taken first and never stops the start.
    run.state, run.ended_at = "starting", None
    provenance = None if resuming else _provenance(resolved, run.id)
    run.handle = experiment.recorded(run, p, (*sets, *rehearsal), extra_env, entry, provenance)
    recorded.append(run.id)  # first: an interrupt as the record is written names the run all the same
    registry.save(run)
    spec = LaunchSpec(run=run, profile=p, task_yaml=task_yaml, config_yaml=config_yaml, envs=envs,
                      secrets=secrets, resume=resuming, placed=_placed)
    started = _start(be, spec, backend, before)
    verb = "resumed" if spec.resume else "started"
    spent = f", {money(run.billed()[1])} spent so far" if spec.resume else ""
    note("[green]✓[/] ", f"{verb} {run.id} ({p.name} on {backend}, {money(run.price_per_hour)}/h, budget "
         f"{money(p.budget.max_usd)}{spent})")
    return started


def _start(be, spec, backend: str, before):
    """be.up, then what it learnt added to the run's record. Interrupted (Ctrl-C, SIGTERM, SIGHUP), the
    record stays as it is, `starting`: the run may be running (launcher/cli.py names it). A start that
    failed started nothing: a new run's record goes, a resume's is put back as it was."""
    from launcher.store import registry
    from launcher.term.ui import console, esc

    run = spec.run
    try:
        with console().status(f"starting {esc(run.id)} on {backend}..."):
            started = be.up(spec)
    except Exception:
        if before is None:
            registry.delete(run.id)
        else:
            registry.save(before)
        raise
    started.state = "running"
    started.ended_at = None
    registry.save(started)
    return started


def _placed(run) -> None:
    """What a backend knows of where the run lives (host, directories, cluster), recorded before it
    starts anything there: a `launch up` stopped then leaves a run that `status` and `down` can reach."""
    from launcher.store import registry

    registry.update(run.id, cluster=run.cluster, handle=run.handle)


def _provenance(resolved, run_id: str):
    """experiment.provenance, or None with a `!` line when it cannot be taken (a full disk, git failing)."""
    from launcher.runs import experiment
    from launcher.term.ui import note

    try:
        return experiment.provenance(resolved, run_id)
    except Exception as e:  # noqa: BLE001 - a record without provenance beats no run record
        note("[yellow]![/] ", f"the run's provenance (commit, diff, data hashes) was not recorded: {e}")
        return None


def _resume_place(prior, backend, host, identity_file):
    """A resume continues where the run ran: its backend, and for ssh its host and key, unless given.
    Another backend would start it over on a machine that has none of its checkpoints: refused."""
    from launcher.errors import BackendError

    if backend is not None and backend != prior.backend:
        raise BackendError(f"--resume {prior.id}: the run ran on the {prior.backend} backend and its checkpoints are "
                           f"there; drop --backend {backend}, or start a fresh run with --new")
    handle = prior.handle or {}
    if prior.backend == "ssh":
        host, identity_file = host or handle.get("host"), identity_file or handle.get("identity_file")
    return prior.backend, host, identity_file


def _require_training_extras():
    """The local backend trains with the training stack: this Python's, or the environment launch builds
    once (launcher/trainenv.py), built here, before anything is claimed or started, and said while it is."""
    from launcher import trainenv
    from launcher.term.ui import err_console, note

    trainenv.python(say=lambda line: note("  ", line, out=err_console()))


def _env_option(items: tuple[str, ...]) -> dict[str, str]:
    from launcher.profiles.schema import parse_env_items

    from launcher.errors import BackendError

    try:
        return parse_env_items(items)
    except ValueError as e:
        raise BackendError(f"--env: {e}") from None


def load_with_overrides(profile: str, sets: tuple[str, ...]):
    """The profile with KEY=VALUE overrides applied in memory (nothing is written), checked like
    `launch up` checks every profile (config and data files in one report)."""
    from launcher.profiles.checks import load_checked

    return load_checked(profile, overrides=tuple(sets))[0]


def _pick_run(p, backend: str, resume, force_new, rehearse: bool = False, explicit_new: bool = False,
              reserve: bool = True, prior=None):
    """(run, resuming): a new Run or the one to resume (`prior`, when the caller found it already);
    refuses a second active run of a profile. A dry run (`reserve` False) names the id the run would
    get without reserving it in the registry."""
    from launcher.store import registry
    from launcher.errors import BackendError

    active = registry.active_for_profile(p.name)
    if active and not resume and not explicit_new:  # --new: the user asked for a second run, it gets its own id
        state = refresh(active)
        if state.active:
            raise BackendError(f"{p.name} already has an active run {active.id} ({state.state}): follow it with "
                               f"`launch logs {active.id} --follow`, stop it with `launch down {active.id}`, "
                               f"or start another with --new")
    from launcher.runs.experiment import profile_arg

    if resume and not force_new:
        from launcher.runs.experiment import resume_target

        old = prior or resume_target(p.name, resume)
        if old.active and (old := refresh(old)).active:  # a second start would bill beside it, or do nothing
            seen = old._remote.state if old._remote.state == "unreachable" else old.state
            raise BackendError(f"run {old.id} is {seen}: it needs no --resume; follow it with `launch logs {old.id} "
                               f"--follow`, or stop it with `launch down {old.id}` and resume it after")
        if old.reason == registry.FORGOTTEN and (old := refresh(old))._remote.state == "running":
            raise BackendError(f"run {old.id} was ended here only (`launch down --forget`) and its machine answers "
                               f"again with the run still on it: a second trainer would be refused there; stop it "
                               f"with `launch down {old.id}` (its trainer saves a final checkpoint), then resume it")
        if old.state == "completed" and not _trains_further(old, p):
            raise BackendError(f"run {old.id} already completed; to train it further resume it with more steps "
                               f"(`launch up {profile_arg(old)} --resume {old.id} --set train.max_steps=N`, N above "
                               f"the {_trained(old)} it trained), or start a fresh run with --new")
        old.state, old.reason = "starting", None
        return old, True
    if not force_new:
        latest = next((r for r in registry.all_runs() if r.profile == p.name), None)
        if latest is not None and refresh(latest).state in ("preempted", "failed", "stopped", "budget_exhausted"):
            from launcher.term.ui import note

            note("[yellow]![/] ", f"last run {latest.id} ended {latest.state}; starting a new "
                 f"one (continue it instead with `launch up {profile_arg(latest)} --resume "
                 f"{latest.id}`)")
    from launcher.runs.rehearse import run_id_prefix

    prefix = run_id_prefix(p.name) if rehearse else p.name
    run_id = registry.new_run_id(prefix) if reserve else f"{prefix}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
    return registry.Run(id=run_id, profile=p.name,
                        backend=backend,
                        config_hash=p.config_hash(), budget_usd=p.budget.max_usd), False


def _trained(run) -> str:
    cfg = (run.handle or {}).get("config") or {}
    steps, epochs = cfg.get("train.max_steps"), cfg.get("train.epochs")
    return f"{steps} steps" if steps else f"{epochs} epoch(s)" if epochs else "steps"


def _trains_further(run, p) -> bool:
    """A completed run resumed with more training (train.max_steps, else train.epochs, above what it
    was started with) continues from its last checkpoint to the new end (README: Runs are experiments)."""
    cfg = (run.handle or {}).get("config") or {}
    steps, epochs = cfg.get("train.max_steps"), cfg.get("train.epochs")
    if p.train.max_steps:
        return isinstance(steps, int) and p.train.max_steps > steps
    return steps is None and isinstance(epochs, (int, float)) and p.train.epochs > epochs


def price_for(p, backend: str) -> tuple[float, str]:
    """($/h, source) for a new run: RunPod's API (skypilot backend), else the catalog snapshot, else
    the profile's price. Local profiles use their notional price."""
    if backend == "skypilot":
        from launcher.backends.skypilot import hourly_price

        return hourly_price(p)
    from launcher.catalog import plan_price

    return plan_price(p), "catalog or profile"


def render_for_run(p, run, backend: str, price_source: str, per_run: bool = False):
    """Cloud: the committed sky/ files (re-rendered if stale), or with `--set` overrides (`per_run`) a
    copy in the run's own directory, as local/ssh runs always get: sky/ stays the profile's render."""
    from launcher.profiles.render import config_path, render_text, task_path, write
    from launcher.store.state import private_dir, state_dir, write_private

    if backend == "skypilot" and not per_run:
        task_text, config_text = render_text(p, _committed_price(p, run, price_source))
        write({task_path(p.name): task_text, config_path(p.name): config_text})
        return task_path(p.name), config_path(p.name)
    task_text, config_text = render_text(p, run.price_per_hour)
    d = private_dir(private_dir(state_dir() / "rendered") / run.id)
    return write_private(d / "task.yaml", task_text), write_private(d / f"{p.name}.yaml", config_text)


def _committed_price(p, run, price_source: str) -> float:
    """sky/ is committed and CI runs `launch render --check`: it is rendered with the offline price, as
    `launch render` does. A live price reaches the run through LAUNCH_PRICE_PER_HOUR instead."""
    if price_source in ("runpod-api", "registry"):
        from launcher.backends.skypilot import hourly_price

        return hourly_price(p, live=False)[0]
    return run.price_per_hour


def _dry_run(p, run, backend: str, price_source: str, per_run: bool = False) -> None:
    """`up --dry-run`: the task rendered as `launch up` would render it (cloud: as the committed sky/
    file, said whether that is up to date; otherwise, or with --set overrides, a per-run copy) into a
    temp dir that is removed (a dry run writes nothing), parsed by SkyPilot for the skypilot backend,
    and the upload list."""
    import shutil
    import tempfile

    import yaml

    from launcher.profiles.render import render_text, task_path
    from launcher.profiles.uploads import print_dry_run

    if backend == "skypilot" and not per_run:
        task_text, config_text = render_text(p, _committed_price(p, run, price_source))
        committed = task_path(p.name)
        fresh = committed.exists() and committed.read_text() == task_text
        checked = f"sky/{committed.name} ({'up to date' if fresh else 'stale: `launch up` re-renders it'})"
    else:
        task_text, config_text = render_text(p, run.price_per_hour)
        checked = f"rendered from {p.name}'s profile for the {backend} backend (a per-run copy)"
    d = Path(tempfile.mkdtemp(prefix="launch-dry-run-"))
    try:
        task_yaml, config_yaml = d / "task.yaml", d / f"{p.name}.yaml"
        task_yaml.write_text(task_text)
        config_yaml.write_text(config_text)
        if backend == "skypilot":
            from launcher.catalog import sky_task

            config = yaml.safe_load(task_text)
            config.pop("workdir", None)
            sky_task(config)  # SkyPilot's parser, offline and out of the user's ~/.sky: schema errors raise
            checked += ", parsed by SkyPilot"
        print_dry_run(p, backend, run.id, task_yaml, config_yaml, checked)
    finally:
        shutil.rmtree(d, ignore_errors=True)
