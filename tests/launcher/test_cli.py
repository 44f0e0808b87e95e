"""The `launch` command line: exit codes and exact one-line messages, never a traceback."""

import json
import multiprocessing
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from launcher.store import registry
from launcher.cli import cli

REPO = Path(__file__).resolve().parents[2]


def invoke(*args, env=None):
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False)


def test_validate_reports_three_errors_at_once(tmp_path):
    text = (REPO / "clusters" / "local-demo.yaml").read_text()
    text = text.replace("infra: local ", "infra: runpod").replace("  num_nodes: 1\n", "  num_nodes: 4\n")
    text = text.replace("  lerning_rate", "").replace("  learning_rate: 2.0e-3", "  lerning_rate: 2.0e-3")
    text = text.replace("  max_steps: 40", "  max_steps: forty")
    bad = tmp_path / "typo.yaml"
    bad.write_text(text)
    r = invoke("validate", str(bad))
    assert r.exit_code == 1
    out = r.output
    assert "Traceback" not in out
    assert "3 problems in the profile:" in out
    assert "typo.yaml" in out and "train.lerning_rate: unknown key; did you mean `train.learning_rate`?" in out
    assert "train.max_steps: Input should be a valid integer" in out
    assert "cluster: num_nodes is 4 but runpod cannot run multi-node tasks" in out


def test_validate_ok():
    r = invoke("validate", "sonia-h100")
    assert r.exit_code == 0 and "✓ sonia-h100: valid (H100-SXM:2 x 1 node(s), lora" in r.output


def test_unknown_profile_is_one_line_with_suggestion():
    r = invoke("plan", "lovecraft")
    assert r.exit_code == 1
    assert r.output.strip().startswith("✗ no profile `lovecraft`: did you mean `lovecraft-a100-spot`?")
    assert len(r.output.strip().splitlines()) == 1


def test_render_check_is_clean():
    r = invoke("render", "--check")
    assert r.exit_code == 0, r.output
    assert "sky/ is up to date (13 files)" in r.output  # 6 profiles x (task + config), the profile schema


def test_profiles_lists_all_four():
    r = invoke("profiles", "--json")
    rows = json.loads(r.output)
    assert [x["profile"] for x in rows] == ["local-demo", "lovecraft-a100-spot", "qwen3-32b-4x4-a100", "sonia-h100",
                                           "spatial-vl-t4", "well-log-ocr-spot"]
    assert all(x["error"] is None and x["est_usd"] > 0 for x in rows if x["profile"] != "local-demo")


def test_plan_json_sonia():
    r = invoke("plan", "sonia-h100", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["cloud"] == "RunPod" and d["instance_type"] == "2x_H100-SXM_SECURE"
    assert d["price_per_hour"] == pytest.approx(6.58) and d["total_usd"] > 0  # catalog extract: 2x 3.29
    assert d["secrets"] == {"HF_TOKEN": "not set"}  # WANDB_API_KEY only for profiles reporting to wandb


def test_run_commands_without_runs():
    for cmd in (["logs"], ["down"]):
        r = invoke(*cmd)
        assert r.exit_code == 1 and "no runs yet: start one with `launch up PROFILE`" in r.output
    r = invoke("status")  # a question with an answer: none yet
    assert r.exit_code == 0 and "no runs yet: start one with `launch up PROFILE`" in r.output
    r = invoke("status", "nope-123")
    assert r.exit_code == 1 and "✗" in r.output


def test_cost_totals_runs():
    registry.save(registry.Run(id="a", profile="sonia-h100", backend="skypilot", started_at=1000.0,
                               ended_at=1000.0 + 1800, price_per_hour=5.38, state="completed"))
    registry.save(registry.Run(id="b", profile="local-demo", backend="local", started_at=2000.0,
                               ended_at=2000.0 + 3600, price_per_hour=0.1, state="failed"))
    d = json.loads(invoke("cost", "--json").output)
    assert {r["id"]: r["cost_usd"] for r in d["runs"]} == {"a": 2.69, "b": 0.1}
    assert d["total_usd"] == pytest.approx(2.79)


def _writer(args):
    home, i = args
    import os

    os.environ["LAUNCH_HOME"] = home
    from launcher.store import registry as reg

    for j in range(20):
        reg.save(reg.Run(id=f"r{i}-{j}", profile="p", backend="local"))
        reg.update(f"r{i}-{j}", state="completed")
    return i


def test_registry_is_safe_with_concurrent_writers(tmp_path):
    home = str(tmp_path / "shared-home")
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        pool.map(_writer, [(home, 0), (home, 1)])
    import os

    os.environ["LAUNCH_HOME"] = home
    runs = registry.all_runs()
    assert len(runs) == 40 and all(r.state == "completed" for r in runs)


def test_help_is_fast_and_imports_nothing_heavy():
    code = ("import sys, launcher.cli; from click.testing import CliRunner; "
            "CliRunner().invoke(launcher.cli.cli, ['--help']); "
            "print(sorted(m for m in ('sky', 'torch', 'transformers', 'rich') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert out.stdout.strip() == "[]", out.stderr


def test_up_local_without_the_training_stack_builds_it_or_says_what_to_set(monkeypatch, tmp_path):
    """Without torch/peft/... in this Python (a plain install of launch), the local backend takes
    LAUNCH_TRAIN_PYTHON or builds the stack's environment (launcher/trainenv.py) before anything is
    recorded or started; what cannot be had is one line naming the variable."""
    import importlib.util

    from launcher import trainenv

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "peft" else real(name, *a))
    monkeypatch.setenv("LAUNCH_TRAIN_PYTHON", str(tmp_path / "no-python"))
    r = invoke("up", "local-demo")
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert f"✗ LAUNCH_TRAIN_PYTHON={tmp_path / 'no-python'}: no such Python" in r.output
    monkeypatch.delenv("LAUNCH_TRAIN_PYTHON")
    monkeypatch.setenv("UV_OFFLINE", "1")  # an empty cache and no network: the build fails, said in one line
    monkeypatch.setenv("UV_CACHE_DIR", str(tmp_path / "empty-cache"))
    r = invoke("up", "local-demo")
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert "building the training stack for runs on this machine once" in r.output
    assert "✗ building the training stack failed (uv pip sync)" in r.output and "set LAUNCH_TRAIN_PYTHON" in r.output
    assert registry.all_runs() == [] and not trainenv.env_dir().exists()
    assert not trainenv.env_dir().with_name(trainenv.env_dir().name + ".building").exists()


def test_up_on_a_full_disk_is_one_line(monkeypatch):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10 * 2**30, 10 * 2**30 - 2**20, 2**20))
    r = invoke("up", "local-demo")
    assert r.exit_code == 1 and "only 1 MB free under" in r.output and "Traceback" not in r.output
    assert registry.all_runs() == []


def test_status_tears_down_a_run_past_its_budget_once_a_checkpoint_exists(tmp_path, monkeypatch):
    import os
    import signal
    import time

    from launcher.runs import lifecycle

    # a trainer that does not answer the final-save request (`sleep`): the teardown waits its bound, here 1 s
    # (a trainer that saves: tests/launcher/backends/test_contract_down.py::test_a_budget_teardown_saves_...)
    monkeypatch.setattr(lifecycle, "BUDGET_SAVE_TIMEOUT_S", 1.0)

    # the run's driver as the local backend starts it: its own process group, the run's id and volume in
    # its environment (what the backend knows it by)
    proc = subprocess.Popen(["sleep", "120"], start_new_session=True,
                            env={**os.environ, "LAUNCH_RUN_ID": "pricey", "LAUNCH_VOLUME": str(tmp_path)})
    try:
        registry.save(registry.Run(id="pricey", profile="local-demo", backend="local",
                                   started_at=time.time() - 3600, price_per_hour=2.0, budget_usd=1.0,
                                   state="running", handle={"pid": proc.pid, "pgid": proc.pid,
                                                            "volume": str(tmp_path)}))
        r = invoke("status", "pricey", "--json")  # no checkpoint yet: stopping would lose the work
        assert "no checkpoint yet, so it keeps running" in r.output and proc.poll() is None
        assert registry.get("pricey").state == "running"
        status = tmp_path / "runs" / "pricey" / "status.json"
        status.parent.mkdir(parents=True)
        status.write_text(json.dumps({"state": "training", "step": 25, "checkpoint_step": 20}))
        r = invoke("status", "pricey", "--json")
        assert "asking for a final checkpoint before tearing down (waiting at most" in r.output, r.output
        assert "billed spend $2.00 reached the $1.00 budget; torn down (checkpoint 20 kept)" in r.output
        proc.wait(timeout=20)  # the process group was stopped
        run = registry.get("pricey")
        assert run.state == "budget_exhausted" and "reached the $1.00 budget" in run.reason
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_up_ssh_needs_a_host():
    r = invoke("up", "local-demo", "--backend", "ssh")
    assert r.exit_code == 1 and "✗ --backend ssh needs --host user@host[:port]" in r.output


def test_env_refuses_secret_looking_names_before_anything_starts():
    for item in ("HF_TOKEN=hf_x", "MY_API_KEY=k", "DB_PASSWORD=p", "AWS_SECRET=s"):
        r = invoke("up", "sonia-h100", "--env", item)
        assert r.exit_code == 1 and r.output.count("\n") == 1, r.output
        assert f"--env: `{item.split('=')[0]}` looks like a secret: secrets stay in your environment" in r.output
    r = invoke("up", "sonia-h100", "--env", "LAUNCH_RUN_ID=x")
    assert r.exit_code == 1 and "is set by launch/SkyPilot for every run" in r.output
    r = invoke("up", "sonia-h100", "--env", "NOEQUALS")
    assert r.exit_code == 1 and "--env: `NOEQUALS`: expected KEY=VALUE" in r.output


def test_bad_set_value_names_the_key(tmp_path):
    r = invoke("up", "local-demo", "--set", "train.max_steps=lots")
    assert r.exit_code == 1 and "train.max_steps: Input should be a valid integer" in r.output
