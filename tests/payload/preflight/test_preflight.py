"""Preflight: real files, directories and disk; the GPU is given by LAUNCH_GPU_MEMORY_GB."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from payload import preflight
from payload.config import RunConfig, SourceConfig, load_run_config
from payload.errors import PayloadError
from payload.model.dims import model_dims

ROOT = Path(__file__).resolve().parents[3]
HUB_DATA = {"sources": [{"name": "hub", "hf_dataset": "someone/chat-data"}]}
TOKEN = "hf_PREFLIGHTsecretTOKEN0123456789"


def demo_cfg(volume, **updates):
    cfg = load_run_config(ROOT / "clusters" / "local-demo.yaml",
                          env={"LAUNCH_VOLUME": str(volume), "LAUNCH_RUN_ID": "t"})
    return cfg.model_copy(update=updates) if updates else cfg


def with_sources(cfg, sources):
    sources = [SourceConfig(**s) for s in sources]
    return cfg.model_copy(update={"data": cfg.data.model_copy(update={"sources": sources})})


def by_name(summary_or_checks):
    checks = summary_or_checks["checks"] if isinstance(summary_or_checks, dict) else summary_or_checks
    return {(c["name"] if isinstance(c, dict) else c.name): c for c in checks}


# ------------------------------------------------------------------- the runbook profiles' shapes

PROFILES = {
    # runbook 000: Qwen3-VL-32B LoRA r32 bf16, 2x H100 80GB, seq 4096, batch 2 (plain DDP)
    "sonia": (dict(model={"name_or_path": "VocaborSilentii/Qwen3-VL-32B-Instruct", "kind": "image_text_to_text",
                          "dtype": "bfloat16"},
                   train={"method": "lora", "lora": {"r": 32, "alpha": 64, "dropout": 0.05},
                          "max_seq_length": 4096, "per_device_batch_size": 2,
                          "gradient_checkpointing": True}), 80, 2),
    # the same with ZeRO-3 sharding the frozen base across both GPUs
    "sonia-zero3": (dict(model={"name_or_path": "VocaborSilentii/Qwen3-VL-32B-Instruct", "kind": "image_text_to_text"},
                         train={"method": "lora", "lora": {"r": 32, "alpha": 64, "dropout": 0.05},
                                "max_seq_length": 4096, "per_device_batch_size": 2,
                                "deepspeed": {"zero_stage": 3}, "gradient_checkpointing": True}), 80, 2),
    # runbook 001: Qwen2.5-32B QLoRA 4-bit r64, 1x A100 80GB, seq 2048, batch 1
    "lovecraft": (dict(model={"name_or_path": "Qwen/Qwen2.5-32B"},
                       train={"method": "qlora", "lora": {"r": 64, "alpha": 256, "dropout": 0.05},
                              "max_seq_length": 2048, "per_device_batch_size": 1,
                              "optimizer": "paged_adamw_32bit", "gradient_checkpointing": True}), 80, 1),
    # Qwen3-32B full fine-tuning, ZeRO-3 over 16x A100 80GB, seq 8192, batch 1
    "qwen3-32b": (dict(model={"name_or_path": "Qwen/Qwen3-32B"},
                       train={"method": "full", "max_seq_length": 8192, "per_device_batch_size": 1,
                              "deepspeed": {"zero_stage": 3}, "gradient_checkpointing": True}), 80, 16),
}


def profile_estimate(name):
    body, mem, gpus = PROFILES[name]
    return preflight.estimate_gpu_memory_gb(RunConfig(data=HUB_DATA, **body), mem, gpus)


def test_memory_estimates_for_the_runbook_profiles():
    est = {name: profile_estimate(name) for name in PROFILES}
    sonia, zero3, love, full = est["sonia"], est["sonia-zero3"], est["lovecraft"], est["qwen3-32b"]
    # shapes come from the known-Qwen table: 33.3B (runbook 000), 32.8B for both text models
    assert sonia["params_b"] == pytest.approx(33.3, abs=0.1) and love["params_b"] == pytest.approx(32.8, abs=0.1)
    assert sonia["components_gb"]["weights"] == pytest.approx(2 * 33.3e9 / 2**30, rel=0.01)
    assert sonia["trainable_params_m"] == pytest.approx(268.4, abs=0.1)  # 64 x 32 x sum(in+out)
    assert love["trainable_params_m"] == pytest.approx(536.9, abs=0.1)
    assert full["components_gb"]["train_state"] == pytest.approx(16 * 32.76e9 / 16 / 2**30, rel=0.01)
    # verdicts: plain-DDP Sonia does not fit an 80 GB card; ZeRO-3 does; QLoRA and full ZeRO-3 fit
    assert sonia["total_gb"] > 80 and sonia["fraction"] > 1
    assert 50 < zero3["total_gb"] < 80 and zero3["components_gb"]["weights"] == pytest.approx(
        sonia["components_gb"]["weights"] / 2, rel=0.01)
    assert 25 < love["total_gb"] < 50
    assert 45 < full["total_gb"] < 80


def test_estimate_scales_with_batch_sequence_and_checkpointing():
    body, mem, gpus = PROFILES["lovecraft"]
    base = RunConfig(data=HUB_DATA, **body)
    est = preflight.estimate_gpu_memory_gb(base, mem, gpus)
    longer = base.model_copy(update={"train": base.train.model_copy(update={"max_seq_length": 4096})})
    no_ckpt = base.model_copy(update={"train": base.train.model_copy(update={"gradient_checkpointing": False})})
    e2 = preflight.estimate_gpu_memory_gb(longer, mem, gpus)
    e3 = preflight.estimate_gpu_memory_gb(no_ckpt, mem, gpus)
    # TRL's fused LM head: tiles + a few bytes of hidden state per token, never B x S x V
    assert e2["components_gb"]["logits"] == pytest.approx(2 * est["components_gb"]["logits"], rel=0.05)
    plain = preflight.estimate_gpu_memory_gb(longer, mem, gpus, fused_lm_head=False)
    assert plain["components_gb"]["logits"] == pytest.approx(4096 * 152064 * 10 / 2**30, rel=1e-2)
    assert plain["components_gb"]["logits"] > 10 * e2["components_gb"]["logits"]
    assert e2["components_gb"]["activations"] == pytest.approx(2 * est["components_gb"]["activations"], rel=1e-2)
    assert e3["components_gb"]["activations"] > 10 * est["components_gb"]["activations"]


def test_gradient_checkpointing_auto_decided_by_the_estimate():
    body, _mem, _gpus = PROFILES["lovecraft"]
    auto = RunConfig(data=HUB_DATA, **body)
    auto = auto.model_copy(update={"train": auto.train.model_copy(update={"gradient_checkpointing": "auto"})})
    big, mid, small = (preflight.estimate_gpu_memory_gb(auto, mem, 1) for mem in (141.0, 80.0, 24.0))
    assert big["gradient_checkpointing"] is False and "auto: off" in big["gradient_checkpointing_reason"]
    # in between, only some layers recompute (transformers' every_n_layers), and it still fits
    assert mid["checkpoint_every_n_layers"] in (2, 3, 4) and mid["total_gb"] <= 0.85 * 80
    assert "1 layer in" in mid["gradient_checkpointing_reason"]
    assert small["checkpoint_every_n_layers"] == 1 and "exceeds" in small["gradient_checkpointing_reason"]
    assert big["components_gb"]["activations"] > mid["components_gb"]["activations"] > \
        small["components_gb"]["activations"]
    assert preflight.estimate_gpu_memory_gb(auto, None, 1)["gradient_checkpointing"] is True  # unknown GPU: on


@pytest.mark.slow  # 8 s: models built from config
def test_model_shapes_by_name_and_from_config():
    from payload.model.tiny import build_tiny_model, build_tiny_tokenizer

    assert preflight.dims_from_name("VocaborSilentii/Qwen3-VL-32B-Instruct").params == pytest.approx(33.3e9, rel=0.01)
    assert preflight.dims_from_name("Qwen/Qwen3-32B").layers == 64
    assert preflight.dims_from_name("Qwen/Qwen2.5-7B-Instruct").hidden == 3584
    assert preflight.dims_from_name("meta-llama/Llama-3.1-70B").params == pytest.approx(70e9, rel=0.1)
    assert preflight.dims_from_name("gpt2") is None

    cfg = demo_cfg("/unused")
    tok = build_tiny_tokenizer(None, vocab_size=cfg.model.tiny.vocab_size)
    real = sum(p.numel() for p in build_tiny_model(cfg.model.tiny, tok).parameters())
    assert model_dims(cfg).params == pytest.approx(real, rel=0.01)


@pytest.mark.parametrize("arch, hidden, layers", [("qwen3", 64, 2), ("qwen3", 48, 3), ("qwen3_vl", 64, 2),
                                                   ("qwen3_vl", 96, 4)])
def test_tiny_dims_from_the_shape_alone_equal_those_of_the_transformers_config(arch, hidden, layers):
    """Preflight reads a tiny model's size from its shape, without the tokenizer or transformers: the
    same ModelDims as the config the model is built from."""
    from types import SimpleNamespace

    from payload.model.memory import dims_from_config
    from payload.model.tiny import build_tiny_tokenizer, tiny_config, tiny_dims

    spec = SimpleNamespace(arch=arch, hidden_size=hidden, num_layers=layers, vocab_size=1024)
    built = tiny_config(spec, build_tiny_tokenizer(None, vocab_size=1024)).to_dict()
    assert tiny_dims(spec) == dims_from_config(built, "tiny config")


def test_a_tiny_vocab_smaller_than_the_tiny_tokenizer_is_refused_by_the_config():
    """The tokenizer always has 265 tokens at least (256 bytes, 9 special): a smaller `model.tiny.vocab_size`
    is refused where the config is read, naming the key (preflight reads the shape without the tokenizer)."""
    from pydantic import ValidationError

    from payload.config import TinyModel
    from payload.model.tiny import build_tiny_tokenizer

    assert len(build_tiny_tokenizer(None, vocab_size=10)) == 265
    TinyModel(vocab_size=265)
    with pytest.raises(ValidationError, match="vocab_size"):
        TinyModel(vocab_size=264)


def test_gpu_count_and_memory_from_the_environment():
    env = {"SKYPILOT_NUM_GPUS_PER_NODE": "4", "SKYPILOT_NUM_NODES": "4", "LAUNCH_GPU_MEMORY_GB": "80"}
    assert preflight.gpu_info(env) == (80.0, 16, "LAUNCH_GPU_MEMORY_GB")
    setup_phase = {"SKYPILOT_SETUP_NUM_GPUS_PER_NODE": "4", "SKYPILOT_SETUP_NODE_IPS": "10.0.0.1\n10.0.0.2\n",
                   "LAUNCH_GPU_MEMORY_GB": "80"}
    assert preflight.gpu_info(setup_phase)[1] == 8
    assert preflight.gpu_info({"WORLD_SIZE": "2", "LAUNCH_GPU_MEMORY_GB": "24"}) == (24.0, 2, "LAUNCH_GPU_MEMORY_GB")


# --------------------------------------------------------------------------------------- checks


def test_local_demo_passes_and_reports_the_estimate(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="payload")
    summary = preflight.main(demo_cfg(tmp_path), env={"LAUNCH_GPU_MEMORY_GB": "80"})
    checks = by_name(summary)
    assert summary["ok"] and {"data[demo-chat]", "data[demo-alpaca]", "model", "run_dir", "disk", "hf_token",
                              "gpu_memory"} <= set(checks)
    assert all(c["status"] == "ok" for c in checks.values()), summary["checks"]
    assert summary["memory"]["known"] and summary["memory"]["total_gb"] < 3
    assert "GiB per GPU x 1" in checks["gpu_memory"]["detail"] and "OK   gpu_memory" in caplog.text
    # attn_implementation `auto` is named as the kernel it loads here (no CUDA GPU: sdpa), not its first letter
    assert "; sdpa, Liger off" in checks["gpu_memory"]["detail"], checks["gpu_memory"]["detail"]
    assert not list((tmp_path / "runs" / "t").glob(".preflight-*"))  # the probe file is removed


def test_gpu_too_small_fails_with_the_estimate(tmp_path):
    with pytest.raises(PayloadError, match=r"gpu_memory: ~[\d.]+ GiB per GPU x 1 .* does not fit; lower"):
        preflight.main(demo_cfg(tmp_path), env={"LAUNCH_GPU_MEMORY_GB": "0.01"})


def test_unwritable_run_dir_fails(tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the volume should be")
    with pytest.raises(PayloadError, match=r"run_dir: cannot write to .*not-a-dir/runs/t .*LAUNCH_VOLUME"):
        preflight.main(demo_cfg(blocker), env={})


def test_missing_empty_and_malformed_data_all_reported(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    cfg = with_sources(demo_cfg(tmp_path), [
        {"name": "gone", "path": str(tmp_path / "gone.jsonl")},
        {"name": "empty", "path": str(empty)},
        {"name": "hub", "hf_dataset": "bad--name/x"},
        {"name": "fine", "path": "payload/samples/demo_chat.jsonl"},
    ])
    with pytest.raises(PayloadError) as err:
        preflight.main(cfg, env={})
    msg = str(err.value)
    assert msg.startswith("3 check(s) failed")  # the stage runner adds `preflight: ` (once)
    assert "data[gone]: " in msg and "gone.jsonl does not exist; fix `data.sources[].path`" in msg
    assert "data[empty]: " in msg and "empty.jsonl is empty" in msg
    assert "data[hub]: hf_dataset `bad--name/x`: Cannot have -- or .." in msg
    assert "data[fine]" not in msg


def test_push_needs_a_token_and_its_value_is_never_shown(tmp_path, caplog, capsys):
    caplog.set_level(logging.DEBUG)
    cfg = demo_cfg(tmp_path)
    cfg = cfg.model_copy(update={"outputs": cfg.outputs.model_copy(update={"push_to_hub": "me/demo"})})
    with pytest.raises(PayloadError, match=r"hf_token: outputs.push_to_hub is `me/demo` but HF_TOKEN is not set; "
                                           r"launch with `--secret HF_TOKEN`"):
        preflight.main(cfg, env={})
    summary = preflight.main(cfg, env={"HF_TOKEN": TOKEN})
    assert by_name(summary)["hf_token"]["detail"] == "HF_TOKEN present (value not shown)"
    out = capsys.readouterr()
    assert TOKEN not in caplog.text + out.out + out.err + json.dumps(summary)


def test_private_hub_sources_without_token_warn(tmp_path):
    cfg = demo_cfg(tmp_path)
    cfg = with_sources(cfg, [{"name": "hub", "hf_dataset": "someone/private-data"}])
    check = preflight.check_token(cfg, env={})
    assert check.status == "warn" and "someone/private-data" in check.detail and "--secret HF_TOKEN" in check.detail
    public = with_sources(cfg, [{"name": "hub", "hf_dataset": "Qwen/some-public-data"}])
    assert preflight.check_token(public, env={}).status == "ok"


def test_disk_too_small_fails_and_counts_the_merged_copy(tmp_path):
    cfg = demo_cfg(tmp_path)
    huge = preflight.ModelDims(hidden=8192, layers=100_000, intermediate=32768, heads=64, kv_heads=8,
                               head_dim=128, vocab=152064, tied=False)  # ~50T params: never fits
    check = preflight.check_disk(cfg, huge, env={})
    assert check.status == "fail" and "needs ~" in check.detail and "keep_best" in check.detail
    tiny = model_dims(cfg)
    needs = {str(p): n for p, n, _ in preflight.disk_needs(cfg, tiny)}
    no_merge = cfg.model_copy(update={"outputs": cfg.outputs.model_copy(update={"merge": False})})
    needs2 = {str(p): n for p, n, _ in preflight.disk_needs(no_merge, tiny)}
    assert needs[str(cfg.run_dir)] - needs2[str(cfg.run_dir)] == pytest.approx(2 * tiny.params)


def test_a_gpu_node_whose_torch_cannot_use_the_gpus_fails_preflight():
    """SkyPilot says the node has GPUs, torch sees none (driver too old for its CUDA): fail before the
    model download, naming the versions; a node without GPUs (local backend, CPU task) is not asked."""
    import torch

    assert preflight.check_cuda({}) is None and preflight.check_cuda({"SKYPILOT_NUM_GPUS_PER_NODE": "0"}) is None
    check = preflight.check_cuda({"SKYPILOT_SETUP_NUM_GPUS_PER_NODE": "2"})
    assert not torch.cuda.is_available()  # this machine: a CPU build
    assert check.status == "fail" and check.detail.startswith(f"this node has 2 GPU(s) but torch {torch.__version__} "
                                                              "(CUDA none (a CPU build)) cannot use them")
    assert "nvidia-smi" in check.detail


def test_a_gpu_node_whose_gpus_are_hidden_on_purpose_trains_on_cpu_with_a_warning():
    """`--env CUDA_VISIBLE_DEVICES=` (CUDA's own "no GPU"; the emulated cloud's CPU pods) is not a broken
    driver: preflight warns that the node's GPUs go unused instead of failing the run."""
    for hidden in ("", "-1"):
        check = preflight.check_cuda({"SKYPILOT_SETUP_NUM_GPUS_PER_NODE": "2", "CUDA_VISIBLE_DEVICES": hidden})
        assert check.status == "warn", check
        assert check.detail == (f"CUDA_VISIBLE_DEVICES={hidden!r} hides this node's 2 GPU(s): the run trains on CPU "
                                "(unset it to use them)")
    assert preflight.check_cuda({"SKYPILOT_SETUP_NUM_GPUS_PER_NODE": "2", "CUDA_VISIBLE_DEVICES": "0"}).status == "fail"
