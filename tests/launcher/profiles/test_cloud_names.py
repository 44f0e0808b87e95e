"""Volume and bucket names are checked at validate time with the clouds' rules (launcher/profiles/cloud_names.py),
and those rules agree with SkyPilot 0.14.1's own validators on every name below.

Run: .venv/bin/python -m pytest -q tests/launcher/profiles/test_cloud_names.py
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from launcher.cli import cli
from launcher.profiles.cloud_names import bucket_name_problem, volume_name_problem

REPO = Path(__file__).resolve().parents[3]

NAMES = ["ok", "sonia-workspace", "qwen3-32b-checkpoints", "a" * 30, "a" * 31, "a" * 63, "a" * 64, "a" * 223,
         "Upper-Case", "under_score", "dots.in.name", "two..dots", "dash-.dot", "-leading", "trailing-",
         "double--dash", "192.168.5.4", "xn--punycode", "name-s3alias", "name--ol-s3", "googlebucket",
         "my-google-data", "x" * 64 + ".y", "space name", "é-accent", "ab"]


def skypilot_volume_ok(name: str, kind: str) -> bool:
    from sky.clouds import Kubernetes, RunPod

    cloud = RunPod if kind == "runpod-network-volume" else Kubernetes
    return cloud.is_volume_name_valid(name)[0]


def skypilot_bucket_ok(name: str, store: str) -> bool:
    from sky import exceptions
    from sky.data import storage

    cls = {"s3": storage.S3Store, "r2": storage.R2Store, "gcs": storage.GcsStore,
           "azure": storage.AzureBlobStore}[store]
    try:
        cls.validate_name(name)
    except exceptions.StorageNameError:
        return False
    return True


@pytest.mark.parametrize("kind", ["runpod-network-volume", "k8s-pvc"])
def test_volume_rules_agree_with_skypilot(kind):
    ours = {n: volume_name_problem(n, kind) is None for n in NAMES}
    theirs = {n: skypilot_volume_ok(n, kind) for n in NAMES}
    assert ours == theirs


@pytest.mark.parametrize("store", ["s3", "r2", "gcs", "azure"])
def test_bucket_rules_agree_with_skypilot(store):
    ours = {n: bucket_name_problem(n, store) is None for n in NAMES}
    theirs = {n: skypilot_bucket_ok(n, store) for n in NAMES}
    assert ours == theirs


@pytest.mark.parametrize("profile, old, new, expected", [
    ("sonia-h100", "name: sonia-workspace", "name: sonia-workspace-for-the-32b-vl-model",
     "cluster.volume.name: `sonia-workspace-for-the-32b-vl-model` is longer than RunPod's 30 characters "
     "(runpod-network-volume rules); choose another name"),
    ("qwen3-32b-4x4-a100", "name: qwen3-32b-checkpoints", "name: Qwen3_Checkpoints",
     "cluster.bucket.name: `Qwen3_Checkpoints` may hold only lowercase letters, digits and `-`, with a letter "
     "or digit at each end (azure bucket rules); choose another name"),
])
def test_validate_names_a_bad_volume_or_bucket_name_in_one_line(tmp_path, profile, old, new, expected):
    text = (REPO / "clusters" / f"{profile}.yaml").read_text()
    assert old in text
    path = tmp_path / f"{profile}.yaml"
    path.write_text(text.replace(old, new, 1))
    line = next(i for i, ln in enumerate(path.read_text().splitlines(), 1) if new in ln)
    r = CliRunner().invoke(cli, ["validate", str(path)], catch_exceptions=False)
    assert r.exit_code == 1 and "Traceback" not in r.output
    assert f"✗ {path}:{line}: {expected}" in r.output.splitlines()
