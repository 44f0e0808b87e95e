"""The stage driver: a run's `stages:` (sft -> dpo -> grpo) in order, each from the previous adapter.

`python -m payload train` comes here (a config without stages goes on to payload.train.recipe.main as
one SFT run). Stage i trains in
`{run_dir}/stages/<i>-<name>/` (its own data/, checkpoints/, metrics.jsonl, outputs/adapter) by
payload.train.recipe's phases with the config `payload.config.stages.stage_run_config` derives, starting
from stage i-1's exported adapter. A stage whose training_summary.json says completed for the same
config, beside its adapter, is finished: a restarted run skips it and resumes the first unfinished
stage from its newest checkpoint that verifies. The run's status.json carries `stage` (name, kind,
index, of) while the stage trains; the budget is the run's, less what earlier stages spent.

At the end the run directory holds what a one-stage run holds: outputs/adapter (the last stage's),
metrics.jsonl (every stage's lines with `stage`), training_summary.json (with a `stages` list), and
also every stage's adapter under outputs/stages/<i>-<name>/adapter (layout.ARTIFACTS `stages`),
copied there as each stage finishes. A run stopped mid-stage (`launch down`, the budget, a signal)
gets the outputs it has then, the finished stages' adapters and the metrics so far, and their
MANIFEST (payload/outputs/manifest.py), as a one-stage run does at a stop.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from payload import layout
from payload.outputs import manifest
from payload.volume.control import all_reduce_max
from payload.volume import lease
from payload.volume import observe
from payload.errors import EXIT_BUDGET, BudgetExhausted, PayloadError
from payload.volume.money import resume_hint, usd
from payload.config.stages import stage_dir_name, stage_run_config
from payload.train.run import Run

log = logging.getLogger("payload.train")
STAGE_OUTPUTS = layout.STAGE_ADAPTERS


def main(cfg) -> dict:
    """`python -m payload train`: train every stage that is not finished; returns the run's summary
    (with per-stage summaries). A config without `stages:` is one SFT run (payload.train.recipe.main)."""
    from payload.train import recipe as train

    if not cfg.stages:
        return train.main(cfg)

    rd = cfg.run_dir
    held = lease.acquire(rd, cfg.runtime.run_id) if observe.rank() == 0 else None
    try:
        summaries, adapter = [], None
        for i in range(len(cfg.stages)):
            scfg = stage_run_config(cfg, i, adapter)
            done = train.already_trained(Run(cfg=scfg, run_dir=scfg.run_dir))
            if done is not None:
                log.info("stage %d/%d %s already finished: skipped", i + 1, len(cfg.stages), scfg.stage.label)
            else:
                done = run_stage(cfg, scfg, spent(summaries))
            summaries.append(done)
            adapter = scfg.run_dir / layout.ADAPTER_DIR
            if observe.rank() == 0:  # a finished stage's adapter is an output already: a stop later keeps it
                _copy_tree(adapter, rd / STAGE_OUTPUTS / stage_dir_name(i, cfg.stages[i]) / "adapter")
        return finish(cfg, summaries)
    finally:
        observe.status_of_stage(None)
        if held is not None:
            held.release()


def spent(summaries: list[dict]) -> float:
    return sum(s.get("cost_usd") or 0.0 for s in summaries)


def run_stage(cfg, scfg, spent_before: float) -> dict:
    """One stage through payload.train.recipe.main, its status routed to the run's status.json."""
    from payload.train import preference
    from payload.train import recipe as train

    budget = cfg.runtime.budget_usd
    info = scfg.stage_info()
    last = info["index"] == info["of"]
    if budget is not None:
        left = budget - spent_before
        # every rank stops here, or none (ranks' figures may differ)
        (over,) = all_reduce_max([float(left <= 0)])
        if over:
            reason = (f"budget of {usd(budget)} spent by the stages before {scfg.stage.label} "
                      f"({usd(spent_before)}); continue with {resume_hint(cfg.runtime.profile)}")
            if observe.rank() == 0:  # no stage trains to record this end: the run's outputs, then its end
                at_stop(cfg, info["index"] - 1, "budget_exhausted")
                observe.write_end(cfg.run_dir, EXIT_BUDGET, reason, cost_usd=round(spent_before, 6), stage=info)
            raise BudgetExhausted(reason)
        scfg.runtime.budget_usd = left

    def route(fields: dict) -> dict:
        out = {**fields, "stage": info}
        if not last and out.get("state") == "completed":  # the run goes on with the next stage
            out.update(state="training", exit_code=None, reason=None, ended_at=None, eta_s=None)
        return out

    observe.status_of_stage(scfg.run_dir, cfg.run_dir, route)
    log.info("stage %d/%d: %s (%s) in %s", info["index"], info["of"], info["name"], info["kind"], scfg.run_dir)
    return train.main(scfg, None if scfg.stage.kind == "sft" else preference.setup,
                      at_stop=lambda state: at_stop(cfg, info["index"], state))


def at_stop(cfg, begun: int, state: str) -> None:
    """What a stop leaves in the run's own directory (rank 0): the metrics of the `begun` first stages
    joined, and the MANIFEST of the run's outputs (the adapters of its finished stages among them)."""
    names = [stage_dir_name(i, s) for i, s in enumerate(cfg.stages)][:begun]
    if names:
        _join_metrics(cfg.run_dir, names, cfg.stages[:begun])
    manifest.at_end(cfg, state)


def finish(cfg, summaries: list[dict]) -> dict:
    """The run's outputs from its stages' (rank 0): last adapter, every adapter, metrics, summary."""
    rd = cfg.run_dir
    names = [stage_dir_name(i, s) for i, s in enumerate(cfg.stages)]
    if observe.rank() != 0:
        return summaries[-1]
    _copy_tree(rd / "stages" / names[-1] / layout.ADAPTER_DIR, rd / layout.ADAPTER_DIR)
    _join_metrics(rd, names, cfg.stages)
    observe.plot_losses(rd / layout.METRICS, rd / layout.LOSS_PLOT, title=f"{cfg.name} ({cfg.runtime.run_id})")
    last = summaries[-1]
    summary = {**last, "config_hash": cfg.config_hash(), "run_id": cfg.runtime.run_id,
               "steps": sum(s.get("steps") or 0 for s in summaries),
               "cost_usd": round(spent(summaries), 6), "adapter_dir": layout.ADAPTER_DIR,
               "stages": [{"name": n, "kind": s.kind, **_brief(x)} for n, s, x in zip(names, cfg.stages, summaries)],
               "finished_at": observe.now_iso()}
    observe.write_summary(rd, summary)
    info = {"name": cfg.stages[-1].label, "kind": cfg.stages[-1].kind, "index": len(names), "of": len(names)}
    observe.write_end(rd, 0, None, step=last.get("steps"), cost_usd=summary["cost_usd"], eta_s=0, stage=info)
    log.info("all %d stages completed: %s", len(names), ", ".join(names))
    return summary


def _brief(s: dict) -> dict:
    keys = ("state", "steps", "final_loss", "cost_usd", "best_checkpoint", "resumed_from", "train_runtime_s")
    return {k: s.get(k) for k in keys}


def _copy_tree(src: Path, dst: Path) -> None:
    if not src.is_dir():
        raise PayloadError(f"a finished stage has no adapter at {src}; delete its training_summary.json to retrain it")
    tmp = dst.with_name(f".{dst.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    shutil.rmtree(dst, ignore_errors=True)
    tmp.rename(dst)


def _join_metrics(rd: Path, names: list[str], stages) -> None:
    """The run's metrics.jsonl: each stage's lines in order, with `stage` added."""
    lines = []
    for name, stage in zip(names, stages):
        for rec in observe.read_metrics(rd / "stages" / name / layout.METRICS):
            lines.append(json.dumps({**rec, "stage": name}, sort_keys=True))
    tmp = rd / (layout.METRICS + ".tmp")
    tmp.write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    tmp.replace(rd / layout.METRICS)
