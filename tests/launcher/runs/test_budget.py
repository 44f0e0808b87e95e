"""Budgets that match the bill: billed time accrued on every refresh (setup in, downtime out), a
`--resume --set budget.max_usd=` stored with the run, a budget stop that keeps the work, cents shown."""

import json
import sqlite3
import types

import pytest
from click.testing import CliRunner

from launcher.store import registry
from launcher.runs import lifecycle as runs
from launcher.runs import start
from launcher.backends import RemoteStatus
from launcher.cli import cli
from launcher.store.registry import Run

PRICE = 3.6  # $/h = $0.001 per second


class Clock:
    def __init__(self, t):
        self.t = t

    def time(self):
        return self.t


class FakeBackend:
    """A backend reduced to what the launcher asks: the state it reports, whether a machine bills."""

    def __init__(self):
        self.reply = RemoteStatus(state="running")
        self.downs, self.specs = [], []

    def status(self, run):
        return self.reply

    def down(self, run):
        self.downs.append(run.id)

    def read_run_file(self, run, rel):  # the run's files are out of reach (Backend's default)
        return None

    def up(self, spec):
        self.specs.append(spec)
        run = spec.run
        run.cluster = run.id
        run.handle.update(kind="cluster", cluster=run.id)
        return run


@pytest.fixture
def clock(monkeypatch):
    c = Clock(1000.0)
    fake_time = types.SimpleNamespace(time=c.time, sleep=lambda s: None, strftime=__import__("time").strftime,
                                      gmtime=__import__("time").gmtime)
    monkeypatch.setattr(registry, "time", fake_time)
    monkeypatch.setattr(runs, "time", fake_time)
    monkeypatch.setattr(start, "time", fake_time)
    return c


@pytest.fixture
def backend(monkeypatch):
    be = FakeBackend()
    import launcher.backends

    monkeypatch.setattr(launcher.backends, "get_backend", lambda name, **kw: be)
    return be


def launch(*args, input=None):
    return CliRunner().invoke(cli, list(args), input=input, catch_exceptions=False)


def status(rid):
    return json.loads(launch("status", rid, "--json").output)


def test_billed_time_counts_setup_but_not_recovery_nor_the_time_down_before_resume(clock, backend):
    registry.save(Run(id="r", profile="sonia-h100", backend="skypilot", started_at=1000.0, state="running",
                      price_per_hour=PRICE, billed_s=0.0, billed_usd=0.0, billing_since=1000.0))
    clock.t = 2000.0  # provisioning, setup and training so far: billed
    assert status("r")["billed_s"] == 1000
    backend.reply = RemoteStatus(state="starting", reason="preempted; recovering", billing=False)
    clock.t = 2500.0  # billed up to this refresh (the last one saw a machine)
    assert status("r")["billed_s"] == 1500
    clock.t = 4000.0  # recovering: no machine bills
    assert status("r")["billed_s"] == 1500
    backend.reply = RemoteStatus(state="running", billing=True)
    clock.t = 4100.0
    status("r")
    clock.t = 4200.0
    assert status("r")["billed_s"] == 1600
    backend.reply = RemoteStatus(state="preempted")  # machine gone until `launch up --resume`
    clock.t = 4300.0
    assert status("r")["cost_usd"] == pytest.approx(1.7)
    clock.t = 9000.0  # down for 78 min: not billed (elapsed would say $8.00)
    d = json.loads(launch("cost", "--json").output)
    assert d["total_usd"] == pytest.approx(1.7) and d["runs"][0]["elapsed_s"] == 3300


def test_an_ended_runs_cluster_bills_until_it_is_gone_whoever_looks_meanwhile(clock, backend):
    """The job ended, its cluster idles until autostop or `launch down` tears it down, and RunPod bills the
    pod all that time: every refresh meanwhile bills on, not only the first one that saw the end. Found on
    the emulated RunPod (tests/cloud/scenarios/test_sigterm.py: `sky cancel`, then `launch down
    --fetch-artifacts`): launch said $0.2262, RunPod billed $0.2609, the fetch and teardown unbilled."""
    registry.save(Run(id="r", profile="sonia-h100", backend="skypilot", started_at=1000.0, state="running",
                      price_per_hour=PRICE, billed_s=0.0, billed_usd=0.0, billing_since=1000.0))
    backend.reply = RemoteStatus(state="stopped", reason="stopped by SIGTERM at step 9 of 20", billing=True)
    clock.t = 2000.0
    assert status("r")["state"] == "stopped" and status("r")["billed_s"] == 1000
    clock.t = 2600.0  # seen again: its cluster still idles, and bills
    assert status("r")["billed_s"] == 1600
    backend.reply = RemoteStatus(state="stopped", billing=False, ended_at=2900.0)  # autostopped at 2900
    clock.t = 4000.0
    assert status("r")["billed_s"] == 1900
    backend.reply = RemoteStatus(state="running", billing=True)  # a cluster of the same name, up by hand
    clock.t = 5000.0
    row = status("r")
    assert (row["state"], row["billed_s"]) == ("stopped", 1900)  # a closed bill never opens again


def test_resume_stores_the_budget_override_and_shows_cents(clock, backend):
    from launcher.profiles.render import config_path, task_path

    committed = {p: p.read_text() for p in (task_path("sonia-h100"), config_path("sonia-h100"))}
    registry.save(Run(id="s1", profile="sonia-h100", backend="skypilot", started_at=1000.0, ended_at=1600.0,
                      state="preempted", price_per_hour=PRICE, budget_usd=40.0, billed_s=600.0, billed_usd=0.6))
    clock.t = 5000.0
    r = launch("up", "sonia-h100", "--resume", "s1", "--set", "budget.max_usd=0.5")
    assert r.exit_code == 0, r.output
    assert "resumed s1 (sonia-h100 on skypilot, $3.60/h, budget $0.50, $0.60 spent so far)" in r.output
    run = registry.get("s1")
    assert (run.budget_usd, run.billed_s, run.billing_since, run.state) == (0.5, 600.0, 5000.0, "running")
    (spec,) = backend.specs
    assert spec.envs["LAUNCH_BUDGET_USD"] == "0.5" and spec.resume
    assert {p: p.read_text() for p in committed} == committed  # sky/ keeps the profile's own budget
    clock.t = 5100.0
    assert json.loads(launch("cost", "--json").output)["runs"][0]["billed_s"] == 700


def test_a_budget_stop_keeps_the_work_it_asks_before_losing_it(clock, backend, monkeypatch):
    registry.save(Run(id="b", profile="sonia-h100", backend="skypilot", started_at=1000.0, state="running",
                      price_per_hour=PRICE, budget_usd=0.5, billed_s=0.0, billed_usd=0.0, billing_since=1000.0))
    clock.t = 1600.0  # $0.60 billed, no checkpoint yet
    backend.reply = RemoteStatus(state="running", step=12)
    r = launch("status", "b")
    assert "before" not in r.output and "no checkpoint yet, so it keeps running" in r.output
    assert backend.downs == [] and registry.get("b").state == "running"
    monkeypatch.setattr(runs, "interactive", lambda: True)
    r = launch("status", "b", input="n\n")
    assert "tearing down now loses 12 steps. Tear down anyway?" in r.output and backend.downs == []
    backend.reply = RemoteStatus.from_report("running", {"state": "training", "step": 30, "checkpoint_step": 25})
    r = launch("status", "b")  # a checkpoint exists: no question, torn down
    assert "billed spend $0.60 reached the $0.50 budget; torn down (checkpoint 25 kept)" in r.output
    assert "no final checkpoint was asked for (no status.json from the run" in r.output
    assert "--resume b --set budget.max_usd=" in r.output
    run = registry.get("b")
    assert backend.downs == ["b"] and run.state == "budget_exhausted" and run.billing_since is None


def test_an_older_registry_database_gains_the_billing_columns(clock):
    db = registry.db_path()
    db.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE runs (id TEXT PRIMARY KEY, profile TEXT NOT NULL, backend TEXT NOT NULL, "
                "cluster TEXT, job_id TEXT, config_hash TEXT, started_at REAL NOT NULL, ended_at REAL, "
                "price_per_hour REAL NOT NULL DEFAULT 0, budget_usd REAL, state TEXT NOT NULL, reason TEXT, "
                "artifacts TEXT, handle TEXT NOT NULL DEFAULT '{}')")
    con.execute("INSERT INTO runs (id, profile, backend, started_at, ended_at, price_per_hour, state) "
                "VALUES ('old', 'sonia-h100', 'skypilot', 1000, 1900, 3.6, 'completed')")
    con.commit()
    con.close()
    (old,) = registry.all_runs()
    assert old.billed_s is None and old.billed() == (900.0, pytest.approx(0.9))  # as it was: elapsed x price
    assert registry.accrue("old", False).billed() == (900.0, pytest.approx(0.9))
    cols = {r[1] for r in sqlite3.connect(db).execute("PRAGMA table_info(runs)")}
    assert {"billed_s", "billed_usd", "billing_since"} <= cols


def test_the_payload_tells_the_launcher_its_newest_checkpoint(tmp_path):
    from payload.volume.money import CostCallback, CostTracker

    cb = CostCallback(CostTracker(tmp_path, price_per_hour=1.0, budget_usd=2.0))
    cb.on_save(None, types.SimpleNamespace(global_step=40), None)
    assert json.loads((tmp_path / "status.json").read_text())["checkpoint_step"] == 40
    assert (tmp_path / "cost.json").exists()


def test_the_payloads_budget_warning_is_shown_by_status(clock, backend):
    """Past `budget.warn_fraction` the payload writes `budget_warning` to status.json; `launch status`
    shows it under the table (and in --json) while the run goes on."""
    registry.save(Run(id="w", profile="well-log-ocr-spot", backend="skypilot", started_at=1000.0, state="running",
                      price_per_hour=PRICE, billed_s=0.0, billed_usd=0.0, billing_since=1000.0, budget_usd=10.0))
    text = "cost $9.1200 is 91% of the $10.00 budget (warning at 90%)"
    backend.reply = RemoteStatus.from_report("running", {"state": "training", "step": 450, "budget_warning": text})
    clock.t = 1100.0
    assert status("w")["budget_warning"] == text
    out = launch("status", "w").output
    assert f"! {text}" in out and "w" in out


def test_new_starts_a_second_run_beside_an_active_one(clock, backend):
    """The refusal of a second active run names --new as the way to start another; --new does."""
    registry.save(Run(id="sonia-h100-1", profile="sonia-h100", backend="skypilot", started_at=1000.0,
                      state="running", price_per_hour=PRICE, budget_usd=40.0))
    r = launch("up", "sonia-h100")
    assert r.exit_code == 1 and "already has an active run sonia-h100-1" in r.output and "--new" in r.output
    assert backend.specs == []
    r = launch("up", "sonia-h100", "--new")
    assert r.exit_code == 0, r.output
    (spec,) = backend.specs
    assert spec.run.id != "sonia-h100-1" and registry.get("sonia-h100-1").state == "running"
