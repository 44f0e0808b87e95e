"""Training on CPU with tiny models: tokenizer/model building, labels, methods, outputs.

Run: .venv/bin/python -m pytest -x -q tests/payload/train/test_train.py
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from train_fixtures import (
    VL_MODEL, make_config, metrics, train_env, train_in_process, write_text_data, write_vl_data,
)

from payload import layout
from payload.errors import PayloadError

__all__ = ["train_env"]  # the fixture, imported for pytest


# ------------------------------------------------------------------------------- tiny tokenizer/model


def test_tiny_tokenizer_is_deterministic_and_has_qwen_specials(tmp_path):
    from transformers import AutoTokenizer

    from payload.model.tiny import SPECIAL_TOKENS, build_tiny_tokenizer

    build_tiny_tokenizer(tmp_path / "a")
    build_tiny_tokenizer(tmp_path / "b")
    assert (tmp_path / "a" / "tokenizer.json").read_bytes() == (tmp_path / "b" / "tokenizer.json").read_bytes()
    tok = AutoTokenizer.from_pretrained(tmp_path / "a")
    assert [tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS] == list(range(len(SPECIAL_TOKENS)))
    assert (tok.pad_token, tok.eos_token) == ("<|endoftext|>", "<|im_end|>")
    assert "{% generation %}" in tok.chat_template.replace("{%- generation -%}", "{% generation %}")
    assert len(tok) <= 1024
    ids = tok("<think>hi</think><|image_pad|>")["input_ids"]
    assert ids[0] == 3 and 4 in ids and ids[-1] == 7


def test_tiny_model_same_seed_gives_byte_identical_weights(tmp_path):
    from payload.config import ModelConfig, TinyModel
    from payload.model.tiny import materialize_tiny

    for arch in ("qwen3", "qwen3_vl"):
        mc = ModelConfig(name_or_path="x", kind="causal_lm" if arch == "qwen3" else "image_text_to_text",
                         tiny=TinyModel(arch=arch))
        a = materialize_tiny(mc, tmp_path / arch / "a")
        b = materialize_tiny(mc, tmp_path / arch / "b")
        assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
        assert materialize_tiny(mc, a) == a  # second call: already there, nothing rebuilt
        assert not list((tmp_path / arch).glob(".tmp-*"))


# -------------------------------------------------------------------------------------- labels


def _setup(cfg):
    import payload.train.recipe as train

    run = train.Run(cfg=cfg, run_dir=cfg.run_dir)
    train.setup(run)
    return run


def _write(run_dir: Path, name: str, records: list[dict]) -> None:
    (run_dir / "data").mkdir(parents=True, exist_ok=True)
    (run_dir / "data" / name).write_text("".join(json.dumps(r) + "\n" for r in records))


CONVERSATION = [
    {"role": "system", "content": "You are Demo."},
    {"role": "user", "content": "Hello there!"},
    {"role": "assistant", "content": "Hi, how can I help?"},
    {"role": "user", "content": "What is two plus two?"},
    {"role": "assistant", "content": [{"type": "text", "text": "It is four."}]},
]


def test_loss_only_on_assistant_tokens_text(train_env):
    cfg = make_config(train_env, "labels")
    _write(cfg.run_dir, "train.jsonl", [{"messages": CONVERSATION, "source": "t"}])
    run = _setup(cfg)
    try:
        tok = run.trainer.processing_class
        row = run.trainer.train_dataset[0]
        enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
        end, nl = tok.convert_tokens_to_ids("<|im_end|>"), enc("\n")
        expected_ids, expected_labels = [], []
        for text, trained in [
            ("<|im_start|>system\nYou are Demo.<|im_end|>\n<|im_start|>user\nHello there!<|im_end|>\n"
             "<|im_start|>assistant\n", False),
            ("Hi, how can I help?", True),
            ("<|im_end|>", True),
            ("\n<|im_start|>user\nWhat is two plus two?<|im_end|>\n<|im_start|>assistant\n", False),
            ("It is four.", True),
            ("<|im_end|>", True),
            ("\n", False),
        ]:
            ids = enc(text)
            expected_ids += ids
            expected_labels += ids if trained else [-100] * len(ids)
        assert row["input_ids"] == expected_ids
        assert row["labels"] == expected_labels
        assert expected_ids.count(end) == 5 and nl[0] in expected_ids
    finally:
        run.stop.restore()


def test_loss_only_on_assistant_tokens_vl(train_env):
    import torch

    cfg = make_config(train_env, "labels-vl", model=VL_MODEL)
    write_vl_data(cfg.run_dir, n_train=4, n_val=0)
    (cfg.run_dir / "data" / "val.jsonl").unlink()
    run = _setup(cfg)
    try:
        trainer = run.trainer
        tok = trainer.processing_class.tokenizer
        row = trainer.train_dataset[0]  # an image question about a color
        batch = trainer.data_collator([{"messages": row["messages"], "images": row["images"]}])
        ids, labels = batch["input_ids"][0].tolist(), batch["labels"][0].tolist()
        answer = tok("The image is " + row["messages"][1]["content"][0]["text"].split()[-1],
                     add_special_tokens=False)["input_ids"]
        end = tok.convert_tokens_to_ids("<|im_end|>")
        start = len(ids) - len(answer) - 2  # answer, <|im_end|>, "\n"
        assert ids[start:start + len(answer)] == answer
        assert labels == [-100] * start + answer + [end, -100]
        image_pad = tok.convert_tokens_to_ids("<|image_pad|>")
        assert ids.count(image_pad) == 2  # 48x40 px -> a 2x4 patch grid -> 2 merged tokens
        assert {"pixel_values", "image_grid_thw", "mm_token_type_ids"} <= set(batch)
        assert torch.isfinite(trainer.model(**batch).loss)
        assert run.counts["vision_trainable_params"] == 0 and run.counts["trainable_params"] > 0
    finally:
        run.stop.restore()


def test_vision_tower_freeze_is_asserted(train_env):
    from payload.model import adapters

    cfg = make_config(train_env, "vision", model=VL_MODEL)
    write_vl_data(cfg.run_dir, n_train=4, n_val=0)
    (cfg.run_dir / "data" / "val.jsonl").unlink()
    run = _setup(cfg)
    try:
        model = run.trainer.model
        visual = [p for n, p in model.named_parameters() if adapters.is_vision_param(n)]
        assert visual and not any(p.requires_grad for p in visual)
        visual[0].requires_grad_(True)
        with pytest.raises(RuntimeError, match="vision tower must be frozen"):
            adapters.check_vision_frozen(cfg, model)
    finally:
        run.stop.restore()


# ---------------------------------------------------------------------------------- whole runs


def test_local_demo_trains_tiny_qwen3(train_env):
    cfg = make_config(train_env, "demo", runtime={"price_per_hour": 36.0}, fast=False,
                      train={"max_steps": 30, "checkpoints": {"save_steps": 10}})
    write_text_data(cfg.run_dir)
    summary = train_in_process(cfg)
    rd = cfg.run_dir
    assert summary["state"] == "completed" and summary["steps"] == 30
    train_losses = [r["loss"] for r in metrics(rd) if "loss" in r]
    evals = [r["eval_loss"] for r in metrics(rd) if "eval_loss" in r]
    assert train_losses[-1] < train_losses[0] - 0.5
    assert evals[-1] < evals[0]
    for rel in (layout.ADAPTER_DIR + "/adapter_model.safetensors", layout.SUMMARY, layout.METRICS,
                layout.LOSS_PLOT, layout.HIGH_LOSS, layout.STATUS, layout.COST):
        assert (rd / rel).is_file(), rel
    assert (rd / layout.LOSS_PLOT).read_bytes()[:4] == b"\x89PNG"
    high = [json.loads(x) for x in (rd / layout.HIGH_LOSS).read_text().splitlines()]
    assert len(high) == 5 and [h["loss"] for h in high] == sorted((h["loss"] for h in high), reverse=True)
    status = json.loads((rd / layout.STATUS).read_text())
    assert status["state"] == "completed" and status["step"] == 30 and status["cost_usd"] > 0
    first = next(r for r in metrics(rd) if "loss" in r)
    assert {"step", "loss", "lr", "tokens_per_s", "real_token_fraction", "cost_usd", "epoch"} <= set(first)
    assert first["real_token_fraction"] == 1.0 and summary["padding_free"]  # padding-free batches: no padding
    assert summary["config_hash"] == cfg.config_hash() and summary["best_checkpoint"] == "checkpoint-30"
    assert summary["cost_usd"] > 0 and summary["tokens_per_s"] > 0
    index = json.loads((rd / layout.CHECKPOINT_LISTING).read_text())  # rewritten at every save (before post)
    assert index[-1]["step"] == 30 and index[-1]["complete"] and index[-1]["eval_loss"] is not None
    assert train_in_process(cfg)["finished_at"] == summary["finished_at"]  # a rerun does nothing


def test_local_demo_trains_tiny_qwen3_vl(train_env):
    from safetensors import safe_open

    # Runbook 000 trains Qwen3-VL with gradient checkpointing: the same path here.
    cfg = make_config(train_env, "demo-vl", model=VL_MODEL, train={"max_steps": 16, "gradient_checkpointing": True})
    write_vl_data(cfg.run_dir)
    summary = train_in_process(cfg)
    rd = cfg.run_dir
    assert summary["state"] == "completed" and summary["vision_trainable_params"] == 0
    losses = [r["loss"] for r in metrics(rd) if "loss" in r]
    assert losses[-1] < losses[0]
    with safe_open(str(rd / layout.ADAPTER_DIR / "adapter_model.safetensors"), "pt") as f:
        keys = list(f.keys())
    assert keys and all(".language_model." in k for k in keys)
    assert (rd / layout.ADAPTER_DIR / "preprocessor_config.json").is_file()
    assert (rd / layout.LOSS_PLOT).is_file() and (rd / layout.HIGH_LOSS).is_file()


def test_full_finetune_exports_final_weights(train_env):
    cfg = make_config(train_env, "full", train={"method": "full", "max_steps": 4, "learning_rate": 1e-4,
                                                "checkpoints": {"save_steps": 2}})
    write_text_data(cfg.run_dir, n_train=8, n_val=2)
    summary = train_in_process(cfg)
    out = cfg.run_dir / layout.ADAPTER_DIR
    assert summary["state"] == "completed" and summary["trainable_params"] == summary["total_params"]
    assert (out / "model.safetensors").is_file() and (out / "config.json").is_file()
    assert (out / "source_checkpoint.txt").read_text().strip() == "checkpoint-4"
    assert not (out / "optimizer.pt").exists()


def test_early_stopping_on_eval_plateau(train_env):
    # A learning rate this small leaves the eval loss bit-for-bit unchanged: no improvement after the first eval.
    cfg = make_config(train_env, "early", train={"learning_rate": 1e-30, "eval_steps": 4, "max_steps": 24,
                                                 "early_stopping_patience": 1})
    write_text_data(cfg.run_dir, n_train=16, n_val=2)
    summary = train_in_process(cfg)
    assert summary["state"] == "completed" and summary["steps"] == 8 and "early stopping" in summary["reason"]
    assert (cfg.run_dir / layout.ADAPTER_DIR).is_dir()


def test_crash_writes_rank_traceback_and_failed_status(train_env, monkeypatch):
    # A step that raises (a max_seq_length shorter than every prompt is exit 2 now: tests/payload/train/test_seqlen.py).
    import payload.train.trainer as trainer

    def boom(*args, **kwargs):
        raise RuntimeError("a crash inside a training step")

    monkeypatch.setattr(trainer.LaunchTrainerMixin, "compute_loss", boom)
    cfg = make_config(train_env, "crash")
    write_text_data(cfg.run_dir, n_train=4, n_val=0)
    with pytest.raises(Exception) as info:
        train_in_process(cfg)
    assert not isinstance(info.value, PayloadError)
    tb = (cfg.run_dir / layout.LOGS_DIR / "rank_0_traceback.log").read_text()
    assert "Traceback" in tb and type(info.value).__name__ in tb
    assert json.loads((cfg.run_dir / layout.STATUS).read_text())["state"] == "failed"


# ------------------------------------------------------------------------------ methods and errors


def test_qlora_on_cpu_is_a_clear_error(train_env):
    cfg = make_config(train_env, "qlora", train={"method": "qlora"})
    write_text_data(cfg.run_dir, n_train=4, n_val=0)
    with pytest.raises(PayloadError, match="qlora needs a CUDA GPU") as info:
        train_in_process(cfg)
    assert "\n" not in str(info.value)


def test_attention_fallback_order_is_logged(train_env, caplog):
    from payload.model import modeling

    cfg = make_config(train_env, "attn", model={"name_or_path": "tiny", "tiny": {"arch": "qwen3"},
                                                "attn_implementation": ["flash_attention_2", "eager", "sdpa"]})
    path = modeling.base_model_path(cfg)
    with caplog.at_level(logging.INFO, logger="payload.train"):
        model, impl = modeling.load_model(cfg, path)
    assert impl == "eager" and model.config._attn_implementation == "eager"
    assert "attention flash_attention_2 skipped: needs a CUDA GPU" in caplog.text
    assert "attention eager" in caplog.text
    cfg.model.attn_implementation = ["flash_attention_2"]
    with pytest.raises(PayloadError, match="add `sdpa` or `eager`"):
        modeling.load_model(cfg, path)


def test_deepspeed_zero3_config_from_switches(train_env):
    import importlib.util

    from payload.model import sharding
    from payload.config import DeepSpeedConfig

    ds = sharding.deepspeed_config(DeepSpeedConfig(zero_stage=3, offload_optimizer=True, offload_params=True))
    zero = ds["zero_optimization"]
    assert zero["stage"] == 3 and zero["offload_optimizer"]["device"] == "cpu"
    assert zero["offload_param"]["device"] == "cpu" and zero["stage3_gather_16bit_weights_on_model_save"]
    assert ds["train_micro_batch_size_per_gpu"] == "auto" and ds["bf16"] == {"enabled": "auto"}
    plain = sharding.deepspeed_config(DeepSpeedConfig(zero_stage=3))["zero_optimization"]
    assert "offload_param" not in plain and "offload_optimizer" not in plain
    cfg = make_config(train_env, "ds", train={"method": "full", "deepspeed": {"zero_stage": 3}})
    if importlib.util.find_spec("deepspeed") is not None:  # the dev lock has it on Linux
        sharding.check_deepspeed_available(cfg)  # on CPU too: DeepSpeed's CPU accelerator (test_deepspeed_cpu.py)


def test_deepspeed_missing_is_one_line_with_the_fix(train_env, monkeypatch):
    import importlib.util

    from payload.model import sharding

    cfg = make_config(train_env, "ds", train={"method": "full", "deepspeed": {"zero_stage": 3}})
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "deepspeed" else real(name, *a))
    with pytest.raises(PayloadError, match="deepspeed package is not installed; pip install deepspeed"):
        sharding.check_deepspeed_available(cfg)


def test_packing_keeps_boundaries_and_fills_batches(train_env):
    import torch

    cfg = make_config(train_env, "pack", train={"packing": True, "max_seq_length": 256,
                                                "per_device_batch_size": 4})
    write_text_data(cfg.run_dir, n_train=16, n_val=0)
    (cfg.run_dir / "data" / "val.jsonl").unlink()
    run = _setup(cfg)
    try:
        trainer = run.trainer
        row = trainer.train_dataset[0]
        assert len(row["seq_lengths"]) > 1  # several records in one packed row
        batch = trainer.data_collator([row])
        assert "attention_mask" not in batch and (batch["position_ids"][0] == 0).sum() == len(row["seq_lengths"])
        model = trainer.model.eval()
        with torch.no_grad():
            packed = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False).logits
            start = 0
            for n in row["seq_lengths"]:
                alone = model(input_ids=batch["input_ids"][:, start:start + n], use_cache=False).logits
                torch.testing.assert_close(packed[:, start:start + n], alone, rtol=1e-4, atol=1e-4)
                start += n
    finally:
        run.stop.restore()
