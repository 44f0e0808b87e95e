"""Getting files back from SkyPilot runs: rsync/ssh through SkyPilot's generated SSH config for
clusters, and the RunPod network volume's S3-compatible API for managed jobs (whose clusters are gone).
These only move bytes; launcher/store/artifacts.py confines and verifies them.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Callable, NamedTuple, Optional

from launcher.store.artifacts import list_command, parse_listing
from launcher.store.handle import Handle
from ... import sky_internals
from ...errors import BackendError
from .. import rsync
from ..base import remote_path
from .sdk import first_line, record_field, sdk, volume_record

SSH_OPTS = ("-o", "BatchMode=yes", "-o", "ConnectTimeout=15")
SSH_TIMEOUT_S = 60
S3_PART = 16 << 20  # a fetch reads objects over this size in ranged parts of this size, S3_READERS at once
S3_READERS = 8


# ------------------------------------------------------------------------- files: ssh + rsync


def ssh_config(host: str) -> Path:
    return Path(os.path.expanduser(f"~/.sky/generated/ssh/{host}"))


def ensure_ssh_config(host: str) -> Optional[str]:
    """Make sure SkyPilot's SSH config entry for cluster `host` exists here; None, or why it cannot.

    SkyPilot's SDK never writes `~/.sky/generated/ssh/<cluster>`: its CLI does (`sky launch`, `sky
    status`), and a local API server writes it in its own HOME. Launched through the SDK against a
    remote API server (`sky api login`), there is none on this machine. So when it is missing, launch
    writes it the way `sky status CLUSTER` does, with SkyPilot's own CLI helper
    (sky/client/cli/command.py `_get_cluster_records_and_set_ssh_config`: `sky.status` with the
    cluster's SSH credentials, then `SSHConfigHelper.add_cluster` from the cluster handle, with the
    API server's websocket proxy on Kubernetes and Slurm)."""
    if ssh_config(host).is_file():
        return None
    try:
        sky_internals.get_cluster_records_and_set_ssh_config(clusters=[host])  # `sky status`'s own
    except Exception as e:  # noqa: BLE001
        return f"no SSH config for cluster {host} here and SkyPilot could not write it ({first_line(e)})"
    if not ssh_config(host).is_file():
        return f"SkyPilot has no SSH access to cluster {host} (not up? see `sky status {host}`)"
    return None


def ssh_argv(host: str) -> list[str]:
    """ssh with the per-cluster config SkyPilot writes (also Included from ~/.ssh/config, which ssh
    reads from the passwd home, so name the file: it follows $HOME like SkyPilot does). Its
    `IdentityFile ~/.sky/...` is expanded by ssh from the passwd home too, where the key is not when
    $HOME is elsewhere (sudo, a container, CI): the key is also named as SkyPilot itself expands it."""
    config = ssh_config(host)
    if not config.is_file():
        return ["ssh", *SSH_OPTS]
    return ["ssh", "-F", str(config), *identities(config), *SSH_OPTS]


def identities(config: Path) -> list[str]:
    """`-i KEY` for each `IdentityFile ~/...` of an ssh config, `~` expanded from $HOME."""
    out = []
    try:
        lines = config.read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        words = line.replace("=", " ", 1).split(None, 1)
        if len(words) == 2 and words[0].lower() == "identityfile" and words[1].strip().startswith("~/"):
            key = Path(os.path.expanduser(words[1].strip().strip('"')))
            if key.is_file():
                out += ["-i", str(key)]
    return out


def cluster_ssh(host: str, command: str, check: bool = True, stdin: Optional[str] = None) -> Optional[str]:
    """Run a command on a cluster's head node; None (check=False) when it cannot be reached or fails."""
    missing = ensure_ssh_config(host)
    if missing and check:
        raise BackendError(missing)
    try:
        done = subprocess.run([*ssh_argv(host), host, command], capture_output=True, text=True,
                              timeout=SSH_TIMEOUT_S, input=stdin)
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


def cluster_list(host: str, run_dir: str, roots: tuple[str, ...]) -> dict[str, int]:
    """{run-dir-relative file: bytes} for the regular files under `roots` on the cluster's head node."""
    return parse_listing(cluster_ssh(host, list_command(remote_path(run_dir), roots)) or "")


def cluster_copy(host: str, run_dir: str, rels: list[str], into: Path) -> None:
    """rsync exactly `rels` into `into` through SkyPilot's SSH config (launcher/backends/rsync.py: a
    file an earlier try cut off goes on from its last byte)."""
    remote_root = run_dir[2:] if run_dir.startswith("~/") else run_dir  # rsync: relative = $HOME
    try:
        rsync.pull(ssh_argv(host), host, remote_root, rels, into)
    except rsync.Unavailable as e:
        raise BackendError(f"{e}: fetching from cluster {host} needs it (apt-get install rsync)") from None


class RunFiles(NamedTuple):
    """How one run's files are listed and copied (`Backend.list_files` / `copy_files`)."""

    list: Callable[[tuple[str, ...]], dict[str, int]]
    copy: Callable[[list[str], Path], None]

    @classmethod
    def of(cls, run, cluster_up: Callable[[], bool]) -> "RunFiles":
        """The cluster over ssh/rsync while it is up, else the RunPod volume's S3 API (managed jobs,
        or a cluster that autostopped); else one line saying where the files are."""
        h = run.handle
        if h.kind == "cluster" and cluster_up() and not ensure_ssh_config(run.cluster):
            return cls(lambda roots: cluster_list(run.cluster, h.run_dir, roots),
                       lambda rels, into: cluster_copy(run.cluster, h.run_dir, rels, into))
        host = h.slurm_login  # a Slurm run: its dir is on the shared filesystem the login node sees
        if host:
            from . import slurm_login

            return cls(lambda roots: slurm_login.listing(host, h.run_dir, roots),
                       lambda rels, into: slurm_login.copy(host, h.run_dir, rels, into))
        if s3_ready(h, explain=True):
            volume, prefix = S3Volume(h.volume), f"{h.volume['key_prefix']}/{run.id}"
            return cls(lambda roots: volume.list(prefix, roots), lambda rels, into: volume.copy(prefix, rels, into))
        bucket, hub = h.bucket, h.push_to_hub
        where = (f"bucket {bucket['name']} ({bucket['store']}; `sky storage ls`)" if bucket else
                 f"volume {h.volume.get('name')}" if isinstance(h.volume, dict) else "its disk, now gone")
        hint = f"; the model was pushed to the hub: `hf download {hub}`" if hub else ""
        raise BackendError(f"run {run.id}: the cluster is gone and its files are on {where}{hint}")


# ------------------------------------------------------------------------ files: RunPod S3 API


def s3_ready(h: Handle, explain: bool = False) -> bool:
    """Whether the run's volume is a RunPod network volume reachable through the S3 API."""
    vol = h.volume if isinstance(h.volume, dict) else {}
    if vol.get("type") != "runpod-network-volume":
        return False
    missing = [k for k in ("RUNPOD_S3_ACCESS_KEY", "RUNPOD_S3_SECRET_KEY") if not os.environ.get(k)]
    if missing and explain:
        raise BackendError(f"the results are on RunPod volume {vol['name']}: set {' and '.join(missing)} "
                           "(RunPod console > Settings > S3 API Keys) to fetch them without a GPU machine")
    return not missing


class S3Volume:
    """A RunPod network volume through its datacenter's S3-compatible endpoint (bucket = volume id)."""

    def __init__(self, vol: dict):
        try:
            import boto3
        except ImportError:
            raise BackendError("fetching from a RunPod volume needs boto3, which launch's `sky` extra brings: "
                               "install launch as `launch[sky]` (`uv tool install 'launch[sky] @ SOURCE'`, "
                               "README: Installing)") from None
        sky = sdk()
        record = volume_record(sky, vol["name"])
        if record is None:
            raise BackendError(f"SkyPilot no longer knows volume {vol['name']}: see `sky volumes ls`")
        self.zone = record_field(record, "zone") or vol.get("zone")
        self.bucket = _runpod_volume_id(record_field(record, "name_on_cloud"), self.zone)
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

    def write(self, key: str, text: str) -> None:
        """One small object (the volume's pods see it as a file at the same path)."""
        self.client.put_object(Bucket=self.bucket, Key=key, Body=text.encode())

    def list(self, prefix: str, roots: tuple[str, ...]) -> dict[str, int]:
        """{key relative to `prefix`: bytes} under each root (keys outside `prefix/` are reported as
        they are, so the caller refuses them)."""
        found = {}
        for root in roots:
            for key, size in self.objects(f"{prefix}/{root}").items():
                found[key[len(prefix) + 1:] if key.startswith(prefix + "/") else key] = size
        return found

    def copy(self, prefix: str, rels: list[str], into: Path) -> None:
        """Each object `prefix/rel` to `into/rel`: boto3's managed download (parallel ranged reads, its
        retries); a file an earlier try cut off goes on from its last byte with one ranged read."""
        from botocore.exceptions import ClientError

        for rel in rels:
            local = into / rel
            local.parent.mkdir(parents=True, exist_ok=True)
            key = f"{prefix}/{rel}"
            try:
                if local.is_file() and local.stat().st_size:
                    self._append(key, local)
                else:
                    self._download(key, local)
            except ClientError as e:
                if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "InvalidRange", "416"):
                    continue  # vanished since the listing (or nothing left to read): verification says so
                raise BackendError(f"reading {rel} from RunPod volume {self.bucket} failed: {e}") from None

    def _download(self, key: str, local: Path) -> None:
        """download_fileobj into `local` itself (download_file's temporary file is deleted when it is cut
        off): the parts land where they belong, and on any interruption the file is cut back to the
        bytes that arrived without a gap before it, so the next try goes on from there."""
        from boto3.s3.transfer import TransferConfig

        with local.open("wb") as f:
            sink = _Prefix(f)
            try:
                self.client.download_fileobj(self.bucket, key, sink, Config=TransferConfig(
                    multipart_threshold=S3_PART, multipart_chunksize=S3_PART, max_concurrency=S3_READERS))
            finally:
                f.truncate(sink.prefix())

    def _append(self, key: str, local: Path) -> None:
        with local.open("ab") as f:
            body = self.client.get_object(Bucket=self.bucket, Key=key, Range=f"bytes={f.tell()}-")["Body"]
            for chunk in iter(lambda: body.read(8 << 20), b""):
                f.write(chunk)


class _Prefix:
    """A file boto3 writes its ranged parts into (seek, write), remembering which bytes arrived."""

    def __init__(self, f):
        self.f, self.at, self.spans = f, 0, []

    def seek(self, offset: int, whence: int = 0) -> int:
        self.at = self.f.seek(offset, whence)
        return self.at

    def tell(self) -> int:
        return self.at

    def seekable(self) -> bool:
        return True

    def write(self, data) -> int:
        n = self.f.write(data)
        self.spans.append((self.at, self.at + n))
        self.at += n
        return n

    def prefix(self) -> int:
        """How many bytes from the start arrived, without a gap."""
        end = 0
        for a, b in sorted(self.spans):
            if a > end:
                break
            end = max(end, b)
        return end


def _runpod_volume_id(name_on_cloud: str, zone: str) -> str:
    """RunPod's id of a network volume (its S3 bucket), via RunPod's REST API (SkyPilot's adaptor)."""
    try:
        listed = sky_internals.runpod_rest_request("GET", "/networkvolumes")
    except Exception as e:  # noqa: BLE001
        raise BackendError(f"cannot list RunPod volumes ({first_line(e)}): set RUNPOD_API_KEY") from None
    if isinstance(listed, dict):  # some deployments wrap the list (SkyPilot handles the same keys)
        listed = next((listed[k] for k in ("items", "data", "networkVolumes") if k in listed), [])
    vols = listed if isinstance(listed, list) else []
    match = next((v for v in vols if v.get("name") == name_on_cloud and v.get("dataCenterId") == zone), None)
    if match is None:
        raise BackendError(f"RunPod has no volume {name_on_cloud} in {zone} any more")
    return match["id"]
