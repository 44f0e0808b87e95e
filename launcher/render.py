"""Profile -> SkyPilot task YAML (`sky/<profile>.yaml`) + resolved run config (`sky/config/<profile>.yaml`).

The rendered task is a plain SkyPilot task: `sky launch sky/sonia-h100.yaml` from the repo root works
without `launch`. It carries no secret values: `secrets:` names them, values come at launch time.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Optional

import yaml

from payload.config import dump_run_config

from .profile import REPO_ROOT, Profile, load_profile, profile_names

SKY_DIR = REPO_ROOT / "sky"
CONFIG_DIR = SKY_DIR / "config"
SECRETS = ("HF_TOKEN", "WANDB_API_KEY")
MASTER_PORT = 29500

# Prebuilt flash-attn wheel matching payload/requirements-gpu.txt (torch 2.8, CUDA 12, py3.11).
FLASH_ATTN_WHEEL = (
    "https://github.com/Dao-AILab/flash-attention/releases/download/v2.8.3/"
    "flash_attn-2.8.3+cu12torch2.8cxx11abiTRUE-cp311-cp311-linux_x86_64.whl"
)

SETUP = """\
set -euo pipefail
# Install the payload's pinned GPU stack with uv (about a minute; never compiles flash-attn).
if [ -z "${LAUNCH_LOCAL:-}" ]; then
  python -m pip install -q uv
  python -m uv pip install --system -q -r payload/requirements-gpu.txt
  python -m uv pip install --system -q "$FLASH_ATTN_WHEEL" \\
    || echo "launch: flash-attn wheel unavailable; attention falls back to sdpa"
fi
python -m payload preflight --config "$LAUNCH_CONFIG"
"""

RUN = """\
set -euo pipefail
# One data-parallel job over every node: SkyPilot sets the node rank, IPs and GPU count.
MASTER_ADDR=$(echo "$SKYPILOT_NODE_IPS" | head -n1)
NPROC=${SKYPILOT_NUM_GPUS_PER_NODE:-1}; [ "$NPROC" -ge 1 ] || NPROC=1
python -m payload data --config "$LAUNCH_CONFIG"
torchrun --nnodes="$SKYPILOT_NUM_NODES" --nproc_per_node="$NPROC" \\
  --node_rank="$SKYPILOT_NODE_RANK" --master_addr="$MASTER_ADDR" --master_port="${LAUNCH_MASTER_PORT:-%(port)d}" \\
  -m payload train --config "$LAUNCH_CONFIG"
if [ "$SKYPILOT_NODE_RANK" = "0" ]; then
  python -m payload post --config "$LAUNCH_CONFIG"
fi
"""


def config_path(name: str) -> Path:
    return CONFIG_DIR / f"{name}.yaml"


def task_path(name: str) -> Path:
    return SKY_DIR / f"{name}.yaml"


def resolved_run_config(p: Profile, price_per_hour: Optional[float] = None):
    """The RunConfig the payload reads: profile sections minus cluster/budget, runtime filled in."""
    from payload.config import RunConfig

    body = p.model_dump(mode="json", exclude={"cluster", "budget", "estimate"})
    body["runtime"] = {
        **body["runtime"],
        "volume": p.runtime_volume(),
        "profile": p.name,
        "price_per_hour": price_per_hour if price_per_hour is not None else (p.budget.price_per_hour or 0.0),
        "budget_usd": p.budget.max_usd,
        "hf_home": f"{p.runtime_volume()}/.hf",
    }
    return RunConfig.model_validate(body)


def task_dict(p: Profile, price_per_hour: float) -> dict:
    c = p.cluster
    resources: dict = {"disk_size": c.disk_size}
    infra = [i for i in c.infra_list if i != "local"]
    if len(infra) == 1:
        resources["infra"] = infra[0] + (f"/{c.region}" if c.region else "")
    elif infra:
        resources["ordered"] = [{"infra": i} for i in infra]
    if c.accelerators:
        resources["accelerators"] = c.accelerators
    else:
        resources["cpus"] = "2+"
    if not c.is_local:
        resources["use_spot"] = c.use_spot
    if c.image_id:
        resources["image_id"] = c.image_id
    if c.use_spot:
        resources["job_recovery"] = {"strategy": c.recovery_strategy,
                                     "max_restarts_on_errors": c.max_restarts_on_errors}
    volume = p.runtime_volume()
    envs = {
        "LAUNCH_PROFILE": p.name,
        "LAUNCH_CONFIG": f"sky/config/{p.name}.yaml",
        "LAUNCH_VOLUME": volume,
        "LAUNCH_PRICE_PER_HOUR": f"{price_per_hour:.4f}",
        "LAUNCH_BUDGET_USD": f"{p.budget.max_usd:g}",
        "HF_HOME": f"{volume}/.hf",
        "HF_XET_HIGH_PERFORMANCE": "1",
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
        "TOKENIZERS_PARALLELISM": "false",
        "FLASH_ATTN_WHEEL": FLASH_ATTN_WHEEL,
    }
    if not c.use_spot:
        # For a plain `sky launch` of a cluster: a stable run dir, so a relaunch resumes. `launch up`
        # always sets LAUNCH_RUN_ID to its run id; a plain `sky jobs launch` of a spot task falls back
        # to SKYPILOT_TASK_ID, which is stable across managed-job recoveries.
        envs["LAUNCH_RUN_ID"] = p.name
    if c.accelerator_name and "SXM" in c.accelerator_name and c.gpus_per_node > 1:
        envs["NCCL_P2P_LEVEL"] = "NVL"  # NVLink between SXM GPUs (runbook 000)
    task: dict = {
        "name": p.name,
        "workdir": ".",
        "resources": resources,
        "num_nodes": c.num_nodes,
    }
    if c.volume:
        task["volumes"] = {c.volume.mount: c.volume.name}
    if c.bucket:
        task["file_mounts"] = {c.bucket.mount: {"name": c.bucket.name, "store": c.bucket.store,
                                                "mode": c.bucket.mode}}
    task["envs"] = envs
    task["secrets"] = {s: None for s in SECRETS}
    task["setup"] = SETUP
    task["run"] = RUN % {"port": MASTER_PORT}
    return task


class _Dumper(yaml.SafeDumper):
    pass


def _str_presenter(dumper, data):
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str_presenter)


def render_text(p: Profile, price_per_hour: float) -> tuple[str, str]:
    """(task YAML, resolved run config YAML) for a profile, deterministic."""
    header = (f"# Rendered by `launch render {p.name}` from clusters/{p.name}.yaml - do not edit here.\n"
              f"# Plain SkyPilot works too, from the repo root: sky launch sky/{p.name}.yaml"
              + (" --secret HF_TOKEN" if not p.cluster.is_local else "") + "\n")
    task = yaml.dump(task_dict(p, price_per_hour), Dumper=_Dumper, sort_keys=False, width=100)
    cfg = resolved_run_config(p, price_per_hour)
    config = (f"# Resolved run config for `python -m payload STAGE --config`, rendered from "
              f"clusters/{p.name}.yaml - do not edit here.\n" + dump_run_config(cfg))
    return header + task, config


def render_profile(name: str, price_per_hour: Optional[float] = None) -> dict[Path, str]:
    p = load_profile(name)
    if price_per_hour is None:
        price_per_hour = plan_price(p)
    task, config = render_text(p, price_per_hour)
    return {task_path(p.name): task, config_path(p.name): config}


def plan_price(p: Profile) -> float:
    """$/h used in the rendered envs: the shipped catalog (offline), else the profile's fallback.
    Local profiles use their notional price. `launch up` replaces it with the live price if known."""
    if p.cluster.is_local:
        return p.budget.price_per_hour or 0.0
    from .catalog import PlanError, catalog_price

    try:
        return catalog_price(p)
    except PlanError:
        if p.budget.price_per_hour is None:
            raise
        return p.budget.price_per_hour


def render_all(names: Optional[list[str]] = None) -> dict[Path, str]:
    out: dict[Path, str] = {}
    for n in names or profile_names():
        out.update(render_profile(n))
    return out


def stale(rendered: dict[Path, str]) -> list[tuple[Path, str]]:
    """(path, unified diff) for every rendered file that differs from what is on disk."""
    out = []
    for path, text in rendered.items():
        old = path.read_text() if path.exists() else ""
        if old != text:
            rel = path.relative_to(REPO_ROOT)
            diff = "".join(difflib.unified_diff(old.splitlines(True), text.splitlines(True),
                                                f"a/{rel}", f"b/{rel}"))
            out.append((path, diff))
    return out


def write(rendered: dict[Path, str]) -> list[Path]:
    written = []
    for path, text in rendered.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != text:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.replace(path)
            written.append(path)
    return written
