"""SkyPilot's optimizer, in-process and offline, on the catalog snapshot (`snapshot`): which instance,
where, at what $/hour, for a profile's task.

The optimizer's answer is kept (in this process and in the offline runtime dir, keyed by the task,
the snapshot and SkyPilot's version), so a later plan of an unchanged task neither runs it nor
imports SkyPilot. `choice_apart` runs it in a child process (launcher/catalog/child.py) for a
process that goes on to use the SDK (`launch up`); `plan_price` is the $/h a rendered task carries.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Optional

from launcher.catalog.snapshot import (
    SNAPSHOT,
    SNAPSHOT_DATE,
    PlanError,
    import_sky_offline,
    offline_home,
    offline_runtime_dir,
    sky_task,
)

# the child process runs from the directory holding this install's `launcher` (`-m launcher.catalog.child`)
PACKAGE_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Rental:
    """What a run rents: the cloud, its instance and region, the accelerators, how many nodes, spot or
    on-demand. The optimizer's answer (`Choice`) is one, and so is the plan made from it
    (launcher/plan/estimate.py `Plan`, which takes these from its choice)."""
    cloud: str
    instance_type: str
    region: Optional[str]
    accelerators: str
    num_nodes: int
    use_spot: bool

    def rental(self) -> dict:
        """These fields by name, as a plan is made from a choice."""
        return {f.name: getattr(self, f.name) for f in fields(Rental)}


@dataclass
class Choice(Rental):
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
    from importlib.metadata import version

    h = hashlib.sha256(version("skypilot").encode())
    for f in sorted(SNAPSHOT.rglob("*.csv")):
        h.update(f.relative_to(SNAPSHOT).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def _answer_key(task: dict) -> str:
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
    from sky import exceptions

    task = sky_task(task_config)
    with sky.Dag() as dag:
        dag.add(task)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), offline_home():
            sky.Optimizer.optimize(dag, quiet=True)
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
    key = p.model_dump_json()
    if key in _CHOICES:
        return _CHOICES[key]
    offline_here = "sky" in sys.modules and os.environ.get("SKY_RUNTIME_DIR") == str(offline_runtime_dir())
    if offline_here or _cached(p):  # a kept answer needs no SkyPilot import: no child either
        _CHOICES[key] = optimize(p)
        return _CHOICES[key]
    done = subprocess.run([sys.executable, "-m", "launcher.catalog.child"], input=child_input(p), text=True,
                          capture_output=True, timeout=CHILD_TIMEOUT_S, cwd=PACKAGE_ROOT)
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
