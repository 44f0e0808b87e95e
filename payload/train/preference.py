"""DPO and GRPO stages: TRL's `DPOTrainer` / `GRPOTrainer` with the SFT stage's machinery.

`payload.train.recipe.setup` hands a DPO or GRPO stage here; everything else (checkpoint markers, verified
resume, lease, budget/SIGTERM stops, status, cost, the exported adapter) is payload/train/recipe.py's,
through the same `LaunchTrainerMixin` on TRL's other trainers.

The policy starts from the previous stage's adapter, loaded trainable (`PeftModel.from_pretrained(...,
is_trainable=True)`). The reference is that same adapter, frozen: TRL copies the loaded "default"
adapter into a "ref" adapter on the same base (a few MB), so no second model is held in memory.

Records (`{run_dir}/data/train.jsonl`, written by the data stage): DPO `{"messages": [..., user,
assistant(chosen)], "rejected": str}` (format `preference`); GRPO `{"messages": [..., user,
assistant(answer)]}` (format `prompt_answer`), the answer passed to the rewards as `answer`.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from payload.volume.control import RunControl
from payload.model import modeling
from payload.model import adapters
from payload.volume import observe
from payload.data import trainset
from payload.errors import PayloadError

log = logging.getLogger("payload.train")


def training_kwargs(cfg, dtype, has_eval: bool) -> dict:
    """The TrainingArguments the SFT stage would use (output dir, precision, checkpointing, ...)."""
    from transformers import TrainingArguments

    from payload.train.arguments import sft_config

    args = sft_config(cfg, has_eval=has_eval, dtype=dtype)
    keep = {f.name for f in dataclasses.fields(TrainingArguments) if f.init} - {"remove_unused_columns"}
    return {name: getattr(args, name) for name in keep}  # TRL's default keeps `answer` for the rewards


def dpo_config(cfg, dtype):
    from trl import DPOConfig

    d = cfg.stage.dpo
    kw = training_kwargs(cfg, dtype, has_eval=False)
    return DPOConfig(**kw, beta=d.beta, loss_type=[d.loss_type], max_length=cfg.train.max_seq_length,
                     precompute_ref_log_probs=False)


def grpo_config(cfg, dtype):
    from trl import GRPOConfig

    g = cfg.stage.grpo
    kw = training_kwargs(cfg, dtype, has_eval=False)
    return GRPOConfig(**kw, num_generations=g.num_generations, max_completion_length=g.max_completion_length,
                      beta=g.beta, temperature=g.temperature, use_vllm=g.use_vllm,
                      reward_weights=g.reward_weights, log_completions=False)


def _split(rec: dict, where: str) -> tuple[list, str]:
    msgs = rec["messages"]
    if not msgs or msgs[-1].get("role") != "assistant":
        raise PayloadError(f"{where}: the record does not end with an assistant turn; rerun the data stage")
    from payload.outputs.infer import text_of

    return msgs[:-1], text_of(msgs[-1]["content"])


def _prompt_row(prompt: list, vl: bool, where: str) -> dict:
    rec = {"messages": prompt}
    return trainset.vl_row(rec, where, Path(".")) if vl else trainset.text_row(rec, where)


def _reply(text: str, vl: bool) -> list:
    return [{"role": "assistant", "content": [{"type": "text", "text": text}] if vl else text}]


def dpo_dataset(records: list[dict], vl: bool):
    """prompt (chat turns), chosen, rejected (assistant turns), images for VL."""
    from datasets import Dataset, Image, List

    rows = []
    for i, rec in enumerate(records):
        where = f"train.jsonl record {i + 1}"
        if not isinstance(rec.get("rejected"), str):
            raise PayloadError(f"{where}: no `rejected` reply: a DPO stage needs `format: preference` data")
        prompt, chosen = _split(rec, where)
        row = _prompt_row(prompt, vl, where)
        rows.append({"prompt": row["messages"], "chosen": _reply(chosen, vl), "rejected": _reply(rec["rejected"], vl),
                     **({"images": row["images"]} if vl else {})})
    ds = Dataset.from_list(rows)
    return ds.cast_column("images", List(Image())) if vl else ds


def grpo_dataset(records: list[dict], vl: bool):
    """prompt (chat turns), answer (for the rewards), images for VL."""
    from datasets import Dataset, Image, List

    rows = []
    for i, rec in enumerate(records):
        where = f"train.jsonl record {i + 1}"
        prompt, answer = _split(rec, where)
        row = _prompt_row(prompt, vl, where)
        rows.append({"prompt": row["messages"], "answer": answer, **({"images": row["images"]} if vl else {})})
    ds = Dataset.from_list(rows)
    return ds.cast_column("images", List(Image())) if vl else ds


_CLASSES: dict = {}


def trainer_class(kind: str):
    """LaunchDPOTrainer / LaunchGRPOTrainer: payload.train.recipe's mixin on TRL's trainer."""
    if kind not in _CLASSES:
        import trl

        from payload.train.trainer import LaunchTrainerMixin

        base = trl.DPOTrainer if kind == "dpo" else trl.GRPOTrainer
        _CLASSES[kind] = type(f"Launch{base.__name__}", (LaunchTrainerMixin, base), {})
    return _CLASSES[kind]


def setup(run) -> None:
    """train.setup for a DPO or GRPO stage: data, model from the previous adapter, the trainer."""
    from payload.train import rewards
    from payload.train.arguments import tokenizer_of, trainer_callbacks
    from payload.train.recipe import start_from_adapter

    cfg = run.cfg
    kind, vl = cfg.stage.kind, cfg.model.kind == "image_text_to_text"
    if cfg.init_adapter is None:
        raise PayloadError(f"stage {cfg.stage.label} ({kind}) needs an adapter to start from: put an sft stage "
                           "before it in `stages:`")
    dtype = modeling.resolve_dtype(cfg.model)
    args = dpo_config(cfg, dtype) if kind == "dpo" else grpo_config(cfg, dtype)
    with args.main_process_first(local=False, desc="base model and data"):
        path = modeling.base_model_path(cfg)
        processing = modeling.load_processing_class(path, cfg.model.kind, cfg.model.trust_remote_code,
                                                    cfg.model.revision)
        train_records, _val = trainset.ensure_data(cfg, tokenizer_of(processing))
    model, run.attn = modeling.load_model(cfg, path, dtype)
    model, _ = adapters.prepare_for_method(cfg, model)
    model, _ = start_from_adapter(cfg, model)
    run.val_records = []  # DPO/GRPO stages are judged by their rewards/margins in metrics.jsonl
    run.control = RunControl(cfg.train.checkpoints, run.stop, run.tracker, cfg.train.logging_steps,
                             has_eval=False, lease=run.lease)
    common = dict(model=model, args=args, processing_class=processing, callbacks=trainer_callbacks(run, False))
    if kind == "dpo":
        run.trainer = trainer_class("dpo")(train_dataset=dpo_dataset(train_records, vl), **common)
    else:
        funcs = rewards.reward_functions(cfg.stage.grpo)
        run.trainer = trainer_class("grpo")(reward_funcs=funcs, train_dataset=grpo_dataset(train_records, vl),
                                            **common)
    run.trainer.launch_run = run
    observe.quiet_trainer(run.trainer)
    adapters.cast_adapters(cfg, run.trainer.model)  # QLoRA adapters per adapters.dtype_plan
    run.counts = adapters.check_vision_frozen(cfg, run.trainer.model)
