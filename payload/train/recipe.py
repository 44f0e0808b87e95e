"""Training stage: `python -m payload train --config RUN.yaml`, or `payload.train.recipe.main(cfg)`.

Which keys of the run config (the profile's `model:`, `train:`, `evaluation:`, `runtime:`) drive each
phase, in the order the phases run:

- `setup`: `model.name`/`kind`/`dtype`/`revision`/`attn_implementation` (the base model, its processor,
  the attention kernel), `data` (the records, written by `python -m payload data` when missing),
  `train.method` with `train.lora`/`train.quantization`/`train.deepspeed` (LoRA, QLoRA 4-bit, full
  weights under ZeRO), `train.packing`/`padding_free` (how records become batches),
  `train.gradient_checkpointing`/`liger`, `runtime.price_per_hour`/`budget_usd` (the cost tracker),
  `init_adapter` (a later stage trains on from the previous adapter).
- `load_checkpoint`: the newest complete checkpoint under the run directory that verifies
  (`runtime.volume`, `runtime.run_id`), and whether `math_hash` changed since it was saved.
- `train`: TRL's SFTTrainer over `train.max_steps`/`epochs`, saving by `train.checkpoints.save_steps` or
  `save_every_minutes` (Young's interval from `expected_preemption_hours` on spot), keeping
  `keep_best` + `keep_recent`; evaluating every `train.eval_steps` (and generating with
  `evaluation.during_training`), `train.early_stopping_patience`; stopping at `runtime.budget_usd`, at
  SIGTERM, or at `launch down`'s request, each after a checkpoint.
- `save`: the adapter (or full weights) from the checkpoint `evaluation.metric_for_best` ranks best (the
  latest for full fine-tuning), `train.high_loss_samples`, the loss plot, summary.json, status.json.
- `cleanup`: the signal handlers, the trackers (`train.report_to`, `wandb:`), the lease, the cost record.

One idea at ~390 lines: a training stage's phases in that order, as plain functions like one torchtune
recipe, read top to bottom (cut, the order would be read across files); the step itself (`trainer`),
the run's state (`run`) and what the run config becomes for TRL and transformers (`arguments`:
SFTConfig, the callbacks, the environment) stand apart.

Same entry point for one process, `torchrun --nproc_per_node N`, and several nodes. The work is TRL's
`SFTTrainer` (assistant-only loss, packing, PEFT) on transformers' `Trainer` (resume with
RNG/optimizer/scheduler/data position, DDP, DeepSpeed). What is added here: checkpoint markers with
checksums and retention, verified resume, the run's lease, time/budget/SIGTERM stops with a named end
(state, exit code and reason in status.json), cost, metrics and the outputs.

Inputs: `{run_dir}/data/{train,val}.jsonl` with canonical records
`{"messages": [{"role", "content": str | [{"type": "text", "text"} | {"type": "image", "image": path}]}],
"source": ...}` (written by `python -m payload data`; run here first if missing).
Outputs: layout.ADAPTER_DIR, SUMMARY, METRICS, LOSS_PLOT, HIGH_LOSS, STATUS, COST.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Optional

from payload import layout
from payload.model import attention
from payload.volume import lease
from payload.model import modeling
from payload.model import adapters
from payload.model import sharding
from payload.volume import observe
from payload.config import resume as runconfig
from payload.volume import stop_request
from payload.volume import timings
from payload.outputs import manifest, tracking
from payload.data import trainset
from payload.volume import checkpoints as ck
from payload.volume.control import SIGTERM_SAVE_BUDGET_S, RunControl, TrainingFinished, TrainingInterrupted
from payload.volume import verify
from payload.train.arguments import set_env, sft_config, tokenizer_of, trainer_callbacks, zero3
from payload.train.run import Run
from payload.train.trainer import trainer_class
from payload.config import dump_run_config
from payload.config.evaluation import best_metric, export_choice
from payload.errors import (
    EXIT_BUDGET, EXIT_CRASH, EXIT_INTERRUPTED, EXIT_OK, BudgetExhausted, PayloadError, exit_code_for, one_line,
)
from payload.volume.money import CostTracker, resume_hint, usd

log = logging.getLogger("payload.train")
STARTED_FROM = "started_from.json"  # in the stage's directory: the adapter it started from and its sha256


def main(cfg, setup_fn=None, at_stop=None) -> dict:
    """Train (or resume) the run described by `cfg`; returns the training summary. Every end is
    recorded in status.json (state, exit_code, reason) before this returns or raises. `setup_fn`
    builds the data, model and trainer instead of SFT's (payload/train/preference.py's for a DPO or GRPO
    stage); a run with `stages:` trains through payload/train/stages.py, which calls this once per stage,
    with `at_stop` writing the run's outputs at a stop (default: this run's MANIFEST, manifest.at_end)."""
    observe.setup_logging()
    if getattr(cfg, "stages", None):
        raise ValueError("a config with `stages:` trains through payload.train.stages.main (python -m payload train)")
    run = Run(cfg=cfg, run_dir=cfg.run_dir, at_stop=at_stop or (lambda state: _manifest_at_stop(cfg, state)))
    if run.main:  # before anything is written: a live trainer elsewhere means exit 4, nothing touched
        run.lease = lease.acquire(run.run_dir, cfg.runtime.run_id)
    try:
        done = already_trained(run)
        if done is not None:
            return done
        setup(run, setup_fn)
        load_checkpoint(run)
        train(run)
        summary = save(run)
    except BaseException as e:
        record_failure(run, e)
        raise
    finally:
        cleanup(run)
    if run.state == "budget_exhausted":
        raise BudgetExhausted(end_line(run))
    if run.state == "stopped":
        stop = stop_request.StopRequested if stop_request.honoured(run.control) else TrainingInterrupted
        raise stop(end_line(run))
    return summary


def end_line(run: Run) -> str:
    """A stop's reason and the checkpoint a resume starts from: the payload's last line in the log."""
    last = ck.latest_complete(ck.checkpoints_dir(run.run_dir))
    return f"{run.reason}; resumes from {last}" if last is not None else run.reason


def start_from_adapter(cfg, model):
    """(PeftModel with the previous stage's adapter, trainable; None): nothing new is initialised."""
    from peft import PeftModel

    path = cfg.init_adapter
    if not (path / "adapter_config.json").is_file():
        raise PayloadError(f"stage {cfg.stage.label}: the previous stage's adapter is missing ({path}); "
                           "rerun the run to train that stage again")
    log.info("stage %s starts from %s", cfg.stage.label, path)
    if observe.rank() == 0:  # what this stage started from, checkable against the previous stage's adapter
        from payload.volume.checksums import sha256_file
        from payload.volume.observe import atomic_write_json

        weights = path / "adapter_model.safetensors"
        atomic_write_json(cfg.run_dir / STARTED_FROM, {"adapter": str(path), "sha256": sha256_file(weights)
                                                       if weights.is_file() else None})
    return PeftModel.from_pretrained(model, str(path), is_trainable=True), None


def record_failure(run: Run, exc: BaseException) -> None:
    """status.json says how the run failed (not when the lease was another trainer's: its run)."""
    if isinstance(exc, lease.LeaseHeld):
        return
    code = exit_code_for(exc)
    if not isinstance(exc, (PayloadError, KeyboardInterrupt)):
        observe.write_traceback(run.run_dir)
    step = run.trainer.state.global_step if run.trainer is not None else None
    observe.write_end(run.run_dir, code, one_line(exc), step=step)
    if code == EXIT_CRASH:
        log.error("crashed at step %s: %s", step, one_line(exc))


# -------------------------------------------------------------------------------------------- setup


def already_trained(run: Run) -> Optional[dict]:
    """A finished run with the same config hash is not trained again (a restarted job moves on)."""
    path = run.run_dir / layout.SUMMARY
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if summary.get("state") in ("completed", "stopped_early") and \
            summary.get("config_hash") == run.cfg.config_hash() and (run.run_dir / layout.ADAPTER_DIR).is_dir():
        log.info("training already finished (%s); nothing to do", path)
        return summary
    return None


def setup(run: Run, build=None) -> None:
    """Directories, signals, cost, data, tokenizer, model and the trainer (`build(run)` makes the last
    four for a DPO or GRPO stage)."""
    cfg, rd = run.cfg, run.run_dir
    set_env(cfg)
    observe.quiet_libraries()
    if run.main:
        stop_request.clear(cfg)
        manifest.forget(stop_request.top_run_dir(cfg))  # this session trains: an earlier end is over
        (rd / layout.LOGS_DIR).mkdir(parents=True, exist_ok=True)
        runconfig.write_resolved(rd, dump_run_config(cfg))  # on a resume: refuses a change of the math
    observe.write_status(rd, state="loading", step=0, max_steps=cfg.train.max_steps, exit_code=None, reason=None,
                         ended_at=None)
    run.stop.install()
    run.tracker = CostTracker(rd, cfg.runtime.price_per_hour, cfg.runtime.budget_usd, write=run.main,
                              warn_fraction=cfg.runtime.budget_warn_fraction)
    sharding.check_deepspeed_available(cfg)
    if cfg.train.method == "qlora":
        modeling.quantization_config(cfg.train.quantization)  # fail fast, before any download
    if build is not None:
        return build(run)
    dtype = modeling.resolve_dtype(cfg.model)
    # The TrainingArguments set up the process group (torchrun), so they come first; without
    # validation data they are rebuilt with evaluation off (dataclasses.replace re-validates).
    args = sft_config(cfg, has_eval=True, dtype=dtype)
    with args.main_process_first(local=False, desc="base model and data"):
        path = modeling.base_model_path(cfg)
        processing = modeling.load_processing_class(path, cfg.model.kind, cfg.model.trust_remote_code,
                                                    cfg.model.revision)
        train_records, run.val_records = trainset.ensure_data(cfg, tokenizer_of(processing))
    images = cfg.model.kind == "image_text_to_text" and trainset.has_images(train_records + run.val_records)
    run.padding_free, why_batch = trainset.padding_free(cfg, images)
    batch = attention.batch_kind(cfg.train.packing, run.padding_free)
    model, run.attn, run.attn_reason = modeling.load_model_for(cfg, path, dtype, batch)
    log.info("batches: %s (%s)", attention.BATCH_LABEL[batch], why_batch)
    if run.main:
        observe.write_status(rd, attention=f"{run.attn}: {run.attn_reason}")
    model, peft_config = adapters.prepare_for_method(cfg, model)
    if args.use_liger_kernel != modeling.use_liger(cfg, model):  # `auto`: off where its patch fails
        args = dataclasses.replace(args, use_liger_kernel=False)
    if getattr(cfg, "init_adapter", None) is not None:  # a later stage: train on from the previous adapter
        model, peft_config = start_from_adapter(cfg, model)
    # Records without images take TRL's text path (a processor tokenizes them as the VL collator
    # would), where padding-free batches are allowed; records with images take the VL collator.
    train_ds = trainset.build_dataset(train_records, images, "train.jsonl")
    eval_ds = trainset.build_dataset(run.val_records, images, "val.jsonl") if run.val_records else None
    if eval_ds is None:
        args = dataclasses.replace(args, eval_strategy="no", metric_for_best_model=None, greater_is_better=None)
    if run.main:
        tracking.start(cfg)  # before the Trainer: its WandbCallback reuses this run
    run.control = RunControl(cfg.train.checkpoints, run.stop, run.tracker, cfg.train.logging_steps,
                             has_eval=eval_ds is not None, lease=run.lease)
    run.trainer = trainer_class()(
        model=model, args=args, train_dataset=train_ds, eval_dataset=eval_ds, processing_class=processing,
        peft_config=peft_config, callbacks=trainer_callbacks(run, eval_ds is not None),
    )
    run.trainer.launch_run = run
    if run.padding_free and not cfg.train.packing:
        trainset.use_padding_free_collator(run.trainer)
    observe.quiet_trainer(run.trainer)
    adapters.cast_adapters(cfg, run.trainer.model)  # QLoRA adapters per adapters.dtype_plan
    run.counts = adapters.check_vision_frozen(cfg, run.trainer.model)
    lost = trainset.check_trained_tokens(run.trainer, cfg, train_records, run.val_records)  # exit 2: none left
    run.counts.update(lost)
    if lost:
        observe.write_status(rd, **lost)


# ------------------------------------------------------------------------------------ resume / train


def load_checkpoint(run: Run) -> None:
    """Pick the newest complete checkpoint that verifies (half-written ones are removed first,
    damaged ones are quarantined on the way)."""
    root = ck.checkpoints_dir(run.run_dir)
    args = run.trainer.args
    with args.main_process_first(local=False, desc="checkpoint cleanup"):
        if run.main:
            ck.clean_incomplete(root)
    run.resume = verify.pick_resume(root, args.process_index, args.world_size)
    step = ck.step_of(run.resume) if run.resume else 0
    dropped = observe.truncate_metrics(run.run_dir / layout.METRICS, step)
    if run.resume:
        marker = ck.read_marker(run.resume)
        # the keys that change the math (a checkpoint saved before math_hash existed: the whole config)
        key, now = (("math_hash", runconfig.math_hash(run.cfg)) if "math_hash" in marker
                    else ("config_hash", run.cfg.config_hash()))
        if marker.get(key) not in (None, now):
            log.warning("resuming %s, saved with a different config (%s %s, now %s)",
                        run.resume.name, key, marker.get(key), now)
        log.info("resuming from %s (dropped %d metric lines logged after it)", run.resume.name, dropped)


def train(run: Run) -> None:
    observe.write_status(run.run_dir, state="training", resumed_from=run.resume.name if run.resume else None)
    try:
        result = run.trainer.train(resume_from_checkpoint=str(run.resume) if run.resume else None)
        run.counts["train_runtime_s"] = round(result.metrics.get("train_runtime", 0.0), 3)
    except TrainingFinished as e:
        log.info("nothing left to train: %s", e)
        run.counts["train_runtime_s"] = 0.0
    run.state, run.reason = end_of_training(run)


def end_of_training(run: Run) -> tuple[str, Optional[str]]:
    """(state, reason) once the training loop returned; a lost lease raises (nothing more is written)."""
    st, c, cfg = run.trainer.state, run.control, run.cfg
    step, total = st.global_step, st.max_steps
    if c.reason == "lease_lost":
        raise lease.LeaseHeld(f"another trainer took over this run's lease at step {step}; this one stopped "
                              "without saving")
    if c.reason == stop_request.REASON:
        return "stopped", stop_request.end_reason(step, total, c.stop_by)
    if c.reason == "stopped":
        import signal

        sig = signal.Signals(run.stop.signum).name if run.stop.signum else "a signal"
        if c.stop_saved:
            kept = f"checkpoint-{step} saved"
        else:
            last = ck.latest_complete(ck.checkpoints_dir(run.run_dir))
            kept = (f"no checkpoint saved (a save takes ~{c.stop_save_s:.1f} s, more than the "
                    f"{SIGTERM_SAVE_BUDGET_S} s allowed); resumes from {last.name if last else 'step 0'}")
        return "stopped", f"stopped by {sig} at step {step} of {total}; {kept}"
    if c.reason == "budget_exhausted":
        return "budget_exhausted", (
            f"budget of {usd(cfg.runtime.budget_usd)} reached at step {step} of {total} (spent "
            f"{usd(run.tracker.usd())}); checkpoint-{step} saved: continue with {resume_hint(cfg.runtime.profile)}")
    if total and step < total:
        metric = best_metric(cfg)[0].removeprefix("eval_").replace("loss", "eval loss")
        return "completed", f"stopped early at step {step} of {total} (early stopping: {metric} stopped improving)"
    return "completed", None


# ------------------------------------------------------------------------------------- save/cleanup

_EXIT = {"completed": EXIT_OK, "budget_exhausted": EXIT_BUDGET, "stopped": EXIT_INTERRUPTED}


def save(run: Run) -> dict:
    """Best adapter (or final full weights) from a checkpoint that verifies, high-loss samples,
    plot, summary, final status."""
    cfg, rd, trainer = run.cfg, run.run_dir, run.trainer
    finished = run.state == "completed"
    root = ck.checkpoints_dir(rd)
    prefer, key, greater = export_choice(cfg)
    best = (ck.latest_complete(root) if prefer == "latest" else ck.best_checkpoint(root, key, greater)) \
        if run.main else None
    if run.main:
        if finished:
            best = verify.export_verified(root, rd / layout.ADAPTER_DIR, prefer, key, greater)
            if best is None:
                raise PayloadError(f"training finished but no checkpoint in {root} verifies to export "
                                   f"the {'weights' if prefer == 'latest' else 'adapter'}: see the lines above")
        if finished and trainer.eval_dataset is not None and not zero3(cfg):
            observe.write_high_loss(trainer, trainer.eval_dataset, run.val_records, cfg.train.high_loss_samples,
                                    rd / layout.HIGH_LOSS)
            tracking.log_high_loss(cfg, rd / layout.HIGH_LOSS)
        observe.plot_losses(rd / layout.METRICS, rd / layout.LOSS_PLOT, title=f"{cfg.name} ({cfg.runtime.run_id})")
    summary = _summary(run, best)
    if run.main:
        observe.write_summary(rd, summary)
    # No `post` follows a stop (`launch down`'s request, the budget, a signal): the MANIFEST of what
    # the run has, so a fetch after it verifies sha256. Before status.json says the run ended (`launch
    # down` fetches once it does), except under a signal's deadline (SIGKILL follows SIGTERM within
    # seconds): there the end is recorded first, the MANIFEST is written after it if time allows.
    stopped = run.main and not finished
    signalled = stopped and not stop_request.honoured(run.control) and run.state == "stopped"
    if stopped and not signalled:
        run.at_stop(run.state)
    observe.write_end(rd, stop_request.exit_code(run.control, _EXIT[run.state]), run.reason, step=summary["steps"],
                      cost_usd=summary["cost_usd"], **stop_request.final_fields(cfg, run.control, summary["steps"]),
                      eta_s=0 if finished else None, loss=summary["final_loss"],
                      eval_loss=summary["final_eval_loss"])
    if signalled:
        run.at_stop(run.state)
    log.info("training %s at step %d: best %s, cost $%.4f%s", run.state, summary["steps"],
             summary["best_checkpoint"], summary["cost_usd"], f" ({run.reason})" if run.reason else "")
    return summary


def _manifest_at_stop(cfg, state: str) -> None:
    """A run's MANIFEST at a stop (a stage's end is not its run's: train/stages.py writes that one)."""
    if cfg.run_dir == stop_request.top_run_dir(cfg):
        manifest.at_end(cfg, state)


def _summary(run: Run, best: Optional[Path]) -> dict:
    records = observe.read_metrics(run.run_dir / layout.METRICS)
    losses = [r["loss"] for r in records if r.get("loss") is not None]
    evals = [r["eval_loss"] for r in records if r.get("eval_loss") is not None]
    real = [r["real_token_fraction"] for r in records if r.get("real_token_fraction") is not None]
    st, cfg = run.trainer.state, run.cfg
    return {
        "state": run.state, "exit_code": stop_request.exit_code(run.control, _EXIT[run.state]), "reason": run.reason,
        "run_id": cfg.runtime.run_id, "config_hash": cfg.config_hash(),
        "model": cfg.model.name_or_path, "kind": cfg.model.kind, "method": cfg.train.method,
        "attn_implementation": run.attn, "attn_reason": run.attn_reason,
        "padding_free": run.padding_free, "steps": st.global_step, "max_steps": st.max_steps,
        "epoch": st.epoch, "best_checkpoint": best.name if best else None,
        "best_eval_loss": ck.read_marker(best).get("eval_loss") if best else None,
        "best_metric": {"key": best_metric(cfg)[0], "value": ck.read_marker(best).get(best_metric(cfg)[0])}
        if best else None,
        "final_loss": losses[-1] if losses else None, "final_eval_loss": evals[-1] if evals else None,
        "first_loss": losses[0] if losses else None, "resumed_from": run.resume.name if run.resume else None,
        "duration_s": round(time.monotonic() - run.t0, 3), "total_seconds": round(run.tracker.seconds(), 3),
        "cost_usd": round(run.tracker.usd(), 6), "sessions": run.tracker.sessions,
        **timings.rates(records),
        "real_token_fraction": round(sum(real) / len(real), 4) if real else None,
        "adapter_dir": layout.ADAPTER_DIR if run.state == "completed" else None,
        **run.counts, **tracking.links(cfg), "finished_at": observe.now_iso(),
    }


def cleanup(run: Run) -> None:
    run.stop.restore()
    tracking.finish()
    if run.lease is not None:
        run.lease.release()
    if run.tracker is not None:
        run.tracker.save()
    run.trainer = None
    import gc

    gc.collect()
