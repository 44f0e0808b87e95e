"""launch installed as a user installs it: the wheel built from a copy of this checkout, in a fresh
environment outside it, its dependencies resolved by uv from the wheel's metadata, held to the pins of
the checkout's locks (SkyPilot's own first, with its click<8.2: requirements/sky-cli.lock) and taken
offline from uv's cache, which `make install` filled: its sync caches the wheels, and its last step
(`python tests/installed.py`, online) the metadata a resolution reads, which a sync never asks for
(without it an offline resolve says "click==8.1.8 needs to be downloaded from a registry"). Used by tests/walks/test_walk_install.py and the
emulated cloud's scenario that runs from an installed tool (tests/cloud/scenarios/test_sigterm.py)."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
UV = Path(sys.executable).parent / "uv"  # uv is in the dev lock (and a dependency of launch)


def uv_env(offline: bool = True) -> dict:
    """uv on the cache `make install` filled (a test's HOME is a fresh one), offline unless `make install`
    fills it."""
    cache = os.environ.get("UV_CACHE_DIR") or str(Path(pwd.getpwuid(os.getuid()).pw_dir) / ".cache" / "uv")
    env = {**os.environ, "UV_CACHE_DIR": cache, "UV_NO_PROGRESS": "1"}
    return {**env, "UV_OFFLINE": "1"} if offline else env


def pins(*locks: str) -> dict[str, str]:
    """name -> version of the locks, the first lock's pin winning."""
    out: dict[str, str] = {}
    for lock in locks:
        for m in re.finditer(r"^([A-Za-z0-9_.\-]+)==(\S+)", (REPO / lock).read_text(), re.M):
            out.setdefault(m.group(1).lower(), m.group(2))
    return out


# What the tool environments of the tests hold beyond the wheel: the cloud scenario's RunPod SDK, and
# pip/setuptools for SkyPilot's wheel of itself (sky/backends/wheel_utils.py:163).
CLOUD_PACKAGES = ("runpod", "boto3", "pip", "setuptools", "wheel")


def write_constraints(path: Path) -> Path:
    pinned = pins("requirements/sky-cli.lock", "requirements/dev.lock")
    path.write_text("".join(f"{n}=={v}\n" for n, v in pinned.items()))
    return path


# The user install as `uv tool install 'launch[sky]'` resolves it, on Linux and on a Mac (the README's
# promise): tests/walks/test_walk_install.py resolves it for each, offline.
USER_PLATFORMS = ("x86_64-manylinux_2_28", "aarch64-apple-darwin")


def user_resolve(platform: str, online: bool = False) -> subprocess.CompletedProcess:
    """`uv pip compile pyproject.toml --extra sky` for `platform` (Python 3.11, macOS 14), no output file."""
    env = {**uv_env(offline=not online), "MACOSX_DEPLOYMENT_TARGET": "14.0"}
    return subprocess.run([str(UV), "pip", "compile", "--python-platform", platform, "--python-version", "3.11",
                           "--extra", "sky", "-o", os.devnull, str(REPO / "pyproject.toml")],
                          capture_output=True, text=True, env=env, timeout=300)


def fill_cache() -> int:
    """Resolve the tools' installs once with the network (`make install`), so uv's cache holds every
    package's metadata for the tests' offline resolves; nothing is installed."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        constraints = write_constraints(Path(tmp) / "constraints.txt")
        env = uv_env(offline=False)
        done = subprocess.run([str(UV), "pip", "compile", "-q", "--python", sys.executable, "-c", str(constraints),
                               "-o", os.devnull, str(REPO / "pyproject.toml"), "-"],
                              input="\n".join(CLOUD_PACKAGES), env=env, text=True)
    if done.returncode:
        return done.returncode
    for platform in USER_PLATFORMS:
        done = user_resolve(platform, online=True)
        if done.returncode:
            print(done.stderr, file=sys.stderr)
            return done.returncode
    return 0


def install_tool(dest: Path, with_packages: tuple[str, ...] = ()) -> Path:
    """The `launch` of a fresh environment under `dest` holding the wheel (and `with_packages`)."""
    src = dest / "src"  # a copy: a build writes build/ and *.egg-info beside its sources
    for name in ("launcher", "payload", "clusters"):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPO / name, src / name)
    run = dict(env=uv_env(), capture_output=True, text=True, timeout=600)
    done = subprocess.run([str(UV), "build", "--wheel", "--no-build-isolation", "--python", sys.executable,
                           "--out-dir", str(dest / "dist"), str(src)], **run)
    assert done.returncode == 0, done.stdout + done.stderr
    wheel = next((dest / "dist").glob("launch-*.whl"))
    done = subprocess.run([str(UV), "venv", "-q", "--python", sys.executable, str(dest / "env")], **run)
    assert done.returncode == 0, done.stderr
    constraints = write_constraints(dest / "constraints.txt")
    done = subprocess.run([str(UV), "pip", "install", "-q", "--python", str(dest / "env" / "bin" / "python"),
                           "-c", str(constraints), str(wheel), *with_packages], **run)
    assert done.returncode == 0, done.stdout + done.stderr
    return dest / "env" / "bin" / "launch"


if __name__ == "__main__":
    sys.exit(fill_cache())
