"""A managed spot job whose RunPod pod was interrupted: RunPod lists it EXITED, SkyPilot 0.14.1 cannot read
that (sky/provision/runpod/instance.py:259 KeyError) and its queue says RUNNING for minutes. `launch
status` and `launch cost` say what happened and bill nothing from the interruption until a new pod runs
(launcher/backends/skypilot/runpod_pods.py).

SkyPilot's API server is faked at its request edge (tests/sky_edge.py); RunPod is the project's emulated
RunPod API (tests/cloud/emulator/runpod_api.py) on 127.0.0.1, reached by the real runpod SDK through
RUNPOD_API_BASE_URL, its pods made by SkyPilot's own RunPod provisioner (a fake PodHost: no namespaces)."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
from click.testing import CliRunner

from launcher.cli import cli
from launcher.store import registry
from launcher.store.registry import Run

try:
    from sky_edge import FakeSky
except ImportError:
    from tests.sky_edge import FakeSky
from cloud.emulator.runpod_api import FakeRunPod

RUN_ID, JOB_ID = "lovecraft-a100-spot-20261128-100000", 3
USER_HASH = "abcd1234"


class PodHost:
    """The emulator's PodHost without namespaces: every pod boots at once and answers ssh."""

    def __init__(self):
        self.stopped: list[str] = []

    def start(self, pod, volume_dir, mount_path):
        return "10.99.0.2"

    def stop(self, pod_id):
        self.stopped.append(pod_id)

    def ssh_ready(self, pod_id):
        return pod_id not in self.stopped


class Clock:
    """RunPod's clock (its pods' lastStatusChange): set by the test, in real epoch seconds."""

    def __init__(self):
        self.now = time.time()

    def __call__(self):
        return self.now


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def runpod(tmp_path, monkeypatch, clock):
    import runpod as runpod_sdk

    fake = FakeRunPod(PodHost(), tmp_path / "runpod", clock=clock)
    fake.start()
    monkeypatch.setenv("RUNPOD_API_BASE_URL", fake.url)  # read on every call (runpod/api/graphql.py)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setenv("RUNPOD_API_KEY", fake.api_key)
    monkeypatch.setattr(runpod_sdk, "api_key", fake.api_key)  # SkyPilot's provisioner reads the SDK's
    yield fake
    fake.close()


@pytest.fixture
def sky(monkeypatch):
    return FakeSky(monkeypatch)


def cluster_on_cloud() -> str:
    """SkyPilot's names: the jobs controller's cluster for the job (sky/jobs/utils.py), plus the user hash."""
    from sky.jobs.utils import generate_managed_job_cluster_name

    return f"{generate_managed_job_cluster_name(RUN_ID, JOB_ID)}-{USER_HASH}"


def spot_pod(name: str) -> str:
    """A spot pod made as SkyPilot's RunPod provisioner makes one (sky/provision/runpod/utils.py launch)."""
    from sky.provision.runpod import utils

    return utils.launch(cluster_name=name, node_type="head", instance_type="1x_A100-80GB_SECURE", region="US",
                        zone=None, disk_size=40, image_name="runpod/base:0.0.2", ports=None,
                        public_key="ssh-ed25519 AAAAC3Nza test", preemptible=True, bid_per_gpu=1.0,
                        docker_login_config=None)


def managed_run(now: float) -> Run:
    run = Run(id=RUN_ID, profile="lovecraft-a100-spot", backend="skypilot", job_id=str(JOB_ID), state="running",
              started_at=now - 900, price_per_hour=3600.0,  # $1 a second
              handle={"kind": "managed_job", "job_id": JOB_ID, "job_name": RUN_ID, "infra": ["runpod"],
                      "run_dir": f"/workspace/runs/{RUN_ID}", "push_to_hub": None, "bucket": None,
                      "volume": {"name": "lovecraft-workspace", "type": "runpod-network-volume",
                                 "zone": "US-CA-2", "key_prefix": "runs"}})
    run.billed_s, run.billed_usd, run.billing_since = 0.0, 0.0, now - 600
    registry.save(run)
    return run


def queue(sky, status="RUNNING", recoveries=0, cloud="RunPod", on_cloud=None):
    from sky.jobs import ManagedJobStatus

    sky.results["jobs.queue"] = [{"job_id": JOB_ID, "job_name": RUN_ID, "task_name": RUN_ID,
                                  "status": ManagedJobStatus[status], "recovery_count": recoveries,
                                  "cluster_name_on_cloud": on_cloud or cluster_on_cloud(), "cloud": cloud}]


def launch(*args: str):
    r = CliRunner().invoke(cli, list(args))
    assert r.exit_code == 0, r.output
    assert "Traceback" not in r.output
    return r.output


def cost() -> dict:
    return json.loads(launch("cost", "--json"))["runs"][0]


def pod_queries(runpod) -> int:
    return (runpod.state_dir / "api.log").read_text().count("query myself{pods}")


def rewind(now: float, billed_s: float = 0.0) -> None:
    """As if the last refresh (which saw the job running) was at `now - 600` with `billed_s` billed."""
    registry.update(RUN_ID, billed_s=billed_s, billed_usd=billed_s, billing_since=now - 600)


def test_an_exited_spot_pod_is_said_and_not_billed_until_a_new_pod_runs(sky, runpod, clock):
    now = time.time()
    managed_run(now)
    clock.now = now - 900
    pod = spot_pod(cluster_on_cloud())
    queue(sky)
    assert cost()["state"] == "running" and "notice" not in cost()
    rewind(now)  # seen running 600 s ago, $0 so far
    clock.now = now - 300
    runpod.preempt(pod, "exited")  # RunPod interrupts the spot pod; SkyPilot's queue still says RUNNING

    out = launch("status", RUN_ID)
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(int(now - 300)))
    assert "starting" in out and "running" not in out, out
    notice = " ".join(line.strip() for line in out.split("! ", 1)[1].splitlines())
    assert f"RunPod reports spot pod {cluster_on_cloud()}-head interrupted at {when} (EXITED)" in notice, out
    assert "sky/provision/runpod/instance.py:259" in notice and "recovering" in notice, out
    row = cost()
    assert row["state"] == "starting" and "preempted" in row["reason"] and "RunPod reports" in row["notice"]
    assert abs(row["cost_usd"] - 300) < 2, row  # from the last look until the interruption, not until now
    assert "RunPod reports spot pod" in launch("cost")  # the `!` line under the table
    assert registry.get(RUN_ID).billing_since is None

    clock.now = now - 30  # SkyPilot's controller recovered it: a new pod of the same name runs
    spot_pod(cluster_on_cloud())  # (the EXITED one is still listed, older)
    queue(sky, recoveries=1)
    row = cost()
    assert row["state"] == "running" and "notice" not in row and abs(row["cost_usd"] - 300) < 2, row
    later = registry.get(RUN_ID).billed(now=time.time() + 100)[1]
    assert abs(later - 400) < 3  # billing resumed with the new pod


def test_each_refresh_asks_runpod_once(sky, runpod, clock):
    now = time.time()
    managed_run(now)
    spot_pod(cluster_on_cloud())
    queue(sky)
    before = pod_queries(runpod)
    launch("status", RUN_ID)
    assert pod_queries(runpod) == before + 1


def test_a_pod_gone_while_skypilot_says_running_stops_the_bill(sky, runpod, clock):
    now = time.time()
    managed_run(now)
    pod = spot_pod(cluster_on_cloud())
    queue(sky)
    assert cost()["state"] == "running"  # seen listed: remembered with the run
    assert registry.get(RUN_ID).handle.runpod_pods_seen == cluster_on_cloud()
    runpod.preempt(pod, "vanish")  # host lost: RunPod lists no pod of the job
    row = cost()
    assert row["state"] == "starting" and "RunPod lists no pod of cluster" in row["notice"], row
    assert registry.get(RUN_ID).billing_since is None
    queue(sky, status="RECOVERING", recoveries=0)  # SkyPilot noticed; no new pod yet: nothing bills
    row = cost()
    assert row["state"] == "starting" and "notice" not in row and registry.get(RUN_ID).billing_since is None


def test_a_pod_never_seen_is_not_called_gone(sky, runpod):
    """Another RunPod account's key here, or a pod not made yet: no pod listed says nothing."""
    managed_run(time.time())
    queue(sky)
    row = cost()
    assert row["state"] == "running" and "notice" not in row and registry.get(RUN_ID).billing_since is not None


def test_without_a_key_another_cloud_or_no_answer_it_reads_as_skypilot_says(sky, runpod, clock, monkeypatch):
    import runpod as runpod_sdk

    from launcher.backends.skypilot import runpod_pods

    now = time.time()
    managed_run(now)
    clock.now = now - 900
    runpod.preempt(spot_pod(cluster_on_cloud()), "exited")
    asked = pod_queries(runpod)

    def as_today():
        row = cost()
        assert row["state"] == "running" and "notice" not in row, row
        assert registry.get(RUN_ID).billing_since is not None  # billing, as SkyPilot's RUNNING says

    queue(sky, cloud="Kubernetes")
    as_today()
    queue(sky)
    monkeypatch.delenv("RUNPOD_API_KEY")
    monkeypatch.setattr(runpod_sdk, "api_key", None)
    as_today()
    assert pod_queries(runpod) == asked
    monkeypatch.setenv("RUNPOD_API_KEY", runpod.api_key)
    with socket.socket() as silent:  # accepts, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        monkeypatch.setenv("RUNPOD_API_BASE_URL", f"http://127.0.0.1:{silent.getsockname()[1]}")
        monkeypatch.setattr(runpod_pods, "TIMEOUT_S", 0.5)
        started = time.monotonic()
        as_today()
        assert time.monotonic() - started < 10
    monkeypatch.setenv("RUNPOD_API_BASE_URL", "http://127.0.0.1:9")  # refused
    as_today()


def test_pod_names_follow_skypilots_without_the_cluster_name_on_cloud():
    from launcher.backends.skypilot.runpod_pods import pod_matcher

    match, cluster = pod_matcher({"cluster_name_on_cloud": None}, RUN_ID, JOB_ID)
    assert cluster_on_cloud().startswith(cluster + "-")
    assert match(f"{cluster_on_cloud()}-head") and match(f"{cluster}-ffff0000-worker")
    assert not match(f"{cluster}0-{USER_HASH}-head") and not match(f"{cluster}-{USER_HASH}-head-2")
    match, cluster = pod_matcher({"cluster_name_on_cloud": "c-3-abcd1234"}, RUN_ID, JOB_ID)
    assert cluster == "c-3-abcd1234" and match("c-3-abcd1234-head") and not match(f"{cluster_on_cloud()}-head")


def test_runpods_status_change_times_are_read():
    from launcher.backends.skypilot.runpod_pods import changed_at, judge

    real = "Exited by user: Thu Jun 13 2024 09:38:32 GMT+0000 (Coordinated Universal Time)"
    assert changed_at({"lastStatusChange": real}) == 1718271512.0
    assert changed_at({"lastStatusChange": "Rented by User: Thu Jun 13 2024 11:38:32 GMT+0200"}) == 1718271512.0
    assert changed_at({"lastStatusChange": "soon"}) is None
    # A live pod whose time is unreadable replaces any dead one: nothing is claimed.
    pods = [{"name": "c-head", "desiredStatus": "EXITED", "lastStatusChange": real},
            {"name": "c-head", "desiredStatus": "RUNNING", "lastStatusChange": None}]
    assert judge(pods, "c", "RUNNING", True).billing is True


def test_the_pod_query_is_one_the_emulated_runpod_answers_in_runpods_schema(runpod, clock):
    from launcher.backends.skypilot.runpod_pods import list_pods

    spot_pod("c-1-abcd1234")
    (pod,) = list_pods(runpod.api_key)
    assert pod["name"] == "c-1-abcd1234-head" and pod["desiredStatus"] == "RUNNING"
    assert pod["lastStatusChange"].startswith("Rented by User: ")
    assert threading.active_count() < 50
