"""The plain transformers `Trainer` baseline of a GPU-check mode: the recipe most fine-tuning
scripts use. Same base model (dtype, attention, 4-bit for qlora), the same LoRA config (peft), the
same DeepSpeed config for full, the same records, chat template, assistant-only labels, batch,
sequence length, optimizer, learning rate and steps; batches padded to their longest record, no
packing, the loss on full logits, gradient checkpointing on, no Liger."""

from __future__ import annotations

import time
from pathlib import Path

import gpu_measure


class PadCollator:
    """Pad to the longest record of the batch; counts real vs computed tokens."""

    def __init__(self, pad_id: int, vl: bool):
        self.pad_id, self.vl, self.real, self.slots = pad_id, vl, 0, 0

    def __call__(self, rows: list[dict]) -> dict:
        import torch

        n = max(len(r["input_ids"]) for r in rows)
        ids = torch.full((len(rows), n), self.pad_id, dtype=torch.long)
        labels = torch.full((len(rows), n), -100, dtype=torch.long)
        att = torch.zeros((len(rows), n), dtype=torch.long)
        for i, r in enumerate(rows):
            k = len(r["input_ids"])
            ids[i, :k], labels[i, :k], att[i, :k] = torch.tensor(r["input_ids"]), torch.tensor(r["labels"]), 1
        self.real, self.slots = self.real + int(att.sum()), self.slots + ids.numel()
        batch = {"input_ids": ids, "labels": labels, "attention_mask": att}
        if self.vl:
            batch["mm_token_type_ids"] = torch.zeros_like(ids)  # text only
        return batch


def load_model(cfg, spec: dict):
    from payload.model import adapters, attention, modeling

    dtype = modeling.resolve_dtype(cfg.model)
    # the first kernel a mode lists; the runbooks' recipe is sdpa, so a mode that leaves the kernel to the
    # payload (`auto`: nothing listed, payload.model.attention.listed) is held to that
    kw = {"dtype": dtype, "attn_implementation": (attention.listed(cfg) or ["sdpa"])[0]}
    if cfg.train.method == "qlora":
        kw["quantization_config"] = modeling.quantization_config(cfg.train.quantization)
    model = modeling.auto_class(cfg.model.kind).from_pretrained(cfg.model.name_or_path, **kw)
    if cfg.train.method == "full":
        if cfg.model.kind == "image_text_to_text":
            adapters.freeze_vision(model)
        return model, dtype
    from peft import get_peft_model, prepare_model_for_kbit_training

    if cfg.train.method == "qlora":
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=True,
                                                gradient_checkpointing_kwargs={"use_reentrant": False})
    return get_peft_model(model, adapters.lora_config(cfg, model)), dtype


def training_args(cfg, spec: dict, dtype):
    import dataclasses

    import torch
    from transformers import TrainingArguments

    from payload.model import modeling, sharding

    t, gpu = cfg.train, modeling.on_gpu()
    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    ckpt = "activation_checkpointing" if "activation_checkpointing" in names else "gradient_checkpointing"
    return TrainingArguments(
        output_dir=str(Path(spec["volume"]) / "baseline-out" / spec.get("run_id", "run")), per_device_train_batch_size=t.per_device_batch_size,
        gradient_accumulation_steps=1, max_steps=t.max_steps, learning_rate=t.learning_rate,
        lr_scheduler_type=t.lr_scheduler, warmup_steps=0, optim=t.optimizer, max_grad_norm=t.max_grad_norm,
        bf16=dtype == torch.bfloat16 and gpu, fp16=dtype == torch.float16 and gpu, use_cpu=not gpu,
        **{ckpt: True, f"{ckpt}_kwargs": {"use_reentrant": False}},
        logging_steps=t.logging_steps, save_strategy="no", report_to="none", disable_tqdm=True, seed=t.seed,
        dataloader_num_workers=0, remove_unused_columns=False, include_num_input_tokens_seen="non_padding",
        deepspeed=sharding.deepspeed_config(t.deepspeed) if t.deepspeed else None,
    )


def run_baseline(spec: dict, result: dict) -> None:
    from datasets import Dataset
    from transformers import AutoTokenizer, Trainer

    offload = gpu_measure.full_offload(spec)
    cfg = gpu_measure.load_cfg(spec, offload=offload)
    cfg = cfg.model_copy(update={"train": cfg.train.model_copy(update={"packing": False, "gradient_checkpointing": True})})
    result.update(gpu_measure.estimate(cfg, fused_lm_head=False))
    result.update({"offload_optimizer": offload, "liger": False, "padding_free": False})
    tok = AutoTokenizer.from_pretrained(cfg.model.name_or_path)
    rows = gpu_measure.tokenize(tok, spec["data_path"], cfg.train.max_seq_length)
    from payload.model import modeling

    args = training_args(cfg, spec, modeling.resolve_dtype(cfg.model))  # before the model: ZeRO-3 init
    model, _dtype = load_model(cfg, spec)
    collate = PadCollator(tok.pad_token_id, cfg.model.kind == "image_text_to_text")
    meter = gpu_measure.step_meter(spec["warmup"])
    trainer = Trainer(model=model, args=args, train_dataset=Dataset.from_list(rows), data_collator=collate,
                      callbacks=[meter])
    gpu_measure.track_longest(trainer, result)
    t = time.perf_counter()
    trainer.train()
    result["train_s"] = round(time.perf_counter() - t, 1)
    losses = [[h.get("step"), h["loss"]] for h in trainer.state.log_history if "loss" in h]
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    result.update(meter.figures())
    result.update({"attn_used": model.config._attn_implementation, "gradient_checkpointing": True,
                   "real_token_fraction": round(collate.real / collate.slots, 4) if collate.slots else None,
                   "trainable_params": trainable, "losses": losses,
                   **({"kbit_preparation": "fp32-upcast"} if cfg.train.method == "qlora" else {}),  # peft's
                   "first_loss": losses[0][1] if losses else None, "last_loss": losses[-1][1] if losses else None})
    gpu_measure.flops(result, cfg, [len(r["input_ids"]) for r in rows], trainable, result.get("device"))
