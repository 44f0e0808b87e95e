"""A Slurm run's files after its SkyPilot cluster is gone: through the cluster's login node.

On Slurm the run's directory is on the cluster's shared filesystem (`cluster.slurm.shared_dir`), which
the login node sees too, and it stays there after `sky down` (SkyPilot removes only the job's own home
and node-local runtime, sky/provision/slurm/instance.py:1256-1287). The login node is the one SkyPilot
reaches for every command: the `Host` of its `~/.slurm/config` (an SSH-config file, sky/adaptors/slurm.py),
so `ssh -F ~/.slurm/config HOST` reaches it as SkyPilot does, with the user's own key. Without this,
`launch status` of a run whose cluster was torn down knew neither its step nor why it ended, and
`launch down --fetch-artifacts` after the job had no way to the files (seen on the emulated Slurm site).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Optional

from launcher.store.artifacts import list_command, parse_listing
from launcher.store.handle import Handle
from ...errors import BackendError
from .. import rsync
from ..base import remote_path

SSH_OPTS = ("-o", "BatchMode=yes", "-o", "ConnectTimeout=15")
SSH_TIMEOUT_S = 60


def login_host(h: Handle) -> Optional[str]:
    """The login node's `Host` (of `infra: slurm/<Host>`) of a run's handle, None for other runs."""
    return h.slurm_login


def config() -> Path:
    return Path(os.path.expanduser("~/.slurm/config"))


def ssh_argv() -> list[str]:
    return ["ssh", "-F", str(config()), *SSH_OPTS]


def read(host: str, path: str) -> Optional[str]:
    """A file on the shared filesystem, read on the login node; None when it cannot be read."""
    try:
        done = subprocess.run([*ssh_argv(), host, f"cat {remote_path(path)}"], capture_output=True, text=True,
                              timeout=SSH_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def listing(host: str, run_dir: str, roots: tuple[str, ...]) -> dict[str, int]:
    """{run-dir-relative file: bytes} under `roots`, as the login node sees the shared filesystem."""
    try:
        done = subprocess.run([*ssh_argv(), host, list_command(remote_path(run_dir), roots)], capture_output=True,
                              text=True, timeout=SSH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise BackendError(f"ssh {host} (the Slurm login node) timed out after {SSH_TIMEOUT_S} s") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        raise BackendError(f"ssh {host} (the Slurm login node, ~/.slurm/config) failed: {last}")
    return parse_listing(done.stdout)


def copy(host: str, run_dir: str, rels: list[str], into: Path) -> None:
    """rsync exactly `rels` from the shared filesystem through the login node."""
    try:
        rsync.pull(ssh_argv(), host, run_dir, rels, into)
    except rsync.Unavailable as e:
        raise BackendError(f"{e}: fetching from Slurm login node {host} needs it (apt-get install rsync)") from None
