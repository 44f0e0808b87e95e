"""QLoRA without the fp32 upcast (issue 30 item 4): the dtype plan, and the loss of a fixed batch.

bitsandbytes 4-bit needs CUDA, so the loss comparison runs the non-quantized path of the same
preparation on a tiny bf16 Qwen3: the old one (peft's `prepare_model_for_kbit_training`, which casts
every bf16 tensor to fp32) against the new one (nothing upcast, adapters cast per `dtype_plan`).
What awaits a GPU: the 4-bit base itself (`make gpu-check --modes qlora-4bit`: peak <= the bf16 LoRA
row's, tokens/s >= 5,274 on the H200)."""

from __future__ import annotations

import pytest
import torch

from payload.model import adapters
from train_fixtures import make_config

DIMS = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=256, tie_word_embeddings=False)


def test_plan_keeps_the_base_in_its_compute_dtype():
    plan = adapters.dtype_plan("qlora", "bfloat16")
    assert plan == {"block_linears": "nf4", "embeddings": "bfloat16", "norms": "bfloat16", "lm_head": "bfloat16",
                    "vision": "bfloat16", "adapters": "bfloat16"}
    t4 = adapters.dtype_plan("qlora", "float16")  # GradScaler cannot unscale fp16 gradients
    assert t4["adapters"] == "float32" and t4["norms"] == t4["embeddings"] == t4["lm_head"] == "float16"
    assert adapters.dtype_plan("lora", "bfloat16")["adapters"] == "float32"  # peft's default
    assert adapters.dtype_plan("lora", "bfloat16", zero3=True)["adapters"] == "bfloat16"  # TRL under ZeRO-3
    assert adapters.dtype_plan("full", "bfloat16") == {"all": "bfloat16"}
    assert "float32" not in {v for k, v in plan.items() if k != "adapters"}


def test_adapter_dtype_follows_mixed_precision(tmp_path):
    cfg = make_config(tmp_path, model={"name_or_path": "x", "dtype": "float16"}, train={"method": "qlora"})
    assert adapters.compute_dtype_name(cfg) == "float16"
    model = _peft(_tiny(torch.bfloat16))  # TRL leaves a quantized model's adapters in bf16 whatever the precision
    _cast_trainable(model, torch.bfloat16)
    adapters.cast_adapters(cfg, model)
    trainable = {p.dtype for p in model.parameters() if p.requires_grad}
    frozen = {p.dtype for p in model.parameters() if not p.requires_grad}
    assert trainable == {torch.float32} and frozen == {torch.bfloat16}
    lora = make_config(tmp_path, model={"name_or_path": "x", "dtype": "float16"}, train={"method": "lora"})
    _cast_trainable(model, torch.bfloat16)
    adapters.cast_adapters(lora, model)  # only QLoRA is cast
    assert {p.dtype for p in model.parameters() if p.requires_grad} == {torch.bfloat16}


def test_new_preparation_keeps_the_loss_and_drops_the_fp32_copies(tmp_path):
    from peft import prepare_model_for_kbit_training

    cfg = make_config(tmp_path, model={"name_or_path": "x", "dtype": "bfloat16"}, train={"method": "qlora"})
    batch = _batch()

    old = _peft(prepare_model_for_kbit_training(_tiny(torch.bfloat16), use_gradient_checkpointing=False))
    model, _ = adapters.prepare_for_method(cfg, _tiny(torch.bfloat16))
    new = _peft(model)
    adapters.cast_adapters(cfg, new)

    assert {p.dtype for p in old.parameters()} == {torch.float32}  # what ran on the H200: all fp32
    plan = adapters.dtype_plan("qlora", "bfloat16")
    assert {p.dtype for p in new.parameters() if not p.requires_grad} == {getattr(torch, plan["norms"])}
    assert {p.dtype for p in new.parameters() if p.requires_grad} == {getattr(torch, plan["adapters"])}

    old_loss, old_grads = _loss_and_grads(old, batch)
    new_loss, new_grads = _loss_and_grads(new, batch)
    assert new_loss == pytest.approx(old_loss, rel=1e-2)
    for name, g in old_grads.items():  # the adapters learn the same direction (bf16 rounding apart)
        cos = torch.nn.functional.cosine_similarity(g.flatten(), new_grads[name].float().flatten(), dim=0)
        assert cos > 0.98, name


def _tiny(dtype):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    return Qwen3ForCausalLM(Qwen3Config(**DIMS, attn_implementation="sdpa")).to(dtype)


def _peft(model):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(1)  # init_lora_weights=False: B random too, so the adapters change the loss
    return get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear",
                                            init_lora_weights=False, task_type="CAUSAL_LM"))


def _cast_trainable(model, dtype):
    for p in model.parameters():
        if p.requires_grad:
            p.data = p.data.to(dtype)


def _batch():
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, DIMS["vocab_size"], (2, 24), generator=g)
    return {"input_ids": ids, "labels": ids.clone()}


def _loss_and_grads(model, batch):
    model.zero_grad()
    loss = model(**batch).loss
    loss.backward()
    return loss.item(), {n: p.grad.detach().float().clone() for n, p in model.named_parameters() if p.requires_grad}
