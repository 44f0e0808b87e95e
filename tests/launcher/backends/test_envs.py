"""Extra environment (profile `envs:`, `launch up --env KEY=VALUE`) and `--set` on every backend.

Profile envs are rendered into the task's `envs:`, which every backend reads; `--env` values reach
the processes of local and ssh runs (started here for real; ssh against a real sshd) and SkyPilot's
task (SDK faked at the launch edge). `--set` on a SkyPilot run renders the task into the run's own
directory (sky/ stays the profile's) and is recorded: `launch status RUN` shows what differs."""

import json
import os
import tempfile
import time
from pathlib import Path

if "SKY_RUNTIME_DIR" not in os.environ:  # tests/conftest.py sets it; kept for a lone run of this file
    os.environ["SKY_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="sky-runtime-")

import pytest
import yaml
from click.testing import CliRunner

from launcher.store import registry
from launcher.profiles import render
from launcher.backends import LaunchSpec
from launcher.backends.local import LocalBackend
from launcher.backends.ssh import SSHBackend
from launcher.cli import cli
from launcher.project import PACKAGE_ROOT as REPO_ROOT
from launcher.profiles.profile import ProfileError, load_profile
from launcher.store.registry import Run
from test_skypilot_backend import FakeSky

SHOW = 'echo "FOO=$FOO N=$N HF_TOKEN=${HF_TOKEN:-unset}"'
TASK = {"name": "envs", "num_nodes": 1, "envs": {"LAUNCH_CONFIG": "sky/config/envs.yaml", "N": "3"},
        "run": SHOW}


def profile_with_envs(tmp_path, envs: str) -> Path:
    text = (REPO_ROOT / "clusters" / "local-demo.yaml").read_text()
    path = tmp_path / "local-demo.yaml"
    path.write_text(text + f"\nenvs:\n{envs}")
    return path


def test_profile_envs_are_rendered_into_the_task_not_the_run_config(tmp_path):
    p = load_profile(str(profile_with_envs(tmp_path, "  FOO: bar\n  N: 3\n")))
    assert p.envs == {"FOO": "bar", "N": "3"}
    task_text, config_text = render.render_text(p, 0.1)
    envs = yaml.safe_load(task_text)["envs"]
    assert envs["FOO"] == "bar" and envs["N"] == "3" and envs["LAUNCH_PROFILE"] == "local-demo"
    assert "envs" not in yaml.safe_load(config_text) and "FOO" not in config_text


@pytest.mark.parametrize("name", ["HF_TOKEN", "WANDB_API_KEY", "OPENAI_API_KEY", "GH_TOKEN", "DB_PASSWORD",
                                  "MY_SECRET", "LAUNCH_RUN_ID"])
def test_profile_envs_refuse_secrets_and_launchs_own_names(tmp_path, name):
    path = profile_with_envs(tmp_path, f"  {name}: x\n")
    with pytest.raises(ProfileError) as e:
        load_profile(str(path))
    (line,) = e.value.problems
    assert f"{path}:" in line and "envs" in line and name in line
    assert ("secrets stay in your environment" in line) or ("set by launch/SkyPilot" in line)


def wait_for(predicate, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError("timed out")


def spec(tmp_path, run_id, backend):
    task, config = tmp_path / "task.yaml", tmp_path / "envs.yaml"
    task.write_text(yaml.safe_dump(TASK))
    config.write_text("name: envs\n")
    return LaunchSpec(run=Run(id=run_id, profile="envs", backend=backend), profile=None, task_yaml=task,
                      config_yaml=config, envs={"FOO": "from --env", "LAUNCH_LOCAL": "1"},
                      secrets={"HF_TOKEN": "hf_secret_value"})


def test_local_backend_passes_env_to_the_run(tmp_path):
    run = LocalBackend().up(spec(tmp_path, "envs-local-1", "local"))
    log = Path(run.handle.home) / "run.log"
    wait_for(lambda: log.exists() and "FOO=" in log.read_text())
    assert "FOO=from --env N=3 HF_TOKEN=hf_secret_value" in log.read_text()
    assert "hf_secret_value" not in (Path(run.handle.home) / "node.sh").read_text()



def test_ssh_backend_passes_env_to_the_run(sshd, tmp_path):
    known = tmp_path / "known_hosts"
    known.write_text(sshd.known_hosts_line())
    be = SSHBackend(host=sshd.host, identity_file=str(sshd.client_key), known_hosts=str(known),
                    remote_root=str(tmp_path / "remote"))
    run = be.up(spec(tmp_path, "envs-ssh-1", "ssh"))
    try:
        log = Path(run.handle.log)
        wait_for(lambda: log.exists() and "FOO=" in log.read_text())
        assert "FOO=from --env N=3 HF_TOKEN=hf_secret_value" in log.read_text()
    finally:
        be.down(run, grace_s=2)


@pytest.mark.slow  # 19 s: launch up through SkyPilot's SDK and optimizer
def test_skypilot_up_with_set_and_env_renders_per_run_and_records_both(monkeypatch):
    from launcher.backends.skypilot import task as sp_backend  # where build_task looks it up

    fake, staged = FakeSky(monkeypatch), {}
    real_stage = sp_backend.stage_workdir
    monkeypatch.setattr(sp_backend, "stage_workdir", lambda run_id, files: (staged.update(files), real_stage(run_id, files))[1])
    committed = {p: p.read_text() for p in (render.task_path("sonia-h100"), render.config_path("sonia-h100"))}
    try:
        r = CliRunner().invoke(cli, ["up", "sonia-h100", "--set", "train.learning_rate=1e-4",
                                     "--env", "NCCL_DEBUG=INFO"], catch_exceptions=False)
        assert r.exit_code == 0, r.output
    finally:
        changed = {p: p.read_text() for p in committed}
        for p, text in committed.items():
            p.write_text(text)
    assert changed == committed  # sky/ stays the profile's committed render
    (task,), _ = fake.one("launch")[1:]
    assert task.envs["NCCL_DEBUG"] == "INFO"
    run = registry.get()
    uploaded = staged["sky/config/sonia-h100.yaml"]  # what is uploaded as the run's config: the override
    assert uploaded.parent.name == run.id and uploaded != render.config_path("sonia-h100")
    assert yaml.safe_load(uploaded.read_text())["train"]["learning_rate"] == 1e-4
    assert run.handle.overrides == ["train.learning_rate=1e-4"] and run.handle.envs == {"NCCL_DEBUG": "INFO"}
    rendered = next(Path(os.environ["LAUNCH_HOME"]).rglob(f"rendered/{run.id}/task.yaml"))
    assert yaml.safe_load(rendered.read_text())["envs"]["LAUNCH_PROFILE"] == "sonia-h100"
    fake.results["status"] = []  # the cluster is gone: status still shows what differs
    r = CliRunner().invoke(cli, ["status", run.id], terminal_width=80)
    out = " ".join(r.output.split())
    assert "differs from profile: train.learning_rate=1e-4" in out and "extra environment: NCCL_DEBUG=INFO" in out
    d = json.loads(CliRunner().invoke(cli, ["status", run.id, "--json"]).output)
    assert d["overrides"] == ["train.learning_rate=1e-4"] and d["envs"] == {"NCCL_DEBUG": "INFO"}


def test_skypilot_dry_run_with_set_leaves_sky_alone(monkeypatch):
    committed = {p: p.read_text() for p in (render.task_path("sonia-h100"), render.config_path("sonia-h100"))}
    r = CliRunner().invoke(cli, ["up", "sonia-h100", "--dry-run", "--set", "train.learning_rate=1e-4"])
    assert r.exit_code == 0, r.output
    assert "parsed by SkyPilot" in " ".join(r.output.split())
    assert {p: p.read_text() for p in committed} == committed


# One made-up value of each token shape launcher/profiles/boundary.py knows (none is a real token).
TOKEN_EXAMPLES = [
    "hf_" + "aB3" * 12, "api_org_" + "Xy7" * 10, "ghp_" + "k9L" * 12, "gho_" + "k9L" * 12, "ghs_" + "k9L" * 12,
    "github_pat_11ABCDEFG0" + "x" * 20 + "_" + "Y" * 40, "0123456789abcdef" * 2 + "89abcdef",
    "local-" + "ab" * 20, "rpa_" + "ZX12" * 8, "AKIAABCDEFGHIJKLMNOP", "ASIA1234567890ABCDEF",
    "sk-" + "a1" * 20, "sk-proj-" + "Q" * 40, "AIza" + "S" * 35,
    "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA", '{"type": "service_account", "private_key_id": "1"}',
    "xoxb-" + "1234567890-abcdef", "glpat-" + "Ab" * 10, "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.sig",
    "https://user:hf_" + "Ab1" * 12 + "@huggingface.co/x",  # inside a URL it is still a token
]


def test_every_known_token_shape_has_an_example_here():
    from launcher.profiles.boundary import SECRET_SHAPES

    matched = {what for v in TOKEN_EXAMPLES for what, pattern, _ in SECRET_SHAPES if pattern.search(v)}
    assert matched == {what for what, _, _ in SECRET_SHAPES}


@pytest.mark.parametrize("value", TOKEN_EXAMPLES)
def test_a_token_shaped_value_is_refused_by_env_and_envs_naming_only_the_variable(tmp_path, value):
    from launcher.profiles.schema import parse_env_items

    with pytest.raises(ValueError) as e:
        parse_env_items((f"BUILD_NOTE={value}",))
    assert str(e.value).startswith("`BUILD_NOTE`'s value looks like ") and value not in str(e.value)
    path = profile_with_envs(tmp_path, f"  BUILD_NOTE: {json.dumps(value)}\n")
    with pytest.raises(ProfileError) as e:
        load_profile(str(path))
    (line,) = e.value.problems
    assert f"{path}:" in line and "envs" in line
    assert "`BUILD_NOTE`'s value looks like" in line and value not in line


@pytest.mark.parametrize("value", ["INFO", "1", "expandable_segments:True", "sk-learn", "hf_transfer",
                                   "0123456789ab", "https://huggingface.co/Qwen/Qwen3-8B", "AKIA", "/workspace/x"])
def test_ordinary_values_pass(value):
    from launcher.profiles.schema import parse_env_items

    assert parse_env_items((f"NOTE={value}",)) == {"NOTE": value}


def test_an_item_without_equals_is_not_echoed_when_it_is_a_token():
    from launcher.profiles.schema import parse_env_items

    token = "ghp_" + "k9L" * 12
    with pytest.raises(ValueError) as e:
        parse_env_items((token,))
    assert token not in str(e.value) and "expected KEY=VALUE" in str(e.value)
