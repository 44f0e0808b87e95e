"""The emulated RunPod's S3-compatible API (tests/cloud/emulator/runpod_s3.py) answers real boto3 over
TLS as RunPod's does, over a volume's directory; and the launcher's S3Volume (status.json, the final-save
request and fetches of managed jobs, launcher/backends/skypilot/files.py) works through it. No root."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cloud.emulator.runpod_s3 import VolumeS3, make_tls

ACCESS = "user_emulated"


@pytest.fixture
def s3(tmp_path):
    vol = tmp_path / "volumes" / "abcde12345"
    vol.mkdir(parents=True)
    tls = make_tls(tmp_path / "tls", ["s3api-eu-ro-1.runpod.io"], ips=("127.0.0.1",))
    log: list[str] = []
    server = VolumeS3(lambda b: vol if b == "abcde12345" else None, ACCESS, log.append)
    server.start("127.0.0.1", 0, tls[1], tls[2])
    port = server._server.server_address[1]
    try:
        yield vol, f"https://127.0.0.1:{port}", tls[0], log
    finally:
        server.close()


def _client(url: str, ca: Path, access: str = ACCESS):
    import boto3

    return boto3.client("s3", endpoint_url=url, region_name="EU-RO-1", aws_access_key_id=access,
                        aws_secret_access_key="rps_emulated", verify=str(ca))


def _volume(url: str, ca: Path):
    """The launcher's S3Volume on this endpoint (its constructor asks SkyPilot and RunPod for the zone
    and bucket; those are tested with the fake API, this is the S3 side)."""
    import boto3  # noqa: F401

    from launcher.backends.skypilot.files import S3Volume

    v = S3Volume.__new__(S3Volume)
    v.zone, v.bucket, v.client = "EU-RO-1", "abcde12345", _client(url, ca)
    return v


def test_what_a_pod_writes_is_listed_read_and_fetched_through_s3(s3, tmp_path):
    vol, url, ca, log = s3
    run = vol / "runs" / "r1"
    (run / "outputs" / "adapter").mkdir(parents=True)
    (run / "status.json").write_text('{"state": "running", "step": 20}')
    (run / "outputs" / "adapter" / "adapter_model.safetensors").write_bytes(b"\0" * 70000)
    (run / "outputs" / "MANIFEST.json").write_text("{}")
    v = _volume(url, ca)
    assert v.read("runs/r1/status.json") == '{"state": "running", "step": 20}'
    listed = v.list("runs/r1", ("outputs",))
    assert listed == {"outputs/MANIFEST.json": 2, "outputs/adapter/adapter_model.safetensors": 70000}, listed
    v.write("runs/r1/stop_request.json", '{"save": true}')  # boto3's aws-chunked PUT with a checksum trailer
    assert (run / "stop_request.json").read_text() == '{"save": true}'
    v.copy("runs/r1", sorted(listed), tmp_path / "got")
    assert (tmp_path / "got" / "outputs/adapter/adapter_model.safetensors").read_bytes() == b"\0" * 70000
    assert any(" S3 PUT /abcde12345/runs/r1/stop_request.json 200" in line for line in log), log


def test_listing_pages_and_folders_as_s3_does(s3):
    vol, url, ca, _ = s3
    for i in range(5):
        (vol / "runs" / f"r{i}").mkdir(parents=True)
        (vol / "runs" / f"r{i}" / "status.json").write_text("{}")
    (vol / "runs" / "top.txt").write_text("x")
    c = _client(url, ca)
    page = c.list_objects_v2(Bucket="abcde12345", Prefix="runs/", Delimiter="/", MaxKeys=4)
    assert page["IsTruncated"] and [p["Prefix"] for p in page["CommonPrefixes"]] == [f"runs/r{i}/" for i in range(4)]
    rest = c.list_objects_v2(Bucket="abcde12345", Prefix="runs/", Delimiter="/", MaxKeys=4,
                             ContinuationToken=page["NextContinuationToken"])
    assert not rest["IsTruncated"] and [p["Prefix"] for p in rest["CommonPrefixes"]] == ["runs/r4/"]
    assert [o["Key"] for o in rest["Contents"]] == ["runs/top.txt"]


def test_a_wrong_key_a_missing_bucket_or_object_and_a_path_out_are_s3_errors(s3):
    from botocore.exceptions import ClientError

    vol, url, ca, _ = s3
    (vol.parent / "secret.txt").write_text("outside the volume")
    errors = {}
    for name, call in {
        "key": lambda: _client(url, ca, access="user_other").get_object(Bucket="abcde12345", Key="a"),
        "bucket": lambda: _client(url, ca).get_object(Bucket="nosuchvol00", Key="a"),
        "object": lambda: _client(url, ca).get_object(Bucket="abcde12345", Key="runs/none.json"),
        "out": lambda: _client(url, ca).get_object(Bucket="abcde12345", Key="../secret.txt"),
    }.items():
        with pytest.raises(ClientError) as e:
            call()
        errors[name] = e.value.response["Error"]["Code"]
    assert errors == {"key": "InvalidAccessKeyId", "bucket": "NoSuchBucket", "object": "NoSuchKey",
                      "out": "InvalidArgument"}, errors
