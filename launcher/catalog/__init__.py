"""SkyPilot's optimizer, in-process and offline, against the catalog snapshot shipped in `v8/`.

SkyPilot reads catalogs from `$SKY_RUNTIME_DIR/.sky/catalogs/v8/` and has no setting to point
elsewhere, so `launch` keeps its own runtime dir (under the launch state dir) holding a copy of the
snapshot, and runs SkyPilot's parser and optimizer there, with the user's own `~/.sky` untouched.
`launch up` on a cloud talks to SkyPilot itself, which keeps its state in `~/.sky` (its own place).

The group: `snapshot` (the snapshot installed where SkyPilot reads it, SkyPilot imported offline,
storage prices), `optimizer` (the optimizer's answers, kept), `child` runs it in a child process
for `up`, `build_snapshot` rebuilds `v8/` from `extract/` (its README). It may import profiles/ (a
profile's resources), store/ (the state dir) and launcher/sky_internals.py (SkyPilot's offline state,
seeded as `sky check` does); plan/, backends/ and runs/ ask it, through this
face.
"""

from __future__ import annotations

from .optimizer import (  # noqa: F401  (the group's face)
    Choice,
    Rental,
    child_input,
    choice_apart,
    fallback_choice,
    optimize,
    optimize_task,
    plan_price,
)
from .snapshot import (  # noqa: F401  (the group's face)
    SNAPSHOT,
    SNAPSHOT_DATE,
    STALE_AFTER_DAYS,
    PlanError,
    import_sky_offline,
    install_snapshot,
    offline_runtime_dir,
    sky_task,
    snapshot_warning,
    storage_price,
)
