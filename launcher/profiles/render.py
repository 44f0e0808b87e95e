"""Profile -> SkyPilot task YAML (`sky/<profile>.yaml`) + resolved run config (`sky/config/<profile>.yaml`).

The rendered task is a plain SkyPilot task: `sky launch sky/sonia-h100.yaml` from the repo root works
without `launch`. It carries no secret values: `secrets:` names them, values come at launch time.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Callable, Optional

import yaml

from payload.config import dump_run_config
from payload.errors import RETRYABLE_EXIT_CODES

from launcher import project
from launcher.profiles.boundary import inside
from launcher.profiles.profile import (
    ProfileError,
    in_clusters,
    load_profile,
    profile_names,
    resolve_profile_path,
)
from launcher.profiles.schema import Profile

SECRETS = ("HF_TOKEN", "WANDB_API_KEY")
MASTER_PORT = 29500

# Prebuilt flash-attn wheel matching payload/requirements-gpu.lock (torch 2.8, CUDA 12, cp311, C++11
# ABI like PyPI's torch); tests/payload/preflight/test_gpu_env.py holds the two together.
FLASH_ATTN_WHEEL = (
    "https://github.com/Dao-AILab/flash-attention/releases/download/v2.8.3/"
    "flash_attn-2.8.3+cu12torch2.8cxx11abiTRUE-cp311-cp311-linux_x86_64.whl"
)
# The managed-jobs controller is a machine of its own (on RunPod a billed pod that cannot stop):
# `launch up` tears it down after this many idle minutes (SkyPilot config
# jobs.controller.resources.autostop; a task's `config:` block cannot set it in SkyPilot 0.14).
CONTROLLER_AUTOSTOP = {"idle_minutes": 10, "down": True}
# Bucket mounts (FUSE) are no place for a venv: those profiles keep the environment on node disk.
NODE_ENV_ROOT = "~/.cache/launch/envs"

SETUP = """\
set -euo pipefail
# The locked GPU stack in its own Python 3.11 environment, built once per lock and kept on the
# volume, so a recovery or a relaunch installs nothing (payload/gpu_env.sh).
source payload/gpu_env.sh
python -m payload preflight --config "$LAUNCH_CONFIG"
"""

RUN = """\
set -euo pipefail
source payload/gpu_env.sh
# One data-parallel job over every node: SkyPilot sets the node rank, IPs and GPU count.
MASTER_ADDR=$(echo "$SKYPILOT_NODE_IPS" | head -n1)
NPROC=${SKYPILOT_NUM_GPUS_PER_NODE:-1}; [ "$NPROC" -ge 1 ] || NPROC=1
# A failed stage ends the job with the payload's own code (payload/errors.py: 2 config/data, 3 budget,
# 5 stopped, 75 transient, 143 signal), not torchrun's 1; only 75 and 143 are retried (payload/exitcode.py).
# payload.train.torchrun is torchrun that ends a deliberate stop with its code and the payload's end line,
# not a ChildFailedError traceback.
SINCE=$(date +%%s)
fail() {
  code=$(python -m payload.exitcode --config "$LAUNCH_CONFIG" --since "$SINCE" "$1") || code=$1
  exit "${code:-$1}"
}
python -m payload data --config "$LAUNCH_CONFIG" || fail $?
python -m payload.train.torchrun --nnodes="$SKYPILOT_NUM_NODES" --nproc_per_node="$NPROC" \\
  --node_rank="$SKYPILOT_NODE_RANK" --master_addr="$MASTER_ADDR" --master_port="${LAUNCH_MASTER_PORT:-%(port)d}" \\
  -m payload train --config "$LAUNCH_CONFIG" || fail $?
if [ "$SKYPILOT_NODE_RANK" = "0" ]; then
  python -m payload post --config "$LAUNCH_CONFIG" || fail $?
fi
"""


def config_path(name: str) -> Path:
    """The project's `sky/config/<name>.yaml`."""
    return project.sky_dir() / "config" / f"{name}.yaml"


def task_path(name: str) -> Path:
    """The project's `sky/<name>.yaml`."""
    return project.sky_dir() / f"{name}.yaml"


def resolved_run_config(p: Profile, price_per_hour: Optional[float] = None):
    """The RunConfig the payload reads: profile sections minus cluster/budget, runtime filled in."""
    from payload.config import RunConfig

    body = p.model_dump(mode="json", exclude={"cluster", "budget", "estimate", "envs"})
    body["runtime"] = {
        **body["runtime"],
        "volume": p.runtime_volume(),
        "profile": p.name,
        "price_per_hour": price_per_hour if price_per_hour is not None else (p.budget.price_per_hour or 0.0),
        "budget_usd": p.budget.max_usd,
        "budget_warn_fraction": p.budget.warn_fraction,
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
    if len(c.accelerator_options) > 1:  # any of them: SkyPilot's optimizer takes the cheapest available
        resources["any_of"] = [{"accelerators": a} for a in c.accelerator_options]
    elif c.accelerators:
        resources["accelerators"] = c.accelerator_options[0]
    else:
        resources["cpus"] = "2+"
    if not c.is_local:
        resources["use_spot"] = c.use_spot
    if c.image_id:
        resources["image_id"] = c.image_id
    if c.use_spot:
        # Retry only what is transient (payload/errors.py). SkyPilot's max_restarts_on_errors would
        # also restart a budget stop or a config error, so it stays 0; recover_on_exit_codes has no
        # limit in SkyPilot, so the profile's count bounds it on the machine (payload/exitcode.py).
        resources["job_recovery"] = {"strategy": c.recovery_strategy, "max_restarts_on_errors": 0,
                                     "recover_on_exit_codes": list(RETRYABLE_EXIT_CODES)}
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
    if c.bucket:  # the GPU environment lives on the volume (payload/gpu_env.sh), else on node disk
        envs["LAUNCH_ENV_ROOT"] = NODE_ENV_ROOT
    if c.use_spot:
        envs["LAUNCH_MAX_RETRIES"] = str(c.max_restarts_on_errors)
    if not c.use_spot:
        # For a plain `sky launch` of a cluster: a stable run dir, so a relaunch resumes. `launch up`
        # always sets LAUNCH_RUN_ID to its run id; a plain `sky jobs launch` of a spot task falls back
        # to SKYPILOT_TASK_ID, which is stable across managed-job recoveries.
        envs["LAUNCH_RUN_ID"] = p.name
    if c.accelerator_name and "SXM" in c.accelerator_name and c.gpus_per_node > 1:
        envs["NCCL_P2P_LEVEL"] = "NVL"  # NVLink between SXM GPUs (runbook 000)
    envs.update(p.envs)  # the profile's own `envs:` (never secrets, never LAUNCH_*: launcher.profiles.profile)
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
    secrets = profile_secrets(p)
    if secrets:
        task["secrets"] = {s: None for s in secrets}
    task["setup"] = SETUP
    task["run"] = RUN % {"port": MASTER_PORT}
    return task


def profile_secrets(p: Profile) -> tuple[str, ...]:
    """The secrets a profile's task names. Each listed one must be given to a plain `sky launch`
    (`--secret NAME`), so optional ones are listed only when the profile uses them: HF_TOKEN when
    anything comes from or goes to the Hugging Face hub, WANDB_API_KEY when it reports to wandb."""
    from payload.config.evaluation import wandb_wanted

    hub = (p.model.tiny is None or p.outputs.push_to_hub
           or any(s.hf_dataset for s in p.data.sources))
    wandb = wandb_wanted(p)
    return tuple(s for s, used in zip(SECRETS, (hub, wandb)) if used)


def launch_command(p: Profile) -> list[str]:
    """The plain SkyPilot command that runs a rendered task the way `launch up` does, as lines."""
    secrets = "".join(f" --secret {s}" for s in profile_secrets(p))
    if p.cluster.use_spot:  # a managed job, its controller torn down when idle (CONTROLLER_AUTOSTOP)
        lines = [f"sky jobs launch sky/{p.name}.yaml{secrets}",
                 *(f"  --config jobs.controller.resources.autostop.{k}={str(v).lower()}"
                   for k, v in CONTROLLER_AUTOSTOP.items())]
        return [line + " \\" for line in lines[:-1]] + lines[-1:]
    if p.cluster.is_local:  # a machine of your own, as a SkyPilot SSH node pool (~/.sky/ssh_node_pools.yaml)
        return [f"sky launch sky/{p.name}.yaml{secrets} --infra ssh/MY_POOL"]
    return [f"sky launch sky/{p.name}.yaml{secrets} --idle-minutes-to-autostop "
            f"{p.cluster.autostop_minutes} --down"]


class _Dumper(yaml.SafeDumper):
    pass


def _str_presenter(dumper, data):
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str_presenter)


PLAIN_HEADER = "# Plain SkyPilot works too, from the repo root:\n"
# A local profile names no cloud: a plain `sky launch` of it lets SkyPilot's optimizer rent the cheapest
# cloud machine that fits (a billed pod with the task's disk), not this machine.
LOCAL_HEADER = ("# Runs on this machine with `launch up {name}`. A plain `sky launch` of this file would rent\n"
                "# the cheapest cloud machine that fits; to run it on a machine of your own with SkyPilot,\n"
                "# make it an SSH node pool (~/.sky/ssh_node_pools.yaml) and name it, from the repo root:\n")


def render_text(p: Profile, price_per_hour: float) -> tuple[str, str]:
    """(task YAML, resolved run config YAML) for a profile, deterministic."""
    header = (f"# Rendered by `launch render {p.name}` from clusters/{p.name}.yaml - do not edit here.\n"
              + (LOCAL_HEADER.format(name=p.name) if p.cluster.is_local else PLAIN_HEADER)
              + "".join(f"#   {line}\n" for line in launch_command(p)))
    task = yaml.dump(task_dict(p, price_per_hour), Dumper=_Dumper, sort_keys=False, width=100)
    cfg = resolved_run_config(p, price_per_hour)
    config = (f"# Resolved run config for `python -m payload STAGE --config`, rendered from "
              f"clusters/{p.name}.yaml - do not edit here.\n" + dump_run_config(cfg))
    return header + task, config


def render_profile(name: str, price_of: Callable[[Profile], float]) -> dict[Path, str]:
    """{sky/<name>.yaml: task, sky/config/<name>.yaml: config}, the envs priced by `price_of(profile)`
    (`launch render` passes launcher.catalog.plan_price: pricing needs the rendered task, so it lives
    above this module)."""
    path = resolve_profile_path(name)
    p = load_profile(str(path))  # its own problems first
    if not in_clusters(path):
        raise ProfileError([f"{name}: only the profiles in clusters/ render into sky/ (the committed renders CI "
                            "checks; a file from elsewhere would overwrite the one its `name:` names): copy it to "
                            "clusters/ (`launch init NAME --from PROFILE` makes one), or see its task with "
                            f"`launch up {name} --dry-run`, which renders it for the run and writes nothing"])
    task, config = render_text(p, price_of(p))
    return {task_path(p.name): task, config_path(p.name): config}


def render_all(names: Optional[list[str]], price_of: Callable[[Profile], float]) -> dict[Path, str]:
    out: dict[Path, str] = {}
    for n in names or profile_names():
        out.update(render_profile(n, price_of))
    from launcher.profiles.schema_json import schema_path, schema_text

    out[schema_path()] = schema_text()  # the editors' schema each profile names (schema_json.py)
    return out


def stale(rendered: dict[Path, str]) -> list[tuple[Path, str]]:
    """(path, unified diff) for every rendered file that differs from what is on disk."""
    out = []
    for path, text in rendered.items():
        old = path.read_text() if path.exists() else ""
        if old != text:
            rel = path.relative_to(project.root())
            diff = "".join(difflib.unified_diff(old.splitlines(True), text.splitlines(True),
                                                f"a/{rel}", f"b/{rel}"))
            out.append((path, diff))
    return out


def write(rendered: dict[Path, str]) -> list[Path]:
    """Write the rendered files that changed; each must lie inside sky/ by the boundary rule (a sky/
    or sky/config/ that is a link out of the repo is refused, not written through)."""
    written = []
    for path, text in rendered.items():
        sky_dir = project.sky_dir()
        if inside(sky_dir, path) is None:
            raise ProfileError([f"{path}: outside sky/ (a link out of the project?); launch render writes only "
                                f"into {sky_dir}: make sky/ and sky/config/ plain directories"])
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != text:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.replace(path)
            written.append(path)
    return written
