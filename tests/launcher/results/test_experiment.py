"""A run is one experiment (issue 23), end to end on the local backend with the tiny CPU model.

One module-scoped pair of short runs: A starts with `--set` overrides, dies by SIGKILL after its
first checkpoint, is refused a learning-rate change on resume (exit 1, one line, nothing started),
then resumes with its own overrides kept plus an allowed `--set train.max_steps=` extension, and
completes at that step; B is a plain short run with a different learning rate. `launch status`
shows A's provenance and override history; `launch compare A B` lists exactly the keys that differ,
both runs' metrics and costs, and writes the overlay plot.
"""

import json
import os
import signal
import time
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from launcher.store import registry
from launcher.cli import cli

BASE = ("--set", "train.checkpoints.save_steps=4", "--set", "train.eval_steps=4", "--set", "train.logging_steps=2",
        "--set", "outputs.merge=false", "--set", "outputs.export_mlx=false")
A_SETS = ("--set", "train.max_steps=12", "--set", "train.learning_rate=1e-3", *BASE)


def launch(*args, width=None):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False, terminal_width=width)


def started_id(result):
    assert result.exit_code == 0, result.output
    return result.output.split("started ")[1].split()[0]


def wait_done(run_id, timeout=240):
    deadline = time.time() + timeout
    while time.time() < deadline:
        d = json.loads(launch("status", run_id, "--json").output)
        if d["state"] not in ("starting", "running"):
            return d
        time.sleep(1)
    raise AssertionError(f"{run_id} did not finish in {timeout}s")


def run_dir(run_id) -> Path:
    return Path(registry.get(run_id).handle.run_dir)


def _processes(run_id):
    from launcher.backends.local import processes_of

    return processes_of(registry.get(run_id))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(A, B, what was seen on the way, the launch home): the scenario of issue 23, once per module."""
    home = tmp_path_factory.mktemp("experiment")
    mp = pytest.MonkeyPatch()
    mp.setenv("HOME", str(home / "home"))
    mp.setenv("LAUNCH_HOME", str(home / "launch-home"))
    (home / "home").mkdir()
    seen = {}
    try:
        a = started_id(launch("up", "local-demo", *A_SETS))
        rd = run_dir(a)
        deadline = time.time() + 180
        while not any((c / "COMPLETE").exists() for c in (rd / "checkpoints").glob("checkpoint-*")):
            assert time.time() < deadline, "no checkpoint appeared"
            time.sleep(0.2)
        os.killpg(registry.get(a).handle.pgid, signal.SIGKILL)  # the machine dies
        deadline = time.time() + 20
        while _processes(a):
            assert time.time() < deadline
            time.sleep(0.2)
        seen["killed"] = json.loads(launch("status", a, "--json").output)
        seen["refused"] = launch("up", "local-demo", "--resume", a, "--set", "train.learning_rate=1e-4")
        seen["after_refusal"] = (registry.get(a).state, _processes(a))
        seen["resumed"] = launch("up", "local-demo", "--resume", a, "--set", "train.max_steps=16")
        seen["a_done"] = wait_done(a)
        seen["status"] = launch("status", a, width=80)
        b = started_id(launch("up", "local-demo", "--new", "--set", "train.max_steps=16", *BASE))
        seen["b_done"] = wait_done(b)
        yield a, b, seen, home
    finally:
        mp.undo()


@pytest.fixture
def in_runs_home(runs, monkeypatch):
    home = runs[3]
    monkeypatch.setenv("HOME", str(home / "home"))
    monkeypatch.setenv("LAUNCH_HOME", str(home / "launch-home"))
    return runs


@pytest.mark.slow  # 41 s: a local run, then its resume
def test_resume_keeps_the_runs_overrides_and_completes_at_its_max_steps(in_runs_home):
    a, _, seen, _ = in_runs_home
    assert seen["killed"]["state"] == "preempted"
    assert seen["resumed"].exit_code == 0 and f"resumed {a}" in seen["resumed"].output
    done = seen["a_done"]
    assert done["state"] == "completed" and done["step"] == 16, done  # not local-demo's 40
    summary = json.loads((run_dir(a) / "outputs" / "training_summary.json").read_text())
    assert summary["steps"] == 16 and summary["resumed_from"].startswith("checkpoint-")
    config = yaml.safe_load((run_dir(a) / "config.yaml").read_text())
    assert config["train"]["learning_rate"] == 1e-3 and config["train"]["max_steps"] == 16
    # the payload recorded the cadence change it accepted on resume
    (change,) = [json.loads(x) for x in (run_dir(a) / "config_history.jsonl").read_text().splitlines()]
    assert change["changes"] == {"train.max_steps": [12, 16]} and change["by"] == "payload"
    run = registry.get(a)
    assert "train.learning_rate=1e-3" in run.handle.overrides and "train.max_steps=16" in run.handle.overrides
    assert "train.max_steps=12" not in run.handle.overrides
    start, resume = run.handle.history
    assert start["event"] == "start" and "train.max_steps=12" in start["set"]
    assert resume["event"] == "resume" and resume["changes"] == {"train.max_steps": [12, 16]}
    assert resume["set"] == ["train.max_steps=16"] and resume["allowed"] == []
    # more steps is the fix launch names for a finished run: the checkpoint is not "a different config"
    log = launch("logs", a).output
    assert "resuming from checkpoint-" in log and "saved with a different config" not in log, log


def test_a_learning_rate_change_on_resume_is_refused_in_one_line(in_runs_home):
    a, _, seen, _ = in_runs_home
    r = seen["refused"]
    assert r.exit_code == 1
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("✗ "), r.output
    assert "train.learning_rate: 0.001 -> 0.0001 would change the math of the run in flight" in lines[0]
    assert "--new" in lines[0] and "--allow-change train.learning_rate" in lines[0]
    assert seen["after_refusal"] == ("preempted", [])  # nothing started, the record untouched


def test_status_shows_provenance_and_override_history(in_runs_home):
    a, _, seen, _ = in_runs_home
    out = seen["status"].output
    assert seen["status"].exit_code == 0, out
    flat = " ".join(out.split())
    head = registry.get(a).handle.provenance["commit"][:12]
    assert f"code {head}" in flat and "launch 0.1.0" in flat
    assert "started with train.max_steps=12, train.learning_rate=1e-3" in flat
    assert "resumed: train.max_steps 12 -> 16" in flat
    d = json.loads(launch("status", a, "--json").output)
    prov = d["provenance"]
    assert len(prov["commit"]) == 40 and isinstance(prov["dirty"], bool)
    assert len(prov["profile_sha256"]) == 64 and len(prov["payload_lock_sha256"]) == 64
    from payload.volume.checksums import file_digest

    repo = Path(__file__).resolve().parents[3]
    assert prov["data_sha256"]["demo-chat"] == file_digest(repo / "payload/samples/demo_chat.jsonl")[1]
    assert prov["dirty"] is False or Path(prov["diff"]).is_file()
    assert [e["event"] for e in d["history"]] == ["start", "resume"]


def test_compare_lists_exactly_the_differing_keys_metrics_costs_and_writes_the_plot(in_runs_home, tmp_path):
    a, b, seen, _ = in_runs_home
    plot = tmp_path / "cmp.png"
    d = json.loads(launch("compare", a, b, "--plot", str(plot), "--json").output)
    # A: max_steps 12 -> 16 on resume and lr 1e-3; B: max_steps 16 and local-demo's lr 2e-3
    assert d["differing"] == {"train.learning_rate": {a: 1e-3, b: 2e-3}}
    by_id = {r["id"]: r for r in d["runs"]}
    for rid in (a, b):
        r = by_id[rid]
        assert r["steps"] == 16 and r["state"] == "completed" and r["cost_usd"] > 0 and r["hours"] > 0
        assert isinstance(r["final_eval_loss"], float) and r["best_eval_loss"] <= r["final_eval_loss"]
        assert r["tokens_per_s"] > 0 and len(r["commit"]) == 40
    assert d["plot"] == str(plot) and plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from PIL import Image

    assert Image.open(plot).size == (700, 400)


def test_compare_at_80_columns_never_cuts_an_id_or_a_dollar_amount(in_runs_home, tmp_path, monkeypatch):
    import re

    from launcher.term import ui

    a, b, _, _ = in_runs_home
    monkeypatch.setenv("COLUMNS", "80")
    ui.console.cache_clear()
    try:
        r = launch("compare", a, b, "--dest", str(tmp_path), width=80)
    finally:
        ui.console.cache_clear()
    assert r.exit_code == 0, r.output
    table = r.output.split(f"  {a}: from")[0]  # then a line per run and the plot's path (whole, wrapped)
    assert max(len(x) for x in table.splitlines()) <= 80, r.output
    d = json.loads(launch("compare", a, b, "--dest", str(tmp_path), "--json").output)
    for rid in (a, b):
        assert re.search(rf"(^|\s){re.escape(rid)}(\s|$)", r.output, re.M), r.output
    from launcher.term.ui import money

    for cost in (x["cost_usd"] for x in d["runs"]):
        assert re.search(rf"(^|\s){re.escape(money(cost))}(\s|$)", r.output, re.M), r.output
    lines = {x.split()[0]: x.split()[1:] for x in table.splitlines() if x.strip()}
    assert lines["train.learning_rate"] == ["0.001", "0.002"]
    assert "train.max_steps" not in lines and "profile" in lines
    assert (tmp_path / "compare" / f"{a}_vs_{b}.png").is_file()


def test_compare_reads_fetched_artifacts_once_the_machine_is_gone(in_runs_home, tmp_path):
    a, b, _, _ = in_runs_home
    dest = tmp_path / "artifacts"
    for rid in (a, b):
        r = launch("down", rid, "--fetch-artifacts", "--dest", str(dest))
        assert r.exit_code == 0, r.output
    # --dest: the plot goes there too, not into the checkout's artifacts/
    d = json.loads(launch("compare", a, b, "--json", "--dest", str(dest)).output)
    assert {r["source"] for r in d["runs"]} == {str(dest / a), str(dest / b)}
    assert all(r["steps"] == 16 for r in d["runs"])


def test_compare_needs_two_runs():
    r = CliRunner().invoke(cli, ["compare", "x"])
    assert r.exit_code == 2 and "at least two different runs" in r.output


def test_compare_shows_a_data_file_whose_content_differs():
    from launcher.results.compare import differing, table_rows

    rows = [{"id": rid, "profile": "local-demo", "state": "completed", "commit": "c" * 40, "dirty": False,
             "data_sha256": {"demo-chat": digest}, "steps": 1, "final_eval_loss": None, "best_eval_loss": None,
             "metric": None, "tokens_per_s": None, "hours": 0.0, "cost_usd": 0.0, "config": {"train.seed": 1}}
            for rid, digest in (("r1", "a" * 64), ("r2", "b" * 64))]
    assert differing(rows) == {}
    table = {t[""]: t for t in table_rows(rows, {})}
    assert table["data demo-chat"]["r1"] == "a" * 12 and table["data demo-chat"]["r2"] == "b" * 12


def test_compare_shows_tokens_per_second_as_whole_numbers_never_in_exponent_form():
    from launcher.results.compare import table_rows

    rows = [{"id": rid, "profile": "local-demo", "state": "completed", "commit": "c" * 40, "dirty": False,
             "data_sha256": {}, "steps": 1, "final_eval_loss": None, "best_eval_loss": None, "metric": None,
             "tokens_per_s": tps, "hours": 0.0, "cost_usd": 0.0, "config": {}}
            for rid, tps in (("r1", 7988.2), ("r2", 10840.4), ("r3", None))]
    table = {t[""]: t for t in table_rows(rows, {})}
    assert [table["tokens/s"][r] for r in ("r1", "r2", "r3")] == ["7,988", "10,840", "-"]  # was 1.084e+04
