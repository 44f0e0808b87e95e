"""`launch up`: from the command to the run's record, as named steps that `_up` takes top to bottom:

1. `_env_of`: the command's own options (`--allow-change` needs `--resume`; `--env` parsed).
2. `read_profile`, `_resolve`: the profile read from disk once and checked once into one value that
   goes down the path (a resume's recorded overrides under this command's, a rehearsal's cuts on
   top). A new run is checked before it claims; a resume after, with what its run recorded.
3. `pick.claim`: every claim this `up` holds (launcher/store/claims.py), taken in that one place; a
   resume's run is found and read under them.
4. `_place`: the backend, and what it needs on this machine before a run is picked.
5. `_plan`: the run (new, or the one resumed: `pick.pick_run`), its history entry, price and render,
   and the budget gate; a dry run ends there (`show_dry_run`, launcher/runs/rendering.py).
6. `_task`: billed from now, the task rendered, the backend and the run's environment.
7. `_record_starting`: the run in the registry, `starting`, before anything that can bill.
8. `_start`: the backend's up, then the run recorded `running`; `_say_started` says so.

launcher/runs/lifecycle.py follows the run from there.

One idea at ~380 lines: `launch up`'s path and the values it hands down (`UpRequest`, `Config`,
`Plan`), read in the order it runs; which run it is (launcher/runs/pick.py) and the task it renders
(launcher/runs/rendering.py) live apart.
"""
from __future__ import annotations

import os
import time
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Optional

import click

from launcher import trainenv
from launcher.errors import BackendError
from launcher.runs import pick
from launcher.runs.lifecycle import follow_run, interactive
from launcher.runs.rendering import price_for, render_for_run, renders_per_run, show_dry_run
from launcher.term.ui import console, err_console, esc, hints, money, note

SECRET_NAMES = ("HF_TOKEN", "WANDB_API_KEY")

RECORDED = "launch.recorded"  # ctx.meta key: the ids `up` recorded (launcher/cli.py names them on an interrupt)


@dataclass(frozen=True)
class UpRequest:
    """`launch up`'s options as the command was given them (a resume's recorded ones join in `_resolve`)."""

    profile: str
    backend: Optional[str] = None
    host: Optional[str] = None
    identity_file: Optional[str] = None
    accept_new_host_key: bool = False
    resume: Optional[str] = None  # a run id, or `latest`
    force_new: bool = False
    nodes: Optional[int] = None
    sets: tuple[str, ...] = ()
    env_items: tuple[str, ...] = ()
    dry_run: bool = False
    rehearse: bool = False
    allow: tuple[str, ...] = ()

    @property
    def resuming(self) -> bool:
        """Whether this `up` continues an earlier run: `--new` asks for a run of its own over `--resume`."""
        return bool(self.resume) and not self.force_new


@dataclass(frozen=True)
class Config:
    """The run's config, resolved once (`_resolve`): the profile as read and as checked, and where from."""

    written: object  # launcher.profiles.profile.ProfileFile: the file's bytes, read once
    resolved: object  # launcher.profiles.checks.ResolvedProfile: `sets` and `rehearsal` applied, checked
    prior: object  # the run a resume continues (launcher.store.registry.Run), else None
    sets: tuple[str, ...]  # the overrides: on a resume the run's recorded ones, this command's on top
    rehearsal: tuple[str, ...]  # a rehearsal's cuts, overrides too
    env: dict  # --env, on a resume over the run's recorded --env
    backend: Optional[str]  # as given, or on a resume where the run ran (with its ssh host and key)
    host: Optional[str]
    identity_file: Optional[str]

    @property
    def profile(self):
        return self.resolved.profile

    @property
    def overrides(self) -> tuple[str, ...]:
        """Every override of the run, as recorded with it."""
        return (*self.sets, *self.rehearsal)


@dataclass(frozen=True)
class Plan:
    """What `_plan` decided: the run, whether it resumes, its history entry, its price's source, and
    the profile its task is rendered from (`per_run`: into the run's own directory, not sky/)."""

    run: object  # launcher.store.registry.Run, `starting`; new runs priced
    resuming: bool
    entry: dict
    source: str
    per_run: bool
    rendered: object  # launcher.profiles.schema.Profile


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
    req = UpRequest(profile=profile, backend=backend, host=host, identity_file=identity_file,
                    accept_new_host_key=accept_new_host_key, resume=resume, force_new=force_new, nodes=nodes,
                    sets=tuple(sets), env_items=tuple(env_items), dry_run=dry_run, rehearse=rehearse,
                    allow=tuple(allow))
    # the run's id once it is in the registry: an interrupt from then on names it, also one that lands
    # after this function returned (the ✓ line and hints printed, the command ending): ctx.meta is the
    # one place launcher/cli.py reads it from then
    recorded: list[str] = click.get_current_context().meta.setdefault(RECORDED, [])
    try:
        # The claims taken are held from the first check to the run's record, and let go before
        # following: one `up` starts or resumes a run, a second one says who holds it.
        with ExitStack() as held:
            started = _up(held, recorded, req)
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


def _up(held, recorded: list, req: UpRequest):
    """`launch up` up to the run's record (None: a dry run), its claims entered into `held`, the run's
    id appended to `recorded` as it is first recorded."""
    from launcher.profiles.profile import read_profile

    extra_env = _env_of(req)
    written = read_profile(req.profile)  # the one read of the profile file; that value goes down the path
    # A new run is checked before it claims (a refusal never waits on, nor blocks, another `up`); a resume
    # reads its run under the claims, then is checked with the run's recorded overrides.
    new = None if req.resuming else _resolve(req, written, extra_env)
    prior = pick.claim(held, written, resume=req.resume, force_new=req.force_new, dry_run=req.dry_run)
    config = new or _resolve(req, written, extra_env, prior=prior)
    backend = _place(req, config)
    plan = _plan(req, config, backend)
    if req.dry_run:
        return show_dry_run(plan.rendered, plan.run, backend, plan.source, plan.per_run)  # None
    be, spec = _task(req, config, backend, plan)
    before = _record_starting(config, plan, recorded)
    started = _start(be, spec, backend, before)
    _say_started(spec, backend)
    return started


def _env_of(req: UpRequest) -> dict[str, str]:
    """The command's own options, refused before anything is read: `--allow-change` only with
    `--resume` (a new run takes any config); the `--env` items as a dict."""
    from launcher.profiles.schema import parse_env_items

    if req.allow and not req.resume:
        raise click.BadParameter("--allow-change goes with --resume (a new run takes any config)",
                                 param_hint="--allow-change")
    try:
        return parse_env_items(req.env_items)
    except ValueError as e:
        raise BackendError(f"--env: {e}") from None


def _resolve(req: UpRequest, written, env: dict, prior=None) -> Config:
    """The run's config, checked once: config and local data files, every problem in one report, before
    anything starts or bills. A resume (`prior`) keeps the run's config: its recorded --set and --env,
    this command's on top, and its backend and host. A rehearsal's cuts are overrides too, allowed on
    every backend (launcher/runs/rehearse.py), computed from the checked profile and checked again."""
    from launcher.profiles.checks import checked
    from launcher.runs import experiment

    sets, backend, host, identity_file = req.sets, req.backend, req.host, req.identity_file
    if prior is not None:
        sets, env = experiment.carried(prior, sets, env)
        backend, host, identity_file = pick.resume_place(prior, backend, host, identity_file)
    resolved = checked(written, tuple(sets))
    rehearsal = ()
    if req.rehearse:
        from launcher.runs.rehearse import overrides

        if req.resume:
            raise BackendError("--rehearse starts a fresh short run; drop --resume")
        rehearsal = overrides(resolved.profile)
        resolved = checked(written, (*sets, *rehearsal))
    return Config(written=written, resolved=resolved, prior=prior, sets=tuple(sets), rehearsal=rehearsal,
                  env=env, backend=backend, host=host, identity_file=identity_file)


def _place(req: UpRequest, config: Config) -> str:
    """The backend the run starts on (default: local for `infra: local` profiles, skypilot otherwise),
    and what it needs here, refused or built before a run is picked: an ssh host, the local training
    stack, a cloud's credentials (said now, before seconds of planning and an API server)."""
    p = config.profile
    backend = config.backend or ("local" if p.cluster.is_local else "skypilot")
    if backend == "ssh" and not config.host:
        raise BackendError("--backend ssh needs --host user@host[:port]")
    if req.nodes and backend != "local":  # it sizes local node processes only: never dropped without a word
        raise BackendError(f"--nodes runs N node processes with --backend local; on {backend} the profile's "
                           f"cluster.num_nodes ({p.cluster.num_nodes}) is the node count: "
                           f"--set cluster.num_nodes={req.nodes}")
    if backend == "local":
        _require_training_extras()
    if backend == "skypilot" and not req.dry_run and not p.cluster.is_local:
        from launcher.backends.skypilot import check_credentials_here

        check_credentials_here(p)
    return backend


def _require_training_extras():
    """The local backend trains with the training stack: this Python's, or the environment launch builds
    once (launcher/trainenv.py), built here, before anything is claimed or started, and said while it is."""
    trainenv.python(say=lambda line: note("  ", line, out=err_console()))


def _plan(req: UpRequest, config: Config, backend: str) -> Plan:
    """The run and what it will be: new (priced) or resumed (its recorded price; the resume rule
    decides what may change), rendered from which profile and where, and a new run planned over its
    own budget cap started only when confirmed (a dry run says it and asks nothing)."""
    from launcher.runs import experiment

    p = config.profile
    run, resuming = pick.pick_run(p, backend, prior=config.prior, force_new=req.force_new, rehearse=req.rehearse,
                                  reserve=not req.dry_run)
    entry = experiment.check_resume(run, config.resolved, req.sets, req.allow) if resuming else \
        experiment.start_entry(config.overrides)
    source = "registry"
    if not resuming:
        run.price_per_hour, source = price_for(p, backend)
    # A cloud run of the profile as written renders into the committed sky/ file (only budget.*
    # overrides may differ from it); any other goes into the run's own directory.
    per_run = renders_per_run(config.overrides, config.written)
    rendered = config.resolved.as_written() if backend == "skypilot" and not per_run else p
    if not resuming:
        from launcher.plan.budget_gate import confirm_over_budget

        confirm_over_budget(p, backend, interactive() and not req.dry_run)
    return Plan(run=run, resuming=resuming, entry=entry, source=source, per_run=per_run, rendered=rendered)


def _task(req: UpRequest, config: Config, backend: str, plan: Plan):
    """(backend, LaunchSpec): the run billed from here (provisioning and setup included), its task
    rendered, its backend, and its environment; secrets go by name from yours, never written down."""
    from launcher.backends import LaunchSpec, get_backend
    from launcher.runs import experiment

    run, p = plan.run, config.profile
    run.budget_usd = p.budget.max_usd  # a `--resume --set budget.max_usd=...` is the run's budget from now
    if run.billed_s is None:  # new, or recorded before billing was accrued: what it billed so far
        run.billed_s, run.billed_usd = run.billed()
    run.billing_since = time.time()
    task_yaml, config_yaml = render_for_run(plan.rendered, run, backend, plan.source, per_run=plan.per_run)
    options = {"local": {"num_nodes": req.nodes}, "skypilot": {},
               "ssh": {"host": config.host, "accept_new_host_key": req.accept_new_host_key,
                       "identity_file": config.identity_file}}
    be = get_backend(backend, **{k: v for k, v in options[backend].items() if v is not None})
    secrets = {k: os.environ[k] for k in SECRET_NAMES if os.environ.get(k)}
    envs = {**config.env, **experiment.allow_env(req.allow), "LAUNCH_RUN_ID": run.id,
            "LAUNCH_PRICE_PER_HOUR": f"{run.price_per_hour:.4f}",
            "LAUNCH_BUDGET_USD": f"{p.budget.max_usd:g}"}
    return be, LaunchSpec(run=run, profile=p, task_yaml=task_yaml, config_yaml=config_yaml, envs=envs,
                          secrets=secrets, resume=plan.resuming, placed=_placed)


def _placed(run) -> None:
    """What a backend knows of where the run lives (host, directories, cluster), recorded before it
    starts anything there: a `launch up` stopped then leaves a run that `status` and `down` can reach."""
    from launcher.store import registry

    registry.update(run.id, cluster=run.cluster, handle=run.handle)


def _record_starting(config: Config, plan: Plan, recorded: list):
    """The run in the registry, `starting`, before anything that can bill starts: a signal, a closed
    terminal or an error from here on leaves a record that `status`, `cost` and `down` find. What
    produced it (git, data hashes: work that can fail) is taken first and never stops the start.
    Returns a resume's record as it was (a resume that fails to start is put back so), else None."""
    from launcher.runs import experiment
    from launcher.store import registry

    run = plan.run
    before = registry.get(run.id) if plan.resuming else None
    run.state, run.ended_at = "starting", None
    provenance = None if plan.resuming else _provenance(config.resolved, run.id)
    run.handle = experiment.recorded(run, config.profile, config.overrides, config.env, plan.entry, provenance)
    recorded.append(run.id)  # first: an interrupt as the record is written names the run all the same
    registry.save(run)
    return before


def _provenance(resolved, run_id: str):
    """experiment.provenance, or None with a `!` line when it cannot be taken (a full disk, git failing)."""
    from launcher.runs import experiment

    try:
        return experiment.provenance(resolved, run_id)
    except Exception as e:  # noqa: BLE001 - a record without provenance beats no run record
        note("[yellow]![/] ", f"the run's provenance (commit, diff, data hashes) was not recorded: {e}")
        return None


def _start(be, spec, backend: str, before):
    """be.up, then what it learnt added to the run's record. Interrupted (Ctrl-C, SIGTERM, SIGHUP), the
    record stays as it is, `starting`: the run may be running (launcher/cli.py names it). A start that
    failed started nothing: a new run's record goes, a resume's is put back as it was."""
    from launcher.store import registry

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


def _say_started(spec, backend: str) -> None:
    """The `✓` line: started or resumed, where, at what price, within what budget (and for a resume
    what it has spent so far)."""
    run, p = spec.run, spec.profile
    verb = "resumed" if spec.resume else "started"
    spent = f", {money(run.billed()[1])} spent so far" if spec.resume else ""
    note("[green]✓[/] ", f"{verb} {run.id} ({p.name} on {backend}, {money(run.price_per_hour)}/h, budget "
         f"{money(p.budget.max_usd)}{spent})")


def load_with_overrides(profile: str, sets: tuple[str, ...]):
    """The profile with KEY=VALUE overrides applied in memory (nothing is written), checked like
    `launch up` checks every profile (config and data files in one report)."""
    from launcher.profiles.checks import load_checked

    return load_checked(profile, overrides=tuple(sets))[0]
