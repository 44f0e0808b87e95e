"""The refresh of a run's state, bill and last step from its backend, and its status row: what
`launch status / cost / logs / down` (launcher/runs/lifecycle.py, launcher/runs/teardown.py), `launch up
--resume` and the results commands share."""

from __future__ import annotations

from launcher.term.units import number


def backend_for(run):
    from launcher.backends import get_backend

    options = {"ssh": {"host": run.handle.host}, "local": {"num_nodes": run.handle.num_nodes}}
    return get_backend(run.backend, **{k: v for k, v in options.get(run.backend, {}).items() if v is not None})


def refresh(run):
    """Ask the backend for the run's state and merge it into the registry, forward only: an ended run
    stays ended, whatever its machine says now (registry.observe holds the rule for every backend)."""
    from launcher.store import registry

    st = backend_for(run).status(run)
    run = registry.observe(run.id, st.state, st.reason, billing=st.billing, ended_at=st.ended_at)
    if run.handle.merged(st.handle) != run.handle:  # what the backend learnt of it
        run = registry.update(run.id, handle=st.handle)
    run = remember(run, {**st.extra, **{k: getattr(st, k) for k in (*LAST_SEEN, "cost_usd")}})
    run.remote = st
    return run


LAST_SEEN = ("step", "max_steps", "loss", "eval_loss")


def remember(run, report: dict):
    """Keep where the run got to (step, loss, stage: its status.json `report`) in its registry record,
    so that its row still says so once it has ended, when nothing is asked of its machine any more (or
    the machine is gone, its status.json with it). Returns the run as recorded (without `remote`)."""
    from launcher.store import registry
    from launcher.store.handle import Handle

    seen = _seen(report)
    if not seen or seen == run.handle.last_status:
        return run
    return registry.update(run.id, handle=Handle(last_status=seen))


def _seen(report) -> dict:
    """The step, loss, training cost and stage of a status.json (or as recorded), each a number or None;
    {}: no step."""
    if not isinstance(report, dict) or number(report.get("step")) is None:
        return {}
    seen = {k: number(report.get(k)) for k in LAST_SEEN}
    train_cost = number(report.get("cost_usd", report.get("train_cost_usd")))  # a status.json, or as recorded
    if train_cost is not None:  # what the payload measured training: said once the run ended too
        seen["train_cost_usd"] = train_cost
    if isinstance(report.get("stage"), dict):
        seen["stage"] = report["stage"]
    return {**seen, **dropped(report)}


def dropped(report: dict) -> dict:
    """The records TRL dropped (their prompt fills train.max_seq_length: payload/data/trainset.py), as
    the payload's status.json says them: `dropped_reason` (a sentence) and `dropped_records` ({split: n})."""
    if not isinstance(report.get("dropped_reason"), str):
        return {}
    counts = report.get("dropped_records")
    return {"dropped_reason": report["dropped_reason"],
            **({"dropped_records": counts} if isinstance(counts, dict) else {})}


def refreshed(run):
    """The run refreshed from its backend while it is watched (live, or an ended run still billing), else
    as recorded."""
    return refresh(run) if run.watched else run


def current_row(run) -> dict:
    """A run's status row, refreshed from its backend first while it is active (`_run`: the run)."""
    run = refreshed(run)
    return {**status_row(run), "_run": run}


TRACKED = ("wandb_url", "tensorboard", "gpu_peak_memory_gb", "gpu_util_mean_pct", "gpu_not_measured")


def status_row(run) -> dict:
    """One run for status/cost. `cost_usd` is what the machines billed: the billed seconds accrued on
    every refresh (setup and downloads included; time down after a preemption, or while a managed job
    recovers, excluded) at each session's price; `train_cost_usd` is what the payload measured while
    training (accumulated across restarts), when known."""
    st = run.remote
    billed_s, billed_usd = run.billed()
    row = {"id": run.id, "profile": run.profile, "backend": run.backend, "state": run.state,
           "reason": run.reason, "price_per_hour": run.price_per_hour, "budget_usd": run.budget_usd,
           "elapsed_s": round(run.elapsed_s(), 1), "billed_s": round(billed_s, 1),
           "cost_usd": round(billed_usd, 6),
           "train_cost_usd": st.cost_usd if st else None,
           "started_at": run.started_at, "ended_at": run.ended_at, "artifacts": run.artifacts,
           "overrides": run.handle.overrides or [], "envs": run.handle.envs or {},
           "history": run.handle.history or [], "provenance": run.handle.provenance}
    if st:
        row.update(step=st.step, max_steps=st.max_steps, loss=st.loss, eval_loss=st.eval_loss,
                   **projection(run, st, billed_usd))
        if isinstance(st.extra.get("stage"), dict):  # a run with stages: which one trains (name, index, of)
            row["stage"] = st.extra["stage"]
        if isinstance(st.extra.get("budget_warning"), str):  # the payload passed budget.warn_fraction
            row["budget_warning"] = st.extra["budget_warning"]
        if isinstance(st.extra.get("attention"), str):  # the kernel the payload loaded, and why
            row["attention"] = st.extra["attention"]
        row.update({k: st.extra[k] for k in TRACKED if st.extra.get(k) is not None})  # payload/outputs/tracking.py
        row.update(dropped(st.extra))
        if st.notice:  # what the state alone does not say (a `!` line in status and cost)
            row["notice"] = st.notice
    if (st is None or st.step is None) and (not run.active or (st and st.state == "unreachable")):
        last = _seen(run.handle.last_status)  # ended, or not answering: where it got to
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
