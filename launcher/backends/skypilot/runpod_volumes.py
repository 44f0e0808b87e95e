"""Where a profile's network volume lives: reused by name, or created where the GPUs are in stock.

A RunPod network volume sits in one datacenter and pins every pod that mounts it there (SkyPilot
cannot move a volume-bound job to another datacenter). So:
- a volume SkyPilot already knows is reused as it is;
- a RunPod volume of the same name that SkyPilot does not know (made by hand, or by another SkyPilot
  API server) is adopted with SkyPilot's `use_existing`, keeping its model cache (65 GB not downloaded
  again). SkyPilot names the RunPod volumes it creates `<name>-<userhash>-<uuid6>`
  (sdk.skypilot_volume_names), and `use_existing` looks the cloud volume up by the SkyPilot
  volume's own name, so such a volume is adopted under its cloud name and the task mounts that name;
- a new volume goes to a datacenter that offers the instance in the catalog snapshot AND has the GPUs
  in stock now (RunPod's GraphQL `lowestPrice(dataCenterId)` stockStatus, one query for all
  datacenters), datacenters with RunPod's S3 API first (results come home without a running pod).
  Without a RunPod API key here there is no stock to ask: the S3 datacenters come first.
"""

from __future__ import annotations

import csv
import os
from typing import Optional

from ... import sky_internals
from ...errors import BackendError
from launcher.profiles.profile import CATALOG_DIR
from .price import picked_accelerator

# RunPod datacenters with the S3-compatible API (docs.runpod.io/storage/s3-api), in this order of
# preference when nothing else decides.
S3_DATACENTERS = ("US-CA-2", "EU-RO-1", "EU-CZ-1", "EUR-IS-1", "EUR-NO-1", "US-GA-2", "US-KS-2",
                  "US-MD-1", "US-MO-2", "US-NC-1", "US-NC-2")
STOCK_RANK = {"High": 0, "Medium": 1, "Low": 2}


def api_key() -> Optional[str]:
    if os.environ.get("RUNPOD_API_KEY"):
        return os.environ["RUNPOD_API_KEY"]
    try:
        import runpod

        return getattr(runpod, "api_key", None) or None
    except ImportError:
        return None


def catalog_zones(profile, accelerator: Optional[str] = None) -> list[tuple[str, str]]:
    """(region, datacenter) pairs of the catalog snapshot offering the profile's instance (of
    `accelerator`, `NAME:COUNT`, when given: the any_of option the run gets)."""
    c = profile.cluster
    name = accelerator.partition(":")[0] if accelerator else c.accelerator_name
    with (CATALOG_DIR / "runpod" / "vms.csv").open() as f:
        rows = [r for r in csv.DictReader(f) if r["AcceleratorName"] == name
                and float(r["AcceleratorCount"] or 0) == c.gpus_per_node
                and (not c.region or r["Region"] == c.region)]
    return list(dict.fromkeys((r["Region"], r["AvailabilityZone"]) for r in rows))


def region_of(datacenter: str) -> str:
    """RunPod region (country code, as in SkyPilot's catalog) of a datacenter id like EU-RO-1."""
    with (CATALOG_DIR / "runpod" / "vms.csv").open() as f:
        found = next((r["Region"] for r in csv.DictReader(f) if r["AvailabilityZone"] == datacenter), None)
    if found:
        return found
    parts = datacenter.split("-")
    return parts[0] if parts[0] in ("US", "CA") else parts[1]


def gpu_stock(accelerator: str, count: int, datacenters: list[str], key: str) -> dict[str, str]:
    """{datacenter: "High" | "Medium" | "Low" | ""} for secure-cloud pods of `count` GPUs, one query."""
    from runpod.api.graphql import run_graphql_query

    gpu_ids = sky_internals.runpod_gpu_name_map()

    fields = " ".join(f'd{i}: lowestPrice(input: {{gpuCount: {count}, dataCenterId: "{dc}", secureCloud: true}}) '
                      "{ stockStatus }" for i, dc in enumerate(datacenters))
    query = f'query {{ gpuTypes(input: {{id: "{gpu_ids[accelerator]}"}}) {{ {fields} }} }}'
    gpu = (run_graphql_query(query, api_key=key).get("data") or {}).get("gpuTypes") or [{}]
    return {dc: ((gpu[0] or {}).get(f"d{i}") or {}).get("stockStatus") or "" for i, dc in enumerate(datacenters)}


def runpod_volumes() -> list[dict]:
    """RunPod's network volumes (id, name, size, dataCenterId), through SkyPilot's RunPod REST adaptor."""
    listed = sky_internals.runpod_rest_request("GET", "/networkvolumes")
    if isinstance(listed, dict):  # some deployments wrap the list (SkyPilot handles the same keys)
        listed = next((listed[k] for k in ("items", "data", "networkVolumes") if k in listed), [])
    return listed if isinstance(listed, list) else []


def _s3_first(zone: str) -> tuple[bool, int]:
    return zone not in S3_DATACENTERS, S3_DATACENTERS.index(zone) if zone in S3_DATACENTERS else 0


def new_volume_infra(profile, key: Optional[str]) -> str:
    """`runpod/REGION/DATACENTER` for a new volume: in stock now, S3 API first (module docstring)."""
    c = profile.cluster
    picked = picked_accelerator(profile)  # an any_of list: the option SkyPilot takes, not the first listed
    zones = catalog_zones(profile, picked)
    where = f" in region {c.region}" if c.region else ""
    if not zones:
        raise BackendError(f"no RunPod datacenter in the catalog snapshot offers {picked}{where}: "
                           "change cluster.accelerators or cluster.region")
    stock = {}
    if key:
        try:
            stock = gpu_stock(picked.partition(":")[0], c.gpus_per_node, [z for _, z in zones], key)
        except Exception:  # noqa: BLE001 - no stock answer: fall back to the S3-first order
            stock = {}
    if any(stock.values()):
        zones = [rz for rz in zones if stock.get(rz[1]) in STOCK_RANK]
        if not zones:
            raise BackendError(f"RunPod has no {picked} in stock in any datacenter{where} right now; "
                               "nothing was created: retry later, or drop cluster.region")
        zones.sort(key=lambda rz: (STOCK_RANK[stock[rz[1]]], *_s3_first(rz[1])))
    else:
        zones.sort(key=lambda rz: _s3_first(rz[1]))
    region, zone = zones[0]
    return f"runpod/{region}/{zone}"


def existing_volume(name: str, volumes: list[dict]) -> Optional[dict]:
    """The RunPod volume called `name`, else one SkyPilot created for `name` (its generated cloud
    name), the largest first: the one most likely to hold the model cache."""
    from .sdk import skypilot_volume_names

    exact = [x for x in volumes if x.get("name") == name]
    alias = skypilot_volume_names(name)
    made = sorted((x for x in volumes if alias.match(str(x.get("name", "")))), key=lambda x: -(x.get("size") or 0))
    return (exact or made or [None])[0]


def volume_config(profile) -> tuple[dict, str]:
    """(SkyPilot volume config to apply, "adopted" | "created") for a volume SkyPilot does not know."""
    v = profile.cluster.volume
    if v.type == "k8s-pvc":
        return {"name": v.name, "type": v.type, "infra": "kubernetes", "size": f"{v.size_gb}GB"}, "created"
    key = api_key()
    if key:
        try:
            found = existing_volume(v.name, runpod_volumes())
        except Exception:  # noqa: BLE001 - cannot list: create as before
            found = None
        if found and found.get("dataCenterId"):
            dc = found["dataCenterId"]
            return {"name": found["name"], "type": v.type, "infra": f"runpod/{region_of(dc)}/{dc}",
                    "use_existing": True}, "adopted"
    return {"name": v.name, "type": v.type, "infra": new_volume_infra(profile, key),
            "size": f"{v.size_gb}GB"}, "created"


def stock_note(profile, zone: Optional[str]) -> Optional[str]:
    """A line when the GPUs are out of stock in an existing volume's datacenter (None: fine or unknown)."""
    c, key = profile.cluster, api_key()
    if not key or not zone or c.volume.type != "runpod-network-volume":
        return None
    try:
        stock = gpu_stock(c.accelerator_name, c.gpus_per_node, [zone], key)
    except Exception:  # noqa: BLE001
        return None
    if stock.get(zone) in STOCK_RANK:
        return None
    return (f"RunPod reports no {c.accelerators_label} in stock in {zone}, where volume {c.volume.name} lives; "
            f"the launch may wait or fail for capacity (move it: `launch volumes rm {c.volume.name}`, "
            "then `launch up` creates it where the GPUs are, and downloads the model again)")
