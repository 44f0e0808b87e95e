"""The memory estimate is held to the GPU measurements committed in bench/results/ (issue 30 item 6).

Every GPU row that ran (payload and plain-Trainer baseline) is estimated by payload/model/memory.py from
what the row describes: the model at the harness's shape (its config.json, as the harness built it),
batch and sequence, method, checkpointing, packing/padding-free, the attention that ran, Liger, the
QLoRA preparation; the estimate must be within 0.85-1.15 of the measured peak (torch's peak reserved +
CUDA memory outside torch).

Padded batches (no packing) pad to the longest record of each batch, not to max_seq_length: the peak
of a 15-step run is at its longest batch. Rows that record it give `longest_row_tokens`; for older
rows it is rebuilt from what the row says: the harness's synthetic records (bench/gpu/gpu_data.py,
seed 42) in the Trainer's order (RandomSampler seeded by `train.seed`, 42). The rebuilt order is
checked against the row's own measured tokens per step before it is used.
"""

from __future__ import annotations

import json
import sys
from functools import lru_cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(REPO / "bench" / "gpu"), str(REPO / "bench")]

import gpu_modes  # noqa: E402

from payload.model.memory import Kernels, dims_from_config, estimate_gpu_memory_gb  # noqa: E402

RESULTS = REPO / "bench" / "results"
TRAIN_SEED = 42  # the Trainer's seed in the harness's run config (payload.config.schema default)


def gpu_rows() -> list[tuple[str, dict]]:
    out = []
    for path in sorted(RESULTS.glob("*.json")):
        data = json.loads(path.read_text())
        if data.get("smoke") or not data.get("device"):
            continue
        out += [(path.name, r) for r in data["rows"] if r.get("status") == "ok" and r.get("measured_peak_gb")]
    return out


ROWS = gpu_rows()


def test_the_h200_table_is_committed():
    assert {(r["mode"], r["role"]) for name, r in ROWS if name == "nvidia-h200-2026-11-26.json"} >= {
        ("lora-bf16-sdpa", "payload"), ("lora-bf16-flex", "payload"), ("qlora-4bit", "payload"),
        ("lora-bf16-vl", "payload"), ("lora-fp16", "payload"), ("lora-bf16-sdpa", "baseline")}


@pytest.mark.parametrize("name,row", ROWS, ids=[f"{n.split('.')[0]}#{r['mode']}-{r['role']}" for n, r in ROWS])
def test_estimate_within_15_percent_of_the_measured_peak(name, row):
    data = json.loads((RESULTS / name).read_text())
    cfg = row_config(data, row)
    est = estimate_gpu_memory_gb(cfg, data.get("gpu_memory_gb"), 1, dims=shape_dims(row["shape"]),
                                 fused_lm_head=row["role"] == "payload", kernels=row_kernels(name, data, row))
    ratio = est["total_gb"] / row["measured_peak_gb"]
    assert 0.85 <= ratio <= 1.15, (f"{name}#{row['mode']} {row['role']}: estimate {est['total_gb']} GiB "
                                   f"{est['components_gb']} vs measured {row['measured_peak_gb']} (ratio {ratio:.2f})")


def test_qlora_without_the_upcast_is_estimated_below_bf16_lora():
    """The default after item 4: the same QLoRA row without the fp32 upcast needs less than bf16 LoRA at
    the same shape (what the next `make gpu-check --modes qlora-4bit` must show)."""
    data = json.loads((RESULTS / "nvidia-h200-2026-11-26.json").read_text())
    rows = {(r["mode"], r["role"]): r for r in data["rows"]}
    q, lora = rows[("qlora-4bit", "payload")], rows[("lora-bf16-sdpa", "payload")]
    dims = shape_dims("qwen3-8b")

    def est(row, upcast):
        k = Kernels(attention=row["attn_used"], liger=row["liger"], padding_free=True, kbit_upcast=upcast)
        return estimate_gpu_memory_gb(row_config(data, row), 139.8, 1, dims=dims, kernels=k)["total_gb"]

    assert est(q, False) < est(lora, False) < est(q, True)
    assert est(q, True) / q["measured_peak_gb"] == pytest.approx(1.0, abs=0.15)


def test_planning_figures_are_the_committed_measurements():
    """launcher/plan/throughput.py MEASURED: each entry is a payload row of the file it cites, on that GPU."""
    from gpu_flops import gpu_key
    from gpu_report import CATALOG_NAME

    from launcher.plan.throughput import MEASURED

    assert MEASURED
    for key, (rate, size, cite) in MEASURED.items():
        path, mode = cite.split("#")
        data = json.loads((REPO / path).read_text())
        row = next(r for r in data["rows"] if r["mode"] == mode and r["role"] == "payload")
        assert row["status"] == "ok" and (rate, size) == (row["tokens_per_s"], row["params_b"]), cite
        assert CATALOG_NAME[gpu_key(data["device"])] == key[0], cite
        method = "full" if mode.startswith("full") else "qlora" if mode.startswith("qlora") else "lora"
        assert key[1] == method, cite


# ----------------------------------------------------------------------------- what a row describes


def row_config(data: dict, row: dict):
    from payload.config import RunConfig

    m = gpu_modes.mode(row["mode"])
    body = gpu_modes.run_config_dict(
        m, model_dir="/models/" + row["shape"], kind=gpu_modes.SHAPES[row["shape"]]["kind"], data_path="/data/mix.jsonl",
        volume="/volume", run_id="row", steps=data["steps"], batch=data["batch"], seq=data["seq"], smoke=False,
        offload=bool(row.get("offload_optimizer")))
    body["train"]["gradient_checkpointing"] = bool(row["gradient_checkpointing"])
    if row["role"] == "baseline":
        body["train"]["packing"] = False  # a plain Trainer pads
    return RunConfig.model_validate(body)


def row_kernels(name: str, data: dict, row: dict) -> Kernels:
    method = gpu_modes.mode(row["mode"])["method"]
    # rows without `kbit_preparation` ran before payload.model.modeling dropped peft's fp32 upcast
    upcast = method == "qlora" and row.get("kbit_preparation", "fp32-upcast") == "fp32-upcast"
    padding_free = bool(row.get("padding_free"))
    return Kernels(attention=row["attn_used"], liger=bool(row.get("liger")), padding_free=padding_free,
                   padded_len=None if padding_free else longest_row(name, data, row), kbit_upcast=upcast)


def longest_row(name: str, data: dict, row: dict) -> int:
    if row.get("longest_row_tokens"):
        return row["longest_row_tokens"]
    lengths = batch_lengths(name)
    warm = data["warmup"]
    real = sum(sum(b) for b in lengths[warm:]) / (len(lengths) - warm)
    assert real == pytest.approx(row["tokens_per_step"], abs=0.1), "the rebuilt batches are not the ones that ran"
    return max(max(b) for b in lengths)


@lru_cache(maxsize=None)
def batch_lengths(name: str) -> list[tuple[int, ...]]:
    """Token lengths of each batch the run trained, rebuilt from the row's data description."""
    import tempfile

    import torch
    from gpu_data import write_records

    data = json.loads((RESULTS / name).read_text())
    d, batch, steps = data["data"], data["batch"], data["steps"]
    tok = tokenizer()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "mix.jsonl"
        write_records(path, tok, d["records"], d["max_length"])
        lines = path.read_text(encoding="utf-8").splitlines()
    order = torch.randperm(len(lines), generator=torch.Generator().manual_seed(TRAIN_SEED)).tolist()

    def length(i: int) -> int:  # as the harness tokenizes (bench/gpu/gpu_measure.py tokenize)
        msgs = json.loads(lines[i])["messages"]
        return min(len(tok.apply_chat_template(msgs, tokenize=True, return_dict=True)["input_ids"]), data["seq"])

    return [tuple(length(i) for i in order[s * batch:(s + 1) * batch]) for s in range(steps)]


@lru_cache(maxsize=None)
def tokenizer():
    from payload.model.tiny import build_tiny_tokenizer

    return build_tiny_tokenizer(None)


@lru_cache(maxsize=None)
def shape_dims(shape: str):
    """The model's shape as the harness built it (bench/gpu/gpu_child.py prepare: payload.model.tiny's config)."""
    from payload.model.tiny import shape_config

    cfg = shape_config(gpu_modes.SHAPES[shape]["arch"], gpu_modes.shape_dims(shape), tokenizer(),
                       gpu_modes.vision_of(shape))
    return dims_from_config(cfg.to_dict(), f"gpu-check shape {shape}")
