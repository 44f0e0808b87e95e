"""Helpers for the artifact-contract tests (not a conftest: import explicitly).

- `make_run_dir`: a finished run directory as the payload leaves it (real safetensors files, a
  checkpoint listing's inputs, logs, and files that are NOT artifacts: data splits, status, cost),
  without training anything. `JOB` is the bash job that copies it into place on "the machine" and
  runs the real manifest step (`python -m payload manifest`), as the rendered task's `post` does.
- `FakeS3`: a boto3 S3 client over a local directory (the RunPod network volume's S3 API stand-in),
  S3 semantics for `list_objects_v2` (Prefix, Delimiter, pagination) and `get_object`; extra keys
  can be planted to play a hostile bucket.
"""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

# The run directory's files relative to it, and where the contract puts each one at home.
HOME_LAYOUT = {
    "outputs/adapter/adapter_model.safetensors": "adapter/adapter_model.safetensors",
    "outputs/adapter/adapter_config.json": "adapter/adapter_config.json",
    "outputs/adapter/tokenizer.json": "adapter/tokenizer.json",
    "outputs/mlx/adapters.safetensors": "mlx/adapters.safetensors",
    "outputs/mlx/adapter_config.json": "mlx/adapter_config.json",
    "outputs/training_summary.json": "training_summary.json",
    "outputs/loss.png": "loss.png",
    "outputs/high_loss_samples.jsonl": "high_loss_samples.jsonl",
    "metrics.jsonl": "metrics.jsonl",
    "data/data_stats.json": "data_stats.json",
    "logs/rank_0_traceback.log": "logs/rank_0_traceback.log",
}
MERGED = {"outputs/merged/model.safetensors": "merged/model.safetensors",
          "outputs/merged/config.json": "merged/config.json"}
NOT_ARTIFACTS = ("data/train.jsonl", "data/val.jsonl", "status.json", "cost.json", "config.yaml",
                 "checkpoints/checkpoint-4/optimizer.pt", "base_model/model.safetensors")

JOB = r"""set -euo pipefail
RD="$LAUNCH_VOLUME/runs/$LAUNCH_RUN_ID"
mkdir -p "$RD"
cp -a "$CONTRACT_TEMPLATE/." "$RD/"
echo "contract job: node $SKYPILOT_NODE_RANK wrote $RD"
echo "contract job: temp $(mktemp -d)"  # where the machine's temporary files go (the run's own on local/ssh)
python -m payload manifest --config "$LAUNCH_CONFIG"
"""


def _tensors(seed: int, rows: int) -> dict:
    rng = np.random.default_rng(seed)
    return {"base_model.model.layers.0.self_attn.q_proj.lora_A.weight": rng.standard_normal((rows, 8), np.float32),
            "base_model.model.layers.0.self_attn.q_proj.lora_B.weight": rng.standard_normal((8, rows), np.float32)}


def make_run_dir(rd: Path) -> Path:
    """A completed run's directory (merge and MLX export done), about 150 kB."""
    def write(rel: str, data) -> None:
        p = rd / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data if isinstance(data, bytes) else data.encode())

    for rel, seed, rows in (("outputs/adapter/adapter_model.safetensors", 1, 64),
                            ("outputs/mlx/adapters.safetensors", 2, 64),
                            ("outputs/merged/model.safetensors", 3, 256),
                            ("checkpoints/checkpoint-4/adapter_model.safetensors", 4, 64),
                            ("checkpoints/checkpoint-8/adapter_model.safetensors", 5, 64),
                            ("base_model/model.safetensors", 6, 64)):
        (rd / rel).parent.mkdir(parents=True, exist_ok=True)
        save_file(_tensors(seed, rows), str(rd / rel))
    write("outputs/adapter/adapter_config.json", json.dumps({"r": 8, "lora_alpha": 16}))
    write("outputs/adapter/tokenizer.json", json.dumps({"model": "tiny"}) * 50)
    write("outputs/mlx/adapter_config.json", json.dumps({"fine_tune_type": "lora", "num_layers": 2}))
    write("outputs/merged/config.json", json.dumps({"model_type": "qwen3"}))
    write("outputs/training_summary.json", json.dumps({"state": "completed", "steps": 8, "final_loss": 1.25,
                                                       "final_eval_loss": 1.5, "cost_usd": 0.001}))
    write("outputs/loss.png", b"\x89PNG\r\n\x1a\n" + os.urandom(2000))
    write("outputs/high_loss_samples.jsonl", "".join(json.dumps({"loss": 3.0 - i, "val_index": i}) + "\n"
                                                      for i in range(5)))
    write("metrics.jsonl", "".join(json.dumps({"step": s, "loss": 2.0 / s}) + "\n" for s in range(1, 9)))
    write("data/data_stats.json", json.dumps({"train": 60, "val": 6}))
    write("logs/rank_0_traceback.log", "no crash, just a file in logs/\n")
    write("checkpoints/checkpoint-4/optimizer.pt", os.urandom(3000))
    write("checkpoints/checkpoint-4/COMPLETE", json.dumps({"step": 4, "eval_loss": 1.75, "loss": 1.6}))
    write("checkpoints/checkpoint-8/COMPLETE", json.dumps({"step": 8, "eval_loss": 1.5, "loss": 1.25}))
    for rel in ("data/train.jsonl", "data/val.jsonl", "cost.json", "config.yaml"):
        write(rel, "{}\n")
    write("status.json", json.dumps({"state": "completed", "step": 8, "max_steps": 8, "loss": 1.25}))
    return rd


# ------------------------------------------------------------------------------------ S3 stand-in


class FakeS3:
    """A boto3 S3 client over a local directory: keys are paths relative to it (regular files only,
    as an object store has no symlinks), plus planted `extra` keys."""

    def __init__(self, root: Path, endpoint_url: str = "", region_name: str = "", extra=None, page_size=3):
        from types import SimpleNamespace

        self.root, self.extra, self.page_size = Path(root), dict(extra or {}), page_size
        self.meta = SimpleNamespace(endpoint_url=endpoint_url, region_name=region_name)
        self.calls: list[tuple[str, dict]] = []

    def _objects(self) -> dict[str, bytes | Path]:
        found: dict[str, bytes | Path] = {}
        for dirpath, _, files in os.walk(self.root, followlinks=False):
            for name in files:
                p = Path(dirpath) / name
                if p.is_file() and not p.is_symlink():
                    found[p.relative_to(self.root).as_posix()] = p
        found.update(self.extra)
        return found

    def list_objects_v2(self, Bucket, Prefix="", Delimiter=None, ContinuationToken=None, **kw):
        self.calls.append(("list_objects_v2", {"Bucket": Bucket, "Prefix": Prefix}))
        contents, prefixes = [], set()
        for key, obj in sorted(self._objects().items()):
            if not key.startswith(Prefix):
                continue
            rest = key[len(Prefix):]
            if Delimiter and Delimiter in rest:
                prefixes.add(Prefix + rest.split(Delimiter)[0] + Delimiter)
            else:
                size = len(obj) if isinstance(obj, bytes) else obj.stat().st_size
                contents.append({"Key": key, "Size": size})
        items = [("c", c) for c in contents] + [("p", {"Prefix": p}) for p in sorted(prefixes)]
        start = int(ContinuationToken or 0)
        page = items[start:start + self.page_size]
        more = start + self.page_size < len(items)
        out = {"Contents": [x for k, x in page if k == "c"], "CommonPrefixes": [x for k, x in page if k == "p"],
               "IsTruncated": more}
        if more:
            out["NextContinuationToken"] = str(start + self.page_size)
        return out

    def put_object(self, Bucket, Key, Body, **kw):
        """An object written through the S3 API is a file on the volume (RunPod: one store, two doors)."""
        self.calls.append(("put_object", {"Bucket": Bucket, "Key": Key}))
        target = self.root / Key
        assert target.resolve().is_relative_to(self.root.resolve()), Key
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(Body)
        return {}

    def get_object(self, Bucket, Key, **kw):
        from botocore.exceptions import ClientError
        from botocore.response import StreamingBody

        self.calls.append(("get_object", {"Bucket": Bucket, "Key": Key}))
        obj = self._objects().get(Key)
        if obj is None:
            raise ClientError({"Error": {"Code": "NoSuchKey", "Message": "missing"}}, "GetObject")
        data = obj if isinstance(obj, bytes) else obj.read_bytes()
        if kw.get("Range"):  # `bytes=N-`, the form a resumed fetch asks
            data = data[int(kw["Range"].removeprefix("bytes=").rstrip("-")):]
        return {"Body": StreamingBody(io.BytesIO(data), len(data)), "ContentLength": len(data)}

    def download_fileobj(self, Bucket, Key, Fileobj, Config=None, **kw):
        """boto3's managed download (its own client method): the object's bytes into a file object."""
        Fileobj.write(self.get_object(Bucket, Key)["Body"].read())
