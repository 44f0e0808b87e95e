"""This machine's programs the tests run for real (an OpenSSH server, rsync), installed with apt where
they are missing, as `make test` and `make cloud-test` install what they need themselves; where that is
impossible (not root, no apt-get, no package index) the calling test is skipped with the reason."""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Callable

import pytest

APT_TIMEOUT = 600


def ensure_apt(packages: tuple[str, ...], ready: Callable[[], bool], why: str) -> None:
    """`apt-get install PACKAGES` unless `ready()`; first without, then after an `apt-get update` (a
    fresh machine's package lists are empty). `why`: what needs them, for the skip's reason."""
    if ready():
        return
    wanted = " ".join(packages)
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip(f"{why} needs {wanted}, and installing it needs root and apt-get: "
                    f"apt-get install -y {wanted}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]
    for cmd in (install, ["apt-get", "update", "-q"], install):
        try:
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=APT_TIMEOUT)
        except subprocess.TimeoutExpired:
            pytest.skip(f"{why}: `{' '.join(cmd)}` took more than {APT_TIMEOUT} s")
        if done.returncode == 0 and cmd is install and ready():
            return
    pytest.skip(f"{why}: could not install {wanted}: {done.stderr.strip()[-500:]}")


def ensure_rsync(why: str) -> None:
    """rsync on this machine: SkyPilot checks for it on its API server's machine before provisioning,
    even for --dryrun (sky/backends/cloud_vm_ray_backend.py:3422)."""
    ensure_apt(("rsync",), lambda: shutil.which("rsync") is not None, why)
