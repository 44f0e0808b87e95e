"""Backends drive a rendered run somewhere: this machine, a host over SSH, or SkyPilot.

Every backend implements the same small interface (`base.Backend`); the CLI never knows which one
it talks to. This package's face: the contract's names (re-exported from `base` and
launcher/errors.py) and `get_backend(name, **options)`, which imports a backend only when asked, so
`launch --help` stays fast. Backends themselves import `base`, never this module.

The group may import store/ (the run registry), profiles/ (render, uploads), catalog/ (prices),
term/ and errors; runs/ and results/ drive it.
"""

from __future__ import annotations

from ..errors import BackendError
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


def get_backend(name: str, **options) -> Backend:
    if name == "local":
        from .local import LocalBackend

        return LocalBackend(**options)
    if name == "ssh":
        from .ssh import SSHBackend

        return SSHBackend(**options)
    if name == "skypilot":
        from .skypilot import SkyPilotBackend

        return SkyPilotBackend(**options)
    raise BackendError(f"unknown backend `{name}`: use local, ssh or skypilot")
