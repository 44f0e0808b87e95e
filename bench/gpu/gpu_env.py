"""The GPU check's environment: use what the machine has where it meets the payload's minimums
(payload/preflight/versions.py), install the rest from wheels carried beside the repo (`.whl/**`, `.whl-bnb/`;
`bench/gpu/gpu_wheels.py` downloads them), and say exactly which versions ran. `--smoke` (CPU, CI)
installs nothing.

Wheels install with pip `--no-index --no-deps --target SITE` (the machine has no network), only for
packages that are missing or older than needed; SITE goes first on PYTHONPATH for this process's
children. Afterwards every carried package's own requirements are checked against what is
importable, so a missing dependency is named instead of failing deep inside an import.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Optional

from payload.preflight import versions

WHEEL_DIRS = (".whl", ".whl-bnb")
# what each optional mode needs beyond payload/versions.REQUIRED (VL assistant-only: transformers 5.18)
MODE_NEEDS = {"bitsandbytes": versions.OPTIONAL["bitsandbytes"], "deepspeed": versions.OPTIONAL["deepspeed"],
              "flash-attn": versions.OPTIONAL["flash-attn"]}
EXTRA = {"liger-kernel": versions.OPTIONAL["liger-kernel"]}  # used when present (train.liger: auto)


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def wheels(root: Path) -> dict[str, Path]:
    """{normalized distribution name: wheel path} of the wheel folders at the repo root."""
    out = {}
    for d in WHEEL_DIRS:
        for w in sorted((root / d).rglob("*.whl")):  # .whl/core, .whl/ds: carried apart or together
            out[norm(w.name.split("-")[0])] = w
    return out


def wanted(modes: list[dict]) -> dict[str, str]:
    """Distribution -> minimum version for the selected modes."""
    need = dict(versions.REQUIRED)
    need.update(EXTRA)
    for m in modes:
        for p in m.get("needs", []):
            need[p] = MODE_NEEDS[p]
        if m["shape"].startswith("qwen3-vl") or m["shape"] == "tiny-qwen3-vl":
            need["transformers"] = versions.VL_ASSISTANT_ONLY_TRANSFORMERS
    return need


def to_install(need: dict[str, str], available: dict[str, Path]) -> list[Path]:
    """Wheels for required packages that are missing or too old, plus every carried wheel whose
    distribution is not installed at all (their dependencies: dill, multiprocess, hjson, ...)."""
    picks = []
    for name, wheel in available.items():
        have = versions.installed(name)
        floor = next((v for n, v in need.items() if norm(n) == name), None)
        if have is None or (floor is not None and versions.older(have, floor)):
            picks.append(wheel)
    return picks


def install(picks: list[Path], site: Path) -> None:
    site.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
           "--no-cache-dir", "--upgrade", "--target", str(site), *map(str, picks)]
    subprocess.run(cmd, check=True)


def prepare(root: Path, modes: list[dict], site: Path) -> Optional[str]:
    """Install what is needed from the carried wheels; returns the PYTHONPATH entry to use (or None).
    Idempotent: a second call finds everything installed (in SITE, once it is on sys.path)."""
    if site.is_dir():  # a previous call on this machine installed some already
        import importlib

        sys.path.insert(0, str(site))
        importlib.invalidate_caches()
    available = wheels(root)
    picks = to_install(wanted(modes), available)
    if not picks:
        return str(site) if site.is_dir() else None
    print(f"gpu-check: installing {len(picks)} carried wheel(s) into {site}: "
          + ", ".join(p.name.split("-")[0] + " " + p.name.split("-")[1] for p in picks), flush=True)
    try:
        install(picks, site)
    except subprocess.CalledProcessError as e:  # e.g. wheels for another Python: run with what is there
        print(f"gpu-check: installing the carried wheels failed ({e}); going on without them", flush=True)
        return None
    return str(site)


def unmet_dependencies(names: list[str]) -> list[str]:
    """For each installed distribution in `names`: its Requires-Dist (no extras) that are unmet."""
    from packaging.requirements import Requirement

    problems = []
    for name in names:
        try:
            reqs = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue
        for line in reqs:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            have = versions.installed(req.name)
            if have is None:
                problems.append(f"{name} needs {req}: not installed")
            elif req.specifier and not req.specifier.contains(have, prereleases=True):
                problems.append(f"{name} needs {req}: {have} installed")
    return problems


def report(modes: list[dict]) -> dict:
    """Versions that ran, where they came from, and unmet dependencies of the stack."""
    have = versions.report()
    site = os.environ.get("GPU_CHECK_SITE")
    origin = {}
    for name in have:
        try:
            path = str(metadata.distribution(name).locate_file(""))
        except metadata.PackageNotFoundError:
            continue
        origin[name] = "carried wheel" if site and path.startswith(site) else "machine"
    names = [n for n in (*have, "huggingface-hub", "tokenizers", "safetensors") if versions.installed(n)]
    return {"python": sys.version.split()[0], "versions": have, "origin": origin,
            "problems": versions.problems(), "unmet_dependencies": unmet_dependencies(names)}
