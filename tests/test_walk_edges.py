"""What launch touches on the user's machine outside its own place, walked as the user walks it
(tests/walk.py: the installed `launch` in a subprocess, fresh HOME and LAUNCH_HOME, 80 columns).

- The commands that need no cloud (validate, plan, profiles, render, init, data preview) leave the
  user's HOME as they found it: SkyPilot's offline planner keeps everything, `~/.sky/...` paths
  included, under LAUNCH_HOME (launcher/catalog/__init__.py). `launch up` on a cloud may create
  `~/.sky`: that is SkyPilot's own place, where it keeps its clusters and API server state.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from walk import REPO, launch


def home_listing(tmp_path: Path) -> list[str]:
    home = tmp_path / "user-home"
    return sorted(str(p.relative_to(home)) for p in home.rglob("*"))


def repo_copy(tmp_path: Path) -> Path:
    """The code and profiles in a scratch repo (`init` writes clusters/NAME.yaml there, not in the
    checkout other tests read); the installed `launch` runs it with PYTHONPATH pointing at it."""
    copy = tmp_path / "repo"
    for d in ("launcher", "payload", "clusters", "sky"):
        shutil.copytree(REPO / d, copy / d, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def test_commands_that_need_no_cloud_leave_the_users_home_as_it_was(tmp_path):
    copy = repo_copy(tmp_path)
    sample = "data.sources=[{name: s, path: payload/samples/demo_chat.jsonl, format: messages}]"
    walks = [  # the planning commands each with a fresh LAUNCH_HOME: each imports SkyPilot itself
        (("validate", "sonia-h100"), {}),
        (("plan", "sonia-h100"), {"env": {"LAUNCH_HOME": str(tmp_path / "lh-plan")}}),
        (("profiles",), {"env": {"LAUNCH_HOME": str(tmp_path / "lh-profiles")}}),
        (("render", "sonia-h100", "--check"), {"env": {"LAUNCH_HOME": str(tmp_path / "lh-render")}}),
        (("data", "preview", "sonia-h100", "-n", "1", "--set", sample), {}),
        (("init", "my-h100", "--from", "sonia-h100"), {"cwd": copy, "env": {"PYTHONPATH": str(copy)}}),
    ]
    for args, how in walks:
        r = launch(tmp_path, *args, **how)
        assert r.returncode == 0, f"launch {' '.join(args)}: exit {r.returncode}\n{r.stdout}{r.stderr}"
        assert home_listing(tmp_path) == [], f"launch {' '.join(args)} wrote into HOME: {home_listing(tmp_path)}"
    assert (copy / "clusters" / "my-h100.yaml").is_file() and not (REPO / "clusters" / "my-h100.yaml").exists()
    for used in ("lh-plan", "lh-profiles", "lh-render"):  # where SkyPilot's own files went instead
        assert (tmp_path / used / "sky-offline" / ".sky" / "user_hash").is_file()
