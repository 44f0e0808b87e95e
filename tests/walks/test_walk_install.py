"""launch as a tool: the wheel built from this checkout, installed into a fresh environment outside it,
used from a project of the user's own in an empty directory, as `uv tool install` / `pipx` users do.

The install is the wheel's own: its package data must hold everything the tool reads (the catalog
snapshot, the example profiles, the payload with its locks and shell), and nothing of a run is read from
or written into the install or this checkout. The tool's environment has SkyPilot and no torch (what a
plain `pip install launch` gives); the local run trains with the training stack's Python
(launcher/trainenv.py), here LAUNCH_TRAIN_PYTHON = this suite's .venv, since the environment launch would
build needs the package index (the build itself is tested offline below, on a lock of one package).

No network: the wheel's dependencies come from uv's cache (filled by `make install`), held to the pins
of the checkout's locks (SkyPilot's own, with its click<8.2, from requirements/sky-cli.lock).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from installed import USER_PLATFORMS, install_tool, pins, user_resolve, uv_env
from walk import REPO, assert_one_line_error, fresh_env

pytestmark = pytest.mark.slow


def tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if "__pycache__" not in p.parts}


@pytest.fixture(scope="module")
def tool(tmp_path_factory) -> Path:
    return install_tool(tmp_path_factory.mktemp("tool"))


def use(tool: Path, tmp_path: Path, *args: str, cwd: Path, env: dict | None = None, timeout: float = 300):
    return subprocess.run([str(tool), *args], cwd=cwd, env=fresh_env(tmp_path, env), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout)


def test_an_installed_launch_runs_a_project_of_your_own_from_an_empty_directory(tool, tmp_path):
    env_dir = tool.parent.parent
    site = next(env_dir.glob("lib/python*/site-packages"))
    before_install = tree(site)
    assert (site / "launcher" / "catalog" / "snapshot.json").is_file()
    assert not (site / "torch").exists() and (site / "sky").is_dir()  # SkyPilot, no torch: a plain install
    proj = tmp_path / "my-project"
    proj.mkdir()
    r = use(tool, tmp_path, "init", "demo", "--from", "local-demo", cwd=proj)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "data: copied data/demo/demo_chat.jsonl, data/demo/demo_alpaca.jsonl" in " ".join(r.stdout.split())
    assert (proj / "clusters" / "demo.yaml").is_file() and (proj / "data" / "demo" / "demo_chat.jsonl").is_file()
    r = use(tool, tmp_path, "profiles", cwd=proj / "data")  # from a subdirectory: the project is found above
    assert r.returncode == 0 and r.stdout.splitlines()[2].startswith("demo "), r.stdout + r.stderr
    assert "shipped examples: local-demo, lovecraft-a100-spot" in r.stdout
    r = use(tool, tmp_path, "validate", "demo", cwd=proj)
    assert r.returncode == 0 and "data/demo/demo_chat.jsonl (55.9 KB): 300 records read" in r.stdout, r.stdout + r.stderr
    assert use(tool, tmp_path, "init", "h100", "--from", "sonia-h100", cwd=proj).returncode == 0
    r = use(tool, tmp_path, "plan", "h100", cwd=proj)  # a cloud profile is planned without torch
    assert r.returncode == 0 and "RunPod 2x_H100-SXM_SECURE" in r.stdout, r.stdout + r.stderr
    # a data path outside the project is refused, naming the key
    bad = (proj / "clusters" / "demo.yaml").read_text().replace("path: data/demo/demo_alpaca.jsonl",
                                                                 "path: ../outside.jsonl")
    (proj / "clusters" / "bad.yaml").write_text(bad.replace("name: demo", "name: bad", 1))
    (tmp_path / "outside.jsonl").write_text('{"instruction": "a", "output": "b"}\n')
    assert_one_line_error(use(tool, tmp_path, "validate", "bad", cwd=proj),
                          "data.sources.1.path: ../outside.jsonl is outside the project")
    (proj / "clusters" / "bad.yaml").unlink()
    # the local run, its payload uploaded from the install
    train = {"LAUNCH_TRAIN_PYTHON": sys.executable}
    r = use(tool, tmp_path, "up", "demo", "--follow", "--set", "train.max_steps=6", "--set", "outputs.merge=false",
            "--set", "outputs.export_mlx=false", cwd=proj, env=train, timeout=600)
    assert r.returncode == 0 and ": completed" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
    run_id = re.search(r"started (demo-\d{8}-\d{6})", r.stdout).group(1)
    workdir = tmp_path / "user-launch-home" / "local" / run_id / "workdir"
    assert (workdir / "payload" / "layout.py").read_bytes() == (site / "payload" / "layout.py").read_bytes()
    r = use(tool, tmp_path, "down", "--fetch-artifacts", cwd=proj / "clusters", env=train)
    assert r.returncode == 0 and "sha256-verified" in r.stdout, r.stdout + r.stderr
    assert (proj / "artifacts" / run_id / "adapter" / "adapter_model.safetensors").is_file()
    # nothing of the run went into the install or the checkout
    assert tree(site) == before_install
    assert not (REPO / "artifacts" / run_id).exists() and not (REPO / "clusters" / "demo.yaml").exists()
    assert not (REPO / "data" / "demo").exists()


def test_outside_a_project_a_command_says_how_to_make_one(tool, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert_one_line_error(use(tool, tmp_path, "plan", "nothing-here", cwd=empty),
                          f"no launch project in {empty} or above it", "launch init NAME --from local-demo")
    assert_one_line_error(use(tool, tmp_path, "plan", "sonia-h100", cwd=empty),
                          "`sonia-h100` is a shipped example", "launch init sonia-h100 --from sonia-h100")
    r = use(tool, tmp_path, "profiles", cwd=empty)
    assert r.returncode == 0 and "shipped examples: local-demo" in r.stdout and "launch init my-demo" in r.stdout
    assert list(empty.iterdir()) == []
    r = use(tool, tmp_path, "--project", str(empty), "init", "x", "--from", "local-demo", cwd=tmp_path)
    assert r.returncode == 0 and (empty / "clusters" / "x.yaml").is_file(), r.stdout + r.stderr


def test_the_training_stack_environment_is_built_from_a_lock_offline(tmp_path, monkeypatch):
    """trainenv.build: a Python 3.11 environment of exactly the lock, this install's launcher on its path,
    moved into place whole (here a lock of one package from uv's cache: click, which `launch --version`
    needs)."""
    from launcher import trainenv

    click = pins("requirements/dev.lock")["click"]
    hashes = re.search(rf"^click=={re.escape(click)} \\\n((?:\s+--hash=\S+.*\n)+)", (REPO / "requirements/dev.lock")
                       .read_text(), re.M).group(1)
    lock = tmp_path / "tiny.lock"
    lock.write_text(f"click=={click} \\\n{hashes}")
    monkeypatch.setattr(trainenv, "lock_path", lambda: lock)
    for k, v in uv_env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("LAUNCH_TORCH_CPU_INDEX", "")
    env = tmp_path / "envs" / "local-x"
    said = []
    trainenv.build(env, said.append)
    assert said and "building the training stack" in said[0] and not env.with_name("local-x.building").exists()
    done = subprocess.run([str(env / "bin" / "python"), "-m", "launcher", "--version"], capture_output=True, text=True,
                          env={"PATH": os.environ["PATH"], "HOME": str(tmp_path)}, cwd=tmp_path, timeout=60)
    assert done.returncode == 0 and "launch, version" in done.stdout, done.stdout + done.stderr
    assert (env / ".complete").is_file()


def test_the_locks_cover_linux_and_macos():
    """The user's training stack and the development lock resolve for macOS arm64 as for Linux (`make
    lock` resolved them; `make lock-check` holds them to their inputs): CPU torch on each."""
    local = (REPO / "payload/requirements-local.lock").read_text()
    assert re.search(r"^torch==2\.13\.0\+cpu ; platform_machine == 'x86_64' and sys_platform == 'linux'", local, re.M)
    assert re.search(r"^torch==2\.13\.0 ; platform_machine != 'x86_64' or sys_platform != 'linux'", local, re.M)
    assert re.search(r"^torch==2\.13\.0 \\$", (REPO / "requirements/dev-macos.lock").read_text(), re.M)


@pytest.mark.parametrize("platform", USER_PLATFORMS)
def test_the_user_install_with_its_sky_extra_resolves_for_linux_and_macos(platform):
    """What `uv tool install 'launch[sky]'` resolves, on Linux x86_64 and macOS arm64 (14): pyproject's
    ranges, no lock and no override (the click SkyPilot pins and the training stack's click live in
    separate environments), offline from the metadata `make install` cached."""
    done = user_resolve(platform)
    assert done.returncode == 0, done.stderr
    assert re.search(r"Resolved \d+ packages", done.stderr), done.stderr
