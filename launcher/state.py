"""Where `launch` keeps its own state: `$LAUNCH_HOME`, default `~/.launch` (runs.db, sky-offline/)."""

from __future__ import annotations

import os
from pathlib import Path


def state_dir() -> Path:
    d = Path(os.environ.get("LAUNCH_HOME") or Path.home() / ".launch").expanduser()
    d.mkdir(parents=True, exist_ok=True)
    return d
