"""What a SkyPilot run costs per hour: RunPod's live price, else SkyPilot's optimizer on the shipped
catalog snapshot, else the profile's own figure."""

from __future__ import annotations

import os

from ... import sky_internals
from ...catalog import SNAPSHOT_DATE, choice_apart
from ...profiles.schema import slurm_price


def hourly_price(profile, live: bool = True) -> tuple[float, str]:
    """($/h for the whole cluster, where it came from): RunPod's API (unless `live` is False), else
    the catalog snapshot through SkyPilot's optimizer, else the profile's budget.price_per_hour."""
    c = profile.cluster
    if c.on_slurm:  # your own cluster: no catalog or API knows its price
        return slurm_price(profile)
    if live and os.environ.get("RUNPOD_API_KEY") and any(i.split("/")[0] == "runpod" for i in c.infra_list):
        try:
            return _runpod_api_price(profile, picked_accelerator(profile)), "runpod-api"
        except Exception:  # noqa: BLE001 - any API problem falls through to the catalog
            pass
    if not c.is_local:
        try:
            return _catalog_choice(profile)[0], f"catalog {SNAPSHOT_DATE}"
        except Exception:  # noqa: BLE001
            pass
    if profile.budget.price_per_hour is not None:
        return float(profile.budget.price_per_hour), "profile"
    return 0.0, "unknown"


def picked_accelerator(profile) -> str:
    """The accelerator spec (`RTX4090:1`) the run gets: the profile's only one, or, for a list
    (SkyPilot `any_of`), the one SkyPilot's optimizer takes on the catalog snapshot, the cheapest it
    can place, which need not be the first listed. The live price and a new volume's datacenter
    follow it (the volume pins where the run can go)."""
    options = profile.cluster.accelerator_options
    if len(options) <= 1:
        return options[0] if options else ""
    return _catalog_choice(profile)[1]


def _catalog_choice(profile) -> tuple[float, str]:
    """($/h, accelerator spec taken) from SkyPilot's optimizer on the shipped snapshot, in a child
    process (this one goes on to use the SDK) and once per profile per process: `launch up` asks for
    the price, for a new volume the pick, and the budget gate plans with the same answer."""
    choice = choice_apart(profile)
    return choice.price_per_hour, choice.accelerators


def _runpod_api_price(profile, accelerator: str) -> float:
    """Secure-cloud price per GPU of `accelerator` (`NAME:COUNT`, the one the run gets) from RunPod's
    GraphQL API (the `runpod` SDK) x GPUs x nodes."""
    import runpod

    gpu_ids = sky_internals.runpod_gpu_name_map()

    c = profile.cluster
    gpu = runpod.get_gpu(gpu_ids[accelerator.partition(":")[0]], gpu_quantity=c.gpus_per_node,
                         api_key=os.environ["RUNPOD_API_KEY"])
    lowest = gpu.get("lowestPrice") or {}
    per_gpu = (gpu.get("secureSpotPrice") or lowest.get("minimumBidPrice")) if c.use_spot else \
        (gpu.get("securePrice") or lowest.get("uninterruptablePrice"))
    if not per_gpu:
        raise ValueError(f"RunPod lists no price for {accelerator}")
    return round(float(per_gpu) * c.gpus_per_node * c.num_nodes, 4)
