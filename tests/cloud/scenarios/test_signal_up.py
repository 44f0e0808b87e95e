"""`launch up sonia-h100` stopped by a signal while SkyPilot provisions its pod on the emulated RunPod (a
closed terminal: SIGHUP; a CI timeout: SIGTERM). Before, the run reached the registry only after the
start returned: `launch status` said "no runs yet", `launch cost` "$0.00", and the pod billed on.
Now the run is recorded, `starting`, before SkyPilot is asked for anything: `launch status` shows it,
`launch down` tears the pod down, and `launch cost` bills it (as RunPod's ledger does, within a few
seconds)."""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest

from tests.cloud.scenarios import profiles
from tests.cloud.scenarios.steps import wait_for


def _signalled_up(cloud, args, sig, when) -> subprocess.CompletedProcess:
    """`launch up sonia-h100 ARGS` in the cloud's namespace, sent `sig` once `when()` holds."""
    proc = subprocess.Popen(["ip", "netns", "exec", cloud.ns, str(cloud.tool), "up", "sonia-h100", *args],
                            cwd=cloud.cwd, env=cloud.env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    wait_for(lambda: proc.poll() is not None or when(), 300, every=0.5, what="the signal's moment")
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.timeout(900)
def test_up_signalled_while_provisioning_keeps_the_run_and_down_ends_its_pod(cloud, in_repo, report):
    args = profiles.sonia(in_repo, max_steps=5000, save_steps=10)
    pods = lambda: cloud.api("GET", "/admin/state")["pods"]  # noqa: E731
    r = _signalled_up(cloud, args, signal.SIGTERM, lambda: bool(pods()))  # the pod exists, SkyPilot sets it up
    out = r.stdout + r.stderr
    assert r.returncode in (0, 143) and "Traceback" not in out, out  # 0: detached, as on Ctrl-C (SkyPilot goes on)

    listed = cloud.launch("status", "--all", "--json", timeout=180)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    [run] = json.loads(listed.stdout)
    assert run["state"] in ("starting", "running"), run
    assert run["id"] in " ".join(out.split()), out  # what runs, and how to stop it
    down = cloud.launch("down", run["id"], timeout=600)
    assert down.returncode == 0 and f"{run['id']} is down" in down.stdout, down.stdout + down.stderr
    wait_for(lambda: not pods(), 120, what="the pod to go after `launch down`")
    time.sleep(1)
    usd = json.loads(cloud.launch("cost", "--json", timeout=180).stdout)["total_usd"]
    ledger = cloud.api("GET", "/admin/state")["billed_usd"]
    print(f"  launch billed ${usd:.4f}; RunPod billed the pod ${ledger:.4f}")
    assert usd > 0 and usd >= ledger - profiles.SONIA_PRICE * 5 / 3600, (usd, ledger)
    report(state=run["state"], usd=usd, ledger_usd=ledger, steps=0)
