"""The emulated cloud's catalog and pod image: what `bake.sh` needs, and the cache of its result.

The image is baked once per key (bake.sh, hook, the dev lock, SkyPilot's own wheel, the catalog) into
`$LAUNCH_CLOUD_CACHE` (default /var/cache/launch-cloud), an ext4 file that the emulator loop-mounts in
its private mount namespace. Baking needs root and the package index; everything after it is offline.
"""

from __future__ import annotations

import csv
import hashlib
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
CACHE = Path(os.environ.get("LAUNCH_CLOUD_CACHE", "/var/cache/launch-cloud"))

# The jobs controller is a RunPod CPU pod (sky/jobs/constants.py CONTROLLER_RESOURCES: cpus 4+, memory
# 4x). The shipped snapshot has GPU rows only; these rows are as published in skypilot-org/
# skypilot-catalog catalogs/v8/runpod/vms.csv (commit 01acdfd4, the snapshot's own): RunPod's CPU
# flavour cpu5m (8 GB per vCPU) at the same price in every datacenter.
CPU_ROWS = (("cpu5m-2-16", 2.0, 16.0, 0.13), ("cpu5m-4-32", 4.0, 32.0, 0.26))
# common/metadata.csv (GPU memory, sky/utils/accelerator_registry.py:39) is read only to pick GPUs by
# memory, which no profile does: its header keeps SkyPilot from downloading it.
METADATA_HEADER = "GPU,MemoryGB,Manufacturer\n"


def write_catalog(dest: Path) -> Path:
    """The emulated cloud's catalogs/v8: the shipped snapshot plus the CPU rows above."""
    from launcher.catalog import SNAPSHOT

    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(SNAPSHOT, dest, ignore=shutil.ignore_patterns("*.md", "*.json", "*.py", "__pycache__"))
    vms = dest / "runpod" / "vms.csv"
    with vms.open() as f:
        rows = list(csv.DictReader(f))
        fields = list(rows[0])
    zones = dict.fromkeys((r["Region"], r["AvailabilityZone"]) for r in rows)
    with vms.open("a", newline="") as f:
        w = csv.DictWriter(f, fields, lineterminator="\n")
        for name, cpus, mem, price in CPU_ROWS:
            for region, zone in zones:
                w.writerow({"InstanceType": name, "AcceleratorName": "", "AcceleratorCount": "", "vCPUs": cpus,
                            "MemoryGiB": mem, "Region": region, "SpotPrice": "", "Price": price,
                            "AvailabilityZone": zone, "GpuInfo": ""})
    (dest / "common" / "metadata.csv").write_text(METADATA_HEADER)
    return dest


def sky_wheel(work: Path) -> Path:
    """The wheel SkyPilot builds of the installed package and installs on every pod it launches
    (sky/backends/wheel_utils.py build_sky_wheel; the same bytes the client uploads later)."""
    env = {**os.environ, "HOME": str(work)}  # SkyPilot keeps it in ~/.sky/wheels, rebuilt when the package changes
    out = subprocess.run([sys.executable, "-c", "from sky.backends import wheel_utils; "
                          "d, h = wheel_utils.build_sky_wheel(); print(next(d.glob('*.whl')))"],
                         env=env, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
    return Path(out)


def python310() -> Path:
    """A Python 3.10 install dir: SkyPilot's runtime venv on pods is 3.10 (constants.py)."""
    found = [os.environ.get("LAUNCH_CLOUD_PY310", ""), shutil.which("python3.10") or "", "/usr/bin/python3.10",
             *sorted(str(p) for p in Path("/root/.pyenv/versions").glob("3.10*/bin/python3.10"))]
    ok = [p for p in found if p and os.path.exists(p) and subprocess.run([p, "-c", ""], capture_output=True).returncode == 0]
    exe = ok[0] if ok else None
    if exe is None:
        raise RuntimeError("the emulated cloud needs a Python 3.10 (SkyPilot's pod runtime): none on PATH")
    prefix = subprocess.run([exe, "-c", "import sys; print(sys.base_prefix)"], check=True,
                            capture_output=True, text=True).stdout.strip()
    return Path(prefix)


def torch_flags() -> list[str]:
    wheels = sorted(Path("/opt/wheels").glob("torch-2.13.0+cpu-*.whl"))
    if wheels:
        return ["--find-links", "/opt/wheels"]
    return ["--extra-index-url", "https://download.pytorch.org/whl/cpu", "--index-strategy", "unsafe-best-match"]


def env_key() -> str:
    """The key payload/gpu_env.sh gives the GPU environment of this lock with no flash-attn wheel:
    sha256 of the lock, the wheel's URL (empty) and `python 3.11 uv 0.13.9`, first 16 hex digits."""
    text = (REPO / "payload" / "gpu_env.sh").read_text()
    assert 'uv_version=0.13.9 python="${LAUNCH_ENV_PYTHON:-3.11}"' in text, "gpu_env.sh changed its key: update env_key"
    lock = (REPO / "payload" / "requirements-gpu.lock").read_bytes()
    return hashlib.sha256(lock + b"\n" + b"python 3.11 uv 0.13.9\n").hexdigest()[:16]


def _key(wheel: Path, catalog: Path) -> str:
    h = hashlib.sha256(env_key().encode())
    for p in [HERE / "bake.sh", HERE / "hook" / "launch_emulator_hook.py", REPO / "requirements" / "dev.lock", wheel]:
        h.update(p.read_bytes())
    for p in sorted(catalog.rglob("*.csv")):
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def ensure_image(log=print) -> tuple[Path, Path]:
    """(image.ext4, catalog dir): baked unless this key's image is already in the cache."""
    CACHE.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="launch-cloud-wheel-"))
    try:
        catalog = write_catalog(CACHE / "catalog-v8")
        wheel = sky_wheel(CACHE / "wheel-home")
        image = CACHE / f"image-{_key(wheel, catalog)}.ext4"
        if image.exists():
            return image, catalog
        for old in CACHE.glob("image-*.ext4*"):
            old.unlink()
        uv = shutil.which("uv", path=str(REPO / ".tools" / "bin")) or shutil.which("uv")
        env = {**os.environ, "REPO": str(REPO), "PY310": str(python310()), "SKY_WHEEL": str(wheel),
               "UV": uv, "HOOK": str(HERE / "hook"), "CATALOG": str(catalog),
               "TORCH_FLAGS": " ".join(torch_flags()), "HOST_UV_CACHE": _uv_cache(uv), "ENV_KEY": env_key()}
        log(f"baking the emulated RunPod image {image.name} (once per lock; needs the package index)")
        subprocess.run(["unshare", "-m", "--propagation", "private", "bash", str(HERE / "bake.sh"), str(image)],
                       env=env, check=True)
        return image, catalog
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _uv_cache(uv: str) -> str:
    """The host's uv cache (where `make install` left the lock's wheels), made if missing: the bake binds it
    into the image. Asked with the user's own HOME: a test's HOME is a fresh folder with no cache in it, and
    binding a path that does not exist failed every bake on a machine without a baked image."""
    env = {**os.environ, "HOME": pwd.getpwuid(os.getuid()).pw_dir}
    path = subprocess.run([uv, "cache", "dir"], env=env, check=True, capture_output=True, text=True).stdout.strip()
    Path(path).mkdir(parents=True, exist_ok=True)
    return path


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    print(ensure_image())
