"""The names the clouds accept for a volume or a bucket, checked when a profile is validated, so a
bad name is one line naming the key before anything is launched, not a SkyPilot error at `up`.

The rules are SkyPilot 0.14.1's own checks, restated without importing SkyPilot (validation stays
fast and light): volumes `clouds/runpod.py` and `clouds/kubernetes.py` `is_volume_name_valid`,
buckets `data/storage.py` `S3CompatibleStore` (S3, R2), `GcsStore` and `AzureBlobStore`
`validate_name`. tests/launcher/profiles/test_cloud_names.py runs SkyPilot's validators on the same names, so the two
cannot drift apart silently.
"""

from __future__ import annotations

import re

_IP = re.compile(r"(?:\d{1,3}\.){3}\d{1,3}")
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"


def volume_name_problem(name: str, kind: str) -> str | None:
    """Why `kind` (runpod-network-volume, k8s-pvc) refuses `name`, or None."""
    if kind == "runpod-network-volume":
        return "is longer than RunPod's 30 characters" if len(name) > 30 else None
    if len(name) > 63:
        return "is longer than Kubernetes' 63 characters"
    if not re.fullmatch(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*", name):
        return ("is not a Kubernetes (DNS-1123) name: lowercase letters, digits, `-` and `.`, a letter or "
                "digit at each end")
    return None


def bucket_name_problem(name: str, store: str) -> str | None:
    """Why `store` (s3, r2, gcs, azure) refuses `name` as a bucket/container name, or None."""
    if store == "gcs":
        return _gcs(name)
    if store == "azure":
        return _azure(name)
    return _s3(name)


def _s3(name: str) -> str | None:
    if not 3 <= len(name) <= 63:
        return "must be 3-63 characters long"
    if not re.fullmatch(r"[a-z0-9][-a-z0-9.]*[a-z0-9]", name):
        return "may hold only lowercase letters, digits, `.` and `-`, with a letter or digit at each end"
    if ".." in name:
        return "must not contain `..`"
    if _IP.fullmatch(name):
        return "must not look like an IP address"
    if name.startswith("xn--") or name.endswith(("-s3alias", "--ol-s3")):
        return "must not start with `xn--` or end with `-s3alias`/`--ol-s3`"
    return None


def _gcs(name: str) -> str | None:
    if not 3 <= len(name) <= 222:
        return "must be 3-222 characters long"
    if not re.fullmatch(r"[a-z0-9][-a-z0-9._]*[a-z0-9]", name):
        return "may hold only lowercase letters, digits, `-`, `_` and `.`, with a letter or digit at each end"
    if name.startswith("goog") or any(s in name for s in ("google", "g00gle", "go0gle", "g0ogle")):
        return "must not start with `goog` or contain `google`"
    if any(len(part) > 63 for part in name.split(".")):
        return "must not have a dot-separated part longer than 63 characters"
    if ".." in name or ".-" in name or "-." in name:
        return "must not contain `..`, `.-` or `-.`"
    if _IP.fullmatch(name):
        return "must not look like an IP address"
    return None


def _azure(name: str) -> str | None:
    if not 3 <= len(name) <= 63:
        return "must be 3-63 characters long"
    if not re.fullmatch(r"[a-z0-9][-a-z0-9]*[a-z0-9]", name):
        return "may hold only lowercase letters, digits and `-`, with a letter or digit at each end"
    if "--" in name:
        return "must not contain `--`"
    return None
