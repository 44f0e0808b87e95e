"""What a profile keeps on its volume, bucket and disk, and what that storage costs per month.

Storage bills while it exists, whether a machine runs or not: `launch down` stops the machines, not
the volume or bucket (they hold the model cache and checkpoints a resume needs). Prices per GB-month
come from launcher/catalog/extract/storage_prices.csv (each row cites its pricing page).

Sizes (estimates, decimal GB):
- model: parameters x 2 bytes (bf16 safetensors, what the hub serves; QLoRA quantizes after download)
- checkpoint: full fine-tuning 14 bytes/parameter (bf16 weights + fp32 master weights and Adam m, v, as
  DeepSpeed saves them); LoRA 12 bytes per trainable parameter (fp32 adapter + Adam m, v)
- kept checkpoints: keep_best + keep_recent (an upper bound: one checkpoint can be both)
- merged model: as big as the model; packages: ~20 GB (torch, CUDA libraries, flash-attn, deepspeed)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

from payload.model.memory import dims_from_name, lora_trainable_params

from launcher.catalog import storage_price

GB = 1e9
PACKAGES_GB = 20.0
MIN_DISK_GB = 50


@dataclass
class Storage:
    kind: str  # "volume" | "bucket"
    name: str
    type: str  # runpod-network-volume, k8s-pvc, s3, azure, gcs, r2
    size_gb: float  # provisioned size (volume); for a bucket: the estimate of what it will hold
    needed_gb: float  # what the run writes there (estimate)
    usd_per_gb_month: Optional[float]
    usd_per_month: Optional[float]
    price_source: str

    def to_dict(self) -> dict:
        return asdict(self)


def model_gb(p) -> float:
    dims = None if p.model.tiny is not None else dims_from_name(p.model.name_or_path)
    return dims.params * 2 / GB if dims else 0.0


def checkpoint_gb(p) -> float:
    dims = None if p.model.tiny is not None else dims_from_name(p.model.name_or_path)
    if dims is None:
        return 0.0
    if p.train.method == "full":
        return dims.params * 14 / GB
    return lora_trainable_params(p, dims) * 12 / GB


def footprint_gb(p) -> dict[str, float]:
    """What the run writes under its volume/bucket (HF cache, checkpoints, outputs), by item."""
    ck = p.train.checkpoints
    items = {"model cache": model_gb(p), "checkpoints": checkpoint_gb(p) * (ck.keep_best + ck.keep_recent)}
    if p.outputs.merge or p.outputs.push_to_hub:
        items["merged model"] = model_gb(p)
    if p.train.method == "full":
        items["final weights"] = model_gb(p)
    return {k: round(v, 1) for k, v in items.items() if v}


def storage_for(p) -> list[Storage]:
    """The profile's volume and bucket with size and $/month (empty for local profiles)."""
    c, out = p.cluster, []
    needed = round(sum(footprint_gb(p).values()), 1)
    if c.volume:
        price, source = storage_price(c.volume.type)
        out.append(Storage("volume", c.volume.name, c.volume.type, float(c.volume.size_gb), needed, price,
                           None if price is None else round(price * c.volume.size_gb, 2), source))
    if c.bucket:
        price, source = storage_price(c.bucket.store)
        out.append(Storage("bucket", c.bucket.name, c.bucket.store, needed, needed, price,
                           None if price is None else round(price * needed, 2), source))
    return out


def disk_needed_gb(p) -> int:
    """Per-node boot/container disk the run needs: packages, plus what passes through the disk.

    With a network volume everything big lives there. A bucket mounted MOUNT_CACHED (rclone
    `--vfs-cache-mode full`, no size cap) keeps what went through it in the last hour on local disk:
    the model cache and this node's share of one checkpoint. Without either, everything is local."""
    c = p.cluster
    if c.is_local:
        return 0
    if c.volume or c.on_slurm:  # on Slurm, everything big is on the shared filesystem
        extra = 0.0
    elif c.bucket:
        extra = model_gb(p) + checkpoint_gb(p) / max(c.num_nodes, 1)
    else:
        extra = sum(footprint_gb(p).values())
    return max(MIN_DISK_GB, int(round((PACKAGES_GB + extra) * 1.1 / 10.0)) * 10)
