"""Running a rendered SkyPilot task without SkyPilot (local and SSH backends).

SkyPilot's contract on every node is: the workdir is uploaded and is the cwd, `envs` and `secrets`
are in the environment together with SKYPILOT_NODE_RANK / SKYPILOT_NODE_IPS / SKYPILOT_NUM_NODES /
SKYPILOT_NUM_GPUS_PER_NODE / SKYPILOT_TASK_ID, `setup` runs, then `run`. These helpers reproduce it,
so the exact script that runs in the cloud is the one exercised here.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Optional

import yaml

from launcher.profiles.uploads import upload_plan


def load_task(task_yaml: Path) -> dict:
    with open(task_yaml) as f:
        return yaml.safe_load(f)


def node_env(task: dict, overrides: dict[str, str], *, rank: int, ips: list[str], gpus_per_node: int,
             task_id: str) -> dict[str, str]:
    """The environment of one node: task envs, launch overrides, then SkyPilot's node variables."""
    env = {k: str(v) for k, v in (task.get("envs") or {}).items() if v is not None}
    env.update(overrides)
    env.update({
        "SKYPILOT_NODE_RANK": str(rank),
        "SKYPILOT_NODE_IPS": "\n".join(ips),
        "SKYPILOT_NUM_NODES": str(len(ips)),
        "SKYPILOT_NUM_GPUS_PER_NODE": str(gpus_per_node),
        "SKYPILOT_TASK_ID": task_id,
    })
    return env


def node_script(task: dict, log_name: str = "run.log") -> str:
    """Bash that runs `setup` then `run` in the cwd; the caller provides the environment."""
    setup = task.get("setup") or "true"
    run = task.get("run") or "true"
    return (
        "set -uo pipefail\n"
        f"echo \"launch: setup on node $SKYPILOT_NODE_RANK\"\n"
        f"bash -c {shlex.quote(setup)} || exit $?\n"
        f"echo \"launch: run on node $SKYPILOT_NODE_RANK\"\n"
        f"exec bash -c {shlex.quote(run)}\n"
    )


def export_lines(env: dict[str, str], skip: Optional[set[str]] = None) -> str:
    """`export K=V` lines for non-secret variables (secrets never go into a script file)."""
    skip = skip or set()
    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in sorted(env.items()) if k not in skip)


def workdir_files(profile, config_yaml: Path, config_rel: str) -> dict[str, Path]:
    """What is uploaded as the workdir (launcher/profiles/uploads.py: an allowlist of the payload's code, the
    run's resolved config at the path the task's LAUNCH_CONFIG names, and the profile's data files)."""
    return upload_plan(profile, config_yaml, config_rel).files
