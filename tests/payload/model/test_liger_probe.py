"""`train.liger: auto` only where Liger's patch imports and applies (issue 30 item 5).

liger-kernel is not installed here (its kernels need Triton and a CUDA GPU): the edge is a fake
`liger_kernel` package on sys.path, with liger-kernel's own entry point
(`liger_kernel.transformers.monkey_patch.MODEL_TYPE_TO_APPLY_LIGER_FN`), one patch that works, one that
raises the ImportError the H200 run hit (liger-kernel 0.8.5 + transformers 5.23, Qwen3-VL), and the GPU
reported present. What awaits a GPU: Liger on/off in one mode (bench/gpu/gpu_modes.py) and the default
that wins."""

from __future__ import annotations

import logging
import sys
import types

import pytest

from payload.model import modeling
from payload.errors import PayloadError
from train_fixtures import make_config

FAKE = '''
APPLIED = []

def apply_liger_kernel_to_qwen3(rope=True, rms_norm=True, swiglu=True, fused_linear_cross_entropy=True, model=None):
    APPLIED.append(("qwen3", fused_linear_cross_entropy))

def apply_liger_kernel_to_qwen3_vl(rope=True, fused_linear_cross_entropy=True, model=None):
    from liger_kernel.transformers.model.output_classes import LigerQwen3VLCausalLMOutputWithPast  # noqa: F401

MODEL_TYPE_TO_APPLY_LIGER_FN = {"qwen3": apply_liger_kernel_to_qwen3, "qwen3_vl": apply_liger_kernel_to_qwen3_vl}
'''


@pytest.fixture
def fake_liger(tmp_path, monkeypatch):
    pkg = tmp_path / "site" / "liger_kernel"
    (pkg / "transformers" / "model").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "transformers" / "__init__.py").write_text("")
    (pkg / "transformers" / "model" / "__init__.py").write_text("")
    (pkg / "transformers" / "model" / "output_classes.py").write_text("class LigerQwen3CausalLMOutputWithPast: ...\n")
    (pkg / "transformers" / "monkey_patch.py").write_text(FAKE)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setattr(modeling, "on_gpu", lambda: True)
    monkeypatch.setattr(modeling, "_LIGER_DECISIONS", {})
    yield
    for name in [m for m in sys.modules if m == "liger_kernel" or m.startswith("liger_kernel.")]:
        del sys.modules[name]


def _model(model_type: str):
    return types.SimpleNamespace(config=types.SimpleNamespace(model_type=model_type))


def test_auto_turns_liger_off_where_its_patch_fails(fake_liger, tmp_path, caplog):
    cfg = make_config(tmp_path, train={"liger": "auto"})
    with caplog.at_level(logging.INFO, logger="payload.train"):
        assert modeling.use_liger(cfg, _model("qwen3_vl")) is False
    lines = [r.getMessage() for r in caplog.records if "liger" in r.getMessage()]
    assert len(lines) == 1
    assert "off" in lines[0] and "qwen3_vl" in lines[0] and "LigerQwen3VLCausalLMOutputWithPast" in lines[0]
    assert modeling.use_liger(cfg) is False  # the decision sticks (the harness records it after the run)


def test_auto_turns_liger_on_where_its_patch_applies(fake_liger, tmp_path):
    cfg = make_config(tmp_path, train={"liger": "auto"})
    assert modeling.use_liger(cfg, _model("qwen3")) is True
    from liger_kernel.transformers.monkey_patch import APPLIED

    assert APPLIED == [("qwen3", False)]  # with the trainer's kernel config: TRL's fused LM head stays
    assert modeling.use_liger(cfg) is True


def test_auto_off_for_a_model_type_liger_does_not_know(fake_liger, tmp_path):
    cfg = make_config(tmp_path, train={"liger": "auto"})
    assert modeling.use_liger(cfg, _model("llama4")) is False


def test_true_fails_loudly_with_the_reason(fake_liger, tmp_path):
    cfg = make_config(tmp_path, train={"liger": True})
    with pytest.raises(PayloadError, match=r"train.liger is true but liger-kernel's qwen3_vl patch failed .*ImportError"):
        modeling.use_liger(cfg, _model("qwen3_vl"))
    assert modeling.use_liger(cfg, _model("qwen3")) is True


def test_off_without_liger_or_gpu(tmp_path, monkeypatch):
    monkeypatch.setattr(modeling, "_LIGER_DECISIONS", {})
    cfg = make_config(tmp_path, train={"liger": "auto"})
    assert modeling.use_liger(cfg, _model("qwen3")) is False  # no liger-kernel, no GPU here
    assert modeling.use_liger(make_config(tmp_path, train={"liger": False}), _model("qwen3")) is False
