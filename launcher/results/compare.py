"""`launch compare RUN RUN [RUN...]`: runs side by side, one column per run, and their loss curves
overlaid in one PNG.

Rows: the profile, each config key whose value differs between the runs (only those: the resolved
config recorded with each run at start and on every resume, launcher/runs/experiment.py), the code
commit, steps, final and best eval loss, the task metric the profile ranks checkpoints by
(CER/WER/...), tokens/s, billed hours and dollars. What a run produced is read from its newest
fetch (`launch down --fetch-artifacts`: the registry's path or DEST/RUN, whichever arrived last) when
that fetch is from the run's last attempt, else where it runs (as `launch checkpoints` reads a live
run: backend.read_run_file). A fetch older than the run's last attempt (it was resumed after) is
never shown as current: one line per such run says so and how to refresh it, and its numbers are
the machine's when the machine still has them, else that older fetch's, labelled as such.

When a fetch was made is the time of the files the fetch writes at home (MANIFEST.json, logs/run.log;
launcher/store/artifacts.py); when an attempt started is in the run's history (launcher/runs/
experiment.py: a `start` or `resume` entry's `at`).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Optional

import click

from launcher import project

from payload import layout

from launcher.errors import BackendError
from launcher.runs.refresh import backend_for, current_row
from launcher.term.tables import Column, print_table
from launcher.term.ui import cell, console, duration, literal, note
from launcher.term.units import money_row, number


def _json(text: Optional[str]):
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def _records(text: Optional[str]) -> list[dict]:
    out = []
    for line in (text or "").splitlines():
        row = _json(line)
        if not isinstance(row, dict):
            break  # a line cut off by a kill
        out.append(row)
    return out


def produced(run, dest: Path) -> tuple[dict, list[dict], str, Optional[str]]:
    """(training summary, metric records, where they came from, a one-line note or None): the newest
    fetch when it is from the run's last attempt, else the machine's, else that older fetch's (the
    note says it is older than the last attempt)."""
    found = sorted(((_fetched_at(d), d) for d in _fetches(run, dest)), key=lambda t: t[0], reverse=True)
    newest, found = (found[0][0] if found else None), [d for _, d in found]
    started = last_attempt_at(run)
    if found and newest >= started[0]:
        return (*_from_fetch(found[0]), str(found[0]), None)
    summary, records, where = _live(run)
    if not found:
        return summary, records, where, None
    fetch, numbers, refresh = found[0], f"these numbers are from {where}", f"`launch down {run.id} --fetch-artifacts`"
    if run.active:
        refresh += " once it ends"
    if not records:  # the machine has nothing to read (gone): the older fetch, labelled as such
        summary, records = _from_fetch(fetch)
        where, numbers = f"{fetch} (older than its last attempt)", "these numbers are from that fetch"
        refresh += " if its machine or volume still holds the run"
    note = (f"{run.id}: its fetch {fetch} ({_when(newest)}) is older than its last attempt "
            f"({started[1]} {_when(started[0])}): {numbers}; refresh it with {refresh}")
    return summary, records, where, note


def _fetches(run, dest: Path) -> list[Path]:
    """The run's fetched artifact dirs that hold metrics: the registry's, and DEST/RUN."""
    dirs = ([Path(run.artifacts)] if run.artifacts else []) + [Path(dest) / run.id]
    return [d for d in dict.fromkeys(dirs) if (d / layout.METRICS).is_file()]


def _fetched_at(d: Path) -> float:
    """When the fetch in `d` was made: the newest of the files a fetch writes here itself (MANIFEST.json,
    logs/run.log), else the metrics' time."""
    times = []
    for name in (layout.LOCAL_MANIFEST, layout.artifact_for(layout.RUN_LOG)[1]):
        try:
            times.append((d / name).stat().st_mtime)
        except OSError:
            continue
    if not times:
        try:
            times.append((d / layout.METRICS).stat().st_mtime)
        except OSError:
            pass
    return max(times, default=0.0)


def last_attempt_at(run) -> tuple[float, str]:
    """(when the run's last attempt started, "started"/"resumed"), from its recorded history."""
    at, event = run.started_at, "started"
    for h in run.handle.history or []:
        if isinstance(h, dict) and h.get("event") in ("start", "resume") and number(h.get("at")) is not None:
            if h["at"] >= at:
                at, event = h["at"], "resumed" if h["event"] == "resume" else "started"
    return at, event


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _from_fetch(d: Path) -> tuple[dict, list[dict]]:
    summary = _json(_read(d / "training_summary.json"))
    return summary if isinstance(summary, dict) else {}, _records(_read(d / layout.METRICS))


def _live(run) -> tuple[dict, list[dict], str]:
    """(summary, records, where) read where the run runs (or ran: a local run dir stays)."""
    try:
        be = backend_for(run)
        summary, metrics = be.read_run_file(run, layout.SUMMARY), be.read_run_file(run, layout.METRICS)
    except BackendError:
        summary, metrics = None, None
    summary = _json(summary)
    # None is a file missing or a machine out of reach alike (backends' read_run_file): say both
    where = f"its {run.backend} machine" if metrics is not None else \
        f"nowhere: no metrics fetched, none on its {run.backend} machine (no step logged, or the machine is gone)"
    return summary if isinstance(summary, dict) else {}, _records(metrics), where


def _read(path: Path) -> Optional[str]:
    try:
        return path.read_text(encoding="utf-8")
    except OSError:
        return None


def run_row(run, dest: Path) -> dict:
    """One run's column: metrics from what it produced, cost from the registry (billed time)."""
    billed = current_row(run)
    run = billed.pop("_run")
    summary, records, source, note = produced(run, dest)
    evals = [r["eval_loss"] for r in records if number(r.get("eval_loss")) is not None]
    rates = [r["tokens_per_s"] for r in records if number(r.get("tokens_per_s"))]
    steps = [r["step"] for r in records if number(r.get("step")) is not None]
    best = summary.get("best_metric") if isinstance(summary.get("best_metric"), dict) else {}
    prov = run.handle.provenance or {}
    return {
        "id": run.id, "profile": run.profile, "state": run.state, "source": source, "fetch_note": note,
        "commit": prov.get("commit"),
        "dirty": prov.get("dirty"),
        "data_sha256": prov.get("data_sha256") or {},
        "steps": number(summary.get("steps")) or (max(steps) if steps else billed.get("step")),
        "final_eval_loss": number(summary.get("final_eval_loss")) or (evals[-1] if evals else None),
        "best_eval_loss": number(summary.get("best_eval_loss")) or (min(evals) if evals else None),
        "metric": {"key": best.get("key"), "value": number(best.get("value"))} if best.get("key") else None,
        "tokens_per_s": number(summary.get("tokens_per_s")) or (round(sum(rates) / len(rates), 1) if rates else None),
        "hours": round(billed["billed_s"] / 3600, 4), "cost_usd": billed["cost_usd"],
        "config": run.handle.config if run.handle.config is not None else _config_of(run),
        "_records": records,
    }


def _config_of(run) -> dict:
    """A run recorded before its config was: the profile with its recorded overrides, if it loads."""
    from launcher.runs.experiment import flat_config
    from launcher.profiles.profile import ProfileError, load_profile

    try:
        return flat_config(load_profile(run.profile, tuple(run.handle.overrides or [])))
    except (ProfileError, OSError):
        return {}


def differing(rows: list[dict]) -> dict[str, dict[str, object]]:
    """{key: {run id: value}} for every config key whose value is not the same in all runs."""
    keys = sorted(set().union(*(r["config"] for r in rows)))
    out = {}
    for k in keys:
        values = {r["id"]: r["config"].get(k) for r in rows}
        if len({json.dumps(v, sort_keys=True, default=str) for v in values.values()}) > 1:
            out[k] = values
    return out


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return v if isinstance(v, str) else json.dumps(v)


def table_rows(rows: list[dict], diff: dict) -> list[dict]:
    """Transposed: one table row per attribute, keyed by run id."""
    def line(name, f):
        return {"": name, **{r["id"]: f(r) for r in rows}}

    out = [line("profile", lambda r: r["profile"]), line("state", lambda r: r["state"])]
    out += [{"": k, **{rid: _fmt(v) for rid, v in values.items()}} for k, values in diff.items()]
    out.append(line("code", lambda r: (r["commit"] or "-")[:12] + (" dirty" if r["dirty"] else "")))
    for name in sorted(set().union(*(r["data_sha256"] for r in rows))):  # same path, other content
        if len({str(r["data_sha256"].get(name)) for r in rows}) > 1:
            out.append(line(f"data {name}", lambda r, n=name: (r["data_sha256"].get(n) or "-")[:12]))
    out.append(line("steps", lambda r: _fmt(r["steps"])))
    out.append(line("final eval loss", lambda r: _fmt(r["final_eval_loss"])))
    out.append(line("best eval loss", lambda r: _fmt(r["best_eval_loss"])))
    for key in dict.fromkeys(r["metric"]["key"] for r in rows if r["metric"] and r["metric"]["key"] != "eval_loss"):
        out.append(line(f"best {key}", lambda r, k=key: _fmt(r["metric"]["value"]) if r["metric"] and
                        r["metric"]["key"] == k else "-"))
    out.append(line("tokens/s", lambda r: "-" if r["tokens_per_s"] is None else f"{r['tokens_per_s']:,.0f}"))
    out.append(line("billed time", lambda r: duration(r["hours"] * 3600)))
    spent = money_row([r["cost_usd"] for r in rows])
    out.append({"": "$ spent", **{r["id"]: usd for r, usd in zip(rows, spent)}})
    return out


@contextmanager
def _matplotlib_home():
    from launcher.store.state import state_dir

    before = os.environ.get("MPLCONFIGDIR")
    os.environ["MPLCONFIGDIR"] = before or str(state_dir() / "matplotlib")
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("MPLCONFIGDIR", None)


def plot_path(dest: Path, ids: list[str]) -> Path:
    name = "_vs_".join(ids)
    if len(name) > 150:
        name = f"{ids[0]}_vs_{len(ids) - 1}_more-{hashlib.sha256(name.encode()).hexdigest()[:8]}"
    return Path(dest) / "compare" / f"{name}.png"


@click.command()
@click.argument("run_ids", nargs=-1, required=True, metavar="RUN RUN [RUN...]")
@click.option("--dest", type=click.Path(file_okay=False), default=project.artifacts_default,
              show_default="the project's artifacts/",
              help="Where `launch down --fetch-artifacts` put the runs' artifacts; the plot goes to DEST/compare/.")
@click.option("--plot", "plot_to", type=click.Path(dir_okay=False), help="Write the overlay PNG here instead.")
@click.option("--json", "as_json", is_flag=True)
def compare(run_ids, dest, plot_to, as_json):
    """Compare runs: differing config, code, steps, eval loss, metric, tokens/s, hours, $; loss curves overlaid.

    \b
    Example: launch compare local-demo-20261125-101500 local-demo-20261125-113000
    """
    from payload.volume.observe import plot_overlay

    from launcher.store import registry

    if len(set(run_ids)) < 2:
        raise click.BadParameter("name at least two different runs", param_hint="RUN")
    rows = [run_row(registry.get(rid), Path(dest)) for rid in dict.fromkeys(run_ids)]
    diff = differing(rows)
    target = Path(plot_to) if plot_to else plot_path(Path(dest), [r["id"] for r in rows])
    with _matplotlib_home():  # matplotlib's font cache under LAUNCH_HOME, not the user's ~/.cache
        png = plot_overlay([(r["id"], r["_records"]) for r in rows], target, "loss: " + " vs ".join(r["id"] for r in rows))
    runs_json = [{k: v for k, v in r.items() if not k.startswith("_") and k != "config"} for r in rows]
    columns = [Column("", lambda t: cell(t[""]), must_copy=True)]
    columns += [Column(r["id"], lambda t, rid=r["id"]: cell(t[rid]), must_copy=True) for r in rows]
    print_table(table_rows(rows, diff), columns, as_json, console=console(),
                json_value={"runs": runs_json, "differing": diff, "plot": str(png) if png else None})
    if not as_json:
        for r in rows:
            console().print(literal("  ", f"{r['id']}: from {r['source']}"), soft_wrap=True)
        for r in rows:
            if r["fetch_note"]:
                note("[yellow]![/] ", r["fetch_note"])
        console().print(literal("  ", f"plot: {png}" if png else "plot: no losses logged yet"), soft_wrap=True)
