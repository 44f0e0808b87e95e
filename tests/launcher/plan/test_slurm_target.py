"""Runbook 004's profile on your own Slurm cluster (`--set cluster.infra=slurm/<Host>`): the plan is made
offline from what the profile says of the cluster (cluster.slurm: its price per GPU-hour, its network),
the run's files go to the shared filesystem instead of the bucket, and what Slurm cannot do is refused
in one line. The real engine on a real Slurm cluster: tests/cloud/scenarios/test_slurm.py."""

from __future__ import annotations

import json

from launcher.profiles.render import task_dict
from walk import launch

SLURM = ("--set", "cluster.infra=slurm/hpc")


def test_plan_on_slurm_bills_the_profiles_gpu_hour_price_and_its_network(tmp_path):
    r = launch(tmp_path, "plan", "qwen3-32b-4x4-a100", *SLURM, "--json")
    plan = json.loads(r.stdout)
    # 4.10 $/GPU-h x 8 GPUs x 2 nodes; no catalog was asked
    assert (plan["price_per_hour"], plan["price_source"]) == (65.6, "profile cluster.slurm.price_per_gpu_hour")
    assert plan["speed"]["link"]["kind"] == "InfiniBand" and plan["speed"]["bound"] == "compute", plan["speed"]
    eth = json.loads(launch(tmp_path, "plan", "qwen3-32b-4x4-a100", *SLURM, "--set", "cluster.slurm.infiniband=false",
                            "--set", "cluster.slurm.network_gbps=80", "--json").stdout)
    assert eth["speed"]["bound"] == "network" and eth["total_hours"] > 5 * plan["total_hours"], eth["speed"]


def test_a_slurm_run_keeps_its_files_on_the_shared_filesystem_not_the_bucket():
    from launcher.profiles.profile import load_profile

    p = load_profile("qwen3-32b-4x4-a100", overrides=["cluster.infra=slurm/hpc"])
    task = task_dict(p, 65.6)
    assert task["resources"]["infra"] == "slurm/hpc" and "file_mounts" not in task, task
    assert task["envs"]["LAUNCH_VOLUME"] == "/shared/launch" and "LAUNCH_ENV_ROOT" not in task["envs"], task["envs"]
    default = task_dict(load_profile("qwen3-32b-4x4-a100"), 65.54)
    assert default["file_mounts"]["/checkpoints"]["store"] == "azure"  # the clouds' target keeps its bucket


def _refused(r, needle: str) -> None:
    """Refused, with a `✗` line naming the key (the profile's missing data file is its other line)."""
    out = r.stdout + r.stderr
    assert r.returncode == 1 and "Traceback" not in out, out
    assert any(ln.startswith("✗") and "cluster" in ln and needle in ln for ln in out.splitlines()), out


def test_what_slurm_cannot_do_is_refused_in_one_line(tmp_path):
    _refused(launch(tmp_path, "plan", "qwen3-32b-4x4-a100", "--set", "cluster.infra=[slurm/hpc, azure]"),
             "slurm/hpc cannot be listed with other infra")
    _refused(launch(tmp_path, "plan", "qwen3-32b-4x4-a100", *SLURM, "--set", "cluster.use_spot=true"),
             "no spot machines")
    _refused(launch(tmp_path, "plan", "qwen3-32b-4x4-a100", *SLURM, "--set", "cluster.slurm.shared_dir=~/runs"),
             "not a usable mount point")
    _refused(launch(tmp_path, "plan", "qwen3-32b-4x4-a100", "--set", "cluster.infra=slurm"), "name the cluster")
