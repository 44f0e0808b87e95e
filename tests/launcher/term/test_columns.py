"""Tables at 60, 80 and 200 columns: every run id, profile name and dollar amount a user copies is
printed whole (never cut with `…`, never folded across lines); columns drop or wrap instead."""

import json
import re
import time

import pytest
from click.testing import CliRunner

from launcher.store import registry
from launcher.term import ui
from launcher.cli import cli
from launcher.profiles.profile import profile_names
from launcher.store.registry import Run
from launcher.term.tables import Column, fits, print_table

RUNS = [  # long ids, as `launch up` makes them for the longest profile names, and a suffixed retry
    ("qwen3-32b-4x4-a100-20261123-141502-12", "qwen3-32b-4x4-a100", 65.54, 1234.5678, 2500.0),
    ("lovecraft-a100-spot-20261122-093011", "lovecraft-a100-spot", 1.39, 11.8, 25.0),
    ("sonia-h100-20261121-235959-3", "sonia-h100", 6.58, 0.0042, 240.0),
]


@pytest.fixture
def columns(monkeypatch):
    """launch at N columns: rich's Console reads COLUMNS when it is made (ui.console is cached)."""
    def at(width: int, *args):
        monkeypatch.setenv("COLUMNS", str(width))
        ui.console.cache_clear()
        try:
            r = CliRunner().invoke(cli, list(args), terminal_width=width)
        finally:
            ui.console.cache_clear()
        assert r.exit_code == 0, r.output
        return r.output
    yield at
    ui.console.cache_clear()


@pytest.fixture
def runs():
    now = time.time()
    for i, (rid, profile, price, usd, budget) in enumerate(RUNS):
        registry.save(Run(id=rid, profile=profile, backend="skypilot", state="completed", started_at=now - 3600 - i,
                          ended_at=now - i, price_per_hour=price, budget_usd=budget, billed_s=3600.0,
                          billed_usd=usd, handle={"kind": "cluster"}))
    return RUNS


def whole(text: str, output: str) -> bool:
    """`text` appears on one line, delimited by spaces or the line's ends (not cut, not folded)."""
    return re.search(rf"(^|\s){re.escape(text)}(\s|$)", output, re.M) is not None


def fits_in(output: str, width: int) -> bool:
    return max(len(line) for line in output.splitlines()) <= width


@pytest.mark.parametrize("width", [60, 80, 200])
def test_status_all_shows_every_run_id_and_amount_whole(runs, columns, width):
    out = columns(width, "status", "--all")
    assert fits_in(out, width), out
    assert "…" not in out
    for rid, profile, _, usd, _ in runs:
        assert whole(rid, out), (rid, out)
        assert whole(ui.money(usd), out), (ui.money(usd), out)
    if width == 200:  # room for everything: the profile column and the rest are there
        for _, profile, *_ in runs:
            assert whole(profile, out)
        assert "projected" in out and "backend" in out


@pytest.mark.parametrize("width", [60, 80, 200])
def test_cost_shows_every_run_id_profile_and_amount_whole(runs, columns, width):
    out = columns(width, "cost")
    assert fits_in(out, width), out
    assert "…" not in out
    for rid, profile, price, usd, budget in runs:
        assert whole(rid, out), (rid, out)
        for amount in (usd, price):
            assert whole(ui.money(amount), out), (ui.money(amount), out)
        assert profile in out  # whole in its column, or as the run id's start
    total = ui.money(round(sum(r[3] for r in runs), 6))
    assert f"total {total} over 3 run(s)" in out


@pytest.mark.parametrize("width", [60, 80, 200])
def test_profiles_shows_every_profile_name_and_price_whole(columns, width):
    out = columns(width, "profiles")
    assert fits_in(out, width), out
    assert "…" not in out
    rows = json.loads(columns(width, "profiles", "--json"))
    assert [r["profile"] for r in rows] == profile_names()
    for r in rows:
        assert whole(r["profile"], out), (r["profile"], out)
        assert whole(ui.money(r["price_per_hour"]), out) and whole(ui.money(r["est_usd"]), out), out


def test_json_is_the_same_rows_at_any_width(runs, columns):
    narrow, wide = (json.loads(columns(w, "status", "--all", "--json")) for w in (60, 200))
    assert narrow == wide and [r["id"] for r in narrow] == [r[0] for r in runs]
    cost = json.loads(columns(60, "cost", "--json"))
    assert [r["id"] for r in cost["runs"]] == [r[0] for r in runs]


def test_low_priority_columns_go_first_and_a_table_too_narrow_becomes_records():
    rows = [{"id": "a-very-long-run-identifier-0001", "usd": "$1,234.57", "note": "x" * 30, "extra": "y"}]
    cols = [Column("id", "id", must_copy=True), Column("usd", "usd", must_copy=True),
            Column("note", "note", priority=1), Column("extra", "extra", priority=2)]
    assert fits(rows, cols, 200) == ["id", "usd", "note", "extra"]
    assert fits(rows, cols, 60) == ["id", "usd", "note"]
    assert fits(rows, cols, 50) == ["id", "usd"]
    assert fits(rows, cols, 30) == []  # even the must-copy columns do not fit: one block per row
    from rich.console import Console

    c = Console(width=30, record=True)
    print_table(rows, cols, console=c)
    out = c.export_text()
    assert whole("a-very-long-run-identifier-0001", out) and "usd: $1,234.57" in out, out


def test_status_at_80_columns_keeps_step_loss_eta_and_dollars_before_profile():
    """What a user watching a run needs most goes last: the profile (the run id starts with it),
    backend and elapsed go before step, loss and ETA; an empty column (an ended run's ETA) goes first."""
    row = {"id": "qwen3-32b-4x4-a100-20261126-101500", "profile": "qwen3-32b-4x4-a100", "backend": "skypilot",
           "state": "running", "step": 1234, "max_steps": 3000, "loss": 1.23456, "elapsed_s": 68000,
           "cost_usd": 1234.5678, "eta_s": 7200, "projected_cost_usd": 1365.6}
    assert fits([row], ui.STATUS_COLUMNS, 200) == [c.name for c in ui.STATUS_COLUMNS]
    assert fits([row], ui.STATUS_COLUMNS, 80) == ["run", "state", "step", "loss", "spent", "ETA"]
    ended = {**row, "id": "local-demo-20261126-101500", "profile": "local-demo", "state": "completed", "eta_s": None,
             "projected_cost_usd": None}  # its empty ETA and projected go before elapsed
    assert fits([ended], ui.STATUS_COLUMNS, 80) == ["run", "state", "step", "loss", "elapsed", "spent"]
