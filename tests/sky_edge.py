"""The SkyPilot API server, faked at the request edge and nowhere else.

Every SDK call that would reach an API server (sky.launch, sky.status, sky.jobs.*, sky.volumes.*...)
is recorded and returns a request id; `sky.get` / `sky.stream_and_get` answer it the way SkyPilot
0.14.1 does: the server-side value (`results[name]`, SkyPilot's own response models, plain dicts filled
in to them) goes through the server's encoder for that request, JSON (the requests DB), and the
client's decoder (`sky.server.requests.serializers`). So the backend sees exactly the shapes and the
failures of the real client: a field the server drops is None, `{None: None}` from job_status is the
decoder's ValueError, an exception is serialized and rebuilt by `sky.exceptions`. The managed-jobs
queue runs the server's own `queue_v2_api`, which keeps only the fields the request names.

Two behaviours of the real machinery are kept as well: the jobs controller that disappears
(`controller_gone()`: queue and cancel raise ClusterNotUpError as `is_controller_accessible` does) and
`sky.cancel` / `sky.jobs.cancel` SIGTERMing the job, then SIGKILLing its process group
SKY_KILL_AFTER_S later (sky/skylet/subprocess_daemon.py: 30 s; tests scale the setting down).
"""

from __future__ import annotations

import inspect
import json
import os
import signal
import threading
import time

import sky
import sky.client.sdk
import sky.jobs
import sky.volumes
from sky import exceptions as ex
from sky.jobs import ManagedJobStatus
from sky.schemas.api import responses
from sky.server.requests.serializers import decoders, encoders
from sky.skylet.job_lib import JobStatus
from sky.utils.status_lib import ClusterStatus

# Our call name -> SkyPilot's request name (sky/server/requests/request_names.py).
REQUEST_NAMES = {"status": "status", "job_status": "job_status", "jobs.queue": "jobs.queue_v2",
                 "jobs.queue_v2": "jobs.queue_v2", "volumes.ls": "volume_list", "enabled_clouds": "enabled_clouds",
                 "launch": "launch", "jobs.launch": "jobs.launch"}
CONTROLLER_GONE = "No in-progress managed jobs."  # controller_utils: default_hint_if_non_existent


def _status_record(rec) -> responses.StatusResponse:
    if isinstance(rec, responses.StatusResponse):
        return rec
    base = {"launched_at": 0, "autostop": 10, "to_down": True, "cluster_hash": "c0ffee", "cluster_ever_up": True,
            "user_hash": "abcd1234", "user_name": "me", "workspace": "default", "is_managed": False, "handle": None,
            "nodes": 1}
    rec = {**base, **rec}
    rec["status"] = ClusterStatus(getattr(rec["status"], "value", rec["status"]))
    return responses.StatusResponse.model_validate(rec)


def _volume_record(rec) -> responses.VolumeRecord:
    if isinstance(rec, responses.VolumeRecord):
        return rec
    base = {"type": "runpod-network-volume", "launched_at": 0, "cloud": "RunPod", "config": {},
            "name_on_cloud": f"{rec['name']}-abcd1234-1a2b3c", "user_hash": "abcd1234", "user_name": "me",
            "workspace": "default", "usedby_pods": [], "usedby_clusters": []}
    return responses.VolumeRecord(**{**base, **rec})


def _job_statuses(value: dict) -> dict:
    return {k: (None if v is None else JobStatus(getattr(v, "value", v))) for k, v in value.items()}


def queue_answer(jobs, request_kwargs: dict):
    """What the API server answers `jobs.queue_v2` with: its own `queue_v2_api` over the controller's
    full records (`jobs`), keeping the fields the client asked for (the client's default when none)."""
    from sky.jobs.server import core

    default = inspect.signature(sky.jobs.client.sdk.queue_v2).parameters["fields"].default
    fields = request_kwargs.get("fields", default)
    full = [{**j, "status": ManagedJobStatus(getattr(j["status"], "value", j["status"]))} for j in jobs]
    ids = request_kwargs.get("job_ids")
    full = [j for j in full if ids is None or j["job_id"] in ids]
    real = core.queue_v2

    def controller(**kw):
        return [dict(j) for j in full], len(full), {}, len(full), []

    core.queue_v2 = controller
    try:
        return core.queue_v2_api(refresh=request_kwargs.get("refresh", False), job_ids=ids,
                                 fields=None if fields is None else list(fields))
    finally:
        core.queue_v2 = real


class FakeSky:
    """Records every SDK call that would reach the API server; answers from `results` through
    SkyPilot's real encoders and decoders (module docstring)."""

    latest: "FakeSky | None" = None  # the last one made (a test reaching the one a helper made)

    def __init__(self, monkeypatch):
        FakeSky.latest = self
        self.calls: list[tuple[str, tuple, dict]] = []
        self.results = {"enabled_clouds": ["RunPod", "Azure", "Kubernetes"], "volumes.ls": [],
                        "volumes.apply": None, "launch": (7, None), "jobs.launch": ([3], None),
                        "down": None, "jobs.cancel": None, "status": [], "job_status": {},
                        "jobs.queue": [], "cancel": None, "check": {}}
        self.client_config = {}  # the SkyPilot config each request would carry to the API server
        self.job = None  # the job's process (a Popen in its own process group), for cancel's signals
        self.killed = threading.Event()
        self.signalled: list[float] = []  # when cancel SIGTERMed a live job
        for name, owner in [("enabled_clouds", sky.client.sdk), ("check", sky.client.sdk), ("launch", sky),
                            ("down", sky), ("status", sky), ("job_status", sky), ("tail_logs", sky),
                            ("cancel", sky), ("launch", sky.jobs), ("cancel", sky.jobs), ("queue", sky.jobs),
                            ("queue_v2", sky.jobs), ("tail_logs", sky.jobs), ("ls", sky.volumes),
                            ("apply", sky.volumes), ("api_stop", sky)]:
            full = name if owner in (sky, sky.client.sdk) else f"{owner.__name__.split('.')[-1]}.{name}"
            monkeypatch.setattr(owner, name, self._recorder(full))
        monkeypatch.setattr(sky.client.sdk, "status", sky.status)  # SkyPilot's CLI calls them from there
        for how in ("get", "stream_and_get"):
            monkeypatch.setattr(sky, how, self._resolve(how))
            monkeypatch.setattr(sky.client.sdk, how, getattr(sky, how))

    def controller_gone(self) -> None:
        """The jobs controller autostopped (`down: true`): what `is_controller_accessible` raises."""
        for name in ("jobs.queue", "jobs.cancel"):
            self.results[name] = ex.ClusterNotUpError(CONTROLLER_GONE, cluster_status=None)

    def _recorder(self, full):
        def call(*args, **kwargs):
            self.calls.append((full, args, kwargs))
            self.client_config[full] = sky.skypilot_config.to_dict()
            if full == "api_stop":
                return None
            if full.endswith("tail_logs"):
                kwargs["output_stream"].write(f"log of {full}\n")
                return 0
            if full in ("cancel", "jobs.cancel"):
                self._signal_job()
            return f"req:{full}:{len(self.calls) - 1}"
        return call

    def _signal_job(self) -> None:
        """SkyPilot's cancel: SIGTERM the job's process group, SIGKILL it SKY_KILL_AFTER_S later."""
        from launcher.backends.skypilot import control

        job = self.job
        if job is None or job.poll() is not None:
            return
        self.signalled.append(time.time())
        os.killpg(job.pid, signal.SIGTERM)

        def kill():
            if job.poll() is None:
                self.killed.set()
                os.killpg(job.pid, signal.SIGKILL)

        threading.Timer(control.SKY_KILL_AFTER_S, kill).start()

    def _resolve(self, how):
        def resolve(request_id, **kwargs):
            self.calls.append((how, (request_id,), kwargs))
            _, name, index = request_id.split(":")
            key = "jobs.queue" if name == "jobs.queue_v2" else name
            value = self.results[key]
            if callable(value):  # a sequence of answers, one per call
                value = value()
            if isinstance(value, BaseException):
                raise ex.deserialize_exception(json.loads(json.dumps(ex.serialize_exception(value), default=str)))
            return self._through_the_wire(name, value, self.calls[int(index)][2])
        return resolve

    def _through_the_wire(self, name: str, value, request_kwargs: dict):
        request = REQUEST_NAMES.get(name)
        if request is None:
            return value
        if name == "status":
            value = [_status_record(r) for r in value]
        elif name == "job_status":
            value = _job_statuses(value)
        elif name in ("jobs.queue", "jobs.queue_v2"):
            value = queue_answer(value[0] if isinstance(value, tuple) else value, request_kwargs)
        elif name == "volumes.ls":
            names = request_kwargs.get("names")
            value = [_volume_record(r) for r in value if names is None or r["name"] in names]
        sent = json.loads(json.dumps(encoders.get_encoder(f"sky.{request}")(value)))
        return decoders.get_decoder(f"sky.{request}")(sent)

    def waited(self, name: str) -> list[tuple[str, dict]]:
        """(get | stream_and_get, kwargs) for each wait on a request of call `name`."""
        return [(c[0], c[2]) for c in self.calls if c[0] in ("get", "stream_and_get")
                and c[1][0].split(":")[1] == name]

    def names(self):
        return [c[0] for c in self.calls]

    def one(self, name):
        found = [c for c in self.calls if c[0] == name]
        assert len(found) == 1, (name, self.names())
        return found[0]


def runpod_edge(monkeypatch, fake, mount, volume="lovecraft-workspace", zone="US-CA-2"):
    """RunPod's REST API (the volume's id) and the volume's S3 API (a directory, `mount`)."""
    import boto3
    import requests

    try:
        from artifact_fixtures import FakeS3
    except ImportError:
        from tests.artifact_fixtures import FakeS3
    monkeypatch.setenv("RUNPOD_API_KEY", "rp_key")
    monkeypatch.setenv("RUNPOD_S3_ACCESS_KEY", "user_abc")
    monkeypatch.setenv("RUNPOD_S3_SECRET_KEY", "rps_def")
    fake.results["volumes.ls"] = [{"name": volume, "zone": zone, "region": "US",
                                   "name_on_cloud": f"{volume}-abcd1234-1a2b3c"}]

    class Listing:
        status_code, text = 200, "[...]"

        def json(self):
            return [{"id": "vol123", "name": f"{volume}-abcd1234-1a2b3c", "dataCenterId": zone}]

    monkeypatch.setattr(requests, "request", lambda method, url, **kw: Listing())
    clients = []

    def client(service, endpoint_url, region_name, aws_access_key_id, aws_secret_access_key):
        assert service == "s3" and aws_access_key_id == "user_abc"
        clients.append(FakeS3(mount, endpoint_url, region_name))
        return clients[-1]

    monkeypatch.setattr(boto3, "client", client)
    return clients
