"""One contract, every backend: a run's bill closes at the run's own end (its driver's exit marker on a
machine of its own, its status.json where SkyPilot no longer knows it), never at the moment a `launch`
command first looked. The local and ssh backends billed until that look: a run that ended an hour
before the first `launch status` was billed that hour too."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from launcher.cli import cli
from launcher.store import registry

try:
    from sky_edge import FakeSky, runpod_edge
    from test_contract import BACKENDS, start, template
except ImportError:
    from tests.sky_edge import FakeSky, runpod_edge
    from tests.test_contract import BACKENDS, start, template

__all__ = ["template"]

HOUR = 3600.0


def _ended_an_hour_ago(kind, run, tmp_path, monkeypatch) -> float:
    """Make the finished run's own end an hour ago, each backend's way; returns the bill it should close with
    beyond that hour (a cluster's idle minutes before its autostop)."""
    end = time.time() - HOUR
    if kind in ("local", "ssh"):  # the driver's exit marker (ssh: the host is this machine, its root in tmp)
        marker = Path(run.handle.home if kind == "local" else run.handle.run_root) / "exit_code"
        os.utime(marker, (end, end))
        return 0.0
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(end))
    rd = tmp_path / "volume" / "runs" / run.id
    (rd / "status.json").write_text(json.dumps({"state": "completed", "exit_code": 0, "step": 8, "max_steps": 8,
                                                "ended_at": stamp, "updated_at": stamp}))
    fake = FakeSky.latest
    if kind == "skypilot-managed":
        fake.controller_gone()
        return 0.0
    runpod_edge(monkeypatch, fake, tmp_path / "volume", volume="sonia-workspace")
    fake.results["status"] = []  # autostopped after its idle minutes, and torn down
    return 60.0 * run.handle.autostop_minutes


@pytest.mark.parametrize("kind", BACKENDS)
def test_contract_the_bill_closes_at_the_runs_own_end(kind, tmp_path, template, sshd, monkeypatch):
    run, _ = start(kind, tmp_path, template, sshd, monkeypatch)
    idle = _ended_an_hour_ago(kind, run, tmp_path, monkeypatch)
    now = time.time()
    run.started_at, run.price_per_hour, run.state, run.ended_at = now - 2 * HOUR, 2.0, "running", None
    registry.save(run)
    registry.accrue(run.id, True, now=now - 2 * HOUR)  # billing since it started, two hours ago

    r = CliRunner().invoke(cli, ["status", run.id, "--json"])  # the first look, an hour after its end
    assert r.exit_code == 0, r.output
    row = json.loads(r.output)
    assert row["state"] == "completed", row
    assert row["billed_s"] == pytest.approx(HOUR + idle, abs=5), row  # not the two hours until this look
    assert row["ended_at"] == pytest.approx(now - HOUR + idle, abs=5), row
    assert row["cost_usd"] == pytest.approx(2.0 * (HOUR + idle) / HOUR, abs=0.01), row
