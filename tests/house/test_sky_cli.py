"""The `sky` command of the project's install works: SkyPilot's CLI from its own locked environment
(.tools/sky-cli = requirements/sky-cli.lock, SkyPilot's own click<8.2), which `make install` links as
.venv/bin/sky. In .venv (click 8.5, for huggingface-hub) SkyPilot 0.14.1's CLI fails every `sky launch`
with "ValueError: False backend is not supported." (SkyPilot issues #7592, #9094); its SDK, which
`launch` uses, does not care.

The fast tests here run in `make test`. `sky launch --dryrun` of the rendered tasks needs a local API
server (its start, its on-boot `sky check`, two dryruns: 45-80 s on 2 shared cores), so it belongs to the
cloud suite: it runs with LAUNCH_CLOUD_TESTS=1 and is skipped otherwise, saying so.

Run: .venv/bin/python -m pytest -q -n 0 tests/house/test_sky_cli.py   (LAUNCH_CLOUD_TESTS=1 for the dryruns)
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from host_tools import ensure_rsync

from launcher.catalog import install_snapshot

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / ".tools" / "sky-cli"
TOOL_PY = TOOL / "bin" / "python"
SKY = Path(sys.prefix) / "bin" / "sky"  # .venv/bin/sky: what `sky` is in an activated .venv
LOCK = REPO / "requirements" / "sky-cli.lock"
INSTALL = "run `make install` (it links .venv/bin/sky to .tools/sky-cli/bin/sky)"


def lock_pins(path: Path) -> dict[str, str]:
    norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()  # noqa: E731
    return {norm(m.group(1)): m.group(2) for m in re.finditer(r"(?m)^([A-Za-z0-9_.-]+)==([^\s;\\]+)", path.read_text())}


def sky_env(home: Path, **extra: str) -> dict[str, str]:
    """The environment a user's shell gives `sky`, with this test's HOME and no reachable server."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SKYPILOT_API_SERVER", "SKY_RUNTIME_DIR"))}
    env.update(HOME=str(home), SKYPILOT_DISABLE_USAGE_COLLECTION="1", PATH=f"{SKY.parent}{os.pathsep}{env['PATH']}")
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sky_is_the_tool_environments_cli():
    assert TOOL_PY.exists(), f".tools/sky-cli is missing; {INSTALL}"
    assert SKY.is_symlink() and SKY.resolve() == (TOOL / "bin" / "sky").resolve(), (
        f"{SKY} is not the link to .tools/sky-cli/bin/sky; {INSTALL}")
    found = shutil.which("sky", path=f"{SKY.parent}{os.pathsep}{os.environ['PATH']}")
    assert found and Path(found).resolve() == (TOOL / "bin" / "sky").resolve()


def test_the_tool_environment_is_its_lock_with_the_click_skypilot_requires():
    """Exactly requirements/sky-cli.lock; SkyPilot's own click requirement holds there; the same
    SkyPilot as .venv's (one API server and one ~/.sky for `launch` and `sky`)."""
    probe = ("import importlib.metadata as m, json; from packaging.requirements import Requirement\n"
             "reqs = [Requirement(r) for r in m.requires('skypilot')]\n"
             "click = next(r for r in reqs if r.name == 'click' and r.marker is None)\n"
             "print(json.dumps({'installed': {d.metadata['Name']: d.version for d in m.distributions()},\n"
             "                  'click_spec': str(click.specifier), 'click_ok': click.specifier.contains(m.version('click'))}))")
    out = json.loads(subprocess.run([str(TOOL_PY), "-c", probe], capture_output=True, text=True, check=True,
                                    timeout=60).stdout)
    norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()  # noqa: E731
    installed = {norm(k): v for k, v in out["installed"].items()}
    pins = lock_pins(LOCK)
    off = {n: (v, pins.get(n)) for n, v in installed.items() if pins.get(n) != v}
    assert not off, f"installed != requirements/sky-cli.lock (name: (installed, locked)); {INSTALL}: {off}"
    assert out["click_ok"], f"click {installed['click']} does not satisfy SkyPilot's click{out['click_spec']}"
    assert installed["skypilot"] == importlib.metadata.version("skypilot") == lock_pins(
        REPO / "requirements" / "dev.lock")["skypilot"]


@pytest.mark.slow  # 8 s: the sky CLI and launch in subprocesses
def test_sky_help_and_launch_help(tmp_path):
    top = subprocess.run(["sky", "--help"], env=sky_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert top.returncode == 0, top.stderr
    assert re.search(r"(?m)^\s+launch\s", top.stdout) and re.search(r"(?m)^\s+jobs\s", top.stdout)
    launch = subprocess.run(["sky", "launch", "--help"], env=sky_env(tmp_path), capture_output=True, text=True,
                            timeout=120)
    assert launch.returncode == 0, launch.stderr
    assert "--dryrun" in launch.stdout and "--secret" in launch.stdout


@pytest.mark.slow  # 5 s: the sky CLI in a subprocess
def test_sky_launch_gets_past_its_options_to_the_api_server(tmp_path):
    """The bug itself, without a server: with click 8.2+ SkyPilot's CLI turns `--backend`'s default into
    False and raises before any request. Here it parses the task and asks the API server, which is
    not started (SKYPILOT_DISABLE_LOCAL_API_SERVER=1, a port nothing listens on): that is the failure
    expected, and the only one."""
    install_snapshot(tmp_path)
    env = sky_env(tmp_path, SKYPILOT_DISABLE_LOCAL_API_SERVER="1", SKYPILOT_API_SERVER_LOCAL_PORT=str(free_port()))
    r = subprocess.run(["sky", "launch", "-y", "--dryrun", "sky/local-demo.yaml"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=120)
    out = r.stdout + r.stderr
    assert "backend is not supported" not in out, out
    assert r.returncode == 1 and "YAML to run: sky/local-demo.yaml" in out
    assert "starting a local API server on this machine is disabled" in out, out


# ------------------------------------------------------------------- the cloud suite: a real server


def servers_on(port: int) -> list[psutil.Process]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "sky.server.server" in cmd and f"--port={port}" in cmd:
            found.append(p)
    return found


@pytest.fixture(scope="module")
def api_server(tmp_path_factory):
    """A local SkyPilot API server of the tool environment, on a free port under this test's HOME
    (never the user's ~/.sky nor a server of theirs on 46580), seeded offline (tests/house/sky_cli_server.py);
    stopped afterwards, whatever the test did, with `sky api stop` (it stops only the server on this
    port), then any process of it left is killed."""
    home = tmp_path_factory.mktemp("sky-cli") / "home"
    install_snapshot(home)
    (home / ".sky" / "config.yaml").write_text("allowed_clouds: [runpod]\n")  # on-boot check: RunPod only
    port = free_port()
    env = sky_env(home, SKYPILOT_API_SERVER_LOCAL_PORT=str(port))
    env.pop("SKYPILOT_DISABLE_LOCAL_API_SERVER", None)
    try:
        seed = subprocess.run([str(TOOL_PY), str(REPO / "tests" / "sky_cli_server.py"),
                               "--volume", "sonia-workspace:CA:CA-MTL-1"], env=env, capture_output=True, text=True,
                              timeout=180)
        assert seed.returncode == 0, seed.stdout + seed.stderr
        yield env
    finally:
        subprocess.run(["sky", "api", "stop"], env=env, capture_output=True, timeout=120)
        left = servers_on(port)
        for p in left:
            for child in p.children(recursive=True) + [p]:
                try:
                    child.send_signal(signal.SIGKILL)
                except psutil.NoSuchProcess:
                    pass
        assert not left, f"`sky api stop` left the API server on port {port} running (killed)"


@pytest.mark.skipif(os.environ.get("LAUNCH_CLOUD_TESTS") != "1",
                    reason="cloud suite (LAUNCH_CLOUD_TESTS=1): a local API server and two dryruns, 45-80 s")
@pytest.mark.parametrize("name, flags, chosen", [
    # runs here with `launch up`; a plain `sky launch` of it rents the cheapest fit (the task says so)
    ("local-demo", [], r"RunPod \(\w+\)\s+1x_L4_SECURE"),
    # its volume (seeded) pins it to the volume's zone; HF_TOKEN is a secret given at launch
    ("sonia-h100", ["--secret", "HF_TOKEN"], r"RunPod \(CA-MTL-1\)\s+2x_H100-SXM_SECURE"),
], ids=["local-demo", "sonia-h100"])
def test_sky_launch_dryrun_of_the_rendered_tasks(api_server, name, flags, chosen):
    ensure_rsync("`sky launch --dryrun`")
    t0 = time.monotonic()
    r = subprocess.run(["sky", "launch", "-y", "--dryrun", *flags, f"sky/{name}.yaml"], cwd=REPO,
                       env={**api_server, "HF_TOKEN": "not-a-token"}, capture_output=True, text=True, timeout=180)
    out = r.stdout + r.stderr
    assert r.returncode == 0 and "Dryrun finished." in out, out
    assert re.search(chosen, out), out
    assert time.monotonic() - t0 < 120
