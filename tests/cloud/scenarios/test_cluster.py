"""sonia-h100 on the emulated RunPod, as its user runs it: up -> logs -> status -> down --fetch-artifacts
mid-training -> volumes -> up --rehearse --follow -> down -> volumes rm. The real SkyPilot (client, local API server, RunPod provisioner,
skylet on the pod) does every step; the pods are namespaces of this machine (tests/cloud/harness.py)."""

from __future__ import annotations

import json

import pytest

from tests.cloud.scenarios import profiles
from tests.cloud.scenarios.steps import cluster_of, run_id_of, status, up, wait_ended, wait_step

PRICE = profiles.SONIA_PRICE


@pytest.mark.timeout(1500)
def test_sonia_up_logs_status_down_fetch_volumes(cloud, in_repo, report, tmp_path):
    args = profiles.sonia(in_repo, max_steps=5000, save_steps=10)
    run = up(cloud, "sonia-h100", *args)

    # One pod on the emulated RunPod, on demand, priced from the catalog.
    pods = cloud.api("GET", "/admin/state")["pods"]
    assert [(p["podType"], p["costPerHr"]) for p in pods] == [("RESERVED", PRICE)], pods

    # The `sky` CLI of the project's install, on the same API server and cloud.
    sky_status = cloud.sky("status", timeout=300)
    assert sky_status.returncode == 0 and cluster_of(run) in sky_status.stdout, sky_status.stdout + sky_status.stderr
    dry = cloud.sky("launch", "-y", "--dryrun", "--secret", "HF_TOKEN", "sky/sonia-h100.yaml",
                    env={"HF_TOKEN": "hf_emulated"}, timeout=300)
    assert dry.returncode == 0 and "2x_H100-SXM_SECURE" in dry.stdout, dry.stdout + dry.stderr
    # Two nodes (runbook 004) cannot run here: SkyPilot's RunPod has no multi-node (sky/clouds/runpod.py:30),
    # as its own dry run of a two-node task on this cloud says; `launch up` refuses such a profile first.
    two = tmp_path / "two-nodes.yaml"
    two.write_text("resources:\n  infra: runpod\n  accelerators: H100-SXM:2\nnum_nodes: 2\nrun: hostname\n")
    nodes = cloud.sky("launch", "-y", "--dryrun", str(two), timeout=300)
    said = nodes.stdout + nodes.stderr
    assert nodes.returncode != 0 and "Multi-node not supported" in said, said
    refused = cloud.launch("up", "qwen3-32b-4x4-a100", "--set", "cluster.infra=[runpod]", timeout=180)
    said = refused.stdout + refused.stderr
    assert refused.returncode == 1 and "runpod cannot run multi-node tasks" in said and "Traceback" not in said, said

    st = wait_step(cloud, run, 12)
    assert st["state"] == "running", st
    assert st.get("loss") is not None, st

    logs = cloud.launch("logs", run, timeout=180)
    assert logs.returncode == 0, logs.stdout + logs.stderr
    assert "step" in logs.stdout, logs.stdout[-3000:]

    down = cloud.launch("down", run, "--fetch-artifacts", "--dest", str(tmp_path / "artifacts"), timeout=900)
    assert down.returncode == 0, down.stdout + down.stderr
    out = down.stdout + down.stderr
    assert "verified" in out, out

    after = status(cloud, run)
    assert after["state"] == "stopped", after
    state = cloud.api("GET", "/admin/state")
    assert not state["pods"], state  # terminated
    vols = cloud.launch("volumes", "--json", timeout=180)
    assert vols.returncode == 0 and "sonia-workspace" in vols.stdout, vols.stdout + vols.stderr

    # A rehearsal of the same profile: 10 steps on a new cluster, followed to its end, then down.
    reh = cloud.launch("up", "sonia-h100", "--rehearse", *args, "--follow", timeout=900)
    assert reh.returncode == 0, reh.stdout[-3000:] + reh.stderr[-3000:]
    rehearsal = run_id_of(reh.stdout)
    assert "rehearsal" in rehearsal, rehearsal
    done = wait_ended(cloud, rehearsal, 300, what="the rehearsal to end")
    assert done["state"] == "completed" and done["step"] == 10, done
    gone = cloud.launch("down", rehearsal, timeout=600)
    assert gone.returncode == 0, gone.stdout + gone.stderr
    assert not cloud.api("GET", "/admin/state")["pods"], "the rehearsal's pod outlived `launch down`"

    cost = json.loads(cloud.launch("cost", "--json", timeout=180).stdout)
    usd = cost["total_usd"]
    rm = cloud.launch("volumes", "rm", "sonia-workspace", "--yes", timeout=300)
    assert rm.returncode == 0, rm.stdout + rm.stderr
    assert not cloud.api("GET", "/admin/state").get("volumes"), "the volume is still on the cloud"
    print("\n".join(f"  {c:<40} {t:6.1f} s  exit {rc}" for c, t, rc in cloud.timings))
    print("  what `launch down --fetch-artifacts` said:\n" + "\n".join("    " + ln for ln in out.splitlines()))
    # both runs (the run and its rehearsal), as `launch cost`'s total counts them: never under what RunPod
    # bills for the pods, over it by at most the wait from `up` to each pod (volume, provisioning) and a
    # refresh's lag
    ledger = cloud.api("GET", "/admin/state")["billed_usd"]
    print(f"  launch billed ${usd:.4f} for the run and its rehearsal; RunPod billed the pods ${ledger:.4f}")
    assert ledger - PRICE * 5 / 3600 <= usd <= ledger + 2 * PRICE * 120 / 3600, (usd, ledger)
    report(state=after["state"], usd=usd, ledger_usd=ledger, steps=after.get("step"))
