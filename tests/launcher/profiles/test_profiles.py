"""Profiles, validation, rendering and planning: the infrastructure-as-code half of the launcher."""

import re
from pathlib import Path

import pytest
import yaml

from launcher.profiles.profile import ProfileError, load_profile, profile_names
from launcher.profiles.schema import total_gpus
from launcher.catalog import plan_price
from launcher.profiles.render import CONTROLLER_AUTOSTOP, render_all, render_profile, render_text, stale

REPO = Path(__file__).resolve().parents[3]
PROFILES = ["local-demo", "lovecraft-a100-spot", "qwen3-32b-4x4-a100", "sonia-h100", "spatial-vl-t4"]


def test_the_four_profiles_are_shipped():
    assert profile_names() == sorted(PROFILES + ["well-log-ocr-spot"])  # that one: tests/launcher/profiles/test_ocr_profile.py


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
    assert s.model.attn_implementation == "auto" and s.train.padding_free == "auto"
    assert (s.train.eval_steps, s.train.checkpoints.save_steps) == (200, 200)
    glm = next(x for x in s.data.sources if x.name == "glm")
    assert glm.strip_think and glm.system_prompt == "sonia" and glm.split == {"train": 0.95, "val": 0.05}
    assert s.outputs.merge

    lc = load_profile("lovecraft-a100-spot")
    assert (lc.cluster.accelerators, lc.cluster.use_spot, lc.train.method) == ("A100-80GB-SXM:1", True, "qlora")
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
    assert any(re.search(r"bad.yaml:\d+: train.max_stepz: unknown key; did you mean `train.max_steps`\?", m) for m in msgs), msgs
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


@pytest.mark.slow  # 12 s: every profile rendered through SkyPilot's task parser
def test_rendered_tasks_are_committed_and_fresh():
    assert stale(render_all(None, plan_price)) == []


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
    # Every listed secret must be given to plain SkyPilot: optional ones only when the profile uses them.
    assert raw.get("secrets") == ({"HF_TOKEN": None} if p.model.tiny is None else None)
    assert not {"HF_TOKEN", "WANDB_API_KEY"} & set(raw["envs"])
    if p.cluster.use_spot:
        assert raw["resources"]["job_recovery"]["strategy"] == "EAGER_NEXT_REGION"
        if p.cluster.volume:  # spatial-vl-t4 keeps its checkpoints in a bucket instead
            assert raw["volumes"] == {p.cluster.volume.mount: p.cluster.volume.name}
    assert "source payload/gpu_env.sh" in task.setup and "source payload/gpu_env.sh" in task.run
    # The GPU environment lives on the volume ($LAUNCH_VOLUME/.envs), but never in a FUSE bucket.
    assert raw["envs"].get("LAUNCH_ENV_ROOT") == ("~/.cache/launch/envs" if p.cluster.bucket else None)


def test_wandb_key_is_a_secret_only_for_profiles_that_report_to_wandb():
    p = load_profile("lovecraft-a100-spot")
    wandb = p.model_copy(update={"train": p.train.model_copy(update={"report_to": ["wandb"]})})
    assert "WANDB_API_KEY: null" in render_text(wandb, 1.0)[0]
    assert "WANDB_API_KEY" not in render_text(p, 1.0)[0]
    assert "--secret HF_TOKEN --secret WANDB_API_KEY" in render_text(wandb, 1.0)[0].splitlines()[2]


def _strategy(name):
    """SkyPilot's own recovery executor for a rendered task (what the jobs controller builds)."""
    import asyncio

    import sky
    from sky.backends import CloudVmRayBackend
    from sky.jobs.recovery_strategy import StrategyExecutor

    task = sky.Task.from_yaml(str(REPO / "sky" / f"{name}.yaml"))
    return StrategyExecutor.make("c", CloudVmRayBackend(), task, 1, 0, None, set(), asyncio.Lock(),
                                 asyncio.Condition())


@pytest.mark.parametrize("name", PROFILES)
def test_a_budget_stop_or_config_error_is_never_retried(name):
    from payload.errors import EXIT_BUDGET, EXIT_CONFIG, EXIT_CRASH, EXIT_INTERRUPTED, EXIT_TRANSIENT

    p = load_profile(name)
    raw = yaml.safe_load((REPO / "sky" / f"{name}.yaml").read_text())
    if not p.cluster.use_spot:  # a cluster job (`sky launch`) is never restarted
        assert "job_recovery" not in raw["resources"]
        return
    assert raw["resources"]["job_recovery"]["max_restarts_on_errors"] == 0
    assert raw["envs"]["LAUNCH_MAX_RETRIES"] == str(p.cluster.max_restarts_on_errors)
    executor = _strategy(name)
    for code in [EXIT_BUDGET, EXIT_CONFIG, EXIT_CRASH] * 3:  # not once, not after a few either
        assert not executor.should_restart_on_failure(exit_codes=[code]), code
    # Transient failures and signals are; SkyPilot has no limit on those (payload/exitcode.py does).
    assert all(executor.should_restart_on_failure(exit_codes=[c]) for c in [EXIT_TRANSIENT, EXIT_INTERRUPTED] * 5)


def _sky_cli_parse(args):
    """Parse a `sky ...` command line with SkyPilot's own click CLI (option callbacks run, the
    command does not): (command function name, parsed params)."""
    import click
    from sky.client.cli import command as sky_cli

    name, cmd, ctx, rest = args[0], sky_cli.cli, None, args[1:]
    while True:
        ctx = cmd.make_context(name, rest, parent=ctx)
        if not isinstance(cmd, click.Group):
            return cmd.callback.__name__, ctx.params
        name, cmd, rest = cmd.resolve_command(ctx, [*ctx.protected_args, *ctx.args])


@pytest.mark.parametrize("name", PROFILES)
def test_the_header_is_the_plain_skypilot_command_and_it_parses(name, monkeypatch):
    import shlex

    from sky import skypilot_config

    monkeypatch.setenv("HF_TOKEN", "hf_x")  # `--secret NAME` reads the value from the environment
    p = load_profile(name)
    lines = (REPO / "sky" / f"{name}.yaml").read_text().splitlines()
    if p.cluster.is_local:  # never "works too": SkyPilot would rent a cloud machine for it (issue 27)
        assert lines[1].startswith(f"# Runs on this machine with `launch up {name}`")
        assert lines[3].endswith("from the repo root:") and lines[4].endswith("--infra ssh/MY_POOL")
    else:
        assert lines[1] == "# Plain SkyPilot works too, from the repo root:"
    command = " ".join(ln[4:].rstrip(" \\") for ln in lines[2:] if ln.startswith("#   "))
    args = shlex.split(command)
    try:
        func, params = _sky_cli_parse(args)
        controller = skypilot_config.get_nested(("jobs", "controller", "resources", "autostop"), None)
    finally:
        skypilot_config.reload_config()  # `--config` applied itself to this process's config
    assert params["entrypoint"] == (f"sky/{name}.yaml",)
    assert (REPO / params["entrypoint"][0]).is_file()
    raw = yaml.safe_load((REPO / "sky" / f"{name}.yaml").read_text())
    assert [k for k, _ in params["secret"]] == list(raw.get("secrets") or {})
    if p.cluster.use_spot:  # a managed job, and its controller torn down when idle
        assert func == "jobs_launch" and controller == CONTROLLER_AUTOSTOP
    else:
        assert func == "launch" and controller is None
        if not p.cluster.is_local:  # the cluster tears itself down after the job, as `launch up` does
            assert (params["idle_minutes_to_autostop"], params["down"]) == (p.cluster.autostop_minutes, True)


def test_no_secret_values_in_rendered_files(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret_value_do_not_write")
    monkeypatch.setenv("WANDB_API_KEY", "wandb_secret_value_do_not_write")
    for text in render_profile("sonia-h100", plan_price).values():
        assert "secret_value" not in text
    for f in (REPO / "sky").rglob("*.yaml"):
        assert not re.search(r"hf_[A-Za-z0-9]{20,}", f.read_text())


def test_plan_sonia_is_runpod_2x_h100_with_dollars():
    from launcher.plan.estimate import plan_profile

    plan = plan_profile(load_profile("sonia-h100"))
    assert plan.cloud == "RunPod" and plan.instance_type == "2x_H100-SXM_SECURE"
    price = catalog_row("runpod_vms.csv", "2x_H100-SXM_SECURE")["Price"]  # the runbook paid $5.38/h
    assert plan.price_per_hour == pytest.approx(float(price))
    assert 1 < plan.total_hours < 6 and plan.total_usd == pytest.approx(plan.total_hours * float(price), rel=0.01)
    assert plan.alternative["use_spot"] is True


def test_plan_multi_node_falls_through_to_a_cloud_that_can():
    from launcher.plan.estimate import plan_profile

    plan = plan_profile(load_profile("qwen3-32b-4x4-a100"))
    assert plan.cloud == "Azure" and plan.num_nodes == 2 and plan.gpus == 16
    assert plan.instance_type == "Standard_ND96amsr_A100_v4"
    nd96 = catalog_row("azure_vms.csv", "Standard_ND96amsr_A100_v4", Region="eastus")
    assert plan.price_per_hour == pytest.approx(2 * float(nd96["Price"]))


def test_plan_lovecraft_matches_the_runbook_duration():
    from launcher.plan.estimate import plan_profile

    plan = plan_profile(load_profile("lovecraft-a100-spot"))
    spot = catalog_row("runpod_vms.csv", "1x_A100-80GB-SXM_SECURE")["SpotPrice"]
    assert plan.use_spot and plan.price_per_hour == pytest.approx(float(spot))
    assert plan.instance_type == "1x_A100-80GB-SXM_SECURE"  # runbook 001: A100 SXM, not RunPod's PCIe A100-80GB
    assert 6 < plan.train_hours < 8.5  # runbook: ~7 h for 600 steps


def test_plan_shows_the_jobs_controller_and_its_autostop(tmp_path):
    from click.testing import CliRunner

    from launcher.cli import cli

    body = (REPO / "clusters" / "lovecraft-a100-spot.yaml").read_text()
    spot = tmp_path / "lc.yaml"  # the data file is the user's: a shipped sample stands in
    spot.write_text(body.replace("data/lovecraft/train_sft.jsonl", "payload/samples/demo_alpaca.jsonl"))
    out = " ".join(CliRunner().invoke(cli, ["plan", str(spot)], catch_exceptions=False).output.split())
    assert ("Controller SkyPilot's jobs controller, a small CPU machine billed while up; torn down after 10 "
            "idle min") in out, out
    assert "Secrets HF_TOKEN (not set) - passed at launch" in out  # no wandb reporting: no WANDB_API_KEY
    out = " ".join(CliRunner().invoke(cli, ["plan", "sonia-h100"], catch_exceptions=False).output.split())
    assert "Autostop the cluster is torn down 10 idle min after the job" in out, out


def catalog_row(extract: str, instance_type: str, **match) -> dict:
    """The first row of the committed catalog extract for an instance type (prices are never typed here)."""
    from launcher.catalog.build_snapshot import EXTRACT, read_extract

    _, header, rows = read_extract(EXTRACT / extract)
    found = (dict(zip(header, r)) for r in rows if r[0] == instance_type)
    return next(r for r in found if all(r[k] == v for k, v in match.items()))
