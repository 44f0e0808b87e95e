"""SkyPilot's optimizer, in-process and offline, against the catalog snapshot shipped in `v8/`.

SkyPilot reads catalogs from `$SKY_RUNTIME_DIR/.sky/catalogs/v8/` and has no setting to point
elsewhere, so `launch` keeps its own runtime dir (under the launch state dir) holding a copy of the
snapshot, and seeds SkyPilot's enabled-clouds cache there with the clouds the snapshot covers (the
credential check is the one thing that needs the network). The user's own `~/.sky` is untouched:
besides its runtime dir, SkyPilot writes a few paths spelled `~/.sky/...` (its user hash, the serve
dir it makes at import, the database locks), so every offline use of SkyPilot runs with HOME pointed
at launch's runtime dir (`_offline_home`); the user's `~/.sky/config.yaml` is still the config read.
`launch up` on a cloud talks to SkyPilot itself, which keeps its state in `~/.sky` (its own place).

The group may import profiles/ (a profile's resources) and store/ (the state dir); plan/, backends/
and runs/ ask it.
"""

from __future__ import annotations

import contextlib
import csv
import datetime
import functools
import io
import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from launcher.store.state import state_dir, unusable

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
def _offline_home():
    """HOME is launch's offline runtime dir while SkyPilot runs offline: the paths SkyPilot spells
    `~/.sky/...` (user hash, serve dir, db locks) land there, not in the user's HOME. The user's
    SkyPilot config is still read (SKYPILOT_GLOBAL_CONFIG names it, as SkyPilot documents)."""
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
    Calls into it that may touch `~/.sky` belong inside `_offline_home()`, as `sky_task` and the
    optimizer's are."""
    with _offline_home():
        return _import_sky_offline()


@functools.cache
def _import_sky_offline():
    import sys

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
    import logging

    import sky
    from sky import check, global_user_state, skypilot_config

    logging.getLogger("sky").setLevel(logging.ERROR)  # "kubernetes not enabled" etc. are expected offline
    from sky.clouds import cloud as sky_cloud

    ws = skypilot_config.get_active_workspace()
    global_user_state.set_allowed_clouds(check._get_workspace_allowed_clouds(ws), ws)
    global_user_state.set_enabled_clouds(OFFLINE_CLOUDS, sky_cloud.CloudCapability.COMPUTE, ws)
    return sky


@dataclass
class Choice:
    cloud: str
    instance_type: str
    region: Optional[str]
    accelerators: str
    num_nodes: int
    use_spot: bool
    node_price_per_hour: float

    @property
    def price_per_hour(self) -> float:
        return round(self.node_price_per_hour * self.num_nodes, 4)


def planning_task(p, use_spot: Optional[bool] = None) -> dict:
    """The rendered task as the optimizer gets it (no workdir: planning uploads nothing)."""
    from launcher.profiles.render import task_dict

    d = task_dict(p, 0.0)
    if use_spot is not None:
        d["resources"]["use_spot"] = use_spot
        if not use_spot:
            d["resources"].pop("job_recovery", None)
    d.pop("workdir", None)
    return d


def task_from_profile(p, use_spot: Optional[bool] = None):
    """A sky.Task built from the rendered task YAML (SkyPilot's own parser)."""
    return sky_task(planning_task(p, use_spot))


def sky_task(task: dict):
    """SkyPilot's parser on a task dict (raises on a schema error), offline (`_offline_home`)."""
    import yaml

    with _offline_home():
        return import_sky_offline().Task.from_yaml_config(yaml.safe_load(yaml.safe_dump(task)))


def about(p) -> dict:
    """What the optimizer's answer and its refusal name besides the task: the profile's name, its
    accelerators as the profile lists them, its node count."""
    return {"name": p.name, "label": p.cluster.accelerators_label, "num_nodes": p.cluster.num_nodes}


# The optimizer's answer is a function of the task, the snapshot and SkyPilot's version: kept in this
# process and in the offline runtime dir, so a later `launch plan`/`profiles`/`up` of an unchanged
# task neither runs the optimizer nor imports SkyPilot (~1.7 s of the ~3 s of a plan).
OPTIMIZER_CACHE = "optimizer-answers.json"
CACHE_ENTRIES = 256
_OPTIMIZED: dict[str, dict] = {}


@functools.cache
def _snapshot_key() -> str:
    import hashlib
    from importlib.metadata import version

    h = hashlib.sha256(version("skypilot").encode())
    for f in sorted(SNAPSHOT.rglob("*.csv")):
        h.update(f.relative_to(SNAPSHOT).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def _answer_key(task: dict) -> str:
    import hashlib

    text = json.dumps(task, sort_keys=True, default=str)
    return hashlib.sha256(f"{_snapshot_key()}\0{text}".encode()).hexdigest()[:32]


def optimize(p, use_spot: Optional[bool] = None) -> Choice:
    """Run SkyPilot's optimizer on the profile's task; raises PlanError with SkyPilot's reason. Once
    per task: the answer is kept (see OPTIMIZER_CACHE) for this process and later ones."""
    return optimize_task(planning_task(p, use_spot), about(p))


def optimize_task(task: dict, about: dict) -> Choice:
    """`optimize` of a planning task (`planning_task`) and its profile's `about`: what the optimizer's
    child process gets (launcher/catalog/child.py), so it neither reads nor validates the profile."""
    key = _answer_key(task)
    path = offline_runtime_dir() / OPTIMIZER_CACHE
    if key not in _OPTIMIZED:
        _OPTIMIZED.update(_read_answers(path))
    if key not in _OPTIMIZED:
        try:
            _OPTIMIZED[key] = asdict(_optimize(task, about))
        except PlanError as e:
            _OPTIMIZED[key] = {"error": str(e)}
        _write_answers(path, key, _OPTIMIZED[key])
    answer = _OPTIMIZED[key]
    if "error" in answer:
        raise PlanError(answer["error"])
    return Choice(**answer)


def _cached(p, use_spot: Optional[bool] = None) -> bool:
    key = _answer_key(planning_task(p, use_spot))
    return key in _OPTIMIZED or key in _read_answers(offline_runtime_dir() / OPTIMIZER_CACHE)


def _read_answers(path: Path) -> dict:
    try:
        answers = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return answers if isinstance(answers, dict) else {}


def _write_answers(path: Path, key: str, answer: dict) -> None:
    """Add one answer (atomically: other launch processes may read or write beside this one)."""
    import tempfile

    answers = {**_read_answers(path), key: answer}
    answers = dict(list(answers.items())[-CACHE_ENTRIES:])
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(fd, "w") as f:
            json.dump(answers, f)
        os.replace(tmp, path)
    except OSError:
        pass  # a cache: the next process runs the optimizer again


def _optimize(task_config: dict, about: dict) -> Choice:
    sky = import_sky_offline()
    from sky import exceptions, optimizer

    task = sky_task(task_config)
    with sky.Dag() as dag:
        dag.add(task)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), _offline_home():
            optimizer.Optimizer.optimize(dag, quiet=True)
    except exceptions.ResourcesUnavailableError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else "no matching instance"
        raise PlanError(f"{about['name']}: SkyPilot found no instance in the catalog snapshot ({SNAPSHOT_DATE}) "
                        f"for {about['label']} x {about['num_nodes']} node(s): {first}") from None
    r = task.best_resources
    chosen = ",".join(f"{k}:{v:g}" for k, v in (r.accelerators or {}).items())  # any_of: the one SkyPilot took
    return Choice(cloud=str(r.cloud), instance_type=r.instance_type, region=r.region,
                  accelerators=chosen or about["label"], num_nodes=about["num_nodes"],
                  use_spot=bool(r.use_spot), node_price_per_hour=round(r.get_cost(3600), 4))


def fallback_choice(p) -> Choice:
    """What the plan assumes when the snapshot has no instance for the profile: its own price."""
    return Choice(cloud=",".join(p.cluster.infra_list), instance_type="(not in the catalog snapshot)",
                  region=p.cluster.region, accelerators=p.cluster.accelerators_label,
                  num_nodes=p.cluster.num_nodes, use_spot=p.cluster.use_spot,
                  node_price_per_hour=p.budget.price_per_hour / p.cluster.num_nodes)


_CHOICES: dict[str, Choice] = {}  # profile JSON -> the optimizer's answer (the snapshot is fixed)
CHILD_TIMEOUT_S = 120


def choice_apart(p) -> Choice:
    """SkyPilot's optimizer on the snapshot for a process that goes on to use the SDK (`launch up`):
    run in a child process, since `import_sky_offline()` points SKY_RUNTIME_DIR at launch's offline
    dir and seeds fake enabled clouds there, which must reach neither an SDK call (a local API server
    would start against them) nor ~/.sky. In this process only when it already is the offline
    planner. Once per profile per process: the price, an any_of pick and the budget gate share it.
    Raises PlanError with SkyPilot's reason (no instance fits), RuntimeError when the child failed."""
    import subprocess
    import sys

    key = p.model_dump_json()
    if key in _CHOICES:
        return _CHOICES[key]
    offline_here = "sky" in sys.modules and os.environ.get("SKY_RUNTIME_DIR") == str(offline_runtime_dir())
    if offline_here or _cached(p):  # a kept answer needs no SkyPilot import: no child either
        _CHOICES[key] = optimize(p)
        return _CHOICES[key]
    done = subprocess.run([sys.executable, "-m", "launcher.catalog.child"], input=child_input(p), text=True,
                          capture_output=True, timeout=CHILD_TIMEOUT_S, cwd=HERE.parent.parent)
    answer = json.loads(done.stdout.splitlines()[-1]) if done.returncode == 0 and done.stdout.strip() else None
    if answer is None:
        raise RuntimeError(done.stderr.strip()[-300:] or f"the optimizer's process exited {done.returncode}")
    if "error" in answer:
        raise PlanError(answer["error"])
    _CHOICES[key] = Choice(**answer)
    return _CHOICES[key]


def child_input(p) -> str:
    """What `choice_apart`'s child gets on stdin: the planning task and `about`, never the profile
    (the parent read and validated it once; launcher/catalog/child.py)."""
    return json.dumps({"task": planning_task(p), "about": about(p)})


def catalog_price(p) -> float:
    return optimize(p).price_per_hour


def plan_price(p) -> float:
    """$/h used in the rendered envs: the shipped catalog (offline), else the profile's fallback.
    Local profiles use their notional price. `launch up` replaces it with the live price if known."""
    if p.cluster.is_local:
        return p.budget.price_per_hour or 0.0
    try:
        return catalog_price(p)
    except PlanError:
        if p.budget.price_per_hour is None:
            raise
        return p.budget.price_per_hour


class PlanError(Exception):
    pass
