"""lovecraft-a100-spot as a managed job on the emulated RunPod: SkyPilot's real jobs controller (itself a
RunPod CPU pod) runs the job on a spot pod; the emulator takes that pod away after a checkpoint; the
controller recovers onto a new pod and training resumes from the network volume at the saved step.
The adapter equals the one an uninterrupted run of the same profile trains (here, on the local
backend), and `launch cost` bills both attempts, not the gap between them."""

from __future__ import annotations

import json
import re
import threading
import time
from pathlib import Path

import pytest

from tests.cloud.scenarios import profiles
from tests.cloud.scenarios.steps import run_id_of, up, wait_ended, wait_for

PRICE = 1.59  # RunPod 1x_A100-80GB-SXM_SECURE spot in the shipped catalog snapshot (SpotPrice = Price there)
STEPS, SAVE = 120, 20
# A tiny model trains ~50 steps/s on a pod here; a checkpoint takes ~1 s. The preemption is timed from
# the cloud's side (the volume's directory, polled every 0.2 s), not through `launch status` (a poll
# there reads status.json through RunPod's S3 API, seconds apart), so it lands mid-training.


def _job_pods(cloud) -> list[dict]:
    return [p for p in cloud.api("GET", "/admin/state")["pods"] if p["podType"] == "INTERRUPTABLE"]


def _watch(cloud, run: str, stop: threading.Event, seen: list) -> None:
    """`launch status RUN` every few seconds until `stop`, as a user watching the run does."""
    while not stop.wait(3):
        r = cloud.launch("status", run, "--json", timeout=180)
        if r.returncode == 0:
            seen.append(json.loads(r.stdout).get("state"))


def _adapter(dest: Path) -> bytes:
    files = sorted(dest.rglob("adapter_model.safetensors"))
    assert files, sorted(str(p.relative_to(dest)) for p in dest.rglob("*"))[:50]
    return files[0].read_bytes()


@pytest.mark.timeout(1800)
def test_spot_job_recovers_from_a_preemption_and_resumes_at_the_saved_step(cloud, in_repo, report, tmp_path):
    args = profiles.lovecraft(in_repo, max_steps=STEPS, save_steps=SAVE)
    up_at = time.time()
    run = up(cloud, "lovecraft-a100-spot", *args, timeout=1200)
    # The user watches it in another terminal (`watch launch status`): launch bills what it sees.
    watching, seen = threading.Event(), []
    watcher = threading.Thread(target=_watch, args=(cloud, run, watching, seen), daemon=True)
    watcher.start()

    # The job's spot pod trains past a checkpoint; then the host takes it away.
    (volume,) = cloud.api("GET", "/admin/state")["volumes"]
    run_dir = Path(volume["dir"]) / "runs" / run
    first = run_dir / "checkpoints" / f"checkpoint-{SAVE}" / "COMPLETE"
    wait_for(lambda: first.exists(), 900, every=0.2, what=f"checkpoint-{SAVE} on the volume", cloud=cloud, run=run)
    pods = _job_pods(cloud)
    assert len(pods) == 1 and pods[0]["costPerHr"] == PRICE, pods
    cloud.api("POST", f"/admin/preempt/{pods[0]['id']}?mode=vanish")
    st = json.loads((run_dir / "status.json").read_text())
    assert st["state"] == "training" and st["step"] < STEPS, st  # taken away mid-training
    queue = cloud.sky("jobs", "queue", timeout=300)
    assert queue.returncode == 0 and run in queue.stdout, queue.stdout + queue.stderr

    # SkyPilot's controller notices, launches a new spot pod, and the job runs there again.
    wait_for(lambda: [p for p in _job_pods(cloud) if p["id"] != pods[0]["id"]], 600, what="a new spot pod", cloud=cloud, run=run)
    done = wait_ended(cloud, run, 900, every=10, what="the run to end")
    assert done["state"] == "completed", done
    assert done["step"] == STEPS, done  # read by `launch status` through RunPod's S3 API (a managed job)

    logs = cloud.launch("logs", run, timeout=300).stdout
    resumed = re.findall(r"resum\w* .*?checkpoint-(\d+)", logs)
    assert resumed and int(resumed[-1]) >= SAVE, logs[-4000:]

    down = cloud.launch("down", run, "--fetch-artifacts", "--dest", str(tmp_path / "artifacts"), timeout=900)
    assert down.returncode == 0 and "verified" in down.stdout + down.stderr, down.stdout + down.stderr
    cloud_adapter = _adapter(tmp_path / "artifacts" / run)
    watching.set()
    watcher.join(timeout=120)

    # The bill: both attempts, not the gap. The emulator's ledger is what RunPod bills for the pods.
    ledger = [e for e in cloud.api("GET", "/admin/state")["ledger"] if e["podType"] == "INTERRUPTABLE"]
    assert len(ledger) == 2, ledger
    gap_s = ledger[1]["created"] - ledger[0]["ended"]
    pods_usd = sum(e["costPerHr"] * (e["ended"] - e["created"]) / 3600 for e in ledger)
    cost = json.loads(cloud.launch("cost", "--json", timeout=300).stdout)
    usd = next(r_["cost_usd"] for r_ in cost["runs"] if r_["id"] == run)
    # Never less than RunPod bills for the two pods; more by at most the wait before the first pod
    # (launch bills from `up`: the jobs controller's own start is priced at the job's rate) and a
    # refresh's lag at each end: the gap between the pods is not billed.
    pods_s = sum(e["ended"] - e["created"] for e in ledger)
    before_s = ledger[0]["created"] - up_at
    said = (f"launch billed ${usd:.4f} = {usd / PRICE * 3600:.0f} s at ${PRICE}/h; RunPod billed the job's pods "
            f"${pods_usd:.4f} ({pods_s:.0f} s); {before_s:.0f} s from `up` to the first pod; gap {gap_s:.0f} s; "
            f"{len(seen)} refreshes watched")
    print("  " + said)
    assert pods_usd - PRICE * 20 / 3600 <= usd <= PRICE * (pods_s + before_s + 60) / 3600, said

    # The same run, uninterrupted, on the local backend: the same adapter.
    local = cloud.launch("up", "lovecraft-a100-spot", "--backend", "local", "--follow", *args, timeout=900)
    assert local.returncode == 0, local.stdout[-3000:] + local.stderr[-3000:]
    local_run = run_id_of(local.stdout)
    fetched = cloud.launch("down", local_run, "--fetch-artifacts", "--dest", str(tmp_path / "artifacts"), timeout=300)
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    same = _adapter(tmp_path / "artifacts" / local_run) == cloud_adapter
    print("\n".join(f"  {c:<40} {t:6.1f} s  exit {rc}" for c, t, rc in cloud.timings
                    if not c.startswith("launch status")))  # the watcher's: counted in the bill's line
    print(f"  preempted at step {st['step']}, gap {gap_s:.0f} s, adapter identical to the local run: {same}")
    report(state=done["state"], usd=usd, ledger_usd=pods_usd, steps=done["step"])
    assert same, "the recovered run's adapter differs from the uninterrupted run's"
