"""Which attention kernel a run loads, for each batch kind and what the machine has (payload/model/attention.py).

The decision is a plain function of (batch kind, flash-attn installed, CUDA GPU and its compute
capability), tested here for each case on CPU; loading on CPU goes through the same list.

Run: .venv/bin/python -m pytest -x -q tests/payload/model/test_attention.py
"""

from __future__ import annotations

import logging

import pytest

from train_fixtures import make_config, train_env

from payload.model.attention import (
    PACKED,
    PADDED,
    PADDING_FREE,
    Machine,
    batch_kind,
    candidates,
    order,
)

__all__ = ["train_env"]  # the fixture, imported for pytest

CPU = Machine(cuda=False)
H100 = Machine(cuda=True, capability=(9, 0), flash_attn=False)
H100_FLASH = Machine(cuda=True, capability=(9, 0), flash_attn=True)
T4_FLASH = Machine(cuda=True, capability=(7, 5), flash_attn=True)


def names(batch, machine):
    return [impl for impl, _ in order(batch, machine)]


def first(batch, machine):
    return order(batch, machine)[0]


def test_batch_kinds():
    assert batch_kind(packing=True, padding_free=False) == PACKED
    assert batch_kind(packing=False, padding_free=True) == PADDING_FREE
    assert batch_kind(packing=False, padding_free=False) == PADDED


@pytest.mark.parametrize("batch", [PACKED, PADDING_FREE])
def test_variable_length_batches_go_to_a_kernel_without_a_dense_mask(batch):
    label = "packed batch" if batch == PACKED else "padding-free batch"
    assert names(batch, H100_FLASH) == ["flash_attention_2", "flex_attention", "sdpa", "eager"]
    assert first(batch, H100_FLASH) == ("flash_attention_2",
                                        f"{label}: flash-attn runs its records as variable-length sequences")
    assert names(batch, H100) == ["flex_attention", "sdpa", "eager"]
    assert first(batch, H100) == ("flex_attention",
                                  f"{label}, flash-attn not installed: flex_attention skips the masked blocks")
    # sdpa only where neither works: no GPU, or one older than Ampere (T4)
    assert first(batch, CPU) == ("sdpa", f"{label}, no CUDA GPU: sdpa attends through a block-diagonal mask")
    assert names(batch, T4_FLASH) == ["sdpa", "eager"]
    assert "compute capability 7.5 is below 8.0" in first(batch, T4_FLASH)[1]


def test_padded_batches_keep_sdpa_unless_flash_attn_unpads_them():
    assert names(PADDED, H100) == ["sdpa", "eager"]
    assert first(PADDED, H100) == ("sdpa", "padded batch, flash-attn not installed: sdpa with a padding mask")
    assert names(PADDED, H100_FLASH) == ["flash_attention_2", "sdpa", "eager"]
    assert first(PADDED, H100_FLASH)[1] == "padded batch: flash-attn unpads it"
    assert names(PADDED, CPU) == ["sdpa", "eager"] and names(PADDED, T4_FLASH) == ["sdpa", "eager"]


def test_an_explicit_list_is_honoured_with_a_hint(tmp_path, caplog):
    cfg = make_config(tmp_path, "x", model={"name_or_path": "m", "attn_implementation": ["sdpa", "eager"]})
    with caplog.at_level(logging.WARNING, logger="payload.train"):
        got = candidates(cfg, PADDING_FREE, H100)
    assert [i for i, _ in got] == ["sdpa", "eager"]
    assert got[0][1] == "padding-free batch: set in model.attn_implementation ['sdpa', 'eager']"
    assert "puts sdpa first for a padding-free batch" in caplog.text and "`auto` would pick flex_attention" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="payload.train"):
        candidates(cfg, PADDED, H100)  # a padded batch: sdpa is what auto picks too
        candidates(cfg, PADDING_FREE, CPU)  # nothing better runs on a CPU
    assert caplog.text == ""
    auto = make_config(tmp_path, "y", model={"name_or_path": "m"})
    assert auto.model.attn_implementation == "auto" and candidates(auto, PACKED, H100) == order(PACKED, H100)


def test_loading_on_cpu_takes_the_first_that_runs_and_says_why(train_env, caplog):
    from payload.model import modeling

    cfg = make_config(train_env, "attn", model={"name_or_path": "tiny", "tiny": {"arch": "qwen3"}})
    path = modeling.base_model_path(cfg)
    with caplog.at_level(logging.INFO, logger="payload.train"):
        model, impl, why = modeling.load_model_for(cfg, path, None, PADDING_FREE)
    assert impl == "sdpa" == model.config._attn_implementation
    assert why == "padding-free batch, no CUDA GPU: sdpa attends through a block-diagonal mask"
    assert f"attention sdpa ({why})" in caplog.text
    cfg.model.attn_implementation = ["flex_attention", "eager"]
    model, impl, why = modeling.load_model_for(cfg, path, None, PACKED)
    assert impl == "eager" and "flex_attention: needs a CUDA GPU of compute capability 8.0+ (no CUDA GPU)" in why


def test_launch_status_says_which_attention_ran_and_why(capsys):
    """The payload writes `attention` to status.json; `launch status RUN` shows it under the table."""
    from launcher.runs import experiment
    from launcher.runs import refresh as runs
    from launcher.backends import RemoteStatus
    from launcher.store.registry import Run

    run = Run(id="r1", profile="sonia-h100", backend="skypilot", started_at=1000.0, state="running",
              price_per_hour=6.58, budget_usd=40.0)
    said = "flex_attention: padding-free batch, flash-attn not installed: flex_attention skips the masked blocks"
    run.remote = RemoteStatus.from_report("running", {"state": "training", "step": 3, "attention": said})
    row = runs.status_row(run)
    assert row["attention"] == said
    experiment.print_differences(row)
    assert f"attention: {said}" in " ".join(capsys.readouterr().out.split())


def test_a_cpu_build_of_torch_is_a_machine_without_cuda_and_torch_is_not_imported_to_say_so(monkeypatch):
    """The local and test lock's torch is `+cpu`: no CUDA GPU whatever the host has, so preflight (which
    asks on every `launch up`) and the attention choice say so without importing torch. Any other build
    is asked through torch, as before."""
    import subprocess
    import sys
    from importlib import metadata

    from payload.model import attention

    code = ("import sys; from payload.model.attention import this_machine; from payload.preflight import gpu_info; "
            "m = this_machine(); g = gpu_info({}); print(m.cuda, m.capability, g, 'torch' in sys.modules)")
    if metadata.version("torch").endswith("+cpu"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        assert out.split() == ["False", "None", "(None,", "1,", "'no", "GPU')", "False"], out
    monkeypatch.setattr(metadata, "version", lambda name: "2.13.0+cu128")
    assert not attention.cpu_build_of_torch()
    monkeypatch.setattr(metadata, "version", lambda name: "2.13.0+cpu")
    assert attention.cpu_build_of_torch()
