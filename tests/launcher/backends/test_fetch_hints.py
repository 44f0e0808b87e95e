"""What a managed job's fetch says when it cannot fetch: the install that brings boto3 (launch's `sky`
extra, as the README installs it) and the Hub's own download command (`hf download`: huggingface-hub
2.x ships no `huggingface-cli`)."""

from __future__ import annotations

import builtins

import pytest

from launcher.backends.skypilot.files import RunFiles, S3Volume
from launcher.errors import BackendError
from launcher.store.registry import Run


def test_without_boto3_the_message_names_launchs_sky_extra(monkeypatch):
    real = builtins.__import__

    def no_boto3(name, *a, **k):
        if name == "boto3" or name.startswith("boto3."):
            raise ImportError("No module named 'boto3'")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_boto3)
    with pytest.raises(BackendError) as e:
        S3Volume({"name": "v", "type": "runpod-network-volume"})
    assert "launch[sky]" in str(e.value) and "pip install boto3" not in str(e.value)


def test_a_gone_cluster_whose_model_was_pushed_says_hf_download(monkeypatch):
    run = Run(id="r", profile="p", backend="skypilot", state="completed",
              handle={"kind": "managed_job", "push_to_hub": "me/model", "bucket": {"name": "b", "store": "s3"}})
    with pytest.raises(BackendError, match=r"`hf download me/model`"):
        RunFiles.of(run, lambda: False)
