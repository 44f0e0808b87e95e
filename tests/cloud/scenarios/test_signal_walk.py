"""`launch up sonia-h100` signalled at 20 points from its start to its ✓ line on the emulated RunPod (a
closed terminal: SIGHUP; a CI timeout or `kill`: SIGTERM), one cloud and one SkyPilot API server for all
of them, as one user's day would be. The points are the moments a user sees go by (launch's record,
SkyPilot's "Running on cluster", "Launching on RunPod", the pod in RunPod's API, "Instance is up",
"Cluster launched", "Syncing files", "Setup detached", "Job submitted"), each signalled at once and again
2 s later. Every time: either nothing started (no record, no pod), or `launch status` shows the run,
`launch down` ends it and its pod (and no pod comes back once SkyPilot's requests settle), and `launch
cost` bills it, never less than RunPod's ledger of the pods' lifetimes.

Each point provisions a pod to the point and tears it down: ~2 min each, ~40 min in all on 2 cores, so
this walk is `make cloud-test-signals`, not part of `make cloud-test` (which holds one point of it:
test_signal_up.py)."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import threading
import time

import pytest

from tests.cloud.scenarios import profiles
from tests.cloud.scenarios.steps import wait_for

pytestmark = pytest.mark.signal_walk

POINTS = 20
OFFSETS = (0.0, 2.0)  # seconds after each milestone


class Trial:
    """One `launch up sonia-h100 ARGS` in the cloud's namespace, its output read line by line."""

    def __init__(self, cloud, args):
        self.cloud, self.lines, self.t0 = cloud, [], time.monotonic()
        self.proc = subprocess.Popen(["ip", "netns", "exec", cloud.ns, str(cloud.tool), "up", "sonia-h100", *args],
                                     cwd=cloud.cwd, env=cloud.env(), stdin=subprocess.DEVNULL,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)

    def said(self, text: str) -> bool:
        return any(text in ln for ln in list(self.lines))

    def out(self) -> str:
        self._reader.join(30)
        return "".join(self.lines)


def _recorded(cloud) -> set[str]:
    """The run ids in the user's registry, read-only (as a second `launch status` would read it)."""
    db = cloud.launch_home / "runs.db"
    if not db.exists():
        return set()
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=0.05)
        try:
            return {r[0] for r in con.execute("SELECT id FROM runs")}
        finally:
            con.close()
    except sqlite3.Error:
        return set()


def _milestones(cloud, before: set[str]):
    pods = lambda: bool(cloud.api("GET", "/admin/state")["pods"])  # noqa: E731
    line = lambda text: (text, lambda t: t.said(text))  # noqa: E731
    return [("its start", lambda t: True),
            ("launch's record", lambda t: bool(_recorded(cloud) - before)),
            line("Running on cluster"), line("Launching on RunPod"), ("the pod in RunPod's API", lambda t: pods()),
            line("Instance is up"), line("Cluster launched"), line("Syncing files"), line("Setup detached"),
            line("Job submitted")]


def _no_pod_for(cloud, seconds: float) -> bool:
    """No pod, and none appears for `seconds` (a launch request still in SkyPilot's API server would)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if cloud.api("GET", "/admin/state")["pods"]:
            return False
        time.sleep(1)
    return True


@pytest.mark.timeout(POINTS * 420)
def test_up_signalled_at_twenty_points_always_leaves_a_run_that_down_ends(cloud, in_repo, report):
    args = profiles.sonia(in_repo, max_steps=5000, save_steps=10)
    seen: dict[str, int] = {}
    lines = []
    for i in range(POINTS):
        sig = signal.SIGTERM if i % 2 == 0 else signal.SIGHUP
        before = _recorded(cloud)
        milestones = _milestones(cloud, before)
        name, reached = milestones[i % len(milestones)]
        offset = OFFSETS[(i // len(milestones)) % len(OFFSETS)]
        trial = Trial(cloud, args)
        wait_for(lambda: trial.proc.poll() is not None or reached(trial), 300, every=0.3, what=name)
        time.sleep(offset)
        at = time.monotonic() - trial.t0
        late = trial.proc.poll() is not None or trial.said("✓ started")  # the ✓ line was already out
        trial.proc.send_signal(sig)
        rc = trial.proc.wait(timeout=300)
        out = trial.out()
        where = f"point {i} ({name} +{offset:g} s, {signal.Signals(sig).name} at {at:.1f} s)"
        assert "Traceback" not in out, (where, out)
        assert rc in (0, 128 + sig, -sig), (where, rc, out)

        listed = cloud.launch("status", "--all", "--json", timeout=180)
        assert listed.returncode == 0, (where, listed.stdout + listed.stderr)
        new = [r for r in json.loads(listed.stdout) if r["id"] not in before]
        if not new:  # stopped before its record: nothing may have started
            assert rc in (-sig, 128 + sig) and _no_pod_for(cloud, 10), (where, out)
            what = "none"
        else:
            [run] = new
            flat = " ".join(out.split())
            # `stopped`: signalled before SkyPilot was asked for anything (no cluster: nothing runs)
            assert run["state"] in ("starting", "running", "stopped"), (where, run, out)
            assert f"launch down {run['id']}" in flat, (where, out)  # what runs and how to stop it
            down = cloud.launch("down", run["id"], timeout=600)
            assert down.returncode == 0 and f"{run['id']} is down" in down.stdout, (where, down.stdout + down.stderr)
            wait_for(lambda: _no_pod_for(cloud, 1), 180, what=f"{where}: the pod to go after `launch down`")
            assert _no_pod_for(cloud, 20), f"{where}: a pod came back after `launch down`"
            ended = json.loads(cloud.launch("status", run["id"], "--json", timeout=180).stdout)
            assert ended["state"] not in ("starting", "running", "recovering"), (where, ended)
            what = "after its ✓ line" if late else "signalled"
        seen[what] = seen.get(what, 0) + 1
        lines.append(f"  {where}: exit {rc}, {what}")
        print(lines[-1], flush=True)

    cost = json.loads(cloud.launch("cost", "--json", timeout=180).stdout)
    ledger = cloud.api("GET", "/admin/state")["billed_usd"]
    print("\n".join(lines))
    print(f"  {seen}; launch billed ${cost['total_usd']:.4f} over {len(cost['runs'])} runs; RunPod billed "
          f"the pods ${ledger:.4f}")
    assert all(r["cost_usd"] > 0 for r in cost["runs"]), cost["runs"]
    assert cost["total_usd"] >= ledger - POINTS * profiles.SONIA_PRICE * 5 / 3600, (cost["total_usd"], ledger)
    assert seen.get("signalled", 0) >= POINTS // 2, seen  # most signals landed while SkyPilot provisioned
    report(state=f"{POINTS} points", usd=cost["total_usd"], ledger_usd=ledger, steps=0)
