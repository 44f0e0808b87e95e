"""Stages (runbook 003): sft -> dpo -> grpo on CPU with a tiny model, chained adapters, rewards,
a SIGKILL in the middle of DPO resuming in DPO, config errors, the fp16 path."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
import torch

from payload.volume import checkpoints as ck
from payload import layout
from stage_fixtures import stage_config, write_stage_data
from train_fixtures import (  # noqa: F401
    KILL_TIMEOUT,
    adapter_tensors,
    start_payload,
    train_env,
    wait_for,
    write_config,
)



def _sha(path: Path) -> str:
    from payload.volume.checksums import sha256_file

    return sha256_file(Path(path) / "adapter_model.safetensors")


def _differ(a: dict, b: dict) -> bool:
    assert a.keys() == b.keys()
    return any(not torch.equal(a[k], b[k]) for k in a)


def test_three_stages_chain_adapters_and_call_the_named_rewards(train_env, tmp_path, monkeypatch):
    log = tmp_path / "rewards.log"
    monkeypatch.setenv("REWARD_LOG", str(log))
    data = write_stage_data(tmp_path / "data")
    cfg = stage_config(train_env, data)
    import payload.train.stages as stages

    summary = stages.main(cfg)
    rd = cfg.run_dir
    names = ["1-sft", "2-dpo", "3-rl"]
    assert [s["name"] for s in summary["stages"]] == names
    assert [s["steps"] for s in summary["stages"]] == [4, 4, 2] and summary["state"] == "completed"
    adapters = {n: rd / "stages" / n / layout.ADAPTER_DIR for n in names}
    w = {n: adapter_tensors(p) for n, p in adapters.items()}
    # sft trained from a fresh LoRA (B starts at zero): its B matrices are not zero any more
    assert any(k.endswith("lora_B.weight") and v.abs().sum() > 0 for k, v in w["1-sft"].items())
    assert _differ(w["1-sft"], w["2-dpo"]) and _differ(w["2-dpo"], w["3-rl"]) and _differ(w["1-sft"], w["3-rl"])
    # each later stage started from exactly the previous stage's final adapter
    for prev, n in zip(names, names[1:]):
        started = json.loads((rd / "stages" / n / "started_from.json").read_text())
        assert Path(started["adapter"]) == adapters[prev] and started["sha256"] == _sha(adapters[prev])
    assert not (rd / "stages" / "1-sft" / "started_from.json").exists()
    # GRPO called the user function named in the profile with the records' answers
    calls = [json.loads(x) for x in log.read_text().splitlines()]
    assert calls and all(c["n"] == 2 and len(c["answers"]) == 2 and c["answers"][0].isdigit() for c in calls)
    grpo_metrics = [json.loads(x) for x in (rd / "stages" / "3-rl" / layout.METRICS).read_text().splitlines()]
    logged = set().union(*grpo_metrics)
    assert {"rewards/number_match/mean", "rewards/format/mean", "rewards/counting/mean"} <= logged, logged
    # the run's outputs: last adapter, every stage's adapter, metrics with their stage, status with stage
    assert _sha(rd / layout.ADAPTER_DIR) == _sha(adapters["3-rl"])
    for n in names:
        assert _sha(rd / layout.STAGE_ADAPTERS / n / "adapter") == _sha(adapters[n])
    stages_seen = [json.loads(x)["stage"] for x in (rd / layout.METRICS).read_text().splitlines()]
    assert stages_seen[0] == "1-sft" and stages_seen[-1] == "3-rl"
    status = json.loads((rd / layout.STATUS).read_text())
    assert status["state"] == "completed" and status["stage"] == {"name": "rl", "kind": "grpo", "index": 3, "of": 3}
    # a second start trains nothing: every stage is finished
    before = {n: (rd / "stages" / n / layout.SUMMARY).read_text() for n in names}
    again = stages.main(cfg)
    assert [s["steps"] for s in again["stages"]] == [4, 4, 2]
    assert before == {n: (rd / "stages" / n / layout.SUMMARY).read_text() for n in names}


def test_sigkill_in_dpo_resumes_in_dpo_without_rerunning_sft(tmp_path):
    data = write_stage_data(tmp_path / "data")
    cfg = stage_config(tmp_path / "vol", data, run_id="killed", steps=(2, 8, 2), save_steps=2)
    config = write_config(cfg, tmp_path / "run.yaml")
    rd, log = cfg.run_dir, tmp_path / "train.log"
    dpo_ckpts = rd / "stages" / "2-dpo" / layout.CHECKPOINTS_DIR
    proc = start_payload("train", config, log)
    hit = wait_for(lambda: ck.latest_complete(dpo_ckpts) is not None, proc)
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=KILL_TIMEOUT)
    assert hit, log.read_text()[-3000:]
    status = json.loads((rd / layout.STATUS).read_text())
    assert status["stage"]["name"] == "dpo" and status["stage"]["index"] == 2 and status["state"] == "training"
    sft = rd / "stages" / "1-sft"
    sft_summary, sft_sha = (sft / layout.SUMMARY).read_text(), _sha(sft / layout.ADAPTER_DIR)
    sft_mtime = (sft / layout.ADAPTER_DIR / "adapter_model.safetensors").stat().st_mtime_ns
    killed_at = ck.step_of(ck.latest_complete(dpo_ckpts))
    assert 2 <= killed_at < 8
    proc = start_payload("train", config, log)
    assert proc.wait(timeout=KILL_TIMEOUT) == 0, log.read_text()[-3000:]
    # SFT was not trained again: its summary and adapter are untouched
    assert (sft / layout.SUMMARY).read_text() == sft_summary and _sha(sft / layout.ADAPTER_DIR) == sft_sha
    assert (sft / layout.ADAPTER_DIR / "adapter_model.safetensors").stat().st_mtime_ns == sft_mtime
    dpo = json.loads((rd / "stages" / "2-dpo" / layout.SUMMARY).read_text())
    assert dpo["state"] == "completed" and dpo["steps"] == 8
    assert dpo["resumed_from"] is not None and ck.step_of(Path(dpo["resumed_from"])) >= killed_at
    assert "stage 1/3 sft already finished: skipped" in log.read_text()
    run = json.loads((rd / layout.SUMMARY).read_text())
    assert run["state"] == "completed" and [s["steps"] for s in run["stages"]] == [2, 8, 2]


# ------------------------------------------------------------------------------------------- config


def _profile_errors(tmp_path, stages) -> list[str]:
    import yaml

    from payload.config import ConfigError, load_run_config
    from train_fixtures import demo_dict

    d = demo_dict()
    d["stages"] = stages
    p = tmp_path / "p.yaml"
    p.write_text(yaml.safe_dump(d, sort_keys=False))
    with pytest.raises(ConfigError) as e:
        load_run_config(p)
    return e.value.problems


@pytest.mark.parametrize("stages, expected", [
    ([{"kind": "grpo", "grpo": {"rewards": ["exact"]}}], "stages.0.grpo.rewards: unknown reward 'exact': use one of"),
    ([{"kind": "sft", "dpo": {"beta": 0.1}}], "stages.0: `dpo:` only applies to `kind: dpo`"),
    ([{"kind": "ppo"}], "stages.0.kind: Input should be 'sft', 'dpo' or 'grpo'"),
    ([{"kind": "dpo", "train": {"lr": 1}}], "train override(s) ['lr'] are not `train:` keys"),
    ([{"kind": "sft"}, {"kind": "sft"}], "stage names must be unique, repeated: ['sft']"),
    ([{"kind": "sft"}, {"kind": "grpo", "grpo": {"num_generations": 3}}],
     "= 4 must be a multiple of grpo.num_generations 3"),
    ([{"kind": "dpo", "dpo": {"betta": 1}}], "stages.0.dpo.betta: unknown key; did you mean `stages.0.dpo.beta`?"),
])
def test_stage_config_errors_are_one_line_with_the_key(tmp_path, stages, expected):
    problems = _profile_errors(tmp_path, stages)
    assert len(problems) == 1 and expected in problems[0], problems
    assert problems[0].startswith(f"{tmp_path / 'p.yaml'}:") and "\n" not in problems[0]


def test_a_profile_without_stages_is_unchanged():
    from payload.config import RunConfig, dump_run_config
    from train_fixtures import demo_dict

    cfg = RunConfig.model_validate(demo_dict())
    assert cfg.stages == [] and "stages" not in dump_run_config(cfg)
    staged = RunConfig.model_validate({**demo_dict(), "stages": [{"kind": "sft"}]})
    assert staged.config_hash() != cfg.config_hash()


# --------------------------------------------------------------------------------------------- fp16


def test_fp16_is_chosen_where_bf16_is_missing_and_scales_the_loss(monkeypatch, tmp_path):
    """A T4 (CUDA, no bf16): dtype auto -> float16, trainer args fp16 (GradScaler) for SFT and DPO;
    then one fp16-autocast step with loss scaling on CPU, as far as this torch allows."""
    from payload.model import modeling
    from payload.config import ModelConfig
    from payload.train.preference import dpo_config
    from payload.config.stages import stage_run_config
    from payload.train.arguments import sft_config

    monkeypatch.setattr(modeling, "on_gpu", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert modeling.resolve_dtype(ModelConfig(name_or_path="x")) == torch.float16
    cfg = stage_config(tmp_path / "vol", write_stage_data(tmp_path / "data"))
    for args in (sft_config(stage_run_config(cfg, 0), False, torch.float16),
                 dpo_config(stage_run_config(cfg, 1, tmp_path), torch.float16)):
        assert args.fp16 and not args.bf16 and not args.use_cpu
    monkeypatch.undo()
    try:
        lin = torch.nn.Linear(8, 8)
        opt = torch.optim.SGD(lin.parameters(), lr=0.1)
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 8)
        with torch.autocast("cpu", dtype=torch.float16):
            out = lin(torch.randn(4, 8))
    except (RuntimeError, AssertionError) as e:  # pragma: no cover - older torch builds
        pytest.skip(f"torch on CPU refuses fp16 autocast/GradScaler: {e}")
    assert out.dtype == torch.float16
    before = lin.weight.detach().clone()
    scaler.scale(out.float().pow(2).mean()).backward()
    scaler.step(opt)
    scaler.update()
    assert not torch.equal(before, lin.weight) and scaler.get_scale() > 0


# ------------------------------------------------------------------------------------------ profile


def test_spatial_profile_validates_renders_and_plans_each_stage():
    from click.testing import CliRunner

    from launcher.cli import cli
    from launcher.plan.estimate import plan_profile
    from launcher.profiles.profile import load_profile
    from launcher.catalog import plan_price
    from launcher.profiles.render import render_profile

    p = load_profile("spatial-vl-t4")
    assert [s.kind for s in p.stages] == ["sft", "dpo", "grpo"]
    assert (p.cluster.accelerators, p.cluster.use_spot) == ("T4:1", True)
    assert (p.train.max_seq_length, p.train.lora.r, p.train.gradient_accumulation_steps) == (2048, 16, 8)
    assert p.stages[2].grpo.num_generations == 4 and not p.stages[2].grpo.use_vllm
    assert [s.sources[0].max_records for s in (p.data, p.stages[1].data, p.stages[2].data)] == [1000, 500, 300]
    import sky

    from payload.config import load_run_config

    rendered = render_profile("spatial-vl-t4", plan_price)
    task_path = next(k for k in rendered if k.parent.name == "sky")
    assert rendered[task_path] == task_path.read_text()  # committed and fresh
    sky.Task.from_yaml(str(task_path)).validate()
    resolved = load_run_config(next(k for k in rendered if k.parent.name == "config"), env={})
    assert [s.label for s in resolved.stages] == ["sft", "dpo", "grpo"]
    plan = plan_profile(p)
    assert [s["name"] for s in plan.stages] == ["1-sft", "2-dpo", "3-grpo"]
    # runbook 003 on a T4: SFT ~4 h (1k), DPO ~2 h (500), GRPO ~3 h (300); within 40 %
    for row, runbook_h in zip(plan.stages, (4.0, 2.0, 3.0)):
        assert runbook_h * 0.6 < row["hours"] < runbook_h * 1.4, row
        assert row["memory"] == "fits" and row["usd"] == pytest.approx(row["hours"] * plan.price_per_hour, abs=0.01)
    assert plan.train_hours == pytest.approx(sum(r["hours"] for r in plan.stages), abs=0.01)
    assert plan.memory["status"] == "fits" and plan.memory["stage"] == "grpo"
    out = CliRunner().invoke(cli, ["plan", "spatial-vl-t4"], env={"COLUMNS": "80"})
    assert out.exit_code == 0, out.output
    for name in ("Stage 1-sft", "Stage 2-dpo", "Stage 3-grpo"):
        assert name in out.output


def test_a_stage_that_cannot_fit_is_refused_by_the_memory_estimate():
    from launcher.plan.estimate import memory_verdict
    from launcher.profiles.profile import load_profile

    p = load_profile("spatial-vl-t4")
    grpo = p.stages[2].model_copy(update={"train": {**p.stages[2].train, "per_device_batch_size": 64,
                                                    "gradient_accumulation_steps": 1}})
    big = p.model_copy(update={"stages": [p.stages[0], p.stages[1], grpo]})
    verdict = memory_verdict(big)
    assert verdict["status"] == "does not fit" and verdict["stage"] == "grpo", verdict


def test_vision_language_stages_train_on_images(train_env, tmp_path):
    """Runbook 003 is Qwen3-VL: DPO pairs and GRPO prompts with images, on a tiny Qwen3-VL."""
    from payload.config import RunConfig
    from train_fixtures import VL_MODEL, vl_records

    root = tmp_path / "vl"
    recs = [r for r in vl_records(root / "img", 12, 0) if isinstance(r["messages"][0]["content"], list)]
    pref, qa = [], []
    for i, r in enumerate(recs):
        img, ans = r["messages"][0]["content"][0]["image"], r["messages"][1]["content"]
        pref.append({"question": f"What color is image {i}?", "chosen": ans, "rejected": "Unknown.", "image": img})
        qa.append({"prompt": f"What color is image {i}?", "answer": ans.split()[-1].rstrip("."), "images": [img]})
    data = write_stage_data(root / "text")
    for name, rows in (("sft", recs), ("dpo", pref), ("grpo", qa)):
        data[name] = root / f"{name}.jsonl"
        data[name].write_text("".join(json.dumps(x) + "\n" for x in rows))
    body = stage_config(train_env, data, steps=(2, 2, 2)).model_dump(mode="json")
    body["model"], body["train"]["max_seq_length"] = VL_MODEL, 256
    body["stages"][2]["grpo"]["rewards"] = ["exact_match", "format"]
    import payload.train.stages as stages

    cfg = RunConfig.model_validate(body)
    summary = stages.main(cfg)
    assert [s["steps"] for s in summary["stages"]] == [2, 2, 2]
    rows = [json.loads(x) for x in (cfg.run_dir / "stages" / "2-dpo" / "data" / "train.jsonl").read_text().splitlines()]
    assert all(r["messages"][0]["content"][0]["type"] == "image" and r["rejected"] == "Unknown." for r in rows)
    w = [adapter_tensors(cfg.run_dir / layout.STAGE_ADAPTERS / n / "adapter") for n in ("1-sft", "2-dpo", "3-rl")]
    assert _differ(w[0], w[1])


def test_validate_names_a_missing_stage_data_file_with_its_line():
    from launcher.profiles.checks import data_file_report
    from launcher.profiles.profile import resolve_profile_path

    problems, _ = data_file_report(resolve_profile_path("spatial-vl-t4"))
    stage = [p for p in problems if "stages.2.data.sources.0.path: data/spatial/grpo.jsonl not found" in p]
    assert len(stage) == 1 and "spatial-vl-t4.yaml:" in stage[0], problems
