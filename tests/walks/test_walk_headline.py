"""The headline command as a new user runs it (issue 32 item 1): `launch up PROFILE` for every shipped
cloud profile, from the installed console script, with a fresh HOME, no credentials, stdin not a
terminal. It ends in the one credentials line, exit 1, with nothing left running: no SkyPilot API
server, no run recorded as active. Before, every one ended in `✗ internal: this process imported
SkyPilot for offline planning`.

Each test gets a SkyPilot API server port of its own (SkyPilot's SKYPILOT_API_SERVER_LOCAL_PORT):
this machine runs other test sessions whose servers sit on the default port, and a user's machine
has only its own. RunPod's API is pointed at a closed local port: no test reaches the network.
"""

from __future__ import annotations

import socket
from pathlib import Path

import psutil
import pytest
import yaml

from walk import REPO, assert_one_line_error, launch

CLOUD_PROFILES = sorted(f.stem for f in (REPO / "clusters").glob("*.yaml")
                        if (yaml.safe_load(f.read_text())["cluster"].get("infra") or "") != "local")

# What the user brings that the repo does not ship: the data files three profiles name
# (data/... is the user's own). The shipped samples stand in, given as the user would, with --set.
DATA = {
    "lovecraft-a100-spot": ["data.sources.0.path=payload/samples/demo_alpaca.jsonl"],
    "qwen3-32b-4x4-a100": ["data.sources.0.path=payload/samples/demo_alpaca.jsonl", "data.sources.0.format=alpaca"],
    "spatial-vl-t4": ["data.sources.0.path=payload/samples/demo_chat.jsonl",
                      "stages.2.data.sources.0.path=payload/samples/demo_chat.jsonl",
                      "stages.2.data.sources.0.format=messages"],
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def up(tmp_path: Path, profile: str, env: dict | None = None):
    port = free_port()
    sets = [a for item in DATA.get(profile, []) for a in ("--set", item)]
    r = launch(tmp_path, "up", profile, *sets, env={"SKYPILOT_API_SERVER_LOCAL_PORT": str(port),
                                                   "RUNPOD_API_BASE_URL": f"http://127.0.0.1:{free_port()}",
                                                   **(env or {})})
    return r, port


def assert_nothing_left(tmp_path: Path, port: int, monkeypatch) -> None:
    """No API server on this test's port or from its HOME, and no run recorded as active."""
    home = str(tmp_path / "user-home")
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(proc.info.get("cmdline") or [])
        if "sky.server.server" not in cmdline:
            continue
        try:
            env_home = proc.environ().get("HOME")
        except (psutil.AccessDenied, psutil.NoSuchProcess):
            env_home = None
        assert f"--port={port}" not in cmdline and env_home != home, f"API server left running: {cmdline}"
    from launcher.store import registry

    monkeypatch.setenv("LAUNCH_HOME", str(tmp_path / "user-launch-home"))
    assert [r.id for r in registry.all_runs() if r.state in registry.ACTIVE_STATES] == []


@pytest.mark.parametrize("profile", CLOUD_PROFILES)
def test_launch_up_without_credentials_ends_in_the_credentials_line(tmp_path, monkeypatch, profile):
    r, port = up(tmp_path, profile)
    line = assert_one_line_error(r, "SkyPilot has no usable credentials for", "`sky check ", code=1)
    out = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.strip()]
    assert out == [line], out  # the one line: no internal error, no API server started and stopped
    assert_nothing_left(tmp_path, port, monkeypatch)


def test_fake_runpod_credentials_end_in_one_line_with_skypilots_reason(tmp_path, monkeypatch):
    """A key that SkyPilot cannot verify (here RunPod's API is unreachable; online, it answers 401)."""
    (tmp_path / "user-home" / ".runpod").mkdir(parents=True)
    (tmp_path / "user-home" / ".runpod" / "config.toml").write_text('[default]\napi_key = "rpa_FAKE00000000"\n')
    r, port = up(tmp_path, "sonia-h100", env={"RUNPOD_API_KEY": "rpa_FAKE00000000"})
    line = assert_one_line_error(r, "SkyPilot has no usable credentials for runpod", "RunPod API key", code=1)
    assert "internal" not in r.stdout + r.stderr and "rpa_FAKE" not in line
    assert_nothing_left(tmp_path, port, monkeypatch)


def test_a_missing_runpod_config_is_named_even_with_runpod_api_key_set(tmp_path, monkeypatch):
    """SkyPilot 0.14 reads RunPod's key from ~/.runpod/config.toml only: RUNPOD_API_KEY alone is no credential."""
    r, port = up(tmp_path, "well-log-ocr-spot", env={"RUNPOD_API_KEY": "rpa_FAKE00000000"})
    assert_one_line_error(r, "~/.runpod/config.toml does not exist", "run `runpod config`", code=1)
    assert_nothing_left(tmp_path, port, monkeypatch)


# The same command past the credentials check (no test can hold real credentials): the price, the
# budget gate's plan and the render run for real in the launching process, and the SDK is then
# imported there, where the cloud launch would start. Only the two cloud edges are replaced.
PAST_THE_CHECK = """
import sys
from launcher.backends import skypilot as sp
from launcher.errors import BackendError

def up(self, spec):
    sp.sdk()  # what crashed: `internal: this process imported SkyPilot for offline planning`
    raise BackendError("the SDK is usable in the launching process")

sp.check_credentials_here = lambda p: None  # as if ~/.runpod/config.toml held a working key
sp.SkyPilotBackend.up = up
sys.argv = ["launch", *sys.argv[1:]]
from launcher.cli import main
main()
"""


def test_launch_up_past_the_credentials_check_plans_and_then_can_use_the_sdk(tmp_path):
    import subprocess
    import sys

    from walk import fresh_env

    args = ["up", "qwen3-32b-4x4-a100", *[a for item in DATA["qwen3-32b-4x4-a100"] for a in ("--set", item)],
            "--set", "budget.max_usd=1"]
    r = subprocess.run([sys.executable, "-c", PAST_THE_CHECK, *args], cwd=REPO, env=fresh_env(tmp_path),
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert "is over the budget cap $1.00" in out, out  # the gate planned, in this process's run of `up`
    assert_one_line_error(r, "the SDK is usable in the launching process", code=1)
    assert "internal" not in out
