"""Getting files back from SkyPilot runs: rsync/ssh through SkyPilot's generated SSH config for
clusters, and the RunPod network volume's S3-compatible API for managed jobs (whose clusters are gone).
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path
from typing import Optional

from . import BackendError

SSH_OPTS = ("-o", "BatchMode=yes", "-o", "ConnectTimeout=15")
SSH_TIMEOUT_S = 60
RSYNC_TIMEOUT_S = 3600


# ------------------------------------------------------------------------- files: ssh + rsync


def _remote_expr(path: str) -> str:
    """A remote path for a shell command, `~/` kept expandable."""
    return '"$HOME"/' + shlex.quote(path[2:]) if path.startswith("~/") else shlex.quote(path)


def _ssh_cmd(host: str) -> list[str]:
    """ssh with the per-cluster config SkyPilot writes at launch (also Included from ~/.ssh/config,
    which ssh reads from the passwd home, so name the file: it follows $HOME like SkyPilot does)."""
    config = Path(os.path.expanduser(f"~/.sky/generated/ssh/{host}"))
    return ["ssh", *(["-F", str(config)] if config.is_file() else []), *SSH_OPTS]


def _ssh(host: str, command: str, check: bool = True) -> Optional[str]:
    """Run a command on a cluster's head node; None (check=False) when it cannot be reached."""
    try:
        done = subprocess.run([*_ssh_cmd(host), host, command], capture_output=True, text=True,
                              timeout=SSH_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        if check:
            raise BackendError(f"ssh {host} timed out after {SSH_TIMEOUT_S} s") from None
        return None
    if done.returncode != 0:
        if check:
            last = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
            raise BackendError(f"ssh {host} failed: {last}")
        return None
    return done.stdout


def _remote_sizes(host: str, run_dir: str, paths: tuple[str, ...]) -> dict[str, int]:
    """{run-dir-relative file: bytes} for every file under `paths` on the cluster."""
    listing = _ssh(host, f"cd {_remote_expr(run_dir)} && find {' '.join(map(shlex.quote, paths))} "
                         "-type f -printf '%s %p\\n' 2>/dev/null; true")
    sizes = {}
    for line in (listing or "").splitlines():
        size, _, rel = line.partition(" ")
        if size.isdigit() and rel:
            sizes[rel] = int(size)
    return sizes


def rsync_fetch(host: str, run_dir: str, dest: Path, paths: tuple[str, ...]) -> list[Path]:
    """rsync each path from the cluster's run dir into dest, then check every file's size."""
    sizes = _remote_sizes(host, run_dir, paths)
    remote_root = run_dir[2:] if run_dir.startswith("~/") else run_dir  # rsync: relative = $HOME
    arrived = []
    for rel in paths:
        is_dir = any(k.startswith(rel.rstrip("/") + "/") for k in sizes)
        if rel not in sizes and not is_dir:
            continue  # never produced (e.g. no loss plot): nothing to bring
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        slash = "/" if is_dir else ""
        cmd = ["rsync", "-az", "-e", shlex.join(_ssh_cmd(host)), f"{host}:{remote_root}/{rel}{slash}",
               f"{target}{slash}"]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=RSYNC_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise BackendError(f"rsync of {rel} from {host} took more than {RSYNC_TIMEOUT_S} s") from None
        if done.returncode != 0:
            raise BackendError(f"rsync of {rel} from {host} failed: {done.stderr.strip()[-300:]}")
        arrived.append(target)
    _verify_sizes(dest, sizes)
    return arrived


def _verify_sizes(dest: Path, sizes: dict[str, int]) -> None:
    for rel, size in sizes.items():
        local = dest / rel
        have = local.stat().st_size if local.exists() else None
        if have != size:
            raise BackendError(f"{rel}: {size} bytes on the machine but {have} here; fetch again")


# ------------------------------------------------------------------------ files: RunPod S3 API


def _s3_ready(h: dict, explain: bool = False) -> bool:
    """Whether the run's volume is a RunPod network volume reachable through the S3 API."""
    vol = h.get("volume") or {}
    if vol.get("type") != "runpod-network-volume":
        return False
    missing = [k for k in ("RUNPOD_S3_ACCESS_KEY", "RUNPOD_S3_SECRET_KEY") if not os.environ.get(k)]
    if missing and explain:
        raise BackendError(f"the results are on RunPod volume {vol['name']}: set {' and '.join(missing)} "
                           "(RunPod console > Settings > S3 API Keys) to fetch them without a GPU machine")
    return not missing


class _S3Volume:
    """A RunPod network volume through its datacenter's S3-compatible endpoint (bucket = volume id)."""

    def __init__(self, vol: dict):
        try:
            import boto3
        except ImportError:
            raise BackendError("fetching from a RunPod volume needs boto3: pip install boto3") from None
        from .skypilot import _get, _sky, _volume_record

        sky = _sky()
        record = _volume_record(sky, vol["name"])
        if record is None:
            raise BackendError(f"SkyPilot no longer knows volume {vol['name']}: see `sky volumes ls`")
        self.zone = _get(record, "zone") or vol.get("zone")
        self.bucket = _runpod_volume_id(_get(record, "name_on_cloud"), self.zone)
        self.client = boto3.client(
            "s3", endpoint_url=f"https://s3api-{self.zone.lower()}.runpod.io", region_name=self.zone,
            aws_access_key_id=os.environ["RUNPOD_S3_ACCESS_KEY"],
            aws_secret_access_key=os.environ["RUNPOD_S3_SECRET_KEY"])

    def objects(self, key: str) -> dict[str, int]:
        """{key: size} for the object `key` or everything under `key/`. One level per request with
        a delimiter: RunPod's flat listings paginate unreliably (their own example does the same)."""
        found, prefixes = {}, [key]
        while prefixes:
            prefix, token = prefixes.pop(), None
            while True:
                args = {"Bucket": self.bucket, "Prefix": prefix, "Delimiter": "/"}
                page = self.client.list_objects_v2(**args, **({"ContinuationToken": token} if token else {}))
                for obj in page.get("Contents", []):
                    if obj["Key"] == key or obj["Key"].startswith(key.rstrip("/") + "/"):
                        found[obj["Key"]] = obj["Size"]
                prefixes += [cp["Prefix"] for cp in page.get("CommonPrefixes", [])
                             if cp["Prefix"].startswith(key.rstrip("/") + "/")]
                token = page.get("NextContinuationToken") if page.get("IsTruncated") else None
                if not token:
                    break
        return found

    def read(self, key: str) -> str:
        return self.client.get_object(Bucket=self.bucket, Key=key)["Body"].read().decode()

    def fetch(self, prefix: str, dest: Path, paths: tuple[str, ...]) -> list[Path]:
        arrived, sizes = [], {}
        for rel in paths:
            objects = self.objects(f"{prefix}/{rel}")
            for key, size in objects.items():
                local = dest / key[len(prefix) + 1:]
                local.parent.mkdir(parents=True, exist_ok=True)
                body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"]
                tmp = local.with_name(local.name + ".part")
                with tmp.open("wb") as f:
                    for chunk in iter(lambda: body.read(8 << 20), b""):
                        f.write(chunk)
                tmp.replace(local)
                sizes[key[len(prefix) + 1:]] = size
            if objects:
                arrived.append(dest / rel)
        _verify_sizes(dest, sizes)
        return arrived


def _runpod_volume_id(name_on_cloud: str, zone: str) -> str:
    """RunPod's id of a network volume (its S3 bucket), via RunPod's REST API (SkyPilot's adaptor)."""
    from sky.adaptors import runpod as runpod_api

    from .skypilot import _first_line

    try:
        listed = runpod_api.rest_request("GET", "/networkvolumes")
    except Exception as e:  # noqa: BLE001
        raise BackendError(f"cannot list RunPod volumes ({_first_line(e)}): set RUNPOD_API_KEY") from None
    if isinstance(listed, dict):  # some deployments wrap the list (SkyPilot handles the same keys)
        listed = next((listed[k] for k in ("items", "data", "networkVolumes") if k in listed), [])
    vols = listed if isinstance(listed, list) else []
    match = next((v for v in vols if v.get("name") == name_on_cloud and v.get("dataCenterId") == zone), None)
    if match is None:
        raise BackendError(f"RunPod has no volume {name_on_cloud} in {zone} any more")
    return match["id"]
