"""`get_backend(name, **options)`: a backend by its name, imported only when asked.

Each backend's module (SkyPilot's SDK, paramiko) is imported here, the first time a command asks
for that backend, so `launch --help` stays fast. Backends take the contract from `base`,
never from this module or the package (scripts/import_cycles.py: a lazy factory is no cycle while
they do).
"""

from __future__ import annotations

from ..errors import BackendError
from .base import Backend


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
