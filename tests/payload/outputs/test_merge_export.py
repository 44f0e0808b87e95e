"""Merge and MLX export on tiny models built from config (CPU, no download).

The adapters here have random, non-zero B matrices, so a wrong merge or a wrong transpose shows
up in the numbers; the tests check that first (base and adapted logits must differ).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard
from safetensors.torch import load_file

from payload import layout
from payload.outputs import export
from payload.outputs import merge
from payload.config import load_run_config
from payload.errors import PayloadError
from payload.model.tiny import BASE_MODEL_DIR, materialize_tiny

ROOT = Path(__file__).resolve().parents[3]
TEXT_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
VL_TARGETS = r"model\.language_model\.layers\.\d+\.(self_attn|mlp)\.\w+_proj"  # language blocks only


def demo_cfg(volume: Path, vl: bool = False, **outputs):
    """The local-demo profile, run under `volume`; optionally its Qwen3-VL twin."""
    cfg = load_run_config(ROOT / "clusters" / "local-demo.yaml",
                          env={"LAUNCH_VOLUME": str(volume), "LAUNCH_RUN_ID": "t"})
    if vl:
        tiny = cfg.model.tiny.model_copy(update={"arch": "qwen3_vl"})
        cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"kind": "image_text_to_text", "tiny": tiny})})
    if outputs:
        cfg = cfg.model_copy(update={"outputs": cfg.outputs.model_copy(update=outputs)})
    return cfg


def model_class(cfg):
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    return AutoModelForImageTextToText if cfg.model.kind == "image_text_to_text" else AutoModelForCausalLM


def make_adapter(cfg, seed: int = 0, **lora_overrides):
    """A PEFT adapter on the materialized tiny base with random non-zero B, saved where train puts it."""
    from peft import LoraConfig, get_peft_model

    base = materialize_tiny(cfg, cfg.run_dir / BASE_MODEL_DIR)
    model = model_class(cfg).from_pretrained(str(base), dtype=torch.float32)
    lora = cfg.train.lora
    targets = VL_TARGETS if cfg.model.kind == "image_text_to_text" else TEXT_TARGETS
    peft = get_peft_model(model, LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=0.0,
                                            target_modules=targets, **lora_overrides))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    peft.eval()
    peft.save_pretrained(str(cfg.run_dir / layout.ADAPTER_DIR))
    return peft


def input_ids(seed: int = 0) -> torch.Tensor:
    return torch.randint(10, 1000, (2, 24), generator=torch.Generator().manual_seed(seed))


def adapted_and_base_logits(peft, ids):
    with torch.no_grad():
        adapted = peft(input_ids=ids).logits
        with peft.disable_adapter():
            base = peft(input_ids=ids).logits
    assert (adapted - base).abs().max() > 1e-2, "the adapter must change the logits, or the test proves nothing"
    return adapted


# ------------------------------------------------------------------------------------------- merge


def test_merged_logits_equal_base_plus_adapter_and_rerun_is_a_noop(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="payload")
    cfg = demo_cfg(tmp_path)
    peft = make_adapter(cfg)
    ids = input_ids()
    expected = adapted_and_base_logits(peft, ids)

    summary = merge.main(cfg, env={})
    merged_dir = cfg.run_dir / layout.MERGED_DIR
    assert summary["already_merged"] is False and summary["merged_dir"] == str(merged_dir)
    merged = model_class(cfg).from_pretrained(str(merged_dir), dtype=torch.float32)
    assert not any("lora" in k for k in merged.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids).logits, expected, atol=1e-5, rtol=1e-5)
    assert sorted(p.name for p in merged_dir.glob("*.safetensors")) == ["model.safetensors"]
    assert (merged_dir / "tokenizer.json").is_file() and (merged_dir / merge.MARKER).is_file()
    assert isinstance(summary["smoke"], str) and "smoke: 'Say hello.' ->" in caplog.text
    assert not list(merged_dir.parent.glob(".merged.tmp-*"))

    stamp = (merged_dir / "model.safetensors").stat().st_mtime_ns
    caplog.clear()
    again = merge.main(cfg, env={})
    assert again["already_merged"] is True and again["smoke"] == summary["smoke"]
    assert "already merged" in caplog.text
    assert (merged_dir / "model.safetensors").stat().st_mtime_ns == stamp


def test_a_retrained_adapter_is_merged_again(tmp_path):
    cfg = demo_cfg(tmp_path, smoke_prompt=None)
    make_adapter(cfg, seed=0)
    assert merge.main(cfg, env={})["already_merged"] is False
    peft = make_adapter(cfg, seed=1)
    ids = input_ids(1)
    expected = adapted_and_base_logits(peft, ids)
    summary = merge.main(cfg, env={})
    assert summary["already_merged"] is False and summary["smoke"] is None
    merged = model_class(cfg).from_pretrained(str(cfg.run_dir / layout.MERGED_DIR), dtype=torch.float32)
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids).logits, expected, atol=1e-5, rtol=1e-5)


def test_vision_language_merge_keeps_processor_files(tmp_path):
    cfg = demo_cfg(tmp_path, vl=True)
    peft = make_adapter(cfg)
    ids = input_ids()
    expected = adapted_and_base_logits(peft, ids)
    summary = merge.main(cfg, env={})
    merged_dir = cfg.run_dir / layout.MERGED_DIR
    merged = model_class(cfg).from_pretrained(str(merged_dir), dtype=torch.float32)
    assert type(merged).__name__ == "Qwen3VLForConditionalGeneration"
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids).logits, expected, atol=1e-5, rtol=1e-5)
    assert (merged_dir / "preprocessor_config.json").is_file()  # copied from the base
    assert isinstance(summary["smoke"], str)


def test_missing_adapter_is_a_payload_error(tmp_path):
    cfg = demo_cfg(tmp_path)
    with pytest.raises(PayloadError, match=r"no adapter to merge in .*outputs/adapter.*payload train"):
        merge.main(cfg, env={})


def test_push_without_token_fails_before_merging(tmp_path):
    cfg = demo_cfg(tmp_path, push_to_hub="someone/demo-merged")
    with pytest.raises(PayloadError, match=r"HF_TOKEN.*--secret HF_TOKEN"):
        merge.main(cfg, env={"HF_TOKEN": ""})
    assert not (cfg.run_dir / layout.MERGED_DIR).exists()


class FakeHub:
    """Stands in for huggingface_hub.HfApi (the network edge); records what would be sent."""

    calls: list = []
    fail_with: Exception | None = None

    def __init__(self, token=None):
        FakeHub.calls.append(("init", token))

    def create_repo(self, repo_id, **kw):
        FakeHub.calls.append(("create_repo", repo_id, kw))

    def upload_folder(self, **kw):
        if FakeHub.fail_with:
            raise FakeHub.fail_with
        FakeHub.calls.append(("upload_folder", kw["repo_id"], kw["folder_path"], kw.get("ignore_patterns")))

    def upload_file(self, **kw):
        FakeHub.calls.append(("upload_file", kw["repo_id"], kw["path_in_repo"], Path(kw["path_or_fileobj"]).read_text()))


TOKEN = "hf_FAKEsecretTOKENvalue0123456789"


def test_push_uploads_the_merged_folder_and_never_leaks_the_token(tmp_path, monkeypatch, caplog, capsys):
    import huggingface_hub

    caplog.set_level(logging.DEBUG)
    monkeypatch.setattr(huggingface_hub, "HfApi", FakeHub)
    FakeHub.calls, FakeHub.fail_with = [], None
    cfg = demo_cfg(tmp_path, push_to_hub="someone/demo-merged", smoke_prompt=None)
    make_adapter(cfg)
    summary = merge.main(cfg, env={"HF_TOKEN": TOKEN})
    merged_dir = cfg.run_dir / layout.MERGED_DIR
    assert summary["pushed"] == "someone/demo-merged"
    assert ("create_repo", "someone/demo-merged", {"repo_type": "model", "private": True, "exist_ok": True}) in FakeHub.calls
    assert ("upload_folder", "someone/demo-merged", str(merged_dir), [merge.MARKER, "README.md"]) in FakeHub.calls
    assert [c[:3] for c in FakeHub.calls if c[0] == "upload_file"] == [("upload_file", "someone/demo-merged", "README.md")]

    FakeHub.calls = []
    assert merge.main(cfg, env={"HF_TOKEN": TOKEN})["pushed"] == "someone/demo-merged"
    assert not [c for c in FakeHub.calls if c[0] == "upload_folder"] and "already pushed" in caplog.text

    FakeHub.fail_with = RuntimeError(f"401 Client Error: bad token {TOKEN}\nmore")
    (cfg.run_dir / layout.OUTPUTS_DIR / merge.PUSHED).unlink()
    with pytest.raises(PayloadError, match=r"push to someone/demo-merged failed .*\*\*\*.*write access") as err:
        merge.main(cfg, env={"HF_TOKEN": TOKEN})
    assert TOKEN not in str(err.value)
    out = capsys.readouterr()
    assert TOKEN not in caplog.text + out.out + out.err
    for f in tmp_path.rglob("*"):
        assert not f.is_file() or TOKEN.encode() not in f.read_bytes(), f


def test_push_without_merge_uploads_the_adapter(tmp_path, monkeypatch):
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeHub)
    FakeHub.calls, FakeHub.fail_with = [], None
    cfg = demo_cfg(tmp_path, merge=False, push_to_hub="someone/demo-adapter")
    make_adapter(cfg)
    summary = merge.main(cfg, env={"HF_TOKEN": TOKEN})
    assert summary["merged"] is False and summary["pushed"] == "someone/demo-adapter"
    assert ("upload_folder", "someone/demo-adapter", str(cfg.run_dir / layout.ADAPTER_DIR),
            [merge.MARKER, "README.md"]) in FakeHub.calls
    card = ModelCard.load(cfg.run_dir / layout.OUTPUTS_DIR / "model_card.md")
    assert card.data.library_name == "peft" and "lora" in card.data.tags
    assert [c[3] for c in FakeHub.calls if c[0] == "upload_file"] == [card.content]


def test_the_model_card_is_the_hubs_with_base_model_datasets_metrics_and_command(tmp_path):
    """What a Hub user sees: the metadata the Hub reads (ModelCard.load parses it back) and a body
    with the training summary's numbers, the way to load it, the command and the resolved config."""
    from payload.outputs import card

    cfg = demo_cfg(tmp_path, push_to_hub="someone/qwen3-demo")
    source = cfg.data.sources[0].model_copy(update={"path": None, "hf_dataset": "someone/chats"})
    cfg = cfg.model_copy(update={
        "model": cfg.model.model_copy(update={"tiny": None, "name_or_path": "Qwen/Qwen3-0.6B"}),
        "data": cfg.data.model_copy(update={"sources": [source, *cfg.data.sources[1:]]})})
    summary = {"steps": 40, "final_loss": 1.23456, "best_eval_loss": 1.5, "tokens_per_s": 812.4, "cost_usd": 0.0123,
               "evaluation": {"test": {"cer": 0.25, "n": 12}}}
    (cfg.run_dir / "outputs").mkdir(parents=True)
    (cfg.run_dir / layout.SUMMARY).write_text(json.dumps(summary))
    path = card.write(cfg, adapter=True)
    loaded = ModelCard.load(path)
    assert loaded.data.base_model == "Qwen/Qwen3-0.6B" and loaded.data.library_name == "peft"
    assert loaded.data.datasets == ["someone/chats"] and loaded.data.pipeline_tag == "text-generation"
    text = loaded.text
    assert "| final train loss | 1.235 |" in text and "| test cer | 0.25 |" in text and "| tokens/s | 812.4 |" in text
    assert 'AutoPeftModelForCausalLM.from_pretrained("someone/qwen3-demo")' in text
    assert "launch up run\n" in text and f"config hash `{cfg.config_hash()}`" in text
    assert "hf_dataset: someone/chats" in text  # the resolved config
    merged = ModelCard.load(card.write(cfg, adapter=False))
    assert merged.data.library_name == "transformers" and "AutoModelForCausalLM.from_pretrained" in merged.text
    assert not (cfg.run_dir / layout.MERGED_DIR).exists()


# ------------------------------------------------------------------------------------------ export


@pytest.fixture(scope="module")
def demo_adapter(tmp_path_factory):
    cfg = demo_cfg(tmp_path_factory.mktemp("export"))
    return cfg, make_adapter(cfg)


def test_mlx_export_keys_shapes_and_transposes(demo_adapter):
    cfg, peft = demo_adapter
    summary = export.main(cfg)
    out = cfg.run_dir / layout.MLX_DIR
    assert summary["out_dir"] == str(out)
    mlx = load_file(str(out / export.MLX_WEIGHTS))
    src = load_file(str(cfg.run_dir / layout.ADAPTER_DIR / export.PEFT_WEIGHTS))
    layers = cfg.model.tiny.num_layers
    modules = [f"self_attn.{m}" for m in TEXT_TARGETS[:4]] + [f"mlp.{m}" for m in TEXT_TARGETS[4:]]
    assert set(mlx) == {f"model.layers.{i}.{m}.lora_{ab}" for i in range(layers) for m in modules for ab in "ab"}
    r = cfg.train.lora.r
    for i in range(layers):
        for m in modules:
            a, b = mlx[f"model.layers.{i}.{m}.lora_a"], mlx[f"model.layers.{i}.{m}.lora_b"]
            peft_a = src[f"base_model.model.model.layers.{i}.{m}.lora_A.weight"]
            peft_b = src[f"base_model.model.model.layers.{i}.{m}.lora_B.weight"]
            assert a.shape == (peft_a.shape[1], r) and b.shape == (r, peft_b.shape[0])
            torch.testing.assert_close(a, peft_a.T, atol=0, rtol=0)
            torch.testing.assert_close(b, peft_b.T, atol=0, rtol=0)

    config = json.loads((out / export.MLX_CONFIG).read_text())
    assert config["fine_tune_type"] == "lora" and config["num_layers"] == layers
    assert config["lora_parameters"] == {"rank": r, "scale": cfg.train.lora.alpha / r, "dropout": 0.0,
                                         "keys": sorted(modules)}

    # mlx-lm computes y + scale * (x @ lora_a) @ lora_b: it must equal what PEFT adds to the base layer.
    x = torch.randn(5, cfg.model.tiny.hidden_size, generator=torch.Generator().manual_seed(3))
    for m in ("self_attn.q_proj", "mlp.gate_proj"):
        layer = peft.get_submodule(f"base_model.model.model.layers.1.{m}")
        with torch.no_grad():
            peft_delta = layer(x) - layer.base_layer(x)
        mlx_delta = config["lora_parameters"]["scale"] * (x @ mlx[f"model.layers.1.{m}.lora_a"]) @ mlx[f"model.layers.1.{m}.lora_b"]
        assert peft_delta.abs().max() > 1e-3
        torch.testing.assert_close(mlx_delta, peft_delta, atol=1e-5, rtol=1e-5)


def test_mlx_export_writes_runbook_001_metadata_and_base_step(demo_adapter, tmp_path):
    """Runbook 001 steps 7-8: metadata.json (base model path, rank, alpha, examples) and the exact
    `mlx_lm.convert` line for the base, 4-bit when the adapter was trained on a 4-bit (QLoRA) base."""
    cfg, _ = demo_adapter
    summary = export.main(cfg)
    out = cfg.run_dir / layout.MLX_DIR
    meta = json.loads((out / export.MLX_METADATA).read_text())
    assert meta["base_model"] == summary["mlx_base"] == "./models/tiny-qwen3-bf16-MLX"
    assert (meta["lora_rank"], meta["lora_alpha"]) == (cfg.train.lora.r, cfg.train.lora.alpha)
    script = (out / export.MLX_BASE_SCRIPT).read_text()
    assert "mlx_lm.convert --hf-path tiny-qwen3 --mlx-path ./models/tiny-qwen3-bf16-MLX\n" in script
    assert " -q " not in script

    from launcher.profiles.profile import load_profile
    from launcher.profiles.render import resolved_run_config

    lc = resolved_run_config(load_profile("lovecraft-a100-spot"))
    lc.runtime.volume = str(tmp_path)
    assert export.write_mlx_base_step(lc, tmp_path) == "./models/Qwen2.5-32B-4bit-MLX"
    assert ("mlx_lm.convert --hf-path Qwen/Qwen2.5-32B -q --q-bits 4 --mlx-path ./models/Qwen2.5-32B-4bit-MLX"
            in (tmp_path / export.MLX_BASE_SCRIPT).read_text())
    meta = json.loads((tmp_path / export.MLX_METADATA).read_text())
    assert (meta["lora_rank"], meta["lora_alpha"], meta["training_examples"]) == (64, 256, None)


def test_mlx_export_scale_num_layers_and_refusals(demo_adapter, tmp_path):
    cfg, _ = demo_adapter
    src = cfg.run_dir / layout.ADAPTER_DIR
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / export.PEFT_WEIGHTS).write_bytes((src / export.PEFT_WEIGHTS).read_bytes())
    peft_cfg = json.loads((src / export.PEFT_CONFIG).read_text())

    def convert(num_layers=None, **changes):
        (adapter / export.PEFT_CONFIG).write_text(json.dumps({**peft_cfg, **changes}))
        return export.peft_to_mlx(adapter, tmp_path / "mlx", num_layers=num_layers)

    r, alpha = peft_cfg["r"], peft_cfg["lora_alpha"]
    assert convert(use_rslora=True)["scale"] == pytest.approx(alpha / r**0.5)
    assert convert(num_layers=36)["num_layers"] == 36
    with pytest.raises(PayloadError, match=r"num_layers=1 .* adapts block 1"):
        convert(num_layers=1)
    with pytest.raises(PayloadError, match="modules_to_save"):
        convert(modules_to_save=["lm_head"])
    with pytest.raises(PayloadError, match="DoRA"):
        convert(use_dora=True)
    with pytest.raises(PayloadError, match="not a PEFT adapter"):
        export.peft_to_mlx(tmp_path / "nowhere", tmp_path / "mlx")


def test_mlx_export_of_a_vision_language_adapter(tmp_path):
    cfg = demo_cfg(tmp_path, vl=True)
    make_adapter(cfg)
    export.main(cfg)
    mlx = load_file(str(cfg.run_dir / layout.MLX_DIR / export.MLX_WEIGHTS))
    # mlx-lm's qwen3_vl model is text-only and keeps its blocks under language_model.model.layers
    assert mlx and all(k.startswith("language_model.model.layers.") for k in mlx)
    assert "language_model.model.layers.1.mlp.down_proj.lora_b" in mlx
