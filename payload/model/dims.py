"""The base model's shape as this machine can find it, and where its Hub cache lies.

Model size comes from, in order: the tiny config (`model.tiny`), a local `config.json` (the local path,
then the HF cache's snapshots), else the name (payload.model.memory.dims_from_name: the table of known
Qwen shapes, else the size in the name). Read by the preflight's disk and memory checks and by
`gradient_checkpointing: auto` (payload.model.modeling.checkpointing_decision).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Optional

from payload.model.memory import ModelDims, dims_from_config, dims_from_name


def model_dims(cfg, env=None) -> Optional[ModelDims]:
    """The base model's shape: tiny config, local/cached config.json, or the name (see module doc)."""
    if cfg.model.tiny is not None:
        from payload.model.tiny import tiny_dims

        return tiny_dims(cfg.model.tiny)
    for path in _config_paths(cfg, env):
        try:
            return dims_from_config(json.loads(path.read_text()), str(path))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return dims_from_name(cfg.model.name_or_path)


def hf_home(cfg, env=None) -> Path:
    """The HF cache: `runtime.hf_home`, else HF_HOME, else `{volume}/.hf`."""
    env = os.environ if env is None else env
    return Path(cfg.runtime.hf_home or env.get("HF_HOME") or Path(cfg.runtime.volume) / ".hf")


def hub_cache_dir(cfg, env=None) -> Path:
    """Where the HF cache keeps the base model's files (`hub/models--org--name`)."""
    return hf_home(cfg, env) / "hub" / ("models--" + cfg.model.name_or_path.replace("/", "--"))


def _config_paths(cfg, env) -> list[Path]:
    local = Path(cfg.model.name_or_path).expanduser()
    return [local / "config.json", *sorted(hub_cache_dir(cfg, env).glob("snapshots/*/config.json"))]
