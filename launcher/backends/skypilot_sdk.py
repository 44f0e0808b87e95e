"""The SkyPilot SDK as the SkyPilot backend's modules use it: the guarded `sky` import and the small
readers of its responses. One owner, so `skypilot.py` (lifecycle) and `skypilot_files.py` (moving
bytes) share public names instead of reaching into each other."""

from __future__ import annotations

import os
import re
import sys

from . import BackendError


def sdk():
    """`sky` for SDK calls: never with launch's offline runtime dir (fake enabled clouds, and a local
    API server started from this process would keep its state there)."""
    from ..catalog import offline_runtime_dir

    if "sky" in sys.modules and os.environ.get("SKY_RUNTIME_DIR") == str(offline_runtime_dir()):
        raise BackendError("internal: this process imported SkyPilot for offline planning "
                           "(launcher.catalog.import_sky_offline); run SDK calls in a fresh process")
    os.environ.setdefault("SKYPILOT_DISABLE_USAGE_COLLECTION", "1")
    import sky
    import sky.client.sdk  # noqa: F401
    import sky.jobs  # noqa: F401  (sky.jobs.* and sky.volumes.* are used as attributes)
    import sky.volumes  # noqa: F401

    return sky


def record_field(record, key, default=None):
    """A field of an SDK response record (pydantic response models and dicts both have .get)."""
    value = record.get(key, default) if hasattr(record, "get") else getattr(record, key, default)
    return default if value is None else value


def first_line(e: BaseException) -> str:
    """An exception's first non-empty line, ANSI colours removed, at most 300 characters."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(e)).strip()
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), type(e).__name__)
    return line if len(line) <= 300 else line[:297] + "..."


def volume_record(sky, name: str):
    """SkyPilot's record of the volume `name`, or None."""
    records = sky.get(sky.volumes.ls(names=[name]))
    return next((r for r in records or [] if record_field(r, "name") == name), None)
