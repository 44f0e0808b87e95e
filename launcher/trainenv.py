"""The training stack on this machine: the Python that runs what trains or loads a model here.

`launch` itself plans and drives cloud runs with SkyPilot, and SkyPilot 0.14.1 pins click<8.2 while the
training stack's huggingface-hub needs click>=8.4.2: no one environment a plain `pip install` accepts
holds both. So the stack lives apart, as it does on the GPU machine (payload/gpu_env.sh builds that one
from payload/requirements-gpu.lock): the local backend's runs, `launch eval` and `launch chat` use

1. this Python, when it already has the stack (the checkout's .venv; an environment you made yourself),
2. else LAUNCH_TRAIN_PYTHON, a Python of yours that has it,
3. else an environment `launch` builds once per lock from payload/requirements-local.lock (shipped with
   launch: CPU torch on Linux x86_64, the plain wheel on macOS and Linux aarch64; Python 3.11), under
   LAUNCH_HOME/envs/, with uv (a dependency of launch), saying so before it starts.

A command that loads a model in this process (`eval`, `chat`) is run again, whole, with that Python
(`reexec`): the environment sees this install's launcher and payload through a .pth file, and nothing of
this environment's own packages.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

from launcher import project

LOCK = "payload/requirements-local.lock"
ENV = "LAUNCH_TRAIN_PYTHON"
STACK = ("torch", "transformers", "peft", "trl", "datasets")
# Where the +cpu torch of Linux x86_64 comes from; LAUNCH_TORCH_CPU_INDEX="" drops it (a mirror or a
# find-links folder given to uv by its own UV_* settings serves instead).
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


class TrainEnvError(Exception):
    """The stack cannot be had here; its text is the one line to show."""


def has_stack() -> bool:
    """Whether this Python can train and load models (the packages are found, not imported)."""
    return all(importlib.util.find_spec(m) is not None for m in STACK)


def lock_path() -> Path:
    return project.PACKAGE_ROOT / LOCK


def env_dir() -> Path:
    from launcher.store.state import state_dir

    digest = hashlib.sha256(lock_path().read_bytes()).hexdigest()[:12]
    return state_dir() / "envs" / f"local-{digest}"


def python(say=None) -> Path:
    """The Python with the training stack (see the module's docstring), built first when needed;
    `say(line)` is told before a build starts."""
    if has_stack():
        return Path(sys.executable)
    named = os.environ.get(ENV)
    if named:
        path = Path(named).expanduser()
        if not os.access(path, os.X_OK):
            raise TrainEnvError(f"{ENV}={named}: no such Python; point it at a python with torch, transformers, "
                                f"peft and TRL, or unset it and launch builds one")
        return path
    env = env_dir()
    py = env / "bin" / "python"
    if (env / ".complete").is_file() and py.exists():
        return py
    build(env, say)
    return py


def build(env: Path, say=None) -> None:
    """A Python 3.11 environment at `env` holding exactly the shipped lock, and this install's launcher
    and payload on its path. Built in a sibling directory and moved into place, so an interrupted build
    leaves nothing half-made that a later command would take for ready."""
    uv = _uv()
    if say:
        say(f"building the training stack for runs on this machine once (torch, transformers, peft, TRL, "
            f"~1 GB; a few minutes) into {env}, from launch's {LOCK}")
    tmp = env.with_name(env.name + ".building")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    try:
        _run([uv, "venv", "-q", "--python", "3.11", str(tmp)])
        index = os.environ.get("LAUNCH_TORCH_CPU_INDEX", TORCH_CPU_INDEX)
        extra = ["--extra-index-url", index, "--index-strategy", "unsafe-best-match"] \
            if sys.platform == "linux" and index else []
        _run([uv, "pip", "sync", "-q", "--compile-bytecode", "--python", str(tmp / "bin" / "python"), *extra,
              str(lock_path())])
        src = tmp / "launch-src"
        src.mkdir()
        for pkg in ("launcher", "payload"):
            (src / pkg).symlink_to(project.PACKAGE_ROOT / pkg)
        site = subprocess.run([str(tmp / "bin" / "python"), "-c",
                               "import sysconfig; print(sysconfig.get_path('purelib'))"],
                              capture_output=True, text=True, check=True).stdout.strip()
        # The final path, not tmp's: the environment is moved into place below.
        Path(site, "launch-src.pth").write_text(f"{env / 'launch-src'}\n")
        (tmp / ".complete").write_text(f"{lock_path()}\n")
        shutil.rmtree(env, ignore_errors=True)
        tmp.rename(env)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    # A venv's own paths (bin/activate, scripts' shebangs) name tmp: the interpreter we call is found by
    # its path under env and finds its site-packages relative to itself, so the move is harmless for it.


def _uv() -> str:
    try:
        from uv import find_uv_bin

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        found = shutil.which("uv")
        if found:
            return found
    raise TrainEnvError("the training stack for runs on this machine needs uv to build it (a dependency of launch: "
                        f"reinstall launch), or set {ENV} to a python with torch, transformers, peft and TRL")


def _run(cmd: list[str]) -> None:
    done = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode != 0:
        last = (done.stdout or "").strip().splitlines()[-3:]
        raise TrainEnvError(f"building the training stack failed ({Path(cmd[0]).name} {cmd[1]} {cmd[2]}): "
                            f"{' / '.join(last) or f'exit {done.returncode}'}; with no network, set {ENV} to a "
                            f"python with torch, transformers, peft and TRL")


def reexec(say=None) -> None:
    """Run this very command again with the training stack's Python, when this one lacks it; returns
    only when this Python has the stack. stdin, stdout, stderr and the environment are kept."""
    if has_stack():
        return
    py = python(say)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(str(py), [str(py), "-m", "launcher", *sys.argv[1:]])
