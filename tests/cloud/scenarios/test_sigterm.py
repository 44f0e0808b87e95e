"""SkyPilot's own cancel of a sonia-h100 run mid-training, on the emulated RunPod: the project's `sky cancel`
has the skylet on the pod send the job's process group SIGTERM, and SIGKILL 30 s later
(sky/skylet/subprocess_daemon.py), the path a `launch down` takes for a trainer that does not answer its
stop request. The payload saves a checkpoint at the step boundary on that SIGTERM and ends `stopped`;
`launch status` says so with the step; `launch down --fetch-artifacts` brings the run's outputs home,
sha256-verified, with that checkpoint in its index, and the pod is terminated.

The user here is one who installed launch as a tool (tests/installed.py: the wheel in a fresh
environment, SkyPilot and the RunPod SDK, no torch) and works in a project of their own outside this
checkout (`launch init sonia-h100 --from sonia-h100` in an empty directory): what the pod runs is the
payload the install ships, and the artifacts land in the project's artifacts/."""

from __future__ import annotations

import json
import re

import pytest

from tests.cloud.scenarios import profiles
from tests.installed import CLOUD_PACKAGES, install_tool
from tests.cloud.scenarios.steps import cluster_of, status, up, wait_ended, wait_step


@pytest.mark.timeout(1200)
def test_skypilots_sigterm_saves_a_checkpoint_and_down_fetches_it(cloud, report, tmp_path):
    cloud.tool = install_tool(tmp_path / "tool", CLOUD_PACKAGES)
    cloud.cwd = project = tmp_path / "my-project"
    project.mkdir()
    made = cloud.launch("init", "sonia-h100", "--from", "sonia-h100", timeout=120)
    assert made.returncode == 0 and (project / "clusters" / "sonia-h100.yaml").is_file(), made.stdout + made.stderr
    (project / "data").mkdir()
    # No periodic save before the signal (save_steps 5000): a checkpoint after it is the SIGTERM's.
    args = profiles.sonia(project / "data", max_steps=20000, save_steps=5000, root=project)
    run = up(cloud, "sonia-h100", *args)
    wait_step(cloud, run, 5)

    cancel = cloud.sky("cancel", "-y", "-a", cluster_of(run), timeout=300)
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    ended = wait_ended(cloud, run, 300, what="the run to end after SkyPilot's cancel")
    assert ended["state"] == "stopped", ended
    m = re.search(r"stopped by SIGTERM at step (\d+) of 20000; checkpoint-(\d+) saved", ended.get("reason") or "")
    assert m and m.group(1) == m.group(2), ended
    step = int(m.group(1))

    down = cloud.launch("down", run, "--fetch-artifacts", timeout=900)
    out = down.stdout + down.stderr
    assert down.returncode == 0 and "verified" in out, out
    index = json.loads((project / "artifacts" / run / "checkpoints.json").read_text())  # the project's
    assert [(c["name"], c["complete"]) for c in index] == [(f"checkpoint-{step}", True)], index
    assert not cloud.api("GET", "/admin/state")["pods"], "the pod outlived `launch down`"
    print("  what `launch down --fetch-artifacts` said:\n" + "\n".join("    " + ln for ln in out.splitlines()))
    # The bill runs until the pod is gone, not until the job ended: never under what RunPod billed for the
    # pod (a few seconds of clocks aside), over it by the wait from `up` to the pod (before the fix: $0.2262
    # against RunPod's $0.2609, the fetch and teardown after the job's end unbilled)
    usd = json.loads(cloud.launch("cost", "--json", timeout=180).stdout)["total_usd"]
    ledger = cloud.api("GET", "/admin/state")["billed_usd"]
    print(f"  launch billed ${usd:.4f}; RunPod billed the pod ${ledger:.4f}")
    assert ledger - profiles.SONIA_PRICE * 3 / 3600 <= usd <= ledger + profiles.SONIA_PRICE * 180 / 3600, (usd, ledger)
    report(state=status(cloud, run)["state"], usd=usd, ledger_usd=ledger, steps=step)
