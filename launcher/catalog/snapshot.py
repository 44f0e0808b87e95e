"""The catalog snapshot shipped in `v8/`, and SkyPilot run offline against it.

SkyPilot reads catalogs from `$SKY_RUNTIME_DIR/.sky/catalogs/v8/` and has no setting to point
elsewhere, so `launch` keeps its own runtime dir (under the launch state dir) holding a copy of the
snapshot, and seeds SkyPilot's enabled-clouds cache there with the clouds the snapshot covers (the
credential check is the one thing that needs the network). The user's own `~/.sky` is untouched:
besides its runtime dir, SkyPilot writes a few paths spelled `~/.sky/...` (its user hash, the serve
dir it makes at import, the database locks), so every offline use of SkyPilot runs with HOME pointed
at launch's runtime dir (`offline_home`); the user's `~/.sky/config.yaml` is still the config read.
`launch up` on a cloud talks to SkyPilot itself, which keeps its state in `~/.sky` (its own place).

Also here: the snapshot's date (and the warning once it is old), the storage prices of its
`extract/`, SkyPilot's own parser on a task (`sky_task`), and `PlanError`, what planning raises
when it cannot go on. The optimizer's answers are `optimizer`'s.
"""

from __future__ import annotations

import contextlib
import csv
import datetime
import functools
import json
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Optional

from launcher.store.state import state_dir, unusable

from .. import sky_internals

HERE = Path(__file__).resolve().parent
SNAPSHOT = HERE / "v8"
SNAPSHOT_META = json.loads((HERE / "snapshot.json").read_text())  # written by build_snapshot.py
SNAPSHOT_DATE: str = SNAPSHOT_META["date"]  # when the rows were read from SkyPilot's catalog
STALE_AFTER_DAYS = 60
OFFLINE_CLOUDS = ["RunPod", "Azure"]


def snapshot_age_days(today: Optional[datetime.date] = None) -> int:
    today = today or datetime.date.today()
    return (today - datetime.date.fromisoformat(SNAPSHOT_DATE)).days


def snapshot_warning(today: Optional[datetime.date] = None) -> Optional[str]:
    """One line when the snapshot is older than STALE_AFTER_DAYS (list prices move), else None."""
    age = snapshot_age_days(today)
    if age <= STALE_AFTER_DAYS:
        return None
    return (f"the catalog snapshot is {age} days old ({SNAPSHOT_DATE}): prices may have moved; refresh "
            "launcher/catalog/extract/ from skypilot-org/skypilot-catalog and run "
            "`python -m launcher.catalog.build_snapshot` (RUNPOD_API_KEY gives live RunPod prices at `up`)")


@functools.cache
def storage_prices() -> dict[str, tuple[Optional[float], str]]:
    """{volume type or bucket store: ($/GB-month or None when unknown, source)} from the extract."""
    lines = [ln for ln in (HERE / "extract" / "storage_prices.csv").read_text().splitlines() if not ln.startswith("#")]
    return {r["kind"]: (float(r["usd_per_gb_month"]) if r["usd_per_gb_month"] else None, r["source"])
            for r in csv.DictReader(lines)}


def storage_price(kind: str) -> tuple[Optional[float], str]:
    return storage_prices().get(kind, (None, f"no price known for `{kind}`"))


def offline_runtime_dir() -> Path:
    return state_dir() / "sky-offline"


def install_snapshot(runtime_dir: Path) -> Path:
    """Copy the shipped catalog CSVs to where SkyPilot reads them under `runtime_dir` (its
    SKY_RUNTIME_DIR). Files without a `.meta/*.md5` beside them count as user-made, so SkyPilot
    never tries to download over them. Returns the catalog dir."""
    dest = Path(runtime_dir) / ".sky" / "catalogs" / "v8"
    for src in SNAPSHOT.rglob("*.csv"):
        target = dest / src.relative_to(SNAPSHOT)
        try:
            if not target.exists() or target.read_bytes() != src.read_bytes():
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, target)
        except OSError as e:  # a read-only LAUNCH_HOME, a file in the way: one line, not a traceback
            raise unusable(target.parent, e) from None
    return dest


@contextlib.contextmanager
def offline_home():
    """HOME is launch's offline runtime dir while SkyPilot runs offline: the paths SkyPilot spells
    `~/.sky/...` (user hash, serve dir, db locks) land there, not in the user's HOME. The user's
    SkyPilot config is still read (SKYPILOT_GLOBAL_CONFIG names it, as SkyPilot documents). Entered
    once at a time, never inside itself: inside, `~` is already the runtime dir, so a second entry
    would look for the user's config there."""
    rt = offline_runtime_dir()
    home = os.environ.get("HOME")
    config = Path(home or Path.home()) / ".sky" / "config.yaml"
    set_config = "SKYPILOT_GLOBAL_CONFIG" not in os.environ and config.is_file()
    if set_config:
        os.environ["SKYPILOT_GLOBAL_CONFIG"] = str(config)
    os.environ["HOME"] = str(rt)
    try:
        yield
    finally:
        if home is None:
            os.environ.pop("HOME", None)
        else:
            os.environ["HOME"] = home
        if set_config:
            os.environ.pop("SKYPILOT_GLOBAL_CONFIG", None)


def import_sky_offline():
    """Import `sky` configured for offline planning; returns the module. Once per process: SkyPilot
    fixes its runtime dir at import, so the catalog copy and the seeded clouds cannot change after.
    Calls into it that may touch `~/.sky` belong inside `offline_home()`, as `sky_task` and the
    optimizer's are."""
    with offline_home():
        return _import_sky_offline()


@functools.cache
def _import_sky_offline():
    rt = offline_runtime_dir()
    if "sky" not in sys.modules:
        os.environ["SKY_RUNTIME_DIR"] = str(rt)
    elif not os.environ.get("SKY_RUNTIME_DIR"):
        # sky is already live against the user's real ~/.sky: seeding fake enabled clouds or copying
        # the snapshot there would corrupt it. Plan in a fresh process instead.
        raise PlanError("offline planning needs its own SkyPilot runtime dir; run `launch plan` in a "
                        "fresh process (SkyPilot was already imported against ~/.sky)")
    os.environ.setdefault("SKYPILOT_DISABLE_USAGE_COLLECTION", "1")
    install_snapshot(Path(os.environ.get("SKY_RUNTIME_DIR") or rt))
    import sky

    logging.getLogger("sky").setLevel(logging.ERROR)  # "kubernetes not enabled" etc. are expected offline
    ws = sky_internals.get_active_workspace()
    sky_internals.set_allowed_clouds(sky_internals.workspace_allowed_clouds(ws), ws)  # as `sky check` does
    sky_internals.set_enabled_clouds(OFFLINE_CLOUDS, sky_internals.cloud_capability().COMPUTE, ws)
    return sky


def sky_task(task: dict):
    """SkyPilot's parser on a task dict (raises on a schema error), offline (`offline_home`)."""
    import yaml

    sky = import_sky_offline()  # enters offline_home itself: not inside the one below
    with offline_home():
        return sky.Task.from_yaml_config(yaml.safe_load(yaml.safe_dump(task)))


class PlanError(Exception):
    """Planning cannot go on: no instance in the snapshot fits (SkyPilot's reason), or SkyPilot was
    already imported against ~/.sky."""
