"""Which run a `launch up` is, and who else may act on it meanwhile: the claims it holds
(launcher/store/claims.py), the run a resume continues (read under them, on the backend and host it
ran on), or a new run, and the refusals between (an active run of the profile beside a new one, a
resume of a run that still runs or already completed). launcher/runs/start.py takes these steps.
"""

from __future__ import annotations

import time

from launcher.errors import BackendError
from launcher.runs.refresh import refresh
from launcher.term.ui import note


def claim(held, written, *, resume, force_new: bool, dry_run: bool):
    """Every claim this `up` holds, entered into `held`, and the run a resume continues, read under
    them (None for a new run). The profile's claim comes first: a resume's `latest` is then the newest
    run for good, and no second `up` checks for an active run meanwhile. A resume claims its run too
    before it reads the record (a `down` of it may hold it without the profile's). `--new` asks for a
    run of its own and checks no other, so it claims none; a dry run starts nothing and claims nothing."""
    from launcher.profiles.profile import validate
    from launcher.runs import experiment
    from launcher.store import claims, registry

    if not dry_run and not force_new:
        held.enter_context(claims.of_profile(written.name))
    if not resume or force_new:
        return None
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
        held.enter_context(claims.of_run(prior.id))
        prior = registry.get(prior.id)  # as recorded now, under its claim
    experiment.own_profile(prior, written)  # never another file of the same name
    return prior


def resume_place(prior, backend, host, identity_file):
    """A resume continues where the run ran: its backend, and for ssh its host and key, unless given.
    Another backend would start it over on a machine that has none of its checkpoints: refused."""
    if backend is not None and backend != prior.backend:
        raise BackendError(f"--resume {prior.id}: the run ran on the {prior.backend} backend and its checkpoints are "
                           f"there; drop --backend {backend}, or start a fresh run with --new")
    if prior.backend == "ssh":
        host, identity_file = host or prior.handle.host, identity_file or prior.handle.identity_file
    return prior.backend, host, identity_file


def pick_run(p, backend: str, *, prior, force_new: bool, rehearse: bool, reserve: bool):
    """(run, resuming): `prior`, the run a resume continues (found by `claim`), once it may resume, or
    a new Run, refused beside an active run of the profile unless `--new` (`force_new`) asked for a
    second one. A dry run (`reserve` False) names the id the run would get without reserving it."""
    from launcher.runs.experiment import profile_arg
    from launcher.store import registry

    active = registry.active_for_profile(p.name)
    if active and prior is None and not force_new:  # --new: the user asked for a second run, it gets its own id
        state = refresh(active)
        if state.active:
            raise BackendError(f"{p.name} already has an active run {active.id} ({state.state}): follow it with "
                               f"`launch logs {active.id} --follow`, stop it with `launch down {active.id}`, "
                               f"or start another with --new")
    if prior is not None:  # the last refresh's RemoteStatus rides on the Run as `remote` (launcher/runs/refresh.py)
        old = prior
        if old.active and (old := refresh(old)).active:  # a second start would bill beside it, or do nothing
            seen = old.remote.state if old.remote.state == "unreachable" else old.state
            raise BackendError(f"run {old.id} is {seen}: it needs no --resume; follow it with `launch logs {old.id} "
                               f"--follow`, or stop it with `launch down {old.id}` and resume it after")
        if old.reason == registry.FORGOTTEN and (old := refresh(old)).remote.state == "running":
            raise BackendError(f"run {old.id} was ended here only (`launch down --forget`) and its machine answers "
                               f"again with the run still on it: a second trainer would be refused there; stop it "
                               f"with `launch down {old.id}` (its trainer saves a final checkpoint), then resume it")
        if old.state == "completed" and not _trains_further(old, p):
            raise BackendError(f"run {old.id} already completed; to train it further resume it with more steps "
                               f"(`launch up {profile_arg(old)} --resume {old.id} --set train.max_steps=N`, N above "
                               f"the {_trained(old)} it trained), or start a fresh run with --new")
        old.state, old.reason = "starting", None
        return old, True
    if not force_new and not rehearse:  # a fresh run by choice needs no word about the last one
        latest = next((r for r in registry.all_runs() if r.profile == p.name), None)
        if latest is not None and refresh(latest).state in ("preempted", "failed", "stopped", "budget_exhausted"):
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
    cfg = run.handle.config or {}
    steps, epochs = cfg.get("train.max_steps"), cfg.get("train.epochs")
    return f"{steps} steps" if steps else f"{epochs} epoch(s)" if epochs else "steps"


def _trains_further(run, p) -> bool:
    """A completed run resumed with more training (train.max_steps, else train.epochs, above what it
    was started with) continues from its last checkpoint to the new end (README: Runs are experiments)."""
    cfg = run.handle.config or {}
    steps, epochs = cfg.get("train.max_steps"), cfg.get("train.epochs")
    if p.train.max_steps:
        return isinstance(steps, int) and p.train.max_steps > steps
    return steps is None and isinstance(epochs, (int, float)) and p.train.epochs > epochs
