"""Padding-free batches by default, without changing the math of a step (tiny models on CPU).

A padding-free batch is the padded batch's records flattened into one row, position ids restarting
per record, no attention mask: the loss and every gradient must be those of the padded batch, for a
causal LM and for a vision-language model trained on records without images (which now takes TRL's
text path; the padded reference there is TRL's VL collator, the path it took before).

Run: .venv/bin/python -m pytest -x -q tests/payload/train/test_padding_free.py
"""

from __future__ import annotations

import json

import pytest

from train_fixtures import (
    VL_MODEL, make_config, text_records, train_env, train_in_process, vl_records, write_text_data,
)

from payload.errors import PayloadError

__all__ = ["train_env"]  # the fixture, imported for pytest

AUTO_VL = {k: v for k, v in VL_MODEL.items() if k != "attn_implementation"}  # model.attn_implementation: auto


def _trainer(cfg, records):
    """The SFT trainer the payload builds for `cfg` (LoRA, no dropout), on `records`, not trained."""
    import torch

    from payload.model import adapters, modeling
    from payload.data import trainset
    from payload.train.arguments import sft_config
    from payload.train.trainer import trainer_class

    torch.manual_seed(0)
    path = modeling.base_model_path(cfg)
    processing = modeling.load_processing_class(path, cfg.model.kind)
    model, _ = modeling.load_model(cfg, path, batch="padding_free")
    model, peft_config = adapters.prepare_for_method(cfg, model)
    args = sft_config(cfg, has_eval=False, dtype=torch.float32)
    ds = trainset.build_dataset(records, False, "train.jsonl")
    trainer = trainer_class()(model=model, args=args, train_dataset=ds, processing_class=processing,
                              peft_config=peft_config)
    for name, p in trainer.model.named_parameters():  # B starts at zero: give every LoRA weight a gradient
        if "lora_B" in name:
            p.data.normal_(std=0.05)
    return trainer


def _loss_and_grads(trainer, batch):
    trainer.model.zero_grad(set_to_none=True)
    loss = trainer.compute_loss(trainer.model, dict(batch))
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    assert grads and all(g is not None and g.abs().sum() > 0 for g in grads.values())
    return loss.detach(), grads


def _records(n: int) -> list[dict]:
    """Text records of clearly different lengths (a padded batch of them has padding)."""
    recs = text_records(n, 7)
    for i, r in enumerate(recs):
        r["messages"][-1]["content"] = " ".join(["The answer is here."] * (1 + 5 * i))
    return recs


@pytest.mark.parametrize("model", [None, AUTO_VL], ids=["causal", "vl-text"])
def test_padding_free_batch_has_the_padded_batch_loss_and_gradients(train_env, model):
    import torch
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling, DataCollatorForVisionLanguageModeling

    from payload.data import trainset

    cfg = make_config(train_env, "eq", model=model, train={"lora": {"dropout": 0.0}, "max_seq_length": 96})
    records = _records(4)
    trainer = _trainer(cfg, records)
    rows = [trainer.train_dataset[i] for i in range(len(records))]
    assert max(len(r["input_ids"]) for r in rows) == 96 > min(len(r["input_ids"]) for r in rows)  # truncated
    pad = trainer._tokenizer.pad_token_id
    if model is None:
        padded = DataCollatorForLanguageModeling(pad_token_id=pad)(rows)
    else:  # the VL collator on the same records, as TRL trained them before (a dataset with `images`)
        vl_rows = list(trainset.build_dataset(records, True, "train.jsonl"))
        padded = DataCollatorForVisionLanguageModeling(
            trainer.processing_class, max_length=96, assistant_only_loss=True, chat_template=trainer.chat_template,
        )(vl_rows)
    free = DataCollatorForLanguageModeling(pad_token_id=pad, padding_free=True)(rows)
    assert "attention_mask" not in free and free["input_ids"].shape[0] == 1
    assert (padded["attention_mask"] == 0).any()  # there was padding to remove
    assert free["input_ids"].shape[1] == int(padded["attention_mask"].sum())
    torch.testing.assert_close(free["input_ids"][0], padded["input_ids"][padded["attention_mask"].bool()])

    loss_padded, grads_padded = _loss_and_grads(trainer, padded)
    loss_free, grads_free = _loss_and_grads(trainer, free)
    torch.testing.assert_close(loss_free, loss_padded, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grads_free, grads_padded, rtol=1e-4, atol=1e-6)


def test_a_run_trains_padding_free_by_default_and_says_how(train_env):
    """A vision-language model on records without images (sonia's shape) trains padding-free by
    default through the payload's own setup; the summary and status.json say which attention ran
    and why, and the eval/high-loss samples go through the same collator."""
    cfg = make_config(train_env, "vltext", model=AUTO_VL, train={"max_steps": 2, "logging_steps": 1})
    write_text_data(cfg.run_dir, n_train=6, n_val=2)
    summary = train_in_process(cfg)
    assert summary["state"] == "completed" and summary["padding_free"] is True
    assert summary["attn_implementation"] == "sdpa"
    assert summary["attn_reason"] == "padding-free batch, no CUDA GPU: sdpa attends through a block-diagonal mask"
    assert summary["real_token_fraction"] == 1.0
    status = json.loads((cfg.run_dir / "status.json").read_text())
    assert status["attention"] == f"sdpa: {summary['attn_reason']}"
    assert (cfg.run_dir / "outputs" / "high_loss_samples.jsonl").read_text().count("\n") == 2


def test_padding_free_decision(tmp_path):
    from payload.data import trainset

    cfg = make_config(tmp_path, "d", model=AUTO_VL)
    images = vl_records(tmp_path / "img", 4, 1)
    assert trainset.has_images(images) and not trainset.has_images(text_records(3, 1))
    assert trainset.padding_free(cfg, False) == (
        True, "train.padding_free: auto, records without images take the text path")
    assert trainset.padding_free(cfg, True) == (False, "the records carry images: TRL pads vision-language batches")
    cfg.train.padding_free = True
    with pytest.raises(PayloadError, match="records carry images.*set train.padding_free: auto"):
        trainset.padding_free(cfg, True)
    cfg.train.padding_free = False
    assert trainset.padding_free(cfg, False) == (False, "train.padding_free: false")
    cfg.train.packing = True
    assert trainset.padding_free(cfg, False)[0] is True


def test_padding_free_and_attention_are_not_math_keys():
    from payload.config import resume as runconfig

    assert not runconfig.changes_math("train.padding_free")
    assert not runconfig.changes_math("model.attn_implementation")
    assert runconfig.changes_math("train.packing") and runconfig.changes_math("model.name_or_path")


def test_plan_says_what_packing_would_save():
    from launcher.plan.estimate import DataEstimate
    from launcher.plan.cost import packing_note, padding_share
    from launcher.profiles.profile import load_profile

    assert padding_share([10, 30], 2, 42) == pytest.approx(1 / 3) and padding_share([7] * 6, 3, 1) == 0.0
    demo = load_profile("local-demo")

    def with_train(**kw):
        return demo.model_copy(update={"train": demo.train.model_copy(update={"per_device_batch_size": 2, **kw})})

    data = DataEstimate(2, 20.0, "counted", lengths=[10, 30])
    padded = packing_note(with_train(padding_free=False), data, train_hours=3.0, price=2.0)
    assert padded.startswith("off: padded batches of 2 are ~33% padding; train.packing: true would save ~1.0 h, "
                             "~$2.00") and "train.padding_free: auto the same time with the same math" in padded
    free = packing_note(with_train(), data, train_hours=3.0, price=2.0)
    assert free.startswith("off: padding-free batches, so the ~33% padding of padded batches of 2 costs nothing")
    assert free.endswith("per-step overhead only, ~0 h of compute")
    assert packing_note(with_train(packing=True), data, 3.0, 2.0) is None
    assert "needs the records' lengths" in packing_note(with_train(), DataEstimate(2, 20.0, "estimate"), 3.0, 2.0)


def test_launch_plan_has_the_packing_line(tmp_path):
    from walk import launch

    r = launch(tmp_path, "plan", "local-demo")
    assert r.returncode == 0, r.stdout + r.stderr
    out = " ".join(r.stdout.split())
    assert "Packing off: padding-free batches, so the ~" in out and "~0 h of compute" in out
