"""Preflight stage: cheap checks before any GPU minute is spent.

    python -m payload preflight --config run.yaml

Each check gives `ok`, `warn` or `fail` with one line of detail; any `fail` raises PayloadError
listing the failing lines. Checks: data sources readable (local files exist and are non-empty; hub
ids checked for syntax only: no network), base model reference, run directory and HF cache
writable, free disk against what the run will write, HF_TOKEN present where needed (presence only,
the value is never shown), and the GPU-memory estimate against the GPU.

Model size comes from, in order: a local `config.json` (local path, the HF cache, or the tiny
config), else a table of known Qwen shapes looked up by name ("Qwen3-VL-32B-Instruct" ->
qwen3-vl/32), else the size in the name ("70B" -> 70e9 parameters, shape of the nearest known row).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from payload import layout
from payload.errors import PayloadError

log = logging.getLogger("payload.preflight")

GIB = 2**30
DATA_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")
PUBLIC_ORGS = {"qwen"}  # hub orgs whose models need no token (Qwen models are not gated)
TOKEN_FIX = "launch with `--secret HF_TOKEN` (the value is taken from your shell, never written to disk)"


@dataclass
class Check:
    name: str
    status: str  # ok | warn | fail
    detail: str

    def line(self) -> str:
        return f"{self.status.upper():4} {self.name}: {self.detail}"


# ------------------------------------------------------------------------------------ model shape


@dataclass(frozen=True)
class ModelDims:
    """Decoder shape; parameter counts are derived from it (Qwen2/Qwen3 blocks, SwiGLU MLP)."""

    hidden: int
    layers: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    vision_params: float = 0.0
    source: str = ""

    @property
    def module_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) of each linear layer of one decoder block, by PEFT target-module name."""
        h, q, kv, i = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim, self.intermediate
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}

    @property
    def block_params(self) -> int:
        return sum(a * b for a, b in self.module_shapes.values()) + 2 * self.hidden

    @property
    def linear_params(self) -> int:
        """Parameters in decoder-block linear layers (what 4-bit quantization shrinks)."""
        return self.layers * sum(a * b for a, b in self.module_shapes.values())

    @property
    def embed_params(self) -> int:
        return self.vocab * self.hidden * (1 if self.tied else 2)

    @property
    def params(self) -> float:
        return self.layers * self.block_params + self.embed_params + self.hidden + self.vision_params


# family/size -> (hidden, layers, intermediate, heads, kv_heads, head_dim, vocab, tied, vision params).
# From the models' config.json files; vision params approximate (Qwen3-VL-32B: 33.3B total, runbook 000).
KNOWN_QWEN = {
    "qwen2.5/0.5": (896, 24, 4864, 14, 2, 64, 151936, True, 0),
    "qwen2.5/1.5": (1536, 28, 8960, 12, 2, 128, 151936, True, 0),
    "qwen2.5/3": (2048, 36, 11008, 16, 2, 128, 151936, True, 0),
    "qwen2.5/7": (3584, 28, 18944, 28, 4, 128, 152064, False, 0),
    "qwen2.5/14": (5120, 48, 13824, 40, 8, 128, 152064, False, 0),
    "qwen2.5/32": (5120, 64, 27648, 40, 8, 128, 152064, False, 0),
    "qwen2.5/72": (8192, 80, 29568, 64, 8, 128, 152064, False, 0),
    "qwen3/0.6": (1024, 28, 3072, 16, 8, 128, 151936, True, 0),
    "qwen3/1.7": (2048, 28, 6144, 16, 8, 128, 151936, True, 0),
    "qwen3/4": (2560, 36, 9728, 32, 8, 128, 151936, True, 0),
    "qwen3/8": (4096, 36, 12288, 32, 8, 128, 151936, False, 0),
    "qwen3/14": (5120, 40, 17408, 40, 8, 128, 151936, False, 0),
    "qwen3/32": (5120, 64, 25600, 64, 8, 128, 151936, False, 0),
    "qwen3-vl/8": (4096, 36, 12288, 32, 8, 128, 151936, False, 0.58e9),
    "qwen3-vl/32": (5120, 64, 25600, 64, 8, 128, 151936, False, 0.54e9),
}


def dims_from_config(data: dict, source: str = "config.json") -> ModelDims:
    """ModelDims from a transformers config dict (text_config for vision-language models)."""
    text = data.get("text_config") or data
    heads = text["num_attention_heads"]
    vision = data.get("vision_config") or {}
    vparams = 0.0
    if vision:
        vh, vi = vision.get("hidden_size", 0), vision.get("intermediate_size", 0)
        vparams = vision.get("depth", 0) * (4 * vh * vh + 2 * vh * vi)
    tied = data.get("tie_word_embeddings", text.get("tie_word_embeddings", False))
    return ModelDims(
        hidden=text["hidden_size"], layers=text["num_hidden_layers"], intermediate=text["intermediate_size"],
        heads=heads, kv_heads=text.get("num_key_value_heads") or heads,
        head_dim=text.get("head_dim") or text["hidden_size"] // heads, vocab=text["vocab_size"],
        tied=bool(tied), vision_params=vparams, source=source,
    )


def dims_from_name(name: str) -> Optional[ModelDims]:
    """Known Qwen shape by name, else the "<N>B" in the name with the nearest known shape."""
    base = name.rstrip("/").split("/")[-1].lower().replace("_", ".")
    size = re.search(r"(?<![\d.])(\d+(?:\.\d+)?)b(?![a-z])", base)
    if size is None:
        return None
    family = "qwen3-vl" if re.search(r"qwen3-?vl", base) else "qwen3" if "qwen3" in base else (
        "qwen2.5" if re.search(r"qwen2\.?5", base) else None)
    key = f"{family}/{size.group(1)}"
    if key in KNOWN_QWEN:
        return ModelDims(*KNOWN_QWEN[key], source=f"known shape {key}")
    want = float(size.group(1)) * 1e9
    nearest = min(KNOWN_QWEN, key=lambda k: abs(math.log(ModelDims(*KNOWN_QWEN[k]).params / want)))
    d = ModelDims(*KNOWN_QWEN[nearest])
    scale = want / d.params  # keep the nearest shape, scale the depth to the named size
    return ModelDims(**{**asdict(d), "layers": max(1, round(d.layers * scale)),
                        "source": f"{size.group(1)}B from the name, shape of {nearest}"})


def model_dims(cfg, env=None) -> Optional[ModelDims]:
    """The base model's shape: tiny config, local/cached config.json, or the name (see module doc)."""
    if cfg.model.tiny is not None:
        from payload.tiny import build_tiny_tokenizer, tiny_config

        tok = build_tiny_tokenizer(None, vocab_size=cfg.model.tiny.vocab_size)
        return dims_from_config(tiny_config(cfg.model.tiny, tok).to_dict(), "tiny config")
    for path in _config_paths(cfg, env):
        try:
            return dims_from_config(json.loads(path.read_text()), str(path))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return dims_from_name(cfg.model.name_or_path)


def hf_home(cfg, env=None) -> Path:
    env = os.environ if env is None else env
    return Path(cfg.runtime.hf_home or env.get("HF_HOME") or Path(cfg.runtime.volume) / ".hf")


def _hub_cache_dir(cfg, env=None) -> Path:
    return hf_home(cfg, env) / "hub" / ("models--" + cfg.model.name_or_path.replace("/", "--"))


def _config_paths(cfg, env) -> list[Path]:
    local = Path(cfg.model.name_or_path).expanduser()
    return [local / "config.json", *sorted(_hub_cache_dir(cfg, env).glob("snapshots/*/config.json"))]


# ---------------------------------------------------------------------------------- GPU memory


def estimate_gpu_memory_gb(cfg, gpu_mem_gb: Optional[float], num_gpus: int, dims: Optional[ModelDims] = None) -> dict:
    """Peak GPU memory per GPU, in GiB (2**30 bytes, as torch and nvidia-smi count), by component.

    P = parameters, N = `num_gpus` (all GPUs of the job), B = per-device batch, S = max_seq_length,
    H/I/L/V = hidden, intermediate, layers, vocab; Q = heads x head_dim, K = kv_heads x head_dim.

    weights      lora: 2P (bf16; 4P if model.dtype float32). qlora: 0.55 B/param for the block
                 linears (NF4 + scales), bf16 for embeddings/lm_head/vision. ZeRO-3: divided by N.
    train_state  lora: T x 16 B, T = L x sum(r x (in + out)) over the targeted block linears (PEFT
                 keeps adapters in fp32: weight 4 + grad 4 + AdamW m,v 8; 8-bit Adam: 10 B).
                 full: 16 B/param (bf16 weight 2 + grad 2 + fp32 master/m/v 12, ZeRO paper's K=12);
                 ZeRO-2 shards the 14 B of grads+optimizer over N, ZeRO-3 all 16 B; offload_optimizer
                 moves the 12 B to CPU, offload_params the 2 B. ZeRO-3 adds a working set: 3 x the
                 largest gathered unit (a block or the embedding) x 2 B (current + prefetch + grads).
    activations  checkpointing on: L x B x S x H x 2 B (each block's bf16 input) + 2 x one block
                 recomputed in backward, B x S x (4H + 4Q + 4K + 4I [+ 5H + Q + I copies when LoRA
                 dropout > 0]) x 2 B; off: L x that block set. Flash/SDPA attention assumed (no S^2).
    logits       B x S x V x 10 B: bf16 logits, fp32 upcast for the loss, fp32 log-softmax/grad.
    overhead     1.5 GiB (CUDA context, NCCL, cuBLAS workspace) + 5 % (allocator fragmentation).

    Assumptions: sequences padded to S (worst case), no CPU-offloaded activations, no Liger/fused
    cross-entropy, vision-tower activations ignored. It is an estimate for a go/no-go before paying:
    expect the real peak within about +-20 %.
    """
    dims = dims or model_dims(cfg)
    if dims is None:
        return {"known": False, "detail": f"unknown size of `{cfg.model.name_or_path}`"}
    t, n = cfg.train, max(1, int(num_gpus))
    ds = t.deepspeed
    comp = {
        "weights": _weights_bytes(cfg, dims, n),
        "train_state": _train_state_bytes(cfg, dims, n),
        "activations": _activation_bytes(cfg, dims),
        "logits": t.per_device_batch_size * t.max_seq_length * dims.vocab * 10,
    }
    if ds and ds.zero_stage == 3:
        comp["zero3_working"] = 3 * max(dims.block_params, dims.vocab * dims.hidden) * 2
    subtotal = sum(comp.values())
    comp["overhead"] = 1.5 * GIB + 0.05 * subtotal
    total = sum(comp.values()) / GIB
    out = {
        "known": True, "model": cfg.model.name_or_path, "params_b": round(dims.params / 1e9, 2),
        "shape_source": dims.source, "method": t.method, "num_gpus": n,
        "zero_stage": ds.zero_stage if ds else None, "batch": t.per_device_batch_size, "seq": t.max_seq_length,
        "components_gb": {k: round(v / GIB, 2) for k, v in comp.items()},
        "total_gb": round(total, 1), "gpu_mem_gb": gpu_mem_gb,
        "fraction": round(total / gpu_mem_gb, 3) if gpu_mem_gb else None,
    }
    if t.method in ("lora", "qlora"):
        out["trainable_params_m"] = round(lora_trainable_params(cfg, dims) / 1e6, 1)
    return out


def lora_trainable_params(cfg, dims: ModelDims) -> int:
    """LoRA parameters over the decoder blocks: sum of r x (in + out) of the targeted linears."""
    targets = cfg.train.lora.target_modules
    shapes = dims.module_shapes
    names = shapes if targets == "all-linear" else [m for m in targets if m in shapes]
    return dims.layers * sum(cfg.train.lora.r * sum(shapes[m]) for m in names)


def _weights_bytes(cfg, dims: ModelDims, n: int) -> float:
    t = cfg.train
    if t.method == "full":
        return 0.0  # counted in train_state (16 B/param)
    per = 4 if cfg.model.dtype == "float32" else 2
    if t.method == "qlora":
        w = 0.55 * dims.linear_params + per * (dims.params - dims.linear_params)
    else:
        w = per * dims.params
    return w / n if t.deepspeed and t.deepspeed.zero_stage == 3 else w


def _train_state_bytes(cfg, dims: ModelDims, n: int) -> float:
    t, ds = cfg.train, cfg.train.deepspeed
    if t.method == "full":
        weights, grads, optim = 2 * dims.params, 2 * dims.params, 12 * dims.params
    else:
        trainable = lora_trainable_params(cfg, dims)
        optim_b = 2 if t.optimizer == "paged_adamw_8bit" else 8
        weights, grads, optim = 4 * trainable, 4 * trainable, optim_b * trainable
    if ds:
        optim = 0 if ds.offload_optimizer else optim / n
        grads /= n
        if ds.zero_stage == 3:
            weights = 0 if ds.offload_params else weights / n
    return weights + grads + optim


def _activation_bytes(cfg, dims: ModelDims) -> float:
    t = cfg.train
    tokens = t.per_device_batch_size * t.max_seq_length
    h, i = dims.hidden, dims.intermediate
    q, kv = dims.heads * dims.head_dim, dims.kv_heads * dims.head_dim
    per_token = 4 * h + 4 * q + 4 * kv + 4 * i
    if t.method != "full" and t.lora.dropout > 0:
        per_token += 5 * h + q + i  # PEFT applies dropout per adapted linear: one input copy each
    block = tokens * per_token * 2
    if t.gradient_checkpointing:
        return dims.layers * tokens * h * 2 + 2 * block
    return dims.layers * block


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
            bad = _repo_id_problem(src.hf_dataset)
            out.append(Check(name, "fail", f"hf_dataset `{src.hf_dataset}`: {bad}") if bad else
                       Check(name, "ok", f"hub dataset `{src.hf_dataset}` (syntax only; not checked offline)"))
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


def _repo_id_problem(repo_id: str) -> Optional[str]:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        return str(e).splitlines()[0].split(". Use ")[0]
    return None


def check_model(cfg) -> Check:
    m = cfg.model
    if m.tiny is not None:
        return Check("model", "ok", f"tiny {m.tiny.arch} built from config (no download)")
    local = Path(m.name_or_path).expanduser()
    if local.exists() or m.name_or_path.startswith(("/", ".", "~")):
        if not (local / "config.json").is_file():
            return Check("model", "fail", f"local model {local} has no config.json; fix `model.name_or_path`")
        return Check("model", "ok", f"local model {local}")
    bad = _repo_id_problem(m.name_or_path)
    if bad:
        return Check("model", "fail", f"model.name_or_path `{m.name_or_path}`: {bad}")
    return Check("model", "ok", f"hub model `{m.name_or_path}` (syntax only; not checked offline)")


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
        out.append((hf_home(cfg, env), 2 * p, _hub_cache_dir(cfg, env)))
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
            and not _hub_cache_dir(cfg, env).is_dir():
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
    try:
        import torch

        if torch.cuda.is_available():
            mem = torch.cuda.get_device_properties(0).total_memory / GIB
            return mem, count or torch.cuda.device_count() * nodes, torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return None, count or 1, "no GPU"


def check_gpu_memory(cfg, dims: Optional[ModelDims], env) -> tuple[Check, dict]:
    mem, n, source = gpu_info(env)
    est = estimate_gpu_memory_gb(cfg, mem, n, dims=dims) if dims else {"known": False}
    if not est.get("known"):
        return Check("gpu_memory", "warn", f"model size unknown for `{cfg.model.name_or_path}`: not estimated"), est
    comps = ", ".join(f"{k} {v:g}" for k, v in est["components_gb"].items())
    detail = f"~{est['total_gb']:g} GiB per GPU x {n} ({comps})"
    if mem is None:
        return Check("gpu_memory", "ok", f"{detail}; no GPU visible, not compared"), est
    detail += f" vs {mem:.1f} GiB ({source})"
    if est["total_gb"] > mem:
        fixes = "lower train.per_device_batch_size or max_seq_length, use qlora, or add train.deepspeed (zero_stage: 3)"
        return Check("gpu_memory", "fail", f"{detail}: does not fit; {fixes}"), est
    status = "warn" if est["total_gb"] > 0.9 * mem else "ok"
    return Check("gpu_memory", status, detail + (": tight, may OOM" if status == "warn" else "")), est


# ---------------------------------------------------------------------------------------- stage


def run_checks(cfg, env=None) -> tuple[list[Check], dict]:
    env = os.environ if env is None else env
    checks = [*check_data(cfg), check_model(cfg), *check_writable(cfg, env)]
    try:
        dims = model_dims(cfg, env)
    except Exception as e:  # noqa: BLE001 - a malformed config.json must not hide the other checks
        dims = None
        checks.append(Check("model_shape", "warn", f"could not read the model shape: {e}"))
    checks += [check_disk(cfg, dims, env), check_token(cfg, env)]
    gpu_check, estimate = check_gpu_memory(cfg, dims, env)
    checks.append(gpu_check)
    return checks, estimate


def main(cfg, env=None) -> dict:
    """Run every check, log one line each; raise PayloadError listing the failures."""
    checks, estimate = run_checks(cfg, env)
    for c in checks:
        (log.warning if c.status != "ok" else log.info)(c.line())
    failed = [c for c in checks if c.status == "fail"]
    if failed:
        raise PayloadError(f"preflight: {len(failed)} check(s) failed: " +
                           " | ".join(f"{c.name}: {c.detail}" for c in failed))
    return {"stage": "preflight", "ok": True, "warnings": sum(c.status == "warn" for c in checks),
            "checks": [asdict(c) for c in checks], "memory": estimate}


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
