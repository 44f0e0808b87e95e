"""`make gpu-check`'s harness on CPU (bench/gpu/gpu_check.py --smoke): the same code the GPU run uses -
a process per run, the payload's training path and the plain-Trainer baseline, the estimate beside
the measurement, JSON + markdown - at tiny shapes, so the harness never rots. The GPU figures
themselves come from running it on a GPU (bench/README.md)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO / "bench" / "gpu"), str(REPO / "bench")]
sys.path.insert(0, str(REPO / "tests"))

import gpu_check  # noqa: E402
import gpu_env  # noqa: E402
import gpu_flops  # noqa: E402
import gpu_modes  # noqa: E402

from payload.preflight import versions  # noqa: E402
from payload.config import RunConfig  # noqa: E402
from payload.model.memory import KNOWN_QWEN, ModelDims  # noqa: E402
from train_fixtures import train_env  # noqa: E402,F401  (fixture)


def smoke(workdir, out, *args):
    proc = subprocess.run([sys.executable, "bench/gpu/gpu_check.py", "--smoke", "--workdir", str(workdir),
                           "--out", str(out), *args], cwd=REPO, capture_output=True, text=True, timeout=480)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [jpath] = out.glob("cpu-*-smoke.json")
    res = json.loads(jpath.read_text())
    return proc, jpath, res, {(r["mode"], r["role"]): r for r in res["rows"]}


@pytest.mark.timeout(900)  # ~1 min alone; minutes on a loaded 2-core machine
def test_smoke_runs_every_mode_in_its_own_process_and_writes_the_table(tmp_path):
    proc, jpath, res, rows = smoke(tmp_path / "w", tmp_path / "results", "--modes", ",".join(gpu_modes.MODE_NAMES))
    assert res["env"]["versions"]["trl"] and not res["env"]["problems"] and res["data"]["text"] == "cycle"
    for mode in gpu_modes.SMOKE_MODES:  # text (packed, padding-free), vision-language (unpacked), images
        for role in ("payload", "baseline") if mode != "lora-bf16-images" else ("payload",):
            r = rows[(mode, role)]
            assert r["status"] == "ok", r
            assert r["tokens_per_s"] > 0 and r["measured_steps"] == 3 and r["flops_per_token_g"] > 0
            assert r["estimate_gb"] > 0 and r["peak_rss_gb"] > 0 and r["mfu"] is None
            assert "no CUDA device" in r["gpu_memory_note"] and r.get("measured_peak_gb") is None
            # the loss at every step of 4 (>= 4 log points), falling on the learnable synthetic data
            steps, losses = zip(*r["losses"])
            assert steps == (1, 2, 3, 4) and losses[-1] < losses[0] - 0.05, r["losses"]
            assert r["longest_row_tokens"] > 0  # what the estimator test reads for padded rows
    images = rows[("lora-bf16-images", "payload")]  # one 320x256 image (80 tokens) + ~140 text tokens a record
    assert images["tokens_per_step"] > 2 * 80 + 2 * 100 and images["context_tokens"] > 180
    assert ("lora-bf16-images", "baseline") not in rows
    assert rows[("lora-bf16-sdpa", "payload")]["padding_free"] is True
    assert rows[("lora-bf16-sdpa", "payload")]["real_token_fraction"] == 1.0
    assert rows[("lora-bf16-sdpa", "baseline")]["real_token_fraction"] < 1.0  # padded batches
    assert rows[("lora-bf16-sdpa", "payload")]["gradient_checkpointing_reason"] == "auto: off on CPU"
    assert rows[("lora-bf16-vl", "baseline")]["attn_used"] == "sdpa"  # `auto` (nothing listed): the runbooks' sdpa
    for name in set(gpu_modes.MODE_NAMES) - set(gpu_modes.SMOKE_MODES):
        assert rows[(name, "payload")]["status"] == "skipped", rows[(name, "payload")]
    assert "needs a CUDA GPU" in rows[("full-zero3", "payload")]["reason"]  # deepspeed: the GPU run counts
    md = jpath.with_suffix(".md").read_text()
    assert all(f"| {m} |" in md for m in gpu_modes.MODE_NAMES) and "Smoke run" in md
    assert "lora-bf16-sdpa" in proc.stdout and "wrote" in proc.stdout

    # a second invocation in the same --workdir trains fresh runs (it was refused as a changed-config
    # resume of the first); models and data are reused
    _proc, _j, _res, again = smoke(tmp_path / "w", tmp_path / "again", "--modes", "lora-bf16-sdpa",
                                   "--baselines", "none")
    assert again[("lora-bf16-sdpa", "payload")]["status"] == "ok", again
    assert again[("lora-bf16-sdpa", "payload")]["measured_steps"] == 3 and len(again) == 1
    assert not list((tmp_path / "w" / "runs" / "runs").iterdir())  # run dirs removed after each run


def test_full_zero3_is_wired_as_a_payload_run():
    """ZeRO-3 cannot run here (no deepspeed on CPU): the config the GPU run trains with is checked
    instead - full fine-tune, DeepSpeed stage 3, optimizer offload only when asked."""
    from payload.model import adapters, sharding

    m = gpu_modes.mode("full-zero3")
    body = gpu_modes.run_config_dict(m, model_dir="/m", kind="image_text_to_text", data_path="/d/mix.jsonl",
                                     volume="/v", run_id="r", steps=15, batch=2, seq=4096, smoke=False)
    cfg = RunConfig.model_validate(body)
    assert cfg.train.method == "full" and cfg.train.deepspeed.zero_stage == 3
    assert cfg.train.learning_rate == 2e-5 and cfg.train.logging_steps == 3
    ds = sharding.deepspeed_config(cfg.train.deepspeed)
    assert ds["zero_optimization"]["stage"] == 3 and "offload_optimizer" not in ds["zero_optimization"]
    assert gpu_modes.skip_reason(m, cuda=True, have=lambda p: True) is None

    # ZeRO-3 leaves each parameter a 0-element shard (its size in ds_numel): the trainable count the
    # payload checks after building the trainer read 0 and refused the run ("no trainable parameters")
    import torch

    model = torch.nn.Module()
    model.lm = torch.nn.Linear(4, 4)
    for p in model.parameters():
        p.ds_numel = p.numel()
        p.data = torch.empty(0)
    counts = adapters.check_vision_frozen(cfg, model)
    assert counts["trainable_params"] == counts["total_params"] == 16 + 4


def test_a_crashed_or_hung_run_is_a_row_with_a_reason(tmp_path):
    crashed = gpu_check.run_child({"role": "baseline", "mode": "no-such-mode"}, tmp_path, timeout=120)
    assert crashed["status"] == "failed" and "no-such-mode" in crashed["reason"]
    hung = gpu_check.run_child({"role": "baseline", "mode": "x"}, tmp_path, timeout=0.2)
    assert hung["status"] == "timeout" and "timed out after" in hung["reason"]


def test_merge_combines_partial_runs_of_one_gpu(tmp_path):
    def part(name, rows):
        p = tmp_path / name
        p.write_text(json.dumps({"date": "2026-11-23", "device": "NVIDIA H100 80GB HBM3", "smoke": False,
                                 "steps": 20, "warmup": 5, "batch": 2, "seq": 4096, "command": name, "data": {},
                                 "env": {}, "rows": rows}))
        return str(p)

    ok = {"status": "ok", "tokens_per_s": 3000.0, "estimate_gb": 40.0, "measured_peak_gb": 38.0}
    a = part("a.json", [{"mode": "lora-bf16-sdpa", "role": "payload", **ok},
                        {"mode": "lora-bf16-sdpa", "role": "baseline", **ok, "tokens_per_s": 1500.0}])
    b = part("b.json", [{"mode": "lora-bf16-flex", "role": "payload", "baseline_of": "lora-bf16-sdpa", **ok,
                         "tokens_per_s": 4500.0}])
    assert gpu_check.main(["--merge", a, b, "--out", str(tmp_path / "out")]) == 0
    md = (tmp_path / "out" / "nvidia-h100-80gb-hbm3-2026-11-23.md").read_text()
    assert "| lora-bf16-sdpa | 3,000 |" in md and "2.00x" in md and "3.00x" in md  # flex shares the baseline
    assert "1.05)" in md  # estimate / measured peak


def test_model_flops_and_gpu_peaks():
    d8 = ModelDims(*KNOWN_QWEN["qwen3/8"])
    m = gpu_flops.matmul_params(d8)
    assert m == pytest.approx(8.19e9 - 151936 * 4096, rel=0.01)  # all but the embedding lookup
    assert gpu_flops.flops_per_token(d8, "full") == 6 * m
    ctx = 600.0
    lora = gpu_flops.flops_per_token(d8, "lora", lora_params=43_000_000, context=ctx)
    assert lora == 4 * m + 6 * 43_000_000 + 6 * 36 * 32 * 128 * ctx
    assert gpu_flops.peak_tflops("NVIDIA H100 80GB HBM3")[0] == 989.0
    assert gpu_flops.peak_tflops("NVIDIA H100 PCIe")[0] == 756.0
    assert gpu_flops.peak_tflops("Tesla T4")[0] == 65.0 and gpu_flops.peak_tflops("NVIDIA L4")[0] == 121.0
    assert gpu_flops.peak_tflops(None)[0] is None
    assert gpu_flops.mfu(1000.0, 50e9, 100.0) == pytest.approx(0.5)


def test_wheels_fill_only_what_is_missing_or_too_old(tmp_path):
    # pynvml stands for a carried dependency this environment lacks (not in the dev lock; hjson was,
    # until deepspeed brought it in)
    for name in ("trl-1.16.0-py3-none-any.whl", "pynvml-12.0.0-py3-none-any.whl",
                 "bitsandbytes-0.50.2-py3-none-manylinux_2_24_x86_64.whl"):
        (tmp_path / (".whl-bnb" if name.startswith("bits") else ".whl")).mkdir(exist_ok=True)
        (tmp_path / (".whl-bnb" if name.startswith("bits") else ".whl") / name).write_bytes(b"")
    have = gpu_env.wheels(tmp_path)
    assert set(have) == {"trl", "pynvml", "bitsandbytes"}
    picked = {p.name.split("-")[0] for p in gpu_env.to_install(gpu_env.wanted([]), have)}
    assert picked == {"pynvml", "bitsandbytes"}  # trl 1.16 installed here satisfies the minimum
    picked = {p.name.split("-")[0] for p in gpu_env.to_install({"trl": "99"}, have)}
    assert "trl" in picked
    assert gpu_env.wanted([gpu_modes.mode("lora-bf16-vl")])["transformers"] == "5.18"
    assert gpu_env.unmet_dependencies(["trl", "peft"]) == []


def test_minimum_versions_are_checked_per_run():
    base = {"data": {"sources": [{"name": "d", "hf_dataset": "a/b"}]},
            "model": {"name_or_path": "Qwen/Qwen3-8B"}}
    assert versions.problems(RunConfig.model_validate(base)) == []
    qlora = RunConfig.model_validate({**base, "train": {"method": "qlora"}})
    [line] = versions.problems(qlora)
    assert line.startswith("bitsandbytes is not installed (needs >= 0.45 for method qlora)")
    assert versions.older("2.11.0+cu130", "2.8") is False and versions.older("5.17.0", "5.18") is True
    with pytest.raises(ValueError, match="full fine-tuning in `model.dtype: float16` needs fp32 master"):
        RunConfig.model_validate({**base, "model": {"name_or_path": "x", "dtype": "float16"},
                                  "train": {"method": "full"}})


def test_planning_cites_a_measured_figure(monkeypatch):
    """A `make gpu-check` figure is the speed model's first anchor on its GPU and method."""
    from launcher.plan import speed as speed_model
    from launcher.plan import throughput

    cite = "bench/results/nvidia-h100-80gb-hbm3-2026-12-01.json#lora-bf16-sdpa"
    monkeypatch.setitem(throughput.MEASURED, ("H100-SXM", "lora"), (3200.0, 8.0, cite))
    t = speed_model.estimate("H100-SXM", "lora", 8.0)
    assert t.mid == pytest.approx(3200.0) and t.kind == "gpu-check" and t.source.startswith(f"measured {cite}")
    assert speed_model.estimate("H100-SXM", "lora", 32.0).source.startswith("runbook 000")  # nearer in size


@pytest.mark.parametrize("arch", ["qwen3", "qwen3_vl"])
def test_padding_free_rows_keep_records_apart(tmp_path, arch):
    """What TRL's padding-free packing relies on, at the shapes the GPU check builds: one row, position
    ids restarting per record, no attention mask, no cache (as in training) -> transformers gives
    every record the logits it has alone (sdpa; flash-attention uses the same boundaries as varlen).
    Holds for Qwen3-VL on text too, though TRL packs no vision-language dataset."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    from payload.model.tiny import materialize_shape

    path = materialize_shape(tmp_path / arch, arch, ModelDims(64, 2, 128, 4, 2, 16, 1024, True), dtype="float32")
    cls = AutoModelForCausalLM if arch == "qwen3" else AutoModelForImageTextToText
    model = cls.from_pretrained(path, attn_implementation="sdpa").eval()

    def logits(ids, **kw):
        if arch != "qwen3":
            kw["mm_token_type_ids"] = torch.zeros_like(ids)
        with torch.no_grad():
            return model(input_ids=ids, use_cache=False, **kw).logits

    a, b = torch.randint(10, 1000, (1, 7)), torch.randint(10, 1000, (1, 5))
    packed = logits(torch.cat([a, b], 1), position_ids=torch.cat([torch.arange(7), torch.arange(5)])[None])
    torch.testing.assert_close(packed[:, :7], logits(a), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(packed[:, 7:], logits(b), rtol=1e-4, atol=1e-4)


def test_partial_checkpointing_reaches_the_trainer(train_env, monkeypatch):
    """`auto` may pick 1 layer in n (GPU only); the trainer gets transformers' every_n_layers and
    checkpoints exactly those decoder layers, and training runs (tiny model, CPU, 2 steps)."""
    from train_fixtures import make_config, train_in_process, write_text_data

    from payload.model import modeling

    monkeypatch.setattr(modeling, "checkpointing_decision", lambda cfg: (2, "forced by the test"))
    cfg = make_config(train_env, "every2", train={"max_steps": 2, "gradient_checkpointing": "auto"},
                      model={"name_or_path": "tiny-qwen3", "attn_implementation": ["sdpa"],
                             "tiny": {"arch": "qwen3", "num_layers": 4}})
    write_text_data(cfg.run_dir, n_train=8, n_val=0)
    (cfg.run_dir / "data" / "val.jsonl").unlink()
    seen = {}
    real_enable = None

    def spy(self, *args, **kwargs):
        seen.update(kwargs)
        return real_enable(self, *args, **kwargs)

    from transformers import PreTrainedModel

    real_enable = PreTrainedModel.activation_checkpointing_enable
    monkeypatch.setattr(PreTrainedModel, "activation_checkpointing_enable", spy)
    summary = train_in_process(cfg)
    assert summary["steps"] == 2 and seen.get("every_n_layers") == 2
