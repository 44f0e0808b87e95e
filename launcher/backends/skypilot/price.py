"""What a SkyPilot run costs per hour: RunPod's live price, else SkyPilot's optimizer on the shipped
catalog snapshot, else the profile's own figure."""

from __future__ import annotations

import os
import subprocess
import sys

from ...profile import REPO_ROOT

PRICE_TIMEOUT_S = 120


def hourly_price(profile, live: bool = True) -> tuple[float, str]:
    """($/h for the whole cluster, where it came from): RunPod's API (unless `live` is False), else
    the catalog snapshot through SkyPilot's optimizer, else the profile's budget.price_per_hour."""
    c = profile.cluster
    if live and os.environ.get("RUNPOD_API_KEY") and any(i.split("/")[0] == "runpod" for i in c.infra_list):
        try:
            return _runpod_api_price(profile), "runpod-api"
        except Exception:  # noqa: BLE001 - any API problem falls through to the catalog
            pass
    if not c.is_local:
        try:
            from ...catalog import SNAPSHOT_DATE

            return _catalog_price(profile), f"catalog {SNAPSHOT_DATE}"
        except Exception:  # noqa: BLE001
            pass
    if profile.budget.price_per_hour is not None:
        return float(profile.budget.price_per_hour), "profile"
    return 0.0, "unknown"


def _catalog_price(profile) -> float:
    """SkyPilot's optimizer on the shipped snapshot, in a child process unless this one already
    imported `sky` for offline planning: `import_sky_offline()` points SKY_RUNTIME_DIR at launch's
    offline dir and seeds its enabled-clouds cache, which must not reach a process that goes on to
    use the SDK (a local API server would start there), nor ~/.sky when `sky` is imported normally."""
    from ...catalog import offline_runtime_dir, optimize

    if "sky" in sys.modules and os.environ.get("SKY_RUNTIME_DIR") == str(offline_runtime_dir()):
        return optimize(profile).price_per_hour
    code = ("import json, sys; from launcher.catalog import optimize; from launcher.profile import Profile; "
            "print(optimize(Profile.model_validate(json.load(sys.stdin))).price_per_hour)")
    done = subprocess.run([sys.executable, "-c", code], input=profile.model_dump_json(), text=True,
                          capture_output=True, timeout=PRICE_TIMEOUT_S, cwd=REPO_ROOT)
    if done.returncode != 0:
        raise RuntimeError(done.stderr.strip()[-300:])
    return float(done.stdout.split()[-1])


def _runpod_api_price(profile) -> float:
    """Secure-cloud price per GPU from RunPod's GraphQL API (the `runpod` SDK) x GPUs x nodes."""
    import runpod
    from sky.provision.runpod.utils import GPU_NAME_MAP

    c = profile.cluster
    gpu = runpod.get_gpu(GPU_NAME_MAP[c.accelerator_name], gpu_quantity=c.gpus_per_node,
                         api_key=os.environ["RUNPOD_API_KEY"])
    lowest = gpu.get("lowestPrice") or {}
    per_gpu = (gpu.get("secureSpotPrice") or lowest.get("minimumBidPrice")) if c.use_spot else \
        (gpu.get("securePrice") or lowest.get("uninterruptablePrice"))
    if not per_gpu:
        raise ValueError(f"RunPod lists no price for {c.accelerators_label}")
    return round(float(per_gpu) * c.gpus_per_node * c.num_nodes, 4)
