"""`launch volumes`: the volumes and buckets that keep billing after `launch down`, and deleting one.

One idea at ~360 lines: what keeps billing after `launch down` (volumes and buckets): listed with
size, age and $/month, deleted, and named by `down` itself (`still_billing_lines`).

Network volumes and buckets hold the model cache and the checkpoints a `--resume` needs, so `down`
leaves them; they bill per GB-month until deleted (prices: launcher/catalog/extract/storage_prices.csv).
The list comes from SkyPilot (`sky.volumes.ls`, `sky.storage_ls`), joined with launch's run registry
(the last run that used each) and the profiles (a bucket's size is not reported: the profile's
estimate is shown, marked `~`).
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from typing import Optional

import click

from launcher.errors import BackendError
from launcher.term.tables import Column, print_table
from launcher.term.ui import console, money, note, note as note_line  # note_line where `note` is an argument


@dataclass
class Stored:
    name: str
    kind: str  # "volume" | "bucket"
    type: str  # runpod-network-volume, k8s-pvc, s3, azure, ...
    where: str
    size_gb: Optional[float]
    size_estimated: bool
    created_at: Optional[float]
    usd_per_month: Optional[float]
    last_run: Optional[str] = None
    last_run_state: Optional[str] = None
    active_runs: list = field(default_factory=list)
    in_use_by: list = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def _size_gb(size) -> Optional[float]:
    m = re.match(r"\s*(\d+(?:\.\d+)?)", str(size or ""))
    return float(m.group(1)) if m else None


def _declared() -> dict[str, object]:
    """{volume or bucket name: the profile that declares it} (sizes and prices of buckets)."""
    from launcher.profiles.profile import load_profile, profile_names

    out = {}
    for n in profile_names():
        try:
            p = load_profile(n)
        except Exception:  # noqa: BLE001 - a broken profile is `launch validate`'s business
            continue
        for s in (p.cluster.volume, p.cluster.bucket):
            if s is not None:
                out.setdefault(s.name, p)
    return out


def _priced(kind: str, size_gb: Optional[float]) -> Optional[float]:
    from launcher.catalog import storage_price

    price, _ = storage_price(kind)
    return None if price is None or size_gb is None else round(price * size_gb, 2)


def _from_skypilot(sky, declared: dict) -> list[Stored]:
    from launcher.backends.skypilot import record_field as f
    from launcher.plan.storage import storage_for

    rows = []
    # refreshed: the listing's `usedby_clusters` is otherwise the API server's cached view (updated by
    # its background daemon, sky/volumes/server/core.py volume_list): a pod torn down a minute ago is
    # still "using" its volume there, and `volumes rm` refused to delete it (seen on the emulated RunPod)
    for r in sky.get(sky.volumes.ls(refresh=True)) or []:
        size = _size_gb(f(r, "size"))
        where = " ".join(x for x in (str(f(r, "cloud", "")), f(r, "zone") or f(r, "region") or "") if x)
        rows.append(Stored(f(r, "name"), "volume", f(r, "type", ""), where, size, False, f(r, "launched_at"),
                           _priced(f(r, "type", ""), size), in_use_by=list(f(r, "usedby_clusters", []) or [])))
    for r in sky.get(sky.storage_ls()) or []:
        stores = [str(getattr(s, "value", s)).lower() for s in f(r, "store", []) or []]
        kind = stores[0] if stores else "?"
        p = declared.get(f(r, "name"))
        est = next((s.size_gb for s in storage_for(p) if s.name == f(r, "name")), None) if p else None
        rows.append(Stored(f(r, "name"), "bucket", kind, kind, est, True, f(r, "launched_at"), _priced(kind, est)))
    return rows


def _stored(run, kind: str) -> Optional[dict]:
    """The SkyPilot volume or bucket a run used (`handle.volume` / `.bucket`, a dict with its name), else
    None: a local or ssh run's `handle.volume` is the path of its directory there, no storage of SkyPilot's."""
    h = getattr(run.handle, kind)
    return h if isinstance(h, dict) and h.get("name") else None


def _from_registry(runs) -> list[Stored]:
    """What launch's runs used, when SkyPilot cannot be asked (unverified: may already be deleted)."""
    seen: dict[str, Stored] = {}
    for run in runs:
        for kind in ("volume", "bucket"):
            h = _stored(run, kind)
            if h is not None and h["name"] not in seen:
                typ = h.get("type") or h.get("store") or "?"
                seen[h["name"]] = Stored(h["name"], kind, typ, h.get("zone") or typ, None, True, None, None)
    return list(seen.values())


def _join_runs(rows: list[Stored], runs) -> None:
    for row in rows:
        used = [r for r in runs if (_stored(r, row.kind) or {}).get("name") == row.name]
        if used:  # registry order: newest first
            row.last_run, row.last_run_state = used[0].id, used[0].state
            row.active_runs = [r.id for r in used if r.active]


NOT_ASKED = ("SkyPilot not asked: launch has run nothing on SkyPilot here, so it made no volume or bucket "
             "(`sky volumes ls` and `sky storage ls` list any made with `sky` directly)")


def collect(sky=None) -> tuple[list[Stored], Optional[str]]:
    """(volumes and buckets, a note when SkyPilot could not be asked). Without a SkyPilot run in the
    registry launch made nothing there: the (empty) local listing is the answer and no SkyPilot API
    server is started for it. Else SkyPilot is asked in a `_sky_session`."""
    from launcher.store import registry
    from launcher.backends.skypilot import map_sky_error

    runs = registry.all_runs()
    if sky is None and not any(r.backend == "skypilot" for r in runs):
        return _from_registry(runs), NOT_ASKED
    note = None
    try:
        with contextlib.ExitStack() as stack:
            sky = sky or stack.enter_context(_sky_session())
            rows = _from_skypilot(sky, _declared())
    except Exception as e:  # noqa: BLE001 - SDK errors become one line
        rows, note = _from_registry(runs), f"{map_sky_error(e)}; showing what launch's runs used (unverified)"
    _join_runs(rows, runs)
    return rows, note


@contextlib.contextmanager
def _sky_session():
    """`sky` for the SDK calls of one command: SkyPilot's own log lines go to stderr (stdout stays the
    listing, `--json` included), without colour codes unless stderr is a terminal; a local API server
    that the first call starts (~1.3 GB, it would outlive the command) is stopped again at the end."""
    from launcher.backends.skypilot import control, sdk

    sky = sdk()
    before = control.local_api_server_pids()
    handlers = [h for h in logging.getLogger("sky").handlers if isinstance(h, logging.StreamHandler)]
    target = sys.stderr if sys.stderr.isatty() else _Plain(sys.stderr)
    streams = [h.setStream(target) for h in handlers]
    try:
        with control.marked_process() as origin:
            try:
                yield sky
            finally:
                left = control.stop_api_server_we_started(sky, before, origin)
                if "still runs" in left:
                    print(left.lstrip("; "), file=sys.stderr)
    finally:
        for h, stream in zip(handlers, streams):
            h.setStream(stream)


class _Plain:
    """A text stream that drops ANSI escape sequences (SkyPilot colours its lines unconditionally)."""

    def __init__(self, stream):
        self.stream = stream

    def write(self, text: str) -> int:
        return self.stream.write(strip_ansi(text))

    def flush(self) -> None:
        self.stream.flush()


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


_ANSI = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)|[@-Z\\-_])")


def _age(created_at: Optional[float]) -> str:
    if not created_at:
        return "age unknown"
    days = (time.time() - created_at) / 86400
    return f"{days:.0f} days old" if days >= 2 else f"{days * 24:.0f} h old"


def _last_run(r: "Stored") -> str:
    """The last run's id on a line of its own (copied into commands), then its state and users."""
    last = f"{r.last_run}\n({r.last_run_state})" if r.last_run else "-"
    users = r.active_runs + [u for u in r.in_use_by if u not in r.active_runs]
    return last + "".join(f"\nin use by {u}" for u in users)


def _columns():
    def size(r):
        return "unknown" if r["size_gb"] is None else f"{'~' if r['size_estimated'] else ''}{r['size_gb']:,.0f} GB"

    def kind(r):
        where = f", {r['where']}" if r["where"] and r["where"] != r["type"] else ""
        return f"{r['kind']} ({r['type']}{where})"

    return [Column("name", "name", must_copy=True),
            Column("kind", kind, priority=3),
            Column("size", size, priority=2, justify="right"),
            Column("age", lambda r: _age(r["created_at"]), priority=4),
            Column("$/month", lambda r: "unknown" if r["usd_per_month"] is None else money(r["usd_per_month"]),
                   must_copy=True, justify="right"),
            Column("last run", lambda r: _last_run(Stored(**r)), must_copy=True, priority=1)]


def print_rows(rows: list[Stored], note: Optional[str], as_json: bool = False) -> None:
    total = round(sum(r.usd_per_month or 0.0 for r in rows), 2)
    dicts = [r.to_dict() for r in rows]
    if as_json:
        return print_table(dicts, [], True, console=console(),
                           json_value={"volumes": dicts, "note": note, "total_usd_per_month": total})
    c = console()
    if note:
        note_line("[yellow]![/] ", note, out=c)
    if not rows:
        note_line("[green]✓[/] ", "no volumes or buckets: nothing bills between runs", out=c)
        return
    print_table(dicts, _columns(), console=c)
    c.print(f"[bold]total[/] {money(total)}/month for {len(rows)} volume(s)/bucket(s)")
    note_line("  [dim]→[/] ", f"launch volumes rm {rows[0].name}", "  (deletes its data; asks first)", out=c)


# ---------------------------------------------------------------------------------------- delete


def interactive() -> bool:
    return sys.stdin.isatty()


def delete(name: str, yes: bool) -> Stored:
    """Delete one volume or bucket after saying what is lost and asking (`yes`: don't ask)."""
    with _sky_session() as sky:
        return _delete(sky, name, yes)


def _delete(sky, name: str, yes: bool) -> Stored:
    from launcher.backends.skypilot import map_sky_error

    rows, note = collect(sky)
    if note:
        raise BackendError(f"cannot delete {name}: {note}")
    row = next((r for r in rows if r.name == name), None)
    if row is None:
        known = ", ".join(r.name for r in rows) or "none"
        raise BackendError(f"no volume or bucket named {name} (known: {known}; see `launch volumes`)")
    if row.active_runs or row.in_use_by:
        users = ", ".join(row.active_runs + row.in_use_by)
        raise BackendError(f"{name} is in use by {users}: stop it first (`launch down {users.split(', ')[0]}`)")
    cost = "" if row.usd_per_month is None else f", {money(row.usd_per_month)}/month"
    lost = f"; run {row.last_run} cannot --resume afterwards" if row.last_run else ""
    question = f"Delete {row.kind} {name} ({row.type}{cost}) and everything on it (model cache, checkpoints{lost})?"
    if not yes:
        if not interactive():
            raise BackendError(f"not deleting {name} without confirmation: pass --yes to delete from a script")
        click.confirm(question, default=False, abort=True)
    try:
        sky.get(sky.volumes.delete([name]) if row.kind == "volume" else sky.storage_delete(name))
    except Exception as e:  # noqa: BLE001
        raise map_sky_error(e) from None
    return row


# ------------------------------------------------------------------------------------------ down


def still_billing_lines(run, checkpoint: Optional[str] = None) -> list[str]:
    """What keeps billing once `launch down` has stopped a run's machines, with the command that stops it;
    `checkpoint` names the checkpoint the run left there (what `--resume` continues from)."""
    from launcher.catalog import storage_price

    h, lines = run.handle, []
    if run.backend == "ssh":
        line = f"the machine {h.host or '(ssh host)'} is yours: it bills until you stop it at your provider"
        if checkpoint:  # on that machine's disk: a pod terminated takes it along
            line += (f"; terminating it deletes {checkpoint} unless its disk outlives it (a network volume): "
                     "copy the run's directory off first if you will `--resume` elsewhere")
        return [line]
    sizes = {}
    try:
        from launcher.profiles.profile import load_profile
        from launcher.plan.storage import storage_for

        sizes = {s.name: s for s in storage_for(load_profile(run.profile))}
    except Exception:  # noqa: BLE001 - the profile may be gone: report without sizes
        pass
    for kind in ("volume", "bucket"):
        item = _stored(run, kind)
        if item is None:
            continue
        name, s = item["name"], sizes.get(item["name"])
        typ = item.get("type") or item.get("store") or (s.type if s else "?")
        price = s.usd_per_month if s else None
        size = f"{'~' if kind == 'bucket' else ''}{s.size_gb:,.0f} GB, " if s else ""
        cost = f"~{money(price)}/month" if price is not None else f"price unknown ({storage_price(typ)[1]})"
        holds = f"{checkpoint}, which `--resume` continues from, and the model cache" if checkpoint else \
            f"the model cache and checkpoints for `launch up {run.profile} --resume`"
        lines.append(f"{kind} {name} ({size}{typ}) keeps billing {cost}: it holds {holds}; "
                     f"delete: launch volumes rm {name}")
    if h.kind == "managed_job":
        lines.append("SkyPilot's managed-jobs controller is a machine of its own and bills until it autostops "
                     "(`sky status` lists it)")
    return lines


# ------------------------------------------------------------------------------------------- cli


@click.group(invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def volumes(ctx, as_json):
    """Volumes and buckets (they bill after `launch down`): size, age, $/month, last run.

    Example: launch volumes
    """
    if ctx.invoked_subcommand is not None:
        return
    rows, note = collect()
    print_rows(rows, note, as_json)


@volumes.command("rm")
@click.argument("name")
@click.option("--yes", is_flag=True, help="Do not ask (scripts).")
def rm(name, yes):
    """Delete a volume or bucket and everything on it (asks first).

    Example: launch volumes rm sonia-workspace
    """
    row = delete(name, yes)
    saved = "" if row.usd_per_month is None else f" ({money(row.usd_per_month)}/month less)"
    note("[green]✓[/] ", f"deleted {row.kind} {name}{saved}")
