"""The SkyPilot task a run launches: SkyPilot's own parse of the rendered `sky/<profile>.yaml`, with the
run id, launch's envs and the secret values added in memory only, and the cluster name a run id gets."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Optional

import yaml

from launcher.profiles.uploads import stage_workdir
from ..base import LaunchSpec
from ..tasks import workdir_files
from .sdk import sdk


def cluster_name(run_id: str) -> str:
    """A valid SkyPilot cluster name (letters, digits, dashes; starts with a letter) for a run id."""
    name = re.sub(r"[^a-z0-9-]+", "-", run_id.lower()).strip("-")
    if not name or not name[0].isalpha():
        name = f"launch-{name}".rstrip("-")
    if len(name) > 63:
        name = f"{name[:56].rstrip('-')}-{hashlib.sha1(run_id.encode(), usedforsecurity=False).hexdigest()[:6]}"
    return name


def build_task(spec: LaunchSpec, volume_name: Optional[str] = None):
    """SkyPilot's parse of the rendered task, with launch's envs and the secret values.

    Secrets go in as `secrets_overrides` (what `sky launch --secret NAME` does), not through
    `Task.update_secrets` after parsing: SkyPilot 0.14 turns every `NAME: null` secret into a
    managed-secret reference that `update_secrets` leaves in place, and the API server then
    refuses the launch ("No value available for secret(s)"). Secrets the user did not set are
    dropped from the task; the payload's preflight says which stage needs one.
    """
    sky = sdk()
    task_yaml = Path(spec.task_yaml).resolve()
    config = yaml.safe_load(task_yaml.read_text())
    given = {k: v for k, v in spec.secrets.items() if v}
    inline = {k: v for k, v in (config.get("secrets") or {}).items() if v is not None}
    config["secrets"] = {**inline, **{k: None for k in given}}
    if not config["secrets"]:
        config.pop("secrets")
    if config.get("workdir"):  # rendered tasks say `workdir: .`; upload exactly the allowlist instead
        config_rel = (config.get("envs") or {}).get("LAUNCH_CONFIG") or f"sky/config/{spec.config_yaml.name}"
        files = workdir_files(spec.profile, Path(spec.config_yaml), config_rel)
        config["workdir"] = str(stage_workdir(spec.run.id, files))
    if volume_name and config.get("volumes"):  # an adopted volume is mounted under its cloud name
        config["volumes"] = {m: (volume_name if n == spec.profile.cluster.volume.name else n)
                             for m, n in config["volumes"].items()}
    envs = {**spec.envs, "LAUNCH_RUN_ID": spec.run.id}
    return sky.Task.from_yaml_config(config, env_overrides=list(envs.items()),
                                     secrets_overrides=list(given.items()))
