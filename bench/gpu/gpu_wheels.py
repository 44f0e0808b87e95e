"""Download the wheels the GPU check needs on a machine without network (Python 3.12, manylinux x86_64).

    make gpu-wheels            # .whl/core/, .whl/ds/ (deepspeed) and .whl-bnb/ (bitsandbytes)
    .venv/bin/python bench/gpu/gpu_wheels.py --python 3.12

The device machine (see /work/.library/device/KINDS.md) has torch 2.11, transformers 5.17, peft,
accelerate, pyarrow, pandas, huggingface-hub, ninja, msgpack, einops..., and no trl, datasets,
pydantic, deepspeed, bitsandbytes or liger-kernel. Each wheel is fetched with `--no-deps`, so every
missing dependency is named here; `bench/gpu/gpu_env.py` there installs only what is missing or too old
and reports any requirement still unmet. A device call carries at most 64 MiB (repo included):
bitsandbytes (~41 MiB) lives in `.whl-bnb/`, carried only for the qlora mode, and deepspeed (~2 MiB)
in `.whl/ds/`, so that `.whl/core` + `.whl-bnb` + the repo fit one call (bench/README.md).

deepspeed is a source distribution on PyPI: it is built here into a pure-Python wheel
(DS_BUILD_OPS=0, ops compile just in time on the GPU machine, which has nvcc and ninja).
flash-attn has no wheel on PyPI (a 20+ minute CUDA build): not carried; its mode is skipped.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORE = [
    "trl==1.16.0",                  # payload: SFTTrainer
    "datasets==5.2.0",              # trl; needs dill, multiprocess (below), pyarrow>=24, fsspec, xxhash (there)
    "dill==0.4.1",
    "multiprocess==0.70.19",
    "pydantic==2.14.3",             # payload.config; needs the three below
    "pydantic-core==2.50.4",
    "annotated-types==0.8.0",
    "typing-inspection==0.4.5",
    "transformers==5.23.0",         # the pinned version; 5.17 (there) lacks VL assistant-only loss (5.18)
    "peft==0.21.2",                 # the tested version, whatever peft the machine has
    "liger-kernel==0.8.5",          # optional (train.liger: auto); needs triton (there)
]
DS = ["hjson==3.1.0"]               # deepspeed's one dependency missing there
BUILT = ["deepspeed==0.19.8"]       # sdist only: built into a py3-none-any wheel here
BNB = ["bitsandbytes==0.50.2"]      # qlora only
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64"]
LIMIT_MIB = 64


def download(specs: list[str], dest: Path, python: str) -> None:
    plat = [x for p in PLATFORMS for x in ("--platform", p)]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "--python-version",
           python, "--implementation", "cp", *plat, "-d", str(dest), *specs]
    subprocess.run(cmd, check=True)


def build(specs: list[str], dest: Path) -> None:
    """Pure-Python wheels from source distributions (needs torch importable here: deepspeed's setup)."""
    env = {**os.environ, "DS_BUILD_OPS": "0"}
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary=:all:",
                        "-d", tmp, *specs], check=True)
        for sdist in Path(tmp).glob("*.tar.gz"):
            subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            "-w", str(dest), str(sdist)], check=True, env=env)


def mib(folder: Path) -> float:
    return sum(p.stat().st_size for p in folder.glob("*.whl")) / 2**20


def repo_mib() -> float:
    """What a device call carries of the repo: tracked files and untracked ones git does not ignore."""
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                         check=True).stdout.decode()
    return sum((ROOT / f).stat().st_size for f in out.split("\0") if f and (ROOT / f).is_file()) / 2**20


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 epilog="example: .venv/bin/python bench/gpu/gpu_wheels.py --python 3.12")
    ap.add_argument("--python", default="3.12", help="the GPU machine's Python (default 3.12)")
    ap.add_argument("--no-bnb", action="store_true", help="skip bitsandbytes (.whl-bnb/)")
    ap.add_argument("--sizes", action="store_true", help="only print the carried sizes of the wheels already here")
    a = ap.parse_args(argv)
    if a.sizes:
        print(sizes())
        return 0
    core, ds, bnb = ROOT / ".whl" / "core", ROOT / ".whl" / "ds", ROOT / ".whl-bnb"
    for folder in (ROOT / ".whl", bnb):
        shutil.rmtree(folder, ignore_errors=True)  # one version of each: two would stop the install
    for folder in (core, ds, bnb):
        folder.mkdir(parents=True)
    download(CORE, core, a.python)
    download(DS, ds, a.python)
    build(BUILT, ds)
    if not a.no_bnb:
        download(BNB, bnb, a.python)
    print(sizes())
    return 0


def sizes() -> str:
    """The two device calls' carries (bench/README.md) against the limit."""
    core, ds, bnb, repo = mib(ROOT / ".whl" / "core"), mib(ROOT / ".whl" / "ds"), mib(ROOT / ".whl-bnb"), repo_mib()
    lines = [f".whl/core {core:.1f} MiB, .whl/ds {ds:.1f} MiB, .whl-bnb {bnb:.1f} MiB, repo {repo:.1f} MiB"]
    for name, total in (("call 1 carry [.whl/core, .whl-bnb]", core + bnb + repo),
                        ("call 2 carry [.whl]", core + ds + repo)):
        lines.append(f"{name}: {total:.1f} of the {LIMIT_MIB} MiB a device call carries"
                     + ("" if total <= LIMIT_MIB else "  TOO MUCH"))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
