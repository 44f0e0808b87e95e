"""The path the user takes: the installed `launch` console script in a subprocess, a fresh HOME and
LAUNCH_HOME, no credentials, stdin not a terminal, an 80-column terminal width.

    from walk import launch
    r = launch(tmp_path, "up", "sonia-h100")
    assert r.returncode == 1 and r.stdout.startswith(...)

Each call builds its environment from scratch: the variables of this process that name a cloud
credential, a hub token or SkyPilot's runtime dir are dropped, so the command sees what a new user's
shell would show it. Pass `env={...}` to add (fake) credentials or settings, `cwd=` to run elsewhere.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LAUNCH = Path(sys.executable).parent / "launch"

# What a fresh machine's shell does not have: credentials of any cloud or hub the project talks to,
# this test session's SkyPilot runtime dir, and the debug switch (a user sees no traceback).
_DROPPED_PREFIXES = ("AWS_", "GOOGLE_", "AZURE_", "RUNPOD_", "LAMBDA_", "SKYPILOT_", "SKY_", "HF_",
                     "HUGGING", "WANDB_", "LAUNCH_", "GITHUB_", "GH_", "OPENAI_", "KUBECONFIG")


def fresh_env(tmp_path: Path, env: dict | None = None) -> dict:
    """The environment of a new user on this machine: HOME and LAUNCH_HOME under tmp_path."""
    home = tmp_path / "user-home"
    home.mkdir(parents=True, exist_ok=True)
    out = {k: v for k, v in os.environ.items() if not k.upper().startswith(_DROPPED_PREFIXES)}
    out.update({
        "HOME": str(home),
        "LAUNCH_HOME": str(tmp_path / "user-launch-home"),
        "COLUMNS": "80",
        "TERM": "dumb",
        # No network in tests: SkyPilot would phone home, the payload's preflight would call the Hub.
        "SKYPILOT_DISABLE_USAGE_COLLECTION": "1",
        "LAUNCH_PREFLIGHT_OFFLINE": "1",
    })
    out.update(env or {})
    return out


def launch(tmp_path: Path, *args: str, env: dict | None = None, cwd: Path | None = None,
           timeout: float = 300) -> subprocess.CompletedProcess:
    """Run `launch ARGS...` as the installed console script; stdout and stderr as text."""
    return subprocess.run([str(LAUNCH), *args], cwd=cwd or REPO, env=fresh_env(tmp_path, env),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)


def assert_one_line_error(r: subprocess.CompletedProcess, *needles: str, code: int = 1) -> str:
    """The run failed with `code`, printed no traceback, and its `✗` line holds every needle."""
    out = r.stdout + r.stderr
    assert r.returncode == code, f"exit {r.returncode}, wanted {code}:\n{out}"
    assert "Traceback" not in out, out
    lines = [line for line in out.splitlines() if line.startswith("✗")]
    assert lines, out
    for needle in needles:
        assert any(needle in line for line in lines), f"{needle!r} not in the ✗ line(s):\n{out}"
    return lines[0]


def run_pids(run_id: str, under: Path) -> list[int]:
    """This test's processes of a run: its id, and its volume under `under` (the test's tmp_path). By the
    id alone, another `make test` beside this one, whose runs have the same ids, would be counted (and
    killed by a cleanup)."""
    out = []
    for env in Path("/proc").glob("[0-9]*/environ"):
        try:
            entries = env.read_bytes().split(b"\0")
            if f"LAUNCH_RUN_ID={run_id}".encode() in entries and \
                    any(e.startswith(f"LAUNCH_VOLUME={under}".encode()) for e in entries):
                out.append(int(env.parent.name))
        except (OSError, ValueError):
            continue
    return out
