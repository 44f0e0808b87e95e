"""Regenerate the offline SkyPilot catalog snapshot shipped with `launch` (v8 CSV format).

    python -m launcher.catalog.build_snapshot

Why a snapshot: `launch plan` must work with no network and no credentials, so it runs SkyPilot's
own optimizer against these files (a catalog file with no `.meta/*.md5` beside it counts as
user-made and is never re-downloaded). Prices are list prices per *instance* hour as recorded on
SNAPSHOT_DATE (sources in launcher/catalog/README.md); `launch plan --live` or RUNPOD_API_KEY
refreshes them. Edit the tables below, re-run, commit the CSVs.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

SNAPSHOT_DATE = "2026-11-21"
HERE = Path(__file__).parent / "v8"

# RunPod secure cloud: (accelerator, $/GPU-h on-demand, $/GPU-h spot, vCPUs/GPU, RAM GiB/GPU, VRAM MiB)
RUNPOD_GPUS = [
    ("H100-SXM", 2.69, 2.69, 20.0, 125.0, 81559),
    ("H100", 2.39, 1.75, 16.0, 176.0, 81559),
    ("A100-80GB", 1.39, 0.82, 8.0, 117.0, 81920),
    ("A100-80GB-SXM", 1.49, 1.19, 16.0, 117.0, 81920),
    ("L40S", 0.86, 0.53, 12.0, 62.0, 46068),
    ("RTX4090", 0.69, 0.34, 6.0, 41.0, 24564),
]
RUNPOD_ZONES = {"US": ["US-CA-2", "US-GA-1"], "CA": ["CA-MTL-1"], "RO": ["EU-RO-1"], "SE": ["EU-SE-1"]}

# Azure (multi-node capable): (instance, accelerator, count, vCPUs, RAM GiB, $/h, spot $/h, region)
AZURE_VMS = [
    ("Standard_NC96ads_A100_v4", "A100-80GB", 4, 96.0, 880.0, 14.69, 5.88, "eastus"),
    ("Standard_NC96ads_A100_v4", "A100-80GB", 4, 96.0, 880.0, 14.69, 5.88, "southcentralus"),
    ("Standard_NC96ads_A100_v4", "A100-80GB", 4, 96.0, 880.0, 16.16, 6.46, "westeurope"),
    ("Standard_ND96amsr_A100_v4", "A100-80GB", 8, 96.0, 1924.0, 32.77, 13.11, "eastus"),
    ("Standard_D8s_v5", None, None, 8.0, 32.0, 0.384, 0.077, "eastus"),
]


def gpu_info(name: str, count: int, vram_mib: int) -> str:
    info = {"Gpus": [{"Name": name, "Manufacturer": "NVIDIA", "Count": count,
                      "MemoryInfo": {"SizeInMiB": vram_mib}}],
            "TotalGpuMemoryInMiB": vram_mib * count}
    return json.dumps(info).replace('"', "'")


def write(rel: str, header: list[str], rows: list[list]) -> None:
    path = HERE / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(header)
        w.writerows(rows)


def main() -> None:
    rows = []
    for acc, price, spot, vcpu, mem, vram in RUNPOD_GPUS:
        for count in (1, 2, 4, 8):
            for region, zones in RUNPOD_ZONES.items():
                for zone in zones:
                    rows.append([f"{count}x_{acc}_SECURE", acc, float(count), vcpu * count,
                                 mem * count, region, round(spot * count, 2), round(price * count, 2),
                                 zone, gpu_info(acc, count, vram)])
    write("runpod/vms.csv", ["InstanceType", "AcceleratorName", "AcceleratorCount", "vCPUs",
                             "MemoryGiB", "Region", "SpotPrice", "Price", "AvailabilityZone",
                             "GpuInfo"], rows)
    rows = []
    for inst, acc, count, vcpu, mem, price, spot, region in AZURE_VMS:
        info = gpu_info(acc, count, 81920) if acc else ""
        rows.append([inst, acc or "", float(count) if count else "", vcpu, mem, info, price, spot,
                     region, 2])
    write("azure/vms.csv", ["InstanceType", "AcceleratorName", "AcceleratorCount", "vCPUs",
                            "MemoryGiB", "GpuInfo", "Price", "SpotPrice", "Region", "Generation"], rows)
    write("azure/images.csv", ["Tag", "Region", "OS", "OSVersion", "ImageId", "CreationDate"],
          [["skypilot:gpu-ubuntu-2204", "", "ubuntu", "22.04", "microsoft-dsvm:ubuntu-hpc:2204:latest",
            SNAPSHOT_DATE]])
    accs = sorted({a for a, *_ in RUNPOD_GPUS} | {"A100-80GB"})
    write("common/accelerators.csv", ["AcceleratorName", "Clouds"],
          [[a, str(["RunPod", "Azure"] if a == "A100-80GB" else ["RunPod"])] for a in accs])


if __name__ == "__main__":
    main()
