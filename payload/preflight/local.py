"""The checks that need no network: data files, the model reference and shape, writable
directories, free disk, the token's presence, package versions, and the GPU-memory estimate."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Optional

from payload import layout
from payload.model import attention
from payload.model.dims import hf_home, hub_cache_dir
from payload.model.memory import GIB, ModelDims, estimate_stage_memory_gb, kernels_of, lora_trainable_params
from payload.preflight.base import DATA_SUFFIXES, PUBLIC_ORGS, TOKEN_FIX, Check, repo_id_problem


# -------------------------------------------------------------------------------------- checks


def check_data(cfg) -> list[Check]:
    """Every source: a local file that exists, is readable and non-empty, or a valid hub id."""
    data_dir = cfg.run_dir / layout.DATA_DIR
    if (data_dir / ".complete").is_file():
        return [Check("data", "ok", f"prepared data already in {data_dir}")]
    out = []
    for src in cfg.data.sources:
        name = f"data[{src.name}]"
        if src.hf_dataset:
            bad = repo_id_problem(src.hf_dataset)
            out.append(Check(name, "fail", f"hf_dataset `{src.hf_dataset}`: {bad}") if bad else
                       Check(name, "ok", f"hub dataset `{src.hf_dataset}` (syntax; reachability: the hub check below)"))
        else:
            out.append(_check_local_file(name, Path(src.path)))
        if src.image_root and not Path(src.image_root).is_dir():
            out.append(Check(name, "fail", f"image_root `{src.image_root}` is not a directory; fix the path"))
    return out


def _check_local_file(name: str, path: Path) -> Check:
    where = path.absolute()
    if not path.exists():
        return Check(name, "fail", f"{where} does not exist; fix `data.sources[].path` or upload the file")
    if not path.is_file():
        return Check(name, "fail", f"{where} is not a file")
    try:
        with open(path, "rb") as f:
            first = f.read(1)
    except OSError as e:
        return Check(name, "fail", f"{where} is not readable: {e.strerror}")
    if not first:
        return Check(name, "fail", f"{where} is empty")
    if path.suffix.lower() not in DATA_SUFFIXES:
        return Check(name, "warn", f"{where}: extension `{path.suffix}` is none of {', '.join(DATA_SUFFIXES)}")
    return Check(name, "ok", f"{where}: {_human(path.stat().st_size)}")


def check_model(cfg) -> Check:
    m = cfg.model
    if m.tiny is not None:
        return Check("model", "ok", f"tiny {m.tiny.arch} built from config (no download)")
    local = Path(m.name_or_path).expanduser()
    if local.exists() or m.name_or_path.startswith(("/", ".", "~")):
        if not (local / "config.json").is_file():
            return Check("model", "fail", f"local model {local} has no config.json; fix `model.name_or_path`")
        return Check("model", "ok", f"local model {local}")
    bad = repo_id_problem(m.name_or_path)
    if bad:
        return Check("model", "fail", f"model.name_or_path `{m.name_or_path}`: {bad}")
    return Check("model", "ok", f"hub model `{m.name_or_path}` (syntax; reachability: the hub check below)")


def check_writable(cfg, env) -> list[Check]:
    """The run directory (and the HF cache, for hub models) can be created and written.

    Creates them when missing (every later stage would) and removes its probe file."""
    dirs = [("run_dir", cfg.run_dir, "set `runtime.volume` (env LAUNCH_VOLUME) to a writable directory")]
    if cfg.model.tiny is None:
        dirs.append(("hf_cache", hf_home(cfg, env), "set `runtime.hf_home` (or HF_HOME) to a writable directory"))
    out = []
    for name, path, fix in dirs:
        probe = Path(path) / f".preflight-{os.getpid()}"
        try:
            Path(path).mkdir(parents=True, exist_ok=True)
            probe.write_bytes(b"ok")
            probe.unlink()
            out.append(Check(name, "ok", f"{path} writable"))
        except OSError as e:
            out.append(Check(name, "fail", f"cannot write to {path} ({e.strerror or e}); {fix}"))
    return out


def disk_needs(cfg, dims: ModelDims, env=None) -> list[tuple[Path, float, Path]]:
    """(location, bytes the run will hold there at its peak, what of it may already exist).

    Base model download 2P into the HF cache (hub models only); in the run directory:
    (keep_best + keep_recent) checkpoints of 14 B/param (full: bf16 weights + fp32 master/Adam)
    or 12 B per LoRA parameter (fp32 adapter + Adam m, v), final weights 2P (full), merged model 2P
    (`outputs.merge`).
    """
    t, p = cfg.train, dims.params
    out = []
    if cfg.model.tiny is None and not Path(cfg.model.name_or_path).expanduser().exists():
        out.append((hf_home(cfg, env), 2 * p, hub_cache_dir(cfg, env)))
    keep = t.checkpoints.keep_best + t.checkpoints.keep_recent
    run = 14 * p * keep + 2 * p if t.method == "full" else 12 * lora_trainable_params(cfg, dims) * keep
    out.append((cfg.run_dir, run + (2 * p if cfg.outputs.merge else 0), cfg.run_dir))
    return out


def check_disk(cfg, dims: Optional[ModelDims], env) -> Check:
    """Free space plus what this run already wrote, against `disk_needs`, per filesystem."""
    if dims is None:
        return Check("disk", "warn", f"model size unknown for `{cfg.model.name_or_path}`: disk not checked")
    by_fs: dict[int, list] = {}
    for path, need, present in disk_needs(cfg, dims, env):
        anchor = _existing_ancestor(path)
        entry = by_fs.setdefault(anchor.stat().st_dev, [anchor, 0.0, shutil.disk_usage(anchor).free])
        entry[1] += need
        entry[2] += _tree_size(present)
    checks = []
    for anchor, need, avail in by_fs.values():
        status = "fail" if avail < need else "warn" if avail < need * 1.1 + 5 * GIB else "ok"
        fix = "" if status == "ok" else "; use a bigger volume, or lower train.checkpoints.keep_best/keep_recent"
        checks.append(Check("disk", status, f"{anchor}: needs ~{_human(need)}, {_human(avail)} available{fix}"))
    return max(checks, key=lambda c: ("ok", "warn", "fail").index(c.status))


def check_token(cfg, env) -> Check:
    """HF_TOKEN present where needed; its value is never read beyond 'is it set'."""
    has = bool(env.get("HF_TOKEN"))
    if cfg.outputs.push_to_hub and not has:
        return Check("hf_token", "fail", f"outputs.push_to_hub is `{cfg.outputs.push_to_hub}` but HF_TOKEN "
                     f"is not set; {TOKEN_FIX}, or remove outputs.push_to_hub")
    if has:
        return Check("hf_token", "ok", "HF_TOKEN present (value not shown)")
    hub = [s.hf_dataset for s in cfg.data.sources if s.hf_dataset]
    if cfg.model.tiny is None and not Path(cfg.model.name_or_path).expanduser().exists() \
            and not hub_cache_dir(cfg, env).is_dir():
        hub.append(cfg.model.name_or_path)
    private = [r for r in dict.fromkeys(hub) if "/" in r and r.split("/")[0].lower() not in PUBLIC_ORGS]
    if private:
        return Check("hf_token", "warn", f"HF_TOKEN not set: gated or private repos ({', '.join(private)}) "
                     f"will fail to download; {TOKEN_FIX}")
    return Check("hf_token", "ok", "no token needed (public or local sources, no push)")


def gpu_info(env) -> tuple[Optional[float], int, str]:
    """(memory per GPU in GiB, GPUs in the whole job, where the memory figure came from).

    GPU count: WORLD_SIZE, else SkyPilot's per-node count x nodes (the run-phase variables, or the
    SKYPILOT_SETUP_* ones that SkyPilot sets while `setup`, where preflight runs), else torch.
    """
    ips = env.get("SKYPILOT_NODE_IPS") or env.get("SKYPILOT_SETUP_NODE_IPS") or ""
    nodes = int(env.get("SKYPILOT_NUM_NODES") or 0) or len(ips.split()) or 1
    per_node = env.get("SKYPILOT_NUM_GPUS_PER_NODE") or env.get("SKYPILOT_SETUP_NUM_GPUS_PER_NODE")
    count = int(env.get("WORLD_SIZE") or 0) or (int(per_node) * nodes if per_node else 0)
    if env.get("LAUNCH_GPU_MEMORY_GB"):
        return float(env["LAUNCH_GPU_MEMORY_GB"]), count or 1, "LAUNCH_GPU_MEMORY_GB"
    if attention.cpu_build_of_torch():
        return None, count or 1, "no GPU"
    try:
        import torch

        if torch.cuda.is_available():
            mem = torch.cuda.get_device_properties(0).total_memory / GIB
            return mem, count or torch.cuda.device_count() * nodes, torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return None, count or 1, "no GPU"


def check_cuda(env) -> Optional[Check]:
    """On a node SkyPilot gave GPUs to: can the lock's torch use them? A driver older than the CUDA
    that torch was built for (12.8 for the GPU lock) leaves `cuda.is_available()` False, and the run
    would otherwise find out at its first CUDA call, after setup and the model download."""
    per_node = env.get("SKYPILOT_NUM_GPUS_PER_NODE") or env.get("SKYPILOT_SETUP_NUM_GPUS_PER_NODE")
    if not per_node or int(per_node) == 0:
        return None  # a CPU task, the local backend, a test
    hidden = env.get("CUDA_VISIBLE_DEVICES")
    if hidden is not None and hidden.strip() in ("", "-1"):
        # CUDA's own switch for "no GPU": the run was started with `--env CUDA_VISIBLE_DEVICES=` (the
        # emulated cloud's CPU pods, tests/cloud), so it trains on CPU, on purpose and said.
        return Check("cuda", "warn", f"CUDA_VISIBLE_DEVICES={hidden!r} hides this node's {per_node} GPU(s): the run "
                     "trains on CPU (unset it to use them)")
    try:
        import torch
    except ImportError:
        return None  # check_versions names the missing stack
    built = torch.version.cuda or "none (a CPU build)"
    if torch.cuda.is_available():
        return Check("cuda", "ok", f"torch {torch.__version__} (CUDA {built}) sees {torch.cuda.device_count()} GPU(s)")
    return Check("cuda", "fail", f"this node has {per_node} GPU(s) but torch {torch.__version__} (CUDA {built}) cannot "
                 "use them: the host's NVIDIA driver is missing or older than that CUDA needs (`nvidia-smi` shows "
                 "its version); pick an image or host whose driver supports it")


def check_versions(cfg) -> Check:
    """The installed training stack against the payload's minimums (payload/preflight/versions.py)."""
    from payload.preflight import versions

    bad = versions.problems(cfg)
    if bad:
        return Check("versions", "fail", "; ".join(bad))
    have = versions.report()
    return Check("versions", "ok", ", ".join(f"{k} {v}" for k, v in have.items() if v))


def check_gpu_memory(cfg, dims: Optional[ModelDims], env) -> tuple[Check, dict]:
    mem, n, source = gpu_info(env)
    # the attention `auto` loads on this node (sdpa without a CUDA GPU of compute capability 8.0+)
    kernels = kernels_of(cfg, machine=attention.this_machine()) if dims else None
    est = estimate_stage_memory_gb(cfg, mem, n, dims=dims, kernels=kernels) if dims else {"known": False}
    if not est.get("known"):
        return Check("gpu_memory", "warn", f"model size unknown for `{cfg.model.name_or_path}`: not estimated"), est
    comps = ", ".join(f"{k} {v:g}" for k, v in est["components_gb"].items())
    k = est.get("kernels") or {}
    how = (f"; {k.get('attention')}, Liger {'on' if k.get('liger') else 'off'}, "
           + ("padding-free" if k.get("padding_free") else f"padded to {cfg.train.max_seq_length}")) if k else ""
    detail = f"~{est['total_gb']:g} GiB per GPU x {n} ({comps}{how})"
    if mem is None:
        return Check("gpu_memory", "ok", f"{detail}; no GPU visible, not compared"), est
    detail += f" vs {mem:.1f} GiB ({source})"
    if est["total_gb"] > mem:
        fixes = "lower train.per_device_batch_size or max_seq_length, use qlora, or add train.deepspeed (zero_stage: 3)"
        return Check("gpu_memory", "fail", f"{detail}: does not fit; {fixes}"), est
    status = "warn" if est["total_gb"] > 0.9 * mem else "ok"
    return Check("gpu_memory", status, detail + (": tight, may OOM" if status == "warn" else "")), est


def _existing_ancestor(path: Path) -> Path:
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _tree_size(path: Path) -> int:
    total = 0  # os.walk of a missing path yields nothing
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass
    return total


def _human(n: float) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB / 10 else f"{n / 2**20:.1f} MiB"
