"""Export stage: the trained PEFT LoRA adapter -> an MLX (mlx-lm) adapter, as in runbook 001.

    python -m payload export --mlx --config run.yaml     # writes {run_dir}/outputs/mlx/

What mlx-lm expects (read from `mlx_lm/tuner/utils.py::load_adapters` and `tuner/lora.py`):
- `adapter_config.json` with `fine_tune_type` ("lora"), `num_layers` (LoRA goes into the LAST
  `num_layers` blocks of `model.layers`) and `lora_parameters` = {rank, scale, dropout, keys}, where
  `keys` are module paths inside one block (`self_attn.q_proj`, `mlp.down_proj`, ...);
- `adapters.safetensors`, loaded with `strict=False`, holding `model.layers.N.<key>.lora_a` of shape
  [in, r] and `lora_b` of shape [r, out]; the layer computes `y + scale * (x @ lora_a) @ lora_b`.

PEFT stores `lora_A.weight` [r, in] and `lora_B.weight` [out, r] and adds `(alpha / r) * B @ A @ x`,
so the conversion is a rename plus a transpose of each matrix; `scale` is `alpha / r`
(`alpha / sqrt(r)` with rsLoRA). Qwen3-VL adapters map onto mlx-lm's text-only `qwen3_vl` model
(`language_model.model.layers.N...`); vision-tower LoRA has no MLX counterpart and is refused.

Needs torch and safetensors only (never mlx): it runs on the GPU machine or anywhere else.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Optional

from payload import layout
from payload.volume import verify
from payload.errors import PayloadError

log = logging.getLogger("payload.export")

PEFT_WEIGHTS = "adapter_model.safetensors"
PEFT_CONFIG = "adapter_config.json"
MLX_WEIGHTS = "adapters.safetensors"
MLX_CONFIG = "adapter_config.json"

# base_model.model.<prefix>layers.<N>.<module>.lora_<A|B>[.<adapter name>].weight
_KEY = re.compile(
    r"^base_model\.model\.(?P<prefix>(?:model\.)?(?:language_model\.)?(?:model\.)?)"
    r"layers\.(?P<layer>\d+)\.(?P<module>.+)\.lora_(?P<ab>[AB])(?:\.[^.]+)?\.weight$"
)
# HF prefix before `layers.` -> mlx-lm prefix (mlx-lm: qwen2/qwen3 `model.layers`, qwen3_vl
# `language_model.model.layers`).
_PREFIX = {
    "model.": "model.",
    "model.language_model.": "language_model.model.",
    "language_model.model.": "language_model.model.",
}


def peft_to_mlx(adapter_dir, out_dir, num_layers: Optional[int] = None, base_model: Optional[str] = None) -> dict:
    """Convert a PEFT LoRA adapter directory into an mlx-lm adapter directory; return a summary.

    `num_layers` should be the base model's block count (mlx-lm wraps the last `num_layers` blocks;
    blocks without weights keep lora_b = 0 and are unchanged). When None it is inferred as the
    highest adapted block + 1, which is right for adapters that reach the last block (PEFT's
    default). The output directory is replaced atomically.
    """
    from safetensors.torch import load_file, save_file

    adapter_dir, out_dir = Path(adapter_dir), Path(out_dir)
    peft_cfg = _read_peft_config(adapter_dir)
    rank, scale = _rank_and_scale(peft_cfg, adapter_dir)
    state = load_file(str(adapter_dir / PEFT_WEIGHTS))
    tensors, keys, layers = _convert_tensors(state, rank, adapter_dir)
    top = max(layers) + 1
    if num_layers is None:
        num_layers = top
    elif num_layers < top:
        raise PayloadError(
            f"num_layers={num_layers} but {adapter_dir} adapts block {top - 1}; "
            f"pass the base model's block count (>= {top})"
        )
    config = {
        "fine_tune_type": "lora",
        "num_layers": num_layers,
        "lora_parameters": {
            "rank": rank,
            "scale": scale,
            "dropout": float(peft_cfg.get("lora_dropout") or 0.0),
            "keys": sorted(keys),
        },
    }
    if base_model:
        config["model"] = base_model  # informational, as mlx-lm itself records it
    tensors = {k: v.contiguous() for k, v in tensors.items()}

    def write(tmp: Path) -> None:
        save_file(tensors, str(tmp / MLX_WEIGHTS), metadata={"format": "mlx"})
        (tmp / MLX_CONFIG).write_text(json.dumps(config, indent=2) + "\n")

    _write_atomically(out_dir, write)
    summary = {"out_dir": str(out_dir), "tensors": len(tensors), "num_layers": num_layers,
               "rank": rank, "scale": scale, "keys": sorted(keys)}
    log.info("MLX adapter: %d tensors, rank %d, scale %g, keys %s -> %s",
             len(tensors), rank, scale, ", ".join(sorted(keys)), out_dir)
    return summary


def _read_peft_config(adapter_dir: Path) -> dict:
    cfg_path, weights = adapter_dir / PEFT_CONFIG, adapter_dir / PEFT_WEIGHTS
    if not cfg_path.is_file() or not weights.is_file():
        raise PayloadError(
            f"{adapter_dir}: not a PEFT adapter (needs {PEFT_CONFIG} and {PEFT_WEIGHTS}); "
            "train first (`python -m payload train`) or point at a checkpoint's adapter"
        )
    cfg = json.loads(cfg_path.read_text())
    problems = []
    if cfg.get("peft_type", "LORA") != "LORA":
        problems.append(f"peft_type {cfg.get('peft_type')} (only LORA converts)")
    if cfg.get("use_dora"):
        problems.append("use_dora: true (DoRA magnitudes have no mapping here)")
    if cfg.get("rank_pattern") or cfg.get("alpha_pattern"):
        problems.append("rank_pattern/alpha_pattern (mlx-lm uses one rank and scale for all layers)")
    if cfg.get("bias", "none") != "none" or cfg.get("lora_bias"):
        problems.append(f"bias={cfg.get('bias')!r}/lora_bias (mlx-lm LoRA layers carry no bias)")
    if cfg.get("modules_to_save"):
        problems.append(f"modules_to_save={cfg['modules_to_save']} (fully trained modules are not LoRA)")
    if cfg.get("fan_in_fan_out"):
        problems.append("fan_in_fan_out: true (Conv1D-style layers)")
    if problems:
        raise PayloadError(f"{cfg_path}: cannot convert to MLX: " + "; ".join(problems))
    return cfg


def _rank_and_scale(cfg: dict, adapter_dir: Path) -> tuple[int, float]:
    try:
        rank, alpha = int(cfg["r"]), float(cfg["lora_alpha"])
    except (KeyError, TypeError, ValueError):
        raise PayloadError(f"{adapter_dir / PEFT_CONFIG}: needs integer `r` and `lora_alpha`") from None
    scale = alpha / math.sqrt(rank) if cfg.get("use_rslora") else alpha / rank
    return rank, scale


def _convert_tensors(state: dict, rank: int, adapter_dir: Path) -> tuple[dict, set, set]:
    """Rename + transpose; check every A has its B with consistent shapes."""
    out, keys, layers, pairs = {}, set(), set(), {}
    for name, tensor in state.items():
        m = _KEY.match(name)
        if m is None or m["prefix"] not in _PREFIX:
            raise PayloadError(
                f"{adapter_dir / PEFT_WEIGHTS}: tensor `{name}` is not a LoRA matrix of a decoder "
                "block (vision tower, embeddings or lm_head); MLX export supports language-block LoRA only"
            )
        base = f"{_PREFIX[m['prefix']]}layers.{m['layer']}.{m['module']}"
        if tensor.ndim != 2:
            raise PayloadError(f"{adapter_dir / PEFT_WEIGHTS}: `{name}` has shape {tuple(tensor.shape)}, expected 2-D")
        out[f"{base}.lora_{m['ab'].lower()}"] = tensor.T  # A: [r,in]->[in,r]; B: [out,r]->[r,out]
        pairs.setdefault(base, {})[m["ab"]] = tuple(tensor.shape)
        keys.add(m["module"])
        layers.add(int(m["layer"]))
    if not out:
        raise PayloadError(f"{adapter_dir / PEFT_WEIGHTS}: no LoRA tensors found")
    for base, shapes in pairs.items():
        a, b = shapes.get("A"), shapes.get("B")
        if a is None or b is None or a[0] != rank or b[1] != rank:
            raise PayloadError(
                f"{adapter_dir / PEFT_WEIGHTS}: `{base}` has lora_A {a} / lora_B {b}, expected rank {rank} for both"
            )
    return out, keys, layers


def _write_atomically(out_dir: Path, write) -> None:
    """Write into a temporary sibling, then swap it in: a crash never leaves a half-written export."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        write(tmp)
        if out_dir.exists():
            shutil.rmtree(out_dir)
        os.rename(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ----------------------------------------------------------------------------------------- stage


def main(cfg) -> dict:
    """`python -m payload export --mlx`: convert {run_dir}/outputs/adapter into {run_dir}/outputs/mlx."""
    if cfg.train.method == "full":
        raise PayloadError(
            "MLX adapter export needs a LoRA adapter, but train.method is `full`; convert the full "
            f"weights in {cfg.run_dir / layout.ADAPTER_DIR} with `mlx_lm.convert --hf-path` instead"
        )
    adapter_dir = cfg.run_dir / layout.ADAPTER_DIR
    if adapter_dir.is_dir():  # checked against its SHA256SUMS; a damaged one is exported again
        verify.ensure_export(cfg.run_dir, "best")
    num_layers = base_num_layers(cfg)
    if num_layers is None:
        log.warning("base model config not found locally: num_layers inferred from the adapter")
    summary = peft_to_mlx(adapter_dir, cfg.run_dir / layout.MLX_DIR, num_layers=num_layers,
                          base_model=cfg.model.name_or_path)
    base = write_mlx_base_step(cfg, cfg.run_dir / layout.MLX_DIR)
    log.info("MLX base: run %s on a Mac (mlx-lm) to make %s, the 4-bit base this adapter loads onto "
             "(runbook 001 step 8)", MLX_BASE_SCRIPT, base)
    return {"stage": "export", "format": "mlx", "mlx_base": base, **summary}


MLX_BASE_SCRIPT = "convert_base.sh"
MLX_METADATA = "metadata.json"


def mlx_base_dir(cfg) -> str:
    """Where runbook 001 keeps the MLX base: ./models/<name>-4bit-MLX (4-bit for QLoRA, as trained)."""
    bits = cfg.train.quantization.bits if cfg.train.quantization else None
    return f"./models/{cfg.model.name_or_path.rstrip('/').rsplit('/', 1)[-1]}-{f'{bits}bit' if bits else 'bf16'}-MLX"


def write_mlx_base_step(cfg, out_dir) -> str:
    """Runbook 001 steps 7-8 beside the MLX adapter: `metadata.json` (base model path, rank, alpha,
    training examples) and `convert_base.sh`, the `mlx_lm.convert` line that makes that base on a Mac
    (mlx runs on Apple silicon; `-q` matters: without it the 32B base is ~61 GB of bf16, not ~18 GB)."""
    out_dir, base = Path(out_dir), mlx_base_dir(cfg)
    q = cfg.train.quantization
    flags = f" -q --q-bits {q.bits}" if q else ""
    revision = f" --revision {cfg.model.revision}" if cfg.model.revision else ""
    (out_dir / MLX_BASE_SCRIPT).write_text(
        "#!/bin/sh\n# Makes the MLX base model this adapter was trained on (runbook 001 step 8); run it on the Mac\n"
        "# where you chat with the adapter, from the directory metadata.json's base_model is relative to.\n"
        "# Needs mlx-lm (pip install mlx-lm) and the base model's files (HF_TOKEN for gated ones).\nset -e\n"
        f"mlx_lm.convert --hf-path {cfg.model.name_or_path}{revision}{flags} --mlx-path {base}\n"
        f"mlx_lm.generate --model {base} --adapter-path \"$(dirname \"$0\")\" --prompt hello --max-tokens 20\n")
    lora = cfg.train.lora
    meta = {"base_model": base, "hf_base_model": cfg.model.name_or_path, "lora_rank": lora.r,
            "lora_alpha": lora.alpha, "training_examples": _train_records(cfg), "run_id": cfg.runtime.run_id}
    (out_dir / MLX_METADATA).write_text(json.dumps(meta, indent=2) + "\n")
    return base


def _train_records(cfg) -> Optional[int]:
    try:
        return json.loads((cfg.run_dir / layout.DATA_STATS).read_text())["totals"]["train"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def base_num_layers(cfg) -> Optional[int]:
    """The base model's decoder-block count, from the tiny config, a local/merged/cached config.json."""
    if cfg.model.tiny is not None:
        return cfg.model.tiny.num_layers
    for path in _config_candidates(cfg):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        text = data.get("text_config") or data
        if isinstance(text.get("num_hidden_layers"), int):
            return text["num_hidden_layers"]
    return None


def _config_candidates(cfg) -> list[Path]:
    name = cfg.model.name_or_path
    out = [Path(name) / "config.json", cfg.run_dir / layout.MERGED_DIR / "config.json"]
    hf_home = Path(cfg.runtime.hf_home or os.environ.get("HF_HOME") or Path(cfg.runtime.volume) / ".hf")
    repo = hf_home / "hub" / ("models--" + name.replace("/", "--"))
    out += sorted(repo.glob("snapshots/*/config.json"))
    return out
