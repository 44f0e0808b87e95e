"""The steps every scenario takes as its user does: start a shipped profile with `launch up`, read
`launch status --json`, wait for a state or a step (saying, on a timeout, what `launch status` and
`launch logs` show), and name the SkyPilot cluster of a run."""

from __future__ import annotations

import json
import re
import time

ACTIVE = ("running", "starting", "recovering")


def run_id_of(out: str) -> str:
    """The run id `launch up` printed (`✓ started RUN`)."""
    m = re.search(r"✓ started (\S+)", out)
    assert m, out
    return m.group(1)


def cluster_of(run: str) -> str:
    from launcher.backends.skypilot import cluster_name

    return cluster_name(run)


def up(cloud, profile: str, *args: str, timeout: float = 900) -> str:
    """`launch up PROFILE ARGS`: it must start a run; its id."""
    r = cloud.launch("up", profile, *args, timeout=timeout)
    assert r.returncode == 0, r.stdout + r.stderr
    return run_id_of(r.stdout)


def status(cloud, run: str) -> dict:
    r = cloud.launch("status", run, "--json", timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


def wait_for(pred, timeout: float, every: float = 5.0, what: str = "", cloud=None, run: str = ""):
    """pred()'s first true answer within timeout seconds, polled every `every` s; else an AssertionError
    with what the user would look at (`launch status`, the log's last lines)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(every)
    said = ""
    if cloud is not None and run:
        for cmd in (("status", run), ("logs", run, "--tail", "40")):
            r = cloud.launch(*cmd, timeout=300)
            said += f"\n$ launch {' '.join(cmd)}\n{r.stdout[-4000:]}{r.stderr[-2000:]}"
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}: {last!r}{said}")


def wait_step(cloud, run: str, step: int, timeout: float = 600) -> dict:
    """`launch status` once the run has trained `step` steps."""
    return wait_for(lambda: (s := status(cloud, run)).get("step") and s["step"] >= step and s, timeout,
                    what=f"step {step}", cloud=cloud, run=run)


def wait_ended(cloud, run: str, timeout: float, what: str, every: float = 5.0) -> dict:
    """`launch status` once the run is no longer running, starting or recovering."""
    return wait_for(lambda: (s := status(cloud, run))["state"] not in ACTIVE and s, timeout, every=every,
                    what=what, cloud=cloud, run=run)
