"""The GPU machine's environment: the lock (`make lock`) and payload/gpu_env.sh, which installs it into
its own Python on the volume once and reuses it on every later setup (a spot recovery, a relaunch).

The lock's resolution for linux x86_64 / Python 3.11 runs `uv pip compile` against PyPI when the
registry is reachable (CI) and skips with the reason otherwise. The install itself runs for real, with
uv, offline: a stand-in lock of one small wheel built here, and this machine's Python 3.11."""

import base64
import hashlib
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from launcher.profiles.render import FLASH_ATTN_WHEEL

REPO = Path(__file__).resolve().parents[3]
LOCK = REPO / "payload" / "requirements-gpu.lock"
PINS_IN = REPO / "payload" / "requirements-gpu.txt"
GPU_PLATFORM = ["--python-platform", "x86_64-manylinux_2_28", "--python-version", "3.11",
                "--only-binary", ":all:", "--no-binary", "deepspeed"]


def pins(path: Path) -> dict[str, str]:
    """{name: version} of every `name==version` line (comments and hashes ignored)."""
    out = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)==([^\s;\\]+)", line)
        if m:
            out[m.group(1).lower().replace("_", "-")] = m.group(2)
    return out


def uv() -> str:
    found = shutil.which("uv", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    if not found:
        pytest.skip("uv is not installed (requirements/dev.lock pins it: `make install`)")
    return found


# ------------------------------------------------------------------------------------- the lock


def test_lock_pins_torchvision_built_for_the_locked_torch_and_cuda_12():
    lock = pins(LOCK)
    torch_minor = int(lock["torch"].split(".")[1])
    major, minor = (int(x) for x in lock["torchvision"].split(".")[:2])
    assert (major, minor) == (0, torch_minor + 15), lock["torchvision"]
    # nvidia-ml-py is NVML's Python binding (GPU utilisation), not a CUDA library: no CUDA version in its name
    cuda = {k: v for k, v in lock.items() if k.startswith("nvidia-") and k != "nvidia-ml-py"}
    assert cuda and all(k.endswith("-cu12") for k in cuda), cuda
    assert lock["nvidia-cuda-runtime-cu12"].startswith("12.")


def test_lock_holds_every_pin_of_its_input_at_the_same_version():
    lock, wanted = pins(LOCK), pins(PINS_IN)
    assert {k: lock.get(k) for k in wanted} == wanted, "run `make lock` after editing requirements-gpu.txt"
    assert "make lock" in LOCK.read_text().splitlines()[1]


def test_flash_attn_wheel_is_built_for_the_locked_torch_cuda_12_and_python_3_11():
    lock = pins(LOCK)
    torch_mm = ".".join(lock["torch"].split(".")[:2])
    name = FLASH_ATTN_WHEEL.rsplit("/", 1)[-1]
    m = re.fullmatch(r"flash_attn-[\d.]+\+cu(\d+)torch([\d.]+)cxx11abi(TRUE|FALSE)-cp311-cp311-linux_x86_64\.whl",
                     name)
    assert m, name
    assert m.group(1).startswith("12") and m.group(2) == torch_mm
    assert m.group(3) == "TRUE"  # PyPI's torch >= 2.7 wheels use the C++11 ABI


def test_lock_resolves_for_linux_x86_64_python_3_11_from_wheels(tmp_path):
    """The lock is complete and consistent for the GPU platform: resolving it again (wheels only,
    deepspeed excepted) yields exactly its own pins. Metadata only: about a second, cold cache."""
    cmd = [uv(), "pip", "compile", "--quiet", "--no-header", "--no-annotate", *GPU_PLATFORM, str(LOCK)]
    env = {**os.environ, "UV_CACHE_DIR": str(tmp_path / "uv-cache")}
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    except subprocess.TimeoutExpired:
        pytest.skip("the package registry did not answer within 180 s")
    if done.returncode != 0 and re.search(r"(?i)connect|dns|network|offline|timed out|error sending request",
                                          done.stderr):
        pytest.skip(f"the package registry is not reachable: {done.stderr.strip().splitlines()[-1][:200]}")
    assert done.returncode == 0, done.stderr
    resolved = {}
    for line in done.stdout.splitlines():
        name, _, version = line.partition("==")
        resolved[name.lower()] = version
    assert resolved == pins(LOCK)


# ----------------------------------------------------------------------- installing it, once


def tiny_wheel(where: Path, version: str = "1.0") -> Path:
    """A minimal pure-Python wheel `tinypkg` (uv installs it offline from a find-links dir)."""
    files = {"tinypkg/__init__.py": f"VALUE = {version!r}\n",
             f"tinypkg-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: tinypkg\nVersion: {version}\n",
             f"tinypkg-{version}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                                                   "Tag: py3-none-any\n"}

    def digest(text):
        raw = hashlib.sha256(text.encode()).digest()
        return f"sha256={base64.urlsafe_b64encode(raw).rstrip(b'=').decode()},{len(text.encode())}"

    record = "".join(f"{k},{digest(v)}\n" for k, v in files.items()) + f"tinypkg-{version}.dist-info/RECORD,,\n"
    where.mkdir(parents=True, exist_ok=True)
    wheel = where / f"tinypkg-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for k, v in {**files, f"tinypkg-{version}.dist-info/RECORD": record}.items():
            z.writestr(k, v)
    return wheel


@pytest.fixture
def node(tmp_path):
    """A GPU node's environment, offline: a stand-in lock, this machine's Python 3.11 in place of a
    uv-managed one, the volume's env root under tmp_path."""
    uv_bin = uv()
    if not shutil.which("python3.11"):
        pytest.skip("no python3.11 on PATH for the stand-in environment")
    tiny_wheel(tmp_path / "wheels")
    lock = tmp_path / "requirements-gpu.lock"
    lock.write_text("tinypkg==1.0\n    # via -r requirements-gpu.txt\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UV_", "VIRTUAL_ENV", "LAUNCH_"))}
    env.update({"PATH": f"{Path(uv_bin).parent}{os.pathsep}{env['PATH']}", "LAUNCH_VOLUME": str(tmp_path / "vol"),
                "LAUNCH_GPU_LOCK": str(lock), "LAUNCH_ENV_SMOKE": "tinypkg", "FLASH_ATTN_WHEEL": "",
                "UV_OFFLINE": "1", "UV_NO_INDEX": "1", "UV_FIND_LINKS": str(tmp_path / "wheels"),
                "UV_PYTHON_PREFERENCE": "only-system", "UV_CACHE_DIR": str(tmp_path / "uv-cache")})
    return env


def setup(env: dict, then: str = 'python -c "import tinypkg, sys; print(sys.prefix, tinypkg.VALUE)"'):
    """The first line of the rendered setup/run scripts, then `then`, as SkyPilot runs them."""
    script = f"set -euo pipefail\nsource payload/gpu_env.sh\n{then}\n"
    return subprocess.run(["bash", "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def test_setup_builds_the_environment_once_and_a_recovery_reinstalls_nothing(node):
    first = setup(node)
    assert first.returncode == 0, first.stderr
    assert "launch: building the GPU environment" in first.stdout
    prefix, value = first.stdout.splitlines()[-1].split()
    envs = Path(node["LAUNCH_VOLUME"]) / ".envs"
    assert Path(prefix).parent == envs and value == "1.0"  # its own environment, on the volume
    installed = Path(prefix) / "lib/python3.11/site-packages/tinypkg/__init__.py"
    before = installed.stat()

    again = setup(node)  # a spot recovery: same volume, fresh machine, setup runs again
    assert again.returncode == 0, again.stderr
    assert f"launch: reusing the GPU environment {prefix} (nothing to install)" in again.stdout
    assert "building" not in again.stdout
    assert again.stdout.splitlines()[-1] == first.stdout.splitlines()[-1]
    assert (installed.stat().st_ino, installed.stat().st_mtime_ns) == (before.st_ino, before.st_mtime_ns)

    # A new lock is a new environment beside the old one (which is named, not deleted).
    tiny_wheel(Path(node["UV_FIND_LINKS"]), "2.0")
    Path(node["LAUNCH_GPU_LOCK"]).write_text("tinypkg==2.0\n")
    upgraded = setup(node)
    assert upgraded.returncode == 0, upgraded.stderr
    new_prefix, value = upgraded.stdout.splitlines()[-1].split()
    assert value == "2.0" and new_prefix != prefix and f"older environments in {envs}" in upgraded.stdout


def test_a_half_built_environment_is_rebuilt(node):
    first = setup(node)
    prefix = Path(first.stdout.splitlines()[-1].split()[0])
    (prefix / ".complete").unlink()  # the machine died mid-install
    (prefix / "lib/python3.11/site-packages/tinypkg/__init__.py").write_text("VALUE = 'torn'\n")
    again = setup(node)
    assert again.returncode == 0, again.stderr
    assert "building" in again.stdout and again.stdout.splitlines()[-1] == f"{prefix} 1.0"


def test_an_environment_that_does_not_import_is_never_marked_complete(node):
    node["LAUNCH_ENV_SMOKE"] = "tinypkg torchvision"
    failed = setup(node)
    assert failed.returncode != 0 and "does not import (tinypkg torchvision)" in failed.stderr
    assert not list((Path(node["LAUNCH_VOLUME"]) / ".envs").glob("*/.complete"))


def test_local_runs_keep_the_current_python(node):
    node["LAUNCH_LOCAL"] = "1"
    done = setup(node, then="command -v python; echo ${VIRTUAL_ENV:-none}")
    assert done.returncode == 0, done.stderr
    assert not Path(node["LAUNCH_VOLUME"]).exists() and done.stdout.split()[-1] == "none"
