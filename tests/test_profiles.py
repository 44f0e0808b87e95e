"""Profiles, validation, rendering and planning: the infrastructure-as-code half of the launcher."""

import re
from pathlib import Path

import pytest
import yaml

from launcher.profile import ProfileError, load_profile, profile_names, total_gpus
from launcher.render import SECRETS, render_all, render_profile, stale

REPO = Path(__file__).resolve().parent.parent
PROFILES = ["local-demo", "lovecraft-a100-spot", "qwen3-32b-4x4-a100", "sonia-h100"]


def test_the_four_profiles_are_shipped():
    assert profile_names() == PROFILES


@pytest.mark.parametrize("name", PROFILES)
def test_every_shipped_profile_validates(name):
    p = load_profile(name)
    assert p.name == name
    if p.train.effective_batch_size:
        t = p.train
        assert t.per_device_batch_size * t.gradient_accumulation_steps * total_gpus(p) == t.effective_batch_size


def test_profiles_reproduce_the_runbooks():
    s = load_profile("sonia-h100")
    assert (s.cluster.infra, s.cluster.accelerators, s.cluster.use_spot) == ("runpod", "H100-SXM:2", False)
    assert s.cluster.volume.mount == "/workspace"
    assert (s.train.lora.r, s.train.lora.alpha, s.train.lora.dropout) == (32, 64, 0.05)
    assert s.train.lora.target_modules == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    assert s.train.lora.language_only and s.train.quantization is None and s.model.dtype == "bfloat16"
    assert (s.train.max_seq_length, s.train.per_device_batch_size, s.train.gradient_accumulation_steps) == (4096, 2, 8)
    assert (s.train.epochs, s.train.learning_rate, s.train.warmup_ratio, s.train.weight_decay) == (2, 1.5e-4, 0.03, 0.01)
    assert s.model.attn_implementation == ["flash_attention_2", "sdpa", "eager"]
    assert (s.train.eval_steps, s.train.checkpoints.save_steps) == (200, 200)
    glm = next(x for x in s.data.sources if x.name == "glm")
    assert glm.strip_think and glm.system_prompt == "sonia" and glm.split == {"train": 0.95, "val": 0.05}
    assert s.outputs.merge

    lc = load_profile("lovecraft-a100-spot")
    assert (lc.cluster.accelerators, lc.cluster.use_spot, lc.train.method) == ("A100-80GB:1", True, "qlora")
    assert (lc.train.quantization.bits, lc.train.quantization.quant_type) == (4, "nf4")
    assert (lc.train.lora.r, lc.train.lora.alpha, lc.train.lora.target_modules) == (64, 256, "all-linear")
    assert (lc.train.max_seq_length, lc.train.packing, lc.train.max_steps) == (2048, True, 600)
    assert (lc.train.gradient_accumulation_steps, lc.train.learning_rate, lc.train.warmup_ratio) == (16, 1e-4, 0.05)
    assert lc.train.optimizer == "paged_adamw_32bit" and lc.outputs.export_mlx
    assert (lc.train.eval_steps, lc.train.checkpoints.save_steps) == (100, 100)

    q = load_profile("qwen3-32b-4x4-a100")
    # Runbook 004's 16 A100 80GB (4 nodes x 4), as 2 nodes x 8 on InfiniBand: one ZeRO-3 job is
    # network-bound on the 80 Gb/s Ethernet of Azure's 4-GPU nodes (see the profile and test_plan.py).
    assert (q.cluster.accelerator_name, total_gpus(q), q.train.method) == ("A100-80GB", 16, "full")
    assert (q.cluster.num_nodes, q.cluster.gpus_per_node) == (2, 8)
    assert q.train.deepspeed.zero_stage == 3 and "runpod" not in q.cluster.infra_list
    assert (q.train.max_seq_length, q.train.learning_rate, q.train.warmup_ratio, q.train.epochs) == (8192, 5e-5, 0.1, 3)
    assert q.data.sources[0].format == "prompt_response"


def _write(tmp_path, text):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    return str(p)


def test_all_errors_at_once_with_file_line_and_fix(tmp_path):
    base = (REPO / "clusters" / "local-demo.yaml").read_text()
    text = base.replace("  num_nodes: 1\n", "  num_nodes: 2\n").replace("infra: local ", "infra: runpod")
    text = text.replace("  accelerators: null      # CPU", "  accelerators: H100-SXM:1")
    text = text.replace("  max_steps: 40\n", "  max_stepz: 40\n").replace("  max_seq_length: 256", "  max_seq_length: lots")
    with pytest.raises(ProfileError) as e:
        load_profile(_write(tmp_path, text))
    msgs = e.value.problems
    assert any(re.search(r"bad.yaml:\d+: train.max_stepz: unknown key; did you mean `max_steps`\?", m) for m in msgs), msgs
    assert any(re.search(r"bad.yaml:\d+: train.max_seq_length: .*integer", m) for m in msgs), msgs
    assert any("runpod cannot run multi-node" in m and "kubernetes" in m for m in msgs), msgs
    line = next(m for m in msgs if "max_stepz" in m)
    lineno = int(line.split(":")[1])
    assert "max_stepz" in text.splitlines()[lineno - 1]


@pytest.mark.parametrize("patch,expect", [
    (("use_spot: false", "use_spot: true"), "use_spot without cluster.volume"),
    (("accelerators: null      # CPU", "accelerators: H100-SMX:2"), "did you mean `H100-SXM`"),
    (("gradient_accumulation_steps: 1\n", "gradient_accumulation_steps: 1\n  effective_batch_size: 6\n"),
     "not divisible"),
    (("method: lora", "method: full\n  quantization: {bits: 4}"), "quantization"),
    (("price_per_hour: 0.10", "price_per_hour: 0.10\n  max_usd_x: 1"), "unknown key"),
])
def test_cross_field_rules(tmp_path, patch, expect):
    text = (REPO / "clusters" / "local-demo.yaml").read_text()
    if "SMX" in patch[1]:
        text = text.replace("infra: local ", "infra: runpod")
    assert patch[0] in text
    with pytest.raises(ProfileError) as e:
        load_profile(_write(tmp_path, text.replace(patch[0], patch[1], 1)))
    assert expect in str(e.value)


def test_budget_below_one_checkpoint_interval(tmp_path):
    text = (REPO / "clusters" / "local-demo.yaml").read_text()
    text = text.replace("    save_steps: 10\n", "    save_steps: 10\n    save_every_minutes: 720\n")
    with pytest.raises(ProfileError, match="less than one checkpoint interval"):
        load_profile(_write(tmp_path, text))


def test_unknown_profile_suggests_the_closest():
    with pytest.raises(ProfileError, match="did you mean `sonia-h100`"):
        load_profile("sonia-h10")


def test_rendered_tasks_are_committed_and_fresh():
    assert stale(render_all()) == []


@pytest.mark.parametrize("name", PROFILES)
def test_skypilot_parses_and_validates_every_rendered_task(name):
    import sky

    task = sky.Task.from_yaml(str(REPO / "sky" / f"{name}.yaml"))
    task.validate()
    p = load_profile(name)
    assert task.num_nodes == p.cluster.num_nodes
    assert "python -m payload data" in task.run and "-m payload train" in task.run
    for var in ("SKYPILOT_NODE_RANK", "SKYPILOT_NODE_IPS", "SKYPILOT_NUM_NODES", "SKYPILOT_NUM_GPUS_PER_NODE"):
        assert var in task.run
    raw = yaml.safe_load((REPO / "sky" / f"{name}.yaml").read_text())
    assert raw["secrets"] == {s: None for s in SECRETS}
    assert not set(SECRETS) & set(raw["envs"])
    if p.cluster.use_spot:
        assert raw["resources"]["job_recovery"]["strategy"] == "EAGER_NEXT_REGION"
        assert raw["volumes"] == {"/workspace": "lovecraft-workspace"}


def test_no_secret_values_in_rendered_files(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value_do_not_write")
    monkeypatch.setenv("WANDB_API_KEY", "wandb_secret_value_do_not_write")
    for text in render_profile("sonia-h100").values():
        assert "secret_value" not in text
    for f in (REPO / "sky").rglob("*.yaml"):
        assert not re.search(r"hf_[A-Za-z0-9]{20,}", f.read_text())


def test_plan_sonia_is_runpod_2x_h100_with_dollars():
    from launcher.plan import plan_profile

    plan = plan_profile(load_profile("sonia-h100"))
    assert plan.cloud == "RunPod" and plan.instance_type == "2x_H100-SXM_SECURE"
    price = catalog_row("runpod_vms.csv", "2x_H100-SXM_SECURE")["Price"]  # the runbook paid $5.38/h
    assert plan.price_per_hour == pytest.approx(float(price))
    assert 1 < plan.total_hours < 6 and plan.total_usd == pytest.approx(plan.total_hours * float(price), rel=0.01)
    assert plan.alternative["use_spot"] is True


def test_plan_multi_node_falls_through_to_a_cloud_that_can():
    from launcher.plan import plan_profile

    plan = plan_profile(load_profile("qwen3-32b-4x4-a100"))
    assert plan.cloud == "Azure" and plan.num_nodes == 2 and plan.gpus == 16
    assert plan.instance_type == "Standard_ND96amsr_A100_v4"
    nd96 = catalog_row("azure_vms.csv", "Standard_ND96amsr_A100_v4", Region="eastus")
    assert plan.price_per_hour == pytest.approx(2 * float(nd96["Price"]))


def test_plan_lovecraft_matches_the_runbook_duration():
    from launcher.plan import plan_profile

    plan = plan_profile(load_profile("lovecraft-a100-spot"))
    spot = catalog_row("runpod_vms.csv", "1x_A100-80GB_SECURE")["SpotPrice"]
    assert plan.use_spot and plan.price_per_hour == pytest.approx(float(spot))
    assert 6 < plan.train_hours < 8.5  # runbook: ~7 h for 600 steps


def catalog_row(extract: str, instance_type: str, **match) -> dict:
    """The first row of the committed catalog extract for an instance type (prices are never typed here)."""
    from launcher.catalog.build_snapshot import EXTRACT, read_extract

    _, header, rows = read_extract(EXTRACT / extract)
    found = (dict(zip(header, r)) for r in rows if r[0] == instance_type)
    return next(r for r in found if all(r[k] == v for k, v in match.items()))
