"""Backends drive a rendered run somewhere: this machine, a host over SSH, or SkyPilot.

Every backend implements the same small interface (`base.Backend`); the CLI never knows which one
it talks to. This package's face: the contract's names (re-exported from `base` and
launcher/errors.py) and `get_backend(name, **options)` (`factory`), which imports a backend only
when asked, so `launch --help` stays fast. Backends themselves import `base`, never this module.

The group may import store/ (the run registry), profiles/ (render, uploads), catalog/ (prices),
term/, errors and launcher/sky_internals.py (every SkyPilot name outside its public SDK); runs/ and
results/ drive it.
"""

from __future__ import annotations

from ..errors import BackendError  # noqa: F401  (the package's public face)
from .base import (  # noqa: F401  (the package's public face)
    Access,
    Backend,
    LaunchSpec,
    RemoteStatus,
    command_line,
    end_state,
    remote_command,
    remote_path,
    tail_offset,
)
from .factory import get_backend  # noqa: F401  (the package's public face)
