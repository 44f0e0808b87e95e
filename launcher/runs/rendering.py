"""The task `launch up` hands its backend: the run's price, its render (the committed sky/ file for a
cloud run of the profile as written, otherwise a copy of its own in the run's directory) and, for
`--dry-run`, that render shown and checked without a file left behind (launcher/runs/start.py calls
these in that order).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path


def price_for(p, backend: str) -> tuple[float, str]:
    """($/h, source) for a new run: RunPod's API (skypilot backend), else the catalog snapshot, else
    the profile's price. Local profiles use their notional price."""
    if backend == "skypilot":
        from launcher.backends.skypilot import hourly_price

        return hourly_price(p)
    from launcher.catalog import plan_price

    return plan_price(p), "catalog or profile"


def renders_per_run(sets: tuple[str, ...], written) -> bool:
    """Whether a cloud run gets a render of its own instead of the committed sky/ file: an override
    other than budget.* (the render would differ from the profile as written), or a profile from
    outside clusters/ (its `name:` must never overwrite the committed render of that name)."""
    from launcher.profiles.profile import in_clusters

    return any(not item.startswith("budget.") for item in sets) or not in_clusters(written.path)


def render_for_run(p, run, backend: str, price_source: str, per_run: bool = False):
    """Cloud: the committed sky/ files (re-rendered if stale), or with `--set` overrides (`per_run`) a
    copy in the run's own directory, as local/ssh runs always get: sky/ stays the profile's render."""
    from launcher.profiles.render import config_path, render_text, task_path, write
    from launcher.store.state import private_dir, state_dir, write_private

    if backend == "skypilot" and not per_run:
        task_text, config_text = render_text(p, _committed_price(p, run, price_source))
        write({task_path(p.name): task_text, config_path(p.name): config_text})
        return task_path(p.name), config_path(p.name)
    task_text, config_text = render_text(p, run.price_per_hour)
    d = private_dir(private_dir(state_dir() / "rendered") / run.id)
    return write_private(d / "task.yaml", task_text), write_private(d / f"{p.name}.yaml", config_text)


def _committed_price(p, run, price_source: str) -> float:
    """sky/ is committed and CI runs `launch render --check`: it is rendered with the offline price, as
    `launch render` does. A live price reaches the run through LAUNCH_PRICE_PER_HOUR instead."""
    if price_source in ("runpod-api", "registry"):
        from launcher.backends.skypilot import hourly_price

        return hourly_price(p, live=False)[0]
    return run.price_per_hour


def show_dry_run(p, run, backend: str, price_source: str, per_run: bool = False) -> None:
    """`up --dry-run`: the task rendered as `launch up` would render it (cloud: as the committed sky/
    file, said whether that is up to date; otherwise, or with --set overrides, a per-run copy) into a
    temp dir that is removed (a dry run writes nothing), parsed by SkyPilot for the skypilot backend,
    and the upload list."""
    import yaml

    from launcher.profiles.render import render_text, task_path
    from launcher.profiles.uploads import print_dry_run

    if backend == "skypilot" and not per_run:
        task_text, config_text = render_text(p, _committed_price(p, run, price_source))
        committed = task_path(p.name)
        fresh = committed.exists() and committed.read_text() == task_text
        checked = f"sky/{committed.name} ({'up to date' if fresh else 'stale: `launch up` re-renders it'})"
    else:
        task_text, config_text = render_text(p, run.price_per_hour)
        checked = f"rendered from {p.name}'s profile for the {backend} backend (a per-run copy)"
    d = Path(tempfile.mkdtemp(prefix="launch-dry-run-"))
    try:
        task_yaml, config_yaml = d / "task.yaml", d / f"{p.name}.yaml"
        task_yaml.write_text(task_text)
        config_yaml.write_text(config_text)
        if backend == "skypilot":
            from launcher.catalog import sky_task

            config = yaml.safe_load(task_text)
            config.pop("workdir", None)
            sky_task(config)  # SkyPilot's parser, offline and out of the user's ~/.sky: schema errors raise
            checked += ", parsed by SkyPilot"
        print_dry_run(p, backend, run.id, task_yaml, config_yaml, checked)
    finally:
        shutil.rmtree(d, ignore_errors=True)
