"""What a run config becomes for transformers and TRL: the environment they read at import
(`set_env`, before the first import of either), TRL's SFTConfig with the speed choices, the trainer's
callbacks in the order they must run, and the dataloader workers of vision-language batches.
recipe.setup and preference.py's setups build their trainers from these."""

from __future__ import annotations

import os
from pathlib import Path

from payload import layout
from payload.model import modeling
from payload.model import sharding
from payload.volume import checkpoints as ck
from payload.volume import observe
from payload.volume import stop_request
from payload.outputs import tracking
from payload.train.run import Run
from payload.train.trainer import ResumeLossState
from payload.config.evaluation import best_metric
from payload.errors import PayloadError
from payload.volume.money import CostCallback


def set_env(cfg) -> None:
    os.environ.setdefault("HF_HOME", cfg.runtime.hf_home or str(Path(cfg.runtime.volume) / ".hf"))
    os.environ.setdefault("TENSORBOARD_LOGGING_DIR", str(cfg.run_dir / layout.LOGS_DIR / "tensorboard"))
    os.environ.setdefault("WANDB_PROJECT", "launch")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    for name in cfg.train.report_to:
        pkg = "tensorboard" if name == "tensorboard" else "wandb"
        import importlib.util

        if importlib.util.find_spec(pkg) is None:
            raise PayloadError(f"train.report_to lists `{name}` but the {pkg} package is not installed")


def tokenizer_of(processing):
    return getattr(processing, "tokenizer", processing)


def trainer_callbacks(run: Run, has_eval: bool) -> list:
    cbs = [run.control, stop_request.SaveAndExit(run.cfg, run.control), ResumeLossState(run),
           CostCallback(run.tracker), tracking.GpuWindow(run.run_dir),  # before Observe: it adds to the log line
           observe.ObserveCallback(run.run_dir, run.tracker, run.cfg.train.max_steps or 0)]
    cfg = run.cfg
    cbs.append(tracking.TrackingCallback(run.tracker, gpu=cfg.wandb is None or cfg.wandb.gpu_stats))
    if cfg.evaluation is not None and cfg.evaluation.during_training and has_eval and not zero3(cfg):
        from payload.outputs.evaluate import GenerationEval

        cbs.append(GenerationEval(run, run.val_records))  # before early stopping: it reads these metrics
    patience = run.cfg.train.early_stopping_patience
    if patience:
        if not has_eval:
            raise PayloadError("train.early_stopping_patience needs validation data (a `val` split in data sources)")
        from transformers import EarlyStoppingCallback

        cbs.append(EarlyStoppingCallback(early_stopping_patience=patience))
    return cbs


def sft_config(cfg, has_eval: bool, dtype):
    """TRL SFTConfig (a transformers TrainingArguments) from the run config.

    Speed choices (measured by `make gpu-check`): `packing` makes TRL pack with best-fit decreasing
    and train padding-free (one row, position_ids restart per record; exact with every attention
    implementation in transformers 5, varlen with flash-attention); the loss always goes through
    TRL's fused LM head (no B x S x V logits); gradient checkpointing and Liger per
    `modeling.gradient_checkpointing` / `modeling.use_liger`; fp16 mixed precision on GPUs without bf16.
    """
    import dataclasses as dc

    import torch
    from trl import SFTConfig

    t = cfg.train
    vl = cfg.model.kind == "image_text_to_text"
    gpu = modeling.on_gpu()
    if t.method == "full" and dtype == torch.float16 and not t.deepspeed:
        raise PayloadError("full fine-tuning in float16 needs fp32 master weights: add train.deepspeed, "
                           "or set model.dtype: float32")
    # transformers renamed gradient_checkpointing to activation_checkpointing (the old name warns) and
    # added `every_n_layers` with it; before that, checkpointing is every layer or none
    every, _why = modeling.checkpointing_decision(cfg)
    workers = dataloader_workers(cfg, gpu)
    if t.deepspeed and not gpu:
        sharding.deepspeed_on_cpu()
    names = {f.name for f in dc.fields(SFTConfig)}
    ckpt = "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"
    ckpt_kwargs = {"use_reentrant": False}
    if every > 1 and ckpt == "activation_checkpointing":
        ckpt_kwargs["every_n_layers"] = every
    return SFTConfig(
        **{ckpt: every > 0, f"{ckpt}_kwargs": ckpt_kwargs},
        use_liger_kernel=modeling.use_liger(cfg),
        output_dir=str(ck.checkpoints_dir(cfg.run_dir)),
        run_name=cfg.runtime.run_id,
        per_device_train_batch_size=t.per_device_batch_size,
        per_device_eval_batch_size=t.per_device_eval_batch_size,
        gradient_accumulation_steps=t.gradient_accumulation_steps,
        num_train_epochs=t.epochs,
        max_steps=t.max_steps or -1,
        learning_rate=t.learning_rate,
        lr_scheduler_type=t.lr_scheduler,
        warmup_steps=t.warmup_ratio,  # < 1: a fraction of the total steps
        weight_decay=t.weight_decay,
        optim=t.optimizer,
        max_grad_norm=t.max_grad_norm,
        bf16=dtype == torch.bfloat16 and gpu,
        fp16=dtype == torch.float16 and gpu,
        use_cpu=not gpu and not t.deepspeed,  # DeepSpeed on CPU: its own accelerator (sharding.deepspeed_on_cpu)
        accelerator_config={"use_configured_state": True} if t.deepspeed and not gpu else None,
        seed=t.seed,
        logging_strategy="steps",
        logging_steps=t.logging_steps,
        eval_strategy="steps" if has_eval else "no",
        eval_steps=t.eval_steps,
        save_strategy="steps",
        save_steps=t.checkpoints.save_steps,
        save_total_limit=None,  # retention is ours (best-K + recent-K), see checkpoints.apply_retention
        metric_for_best_model=best_metric(cfg)[0] if has_eval else None,
        greater_is_better=best_metric(cfg)[1] if has_eval else None,
        report_to=tracking.report_to(cfg) or "none",
        disable_tqdm=True,
        dataloader_num_workers=workers,  # not persistent: see dataloader_workers
        max_length=t.max_seq_length,
        packing=t.packing,
        packing_strategy="bfd",
        eval_packing=False,  # per-sample eval losses (high-loss samples) need unpacked rows
        assistant_only_loss=t.assistant_only_loss,
        ddp_find_unused_parameters=None if vl else False,
        deepspeed=sharding.deepspeed_config(t.deepspeed) if t.deepspeed else None,
    )


VL_LOADER_WORKERS = 4  # per rank; bench/bench_vl_step.py measures what the collation costs


def dataloader_workers(cfg, gpu: bool) -> int:
    """Vision-language batches are made on the fly by TRL's collator (images decoded, resized and cut
    into patches, the chat template tokenized): on a GPU that runs in dataloader worker processes,
    beside the step, instead of in the main process between steps. The sampler stays in the main
    process, so the batches are the same; the workers start again each epoch (not persistent) so the
    main process draws from its RNG as without workers, and dropout stays the same. Text batches are
    tokenized beforehand: no workers; none on CPU either (no GPU step to overlap with)."""
    if not gpu or cfg.model.kind != "image_text_to_text":
        return 0
    per_rank = (os.cpu_count() or 1) // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    return max(0, min(VL_LOADER_WORKERS, per_rank - 1))


def zero3(cfg) -> bool:
    return bool(cfg.train.deepspeed and cfg.train.deepspeed.zero_stage == 3)
