"""What `launch down` leaves, said and verifiable (the way the user meets it: the installed `launch` in a
subprocess, tests/walk.py):

- a training run stopped by `down` says which checkpoint it left, where, and the two next commands
  (`launch up PROFILE --resume RUN`, and `launch volumes rm NAME` where a volume keeps billing for it);
- it wrote its MANIFEST before it exited, so `down --fetch-artifacts` verifies the fetch by sha256
  (these two on a real local-demo run: tests/walks/test_walk_state.py; on every backend, with a stand-in
  trainer: tests/launcher/backends/test_contract_down.py);
- a live run whose host is gone for good cannot be downed (one line naming --forget) until
  `launch down RUN --forget` ends it here only, billed until it was last seen, with a warning.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from launcher.store import registry

try:
    from walk import assert_one_line_error, launch
except ImportError:
    from tests.walk import assert_one_line_error, launch

PRICE = 3600.0  # $1 a second: a second billed after the host was last seen would show


def _shared() -> dict:
    """The walk's commands see the registry this test process writes (conftest's LAUNCH_HOME)."""
    return {"LAUNCH_HOME": os.environ["LAUNCH_HOME"]}


def _flat(r) -> str:
    return " ".join((r.stdout + r.stderr).split())  # rich wraps at 80 columns


# ------------------------------------------------------------- items 1 and 2: a stop, said and verified
# (the run: tests/walks/test_walk_state.py test_down_fetches_after_the_final_checkpoint, with these checks)


def said_left_and_verified(out: str, rd: Path, step: int, run_id: str, home: Path) -> None:
    """What `launch down RUN --fetch-artifacts` of a training local-demo run said and fetched, once its
    trainer saved checkpoint `step` on request (run by tests/walks/test_walk_state.py's walk, which starts
    that run: one real run for both)."""
    from launcher.term.units import human_size

    out = " ".join(out.split())  # rich wraps at 80 columns
    size = sum(p.stat().st_size for p in (rd / f"checkpoints/checkpoint-{step}").rglob("*") if p.is_file())
    # Item 1: what it left, where, and what next (local: the run's directory; no volume bills for it).
    assert f"checkpoint step {step} (checkpoint-{step}, {human_size(size)}) is kept in {rd}" in out, out
    assert f"→ launch up local-demo --resume {run_id}" in out and "volumes rm" not in out, out
    # Item 2: the MANIFEST its stop wrote, and the fetch verified against it.
    assert "sha256-verified against the machine's MANIFEST" in out and "wrote no MANIFEST" not in out, out
    manifest = json.loads((home / "MANIFEST.json").read_text())
    assert manifest["state"] == "stopped" and "origin" not in manifest  # the machine's, not computed at home
    assert {"checkpoints.json", "training_summary.json", "metrics.jsonl"} <= set(manifest["files"])
    for name, entry in manifest["files"].items():
        data = (home / name).read_bytes()
        assert len(data) == entry["bytes"] and hashlib.sha256(data).hexdigest() == entry["sha256"], name


def test_the_volume_line_names_the_checkpoint_it_holds_and_its_price():
    """A cloud run: the volume that keeps billing says it holds the checkpoint, what it bills a month
    (launcher/plan/storage.py's price for the profile's volume) and how to delete it."""
    from launcher.plan.storage import storage_for
    from launcher.profiles.profile import load_profile
    from launcher.runs.volumes import still_billing_lines
    from launcher.term.ui import money

    vol = storage_for(load_profile("sonia-h100"))[0]
    run = registry.Run(id="sonia-h100-20261126-101500", profile="sonia-h100", backend="skypilot", state="stopped",
                       handle={"kind": "cluster", "volume": {"name": vol.name, "type": vol.type}})
    (line,) = still_billing_lines(run, "checkpoint step 71 (checkpoint-71, 1.2 GB)")
    assert line.startswith(f"volume {vol.name} ({vol.size_gb:,.0f} GB, {vol.type}) keeps billing "
                           f"~{money(vol.usd_per_month)}/month: it holds checkpoint step 71 (checkpoint-71, 1.2 GB), "
                           "which `--resume` continues from"), line
    assert line.endswith(f"delete: launch volumes rm {vol.name}")


# ------------------------------------------------------------------------ item 3: a host gone for good


def test_a_live_run_whose_host_is_gone_is_ended_only_with_forget(tmp_path, sshd):
    from sshd import free_port

    seen = time.time() - 30
    run = registry.Run(id="local-demo-20261126-000003", profile="local-demo", backend="ssh", state="running",
                       price_per_hour=PRICE, started_at=seen - 60, seen_at=seen,
                       handle={"host": f"{sshd.user}@127.0.0.1:{free_port()}", "run_root": "/nowhere",
                               "run_dir": "/nowhere/run", "known_hosts": str(tmp_path / "known_hosts")})
    registry.save(run)
    registry.accrue(run.id, True, now=seen - 60)  # billed from its start; last answered 30 s ago

    refused = launch(tmp_path, "down", run.id, env=_shared())
    assert_one_line_error(refused, "cannot reach", f"launch down {run.id} --forget")
    assert registry.get(run.id).state == "running"

    r = launch(tmp_path, "down", run.id, "--forget", env=_shared())
    out = _flat(r)
    assert r.returncode == 0 and "Traceback" not in out, out
    warning = [line for line in r.stdout.splitlines() if line.startswith("!")]
    assert len(warning) == 1 and "could not confirm" in warning[0], r.stdout
    assert f"{run.id} is down (stopped, here only)" in out
    after = registry.get(run.id)
    assert after.state == "stopped" and after.reason == registry.FORGOTTEN and after.ended_at == seen
    assert after.billing_since is None and abs(after.billed_s - 60) < 1e-6  # start to last seen, no more
    status = json.loads(launch(tmp_path, "status", run.id, "--json", env=_shared()).stdout)
    assert status["state"] == "stopped" and status["reason"].startswith("forgotten by launch down --forget")
    assert abs(status["cost_usd"] - 60) < 1e-3  # $1/s for the 60 s it was seen billing
