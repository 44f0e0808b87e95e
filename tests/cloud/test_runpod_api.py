"""The fake RunPod API (tests/cloud/emulator/runpod_api.py) answers the REAL clients: the `runpod` SDK
and SkyPilot 0.14.1's RunPod provisioner (sky/provision/runpod/{instance,utils,volume}.py), pointed at
it on 127.0.0.1 as the emulated-cloud harness points them (RUNPOD_API_BASE_URL, SkyPilot's REST base).
Pods are made by a FakePodHost here (no root, no namespaces): these tests are about the wire."""

import csv
import json
import threading

import pytest
import requests

from cloud.emulator.runpod_api import CATALOG_CSV, CPU_POD_COST_PER_HR, NO_CAPACITY, FakeRunPod

H100 = "NVIDIA H100 80GB HBM3"  # SkyPilot's GPU_NAME_MAP["H100-SXM"]


def _catalog_row(instance_type: str) -> dict:
    with CATALOG_CSV.open() as f:
        return next(r for r in csv.DictReader(f) if r["InstanceType"] == instance_type)


class FakePodHost:
    """The PodHost protocol without namespaces: records what it was asked, answers ssh_ready from a
    set the test controls."""

    def __init__(self, ready: bool = True):
        self.ready_on_start = ready
        self.ready: set[str] = set()
        self.started: dict[str, dict] = {}
        self.stopped: list[str] = []
        self._lock = threading.Lock()

    def start(self, pod, volume_dir, mount_path):
        with self._lock:
            self.started[pod["id"]] = {"pod": pod, "volume_dir": volume_dir, "mount_path": mount_path}
            if self.ready_on_start:
                self.ready.add(pod["id"])
            return f"10.99.0.{len(self.started) + 1}"

    def stop(self, pod_id):
        with self._lock:
            self.stopped.append(pod_id)
            self.ready.discard(pod_id)

    def ssh_ready(self, pod_id):
        return pod_id in self.ready


class Clock:
    def __init__(self):
        self.now = 1_800_000_000.0

    def __call__(self):
        return self.now


def _start(tmp_path, monkeypatch, host, **kw):
    import runpod
    from sky.adaptors import runpod as sky_runpod

    fake = FakeRunPod(host, tmp_path / "runpod", **kw)
    fake.start()
    monkeypatch.setenv("RUNPOD_API_BASE_URL", fake.url)  # read on every call (runpod/api/graphql.py:33)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setattr(runpod, "api_key", fake.api_key)
    monkeypatch.setattr(sky_runpod, "_REST_BASE", fake.url + "/v1")  # hard-coded in sky/adaptors/runpod.py:17
    return fake


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def host():
    return FakePodHost()


@pytest.fixture
def fake(tmp_path, monkeypatch, host, clock):
    fake = _start(tmp_path, monkeypatch, host, clock=clock)
    yield fake
    fake.close()


def _launch(name, *, instance_type="1x_H100-SXM_SECURE", preemptible=False, zone=None, **kw):
    """SkyPilot's own pod creation (sky/provision/runpod/utils.py launch), as run_instances calls it."""
    from sky.provision.runpod import utils

    row = _catalog_row(instance_type) if not instance_type.startswith("cpu") else None
    return utils.launch(cluster_name=name, node_type="head", instance_type=instance_type,
                        region=row["Region"] if row else "US", zone=zone or (row["AvailabilityZone"] if row else None),
                        disk_size=40, image_name="runpod/base:0.0.2", ports=None,
                        public_key="ssh-ed25519 AAAAC3Nza test", preemptible=preemptible,
                        bid_per_gpu=float(row["SpotPrice"]) if row else 0.0, docker_login_config=kw.pop("login", None),
                        **kw)


def _provision_config(instance_type, count, zone, **node):
    from sky.provision import common

    return common.ProvisionConfig(
        provider_config={"availability_zone": zone}, authentication_config={}, docker_config={},
        node_config={"InstanceType": instance_type, "DiskSize": 40, "ImageId": "runpod/base:0.0.2",
                     "PublicKey": "ssh-ed25519 AAAAC3Nza test", "Preemptible": False, "BidPerGPU": 0.0, **node},
        count=count, tags={}, resume_stopped_nodes=False, ports_to_open_on_launch=None)


def test_auth_is_the_sdks_bearer_header_and_nothing_else(fake):
    import runpod
    from runpod.api.graphql import run_graphql_query
    from sky.adaptors import runpod as sky_runpod

    assert run_graphql_query("query { myself { id } }")["data"]["myself"]["id"]
    with pytest.raises(runpod.error.AuthenticationError):  # the SDK's own 401 branch
        run_graphql_query("query { myself { id } }", api_key="wrong")
    # RunPod's docs also show ?api_key=...; the SDK never sends it, so it is not accepted here.
    r = requests.post(f"{fake.url}/graphql?api_key={fake.api_key}", json={"query": "{ myself { id } }"})
    assert r.status_code == 401
    runpod.api_key = "wrong"
    with pytest.raises(RuntimeError, match="RunPod REST error 401"):
        sky_runpod.rest_request("GET", "/networkvolumes")
    log = (fake.state_dir / "api.log").read_text()
    assert "POST /graphql 401" in log and "GET /v1/networkvolumes 401" in log
    assert fake.api_key not in log and "wrong" not in log and "Bearer" not in log


def test_skypilot_reads_a_bad_key_as_an_unexpected_error_not_an_invalid_key(fake):
    """SkyPilot's credential check (sky/clouds/runpod.py _validate_api_key) looks for 'unauthorized'
    in a QueryError, but the SDK raises AuthenticationError on a 401 (runpod/api/graphql.py): a user
    with a wrong key reads 'An unexpected error occurred', not 'RunPod API key is invalid'."""
    import runpod
    from sky.clouds.runpod import RunPod

    assert RunPod._validate_api_key() == (True, None)
    runpod.api_key = "wrong"
    ok, why = RunPod._validate_api_key()
    assert not ok and "unexpected error" in why and "Unauthorized request" in why


def test_a_cluster_through_skypilots_provisioner(fake, host, clock):
    from sky.provision.runpod import instance, utils

    row = _catalog_row("1x_H100-SXM_SECURE")
    record = instance.run_instances(row["Region"], "c1", "c1-ab12", _provision_config(
        "1x_H100-SXM_SECURE", 2, row["AvailabilityZone"]))
    assert len(record.created_instance_ids) == 2
    head = record.head_instance_id
    assert len(head) == 14 and head.isalnum() and head.islower()
    pods = {p["id"]: p for p in fake.pods()}
    assert sorted(p["name"] for p in pods.values()) == ["c1-ab12-head", "c1-ab12-worker"]
    started = host.started[head]["pod"]
    assert started["gpuTypeId"] == H100 and started["dockerArgs"].startswith("bash -c 'echo ")
    assert started["ports"] == "22/tcp,8266/http,6380/http" and host.started[head]["volume_dir"] is None
    assert started["containerEnv"]["RUNPOD_POD_ID"] == head

    info = instance.get_cluster_info(row["Region"], "c1-ab12")
    (inst,) = info.instances[head]
    assert inst.internal_ip == inst.external_ip == pods[head]["ip"] and inst.ssh_port == 22
    assert info.custom_ray_options == {"num-cpus": str(int(float(row["vCPUs"])))}
    assert utils.get_ssh_ports("c1-ab12") == [22, 22]
    assert set(instance.query_instances("c1", "c1-ab12", {}).values()) == {
        (instance.status_lib.ClusterStatus.UP, None)}
    raw = utils._sky_get_pods()
    assert {p["costPerHr"] for p in raw} == {float(row["Price"])}
    assert {p["podType"] for p in raw} == {"RESERVED"} and {p["vcpuCount"] for p in raw} == {float(row["vCPUs"])}

    clock.now += 1800
    instance.terminate_instances("c1-ab12")
    assert fake.pods() == [] and sorted(host.stopped) == sorted(pods)
    assert {e["end_reason"] for e in fake.ledger} == {"terminated"}
    assert fake.billed_usd() == pytest.approx(2 * float(row["Price"]) * 0.5)
    assert fake.billed_usd("c1-ab12-head") == pytest.approx(float(row["Price"]) * 0.5)
    clock.now += 3600
    assert fake.billed_usd() == pytest.approx(2 * float(row["Price"]) * 0.5)  # ended pods bill no more


def test_runtime_is_null_until_ssh_answers(tmp_path, monkeypatch):
    import runpod
    from sky.provision.runpod import utils

    host = FakePodHost(ready=False)
    fake = _start(tmp_path, monkeypatch, host)
    try:
        pod_id = _launch("boot")
        (listed,) = runpod.get_pods()  # the SDK's own QUERY_POD
        assert listed["desiredStatus"] == "RUNNING" and listed["runtime"] is None
        assert "ssh_port" not in utils.list_instances()[pod_id]  # run_instances keeps waiting
        host.ready.add(pod_id)
        info = utils.list_instances()[pod_id]
        ip = fake.pods()[0]["ip"]
        assert (info["external_ip"], info["internal_ip"], info["ssh_port"]) == (ip, ip, 22)
        assert info["port2endpoint"] == {22: {"host": ip, "port": 22}}
        assert runpod.get_pod(pod_id)["runtime"]["ports"][0]["privatePort"] == 22
    finally:
        fake.close()
    assert host.stopped == [pod_id] and fake.ledger[0]["end_reason"] == "emulator-closed"


def test_spot_pod_preempted_exited_is_listed_exited_and_skypilot_cannot_read_it(fake, host, clock):
    from sky.provision.runpod import instance, utils

    row = _catalog_row("1x_H100-SXM_SECURE")
    pod_id = _launch("spot", preemptible=True)  # podRentInterruptable (sky/provision/runpod/api/pods.py)
    (pod,) = fake.pods()
    assert pod["podType"] == "INTERRUPTABLE" and pod["bidPerGpu"] == float(row["SpotPrice"])
    assert pod["costPerHr"] == float(row["SpotPrice"]) and pod["volumeMountPath"] == "/runpod-volume"
    clock.now += 600
    fake.preempt(pod_id, "exited")
    assert host.stopped == [pod_id]
    listed = utils.list_instances()[pod_id]
    assert listed["status"] == "EXITED" and "external_ip" not in listed
    # SkyPilot 0.14.1's status map has no EXITED (sky/provision/runpod/instance.py:259): the real
    # query_instances raises, which the jobs controller retries as a transient error for minutes.
    with pytest.raises(KeyError, match="EXITED"):
        instance.query_instances("spot", "spot", {})
    assert fake.ledger[0]["end_reason"] == "preempted-exited"
    clock.now += 600
    assert fake.billed_usd() == pytest.approx(float(row["SpotPrice"]) / 6)  # billed until preempted
    instance.terminate_instances("spot")  # the user's `down` still removes the listed pod
    assert fake.pods() == [] and fake.ledger[0]["end_reason"] == "preempted-exited"


def test_preempt_vanish_from_the_admin_endpoint(fake, host):
    from sky.provision.runpod import instance

    pod_id = _launch("gone", preemptible=True)
    assert requests.post(f"{fake.url}/admin/preempt/{pod_id}?mode=sideways").status_code == 400
    assert requests.post(f"{fake.url}/admin/preempt/nosuchpod00000?mode=vanish").status_code == 404
    assert requests.post(f"{fake.url}/admin/preempt/{pod_id}?mode=vanish").json() == {"id": pod_id, "mode": "vanish"}
    assert instance.query_instances("gone", "gone", {}) == {} and host.stopped == [pod_id]
    state = requests.get(f"{fake.url}/admin/state").json()
    assert state["pods"] == [] and state["ledger"][0]["end_reason"] == "preempted-vanish"
    assert json.loads((fake.state_dir / "state.json").read_text())["ledger"][0]["id"] == pod_id


def test_network_volume_roundtrip(fake, host):
    from sky import models
    from sky.provision.runpod import instance, volume

    from launcher.backends.skypilot.runpod_volumes import runpod_volumes

    zone = _catalog_row("1x_H100-SXM_SECURE")["AvailabilityZone"]
    config = models.VolumeConfig(name="data", type="runpod-network-volume", cloud="runpod", region=None,
                                 zone=zone, name_on_cloud="data-1a2b", size="20", config={})
    vid = volume.apply_volume(config).id_on_cloud  # POST /v1/networkvolumes
    assert len(vid) == 10
    again = models.VolumeConfig(**{**config.model_dump(), "id_on_cloud": None, "size": "50"})
    assert volume.apply_volume(again).id_on_cloud == vid and again.size == "20"  # found by name: reused
    assert runpod_volumes() == [{"id": vid, "name": "data-1a2b", "size": 20, "dataCenterId": zone}]
    assert requests.get(f"{fake.url}/v1/networkvolumes/{vid}",
                        headers={"Authorization": f"Bearer {fake.api_key}"}).json()["size"] == 20

    pod_id = _launch("vol", network_volume_id=vid, volume_mount_path="/workspace")
    vdir = fake.state_dir / "volumes" / vid
    assert host.started[pod_id]["volume_dir"] == str(vdir) and vdir.is_dir()
    assert host.started[pod_id]["mount_path"] == "/workspace"
    assert volume.get_volume_usedby(config)[0] == ["vol-head"]  # the networkVolumeId variant of myPods
    with pytest.raises(RuntimeError, match="RunPod REST error 400.*in use"):
        volume.delete_volume(config)
    instance.terminate_instances("vol")
    volume.delete_volume(config)  # DELETE /v1/networkvolumes/<id>: 204
    assert runpod_volumes() == [] and not vdir.exists()


def test_a_pod_in_another_datacenter_than_its_volume_is_refused(fake):
    import runpod
    from sky.adaptors import runpod as sky_runpod

    zone = _catalog_row("1x_H100-SXM_SECURE")["AvailabilityZone"]
    vid = sky_runpod.rest_request("POST", "/networkvolumes", json={"name": "v", "size": 10, "dataCenterId": zone})["id"]
    with pytest.raises(runpod.error.QueryError, match="is in"):
        _launch("far", network_volume_id=vid, volume_mount_path="/w", zone="XX-NOPE-1")


def test_gpu_types_answer_catalog_prices_and_stock(fake):
    import runpod

    from launcher.backends.skypilot.runpod_volumes import gpu_stock

    one, two = _catalog_row("1x_H100-SXM_SECURE"), _catalog_row("2x_H100-SXM_SECURE")
    gpu = runpod.get_gpu(H100)  # runpod/api/queries/gpus.py generate_gpu_query
    assert gpu["memoryInGb"] == 80 and gpu["securePrice"] == float(one["Price"])
    assert gpu["lowestPrice"]["uninterruptablePrice"] == float(one["Price"])
    assert gpu["secureSpotPrice"] == gpu["lowestPrice"]["minimumBidPrice"] == float(one["SpotPrice"])
    assert runpod.get_gpu(H100, 2)["lowestPrice"]["uninterruptablePrice"] == float(two["Price"]) / 2
    assert {g["id"] for g in runpod.get_gpus()} >= {H100, "NVIDIA A100 80GB PCIe"}
    with pytest.raises(ValueError, match="No GPU found"):  # a type the catalog does not offer
        runpod.get_gpu("NVIDIA L40S")

    zone = one["AvailabilityZone"]
    assert gpu_stock("H100-SXM", 1, [zone, "XX-NOPE-1"], fake.api_key) == {zone: "High", "XX-NOPE-1": ""}
    fake.set_stock(H100, None)
    assert gpu_stock("H100-SXM", 1, [zone], fake.api_key) == {zone: ""}
    with pytest.raises(runpod.error.QueryError, match="no longer any instances"):
        _launch("oos")
    assert NO_CAPACITY.startswith("There are no longer")


def test_cpu_pod_ssh_key_and_many_pods_at_once(fake, host):
    import runpod
    from runpod.cli.groups.ssh.functions import add_ssh_key

    pod_id = _launch("ctl", instance_type="cpu3c-4-8")  # deployCpuPod with instanceId
    (pod,) = fake.pods()
    assert (pod["vcpuCount"], pod["memoryInGb"], pod["costPerHr"]) == (4.0, 8.0, CPU_POD_COST_PER_HR)
    assert pod["gpuCount"] == 0 and pod["templateId"] == "runpod-ubuntu" and pod["id"] == pod_id

    add_ssh_key("ssh-ed25519 AAAAkey1 skypilot-one")  # as sky/authentication.py:370 does
    add_ssh_key("ssh-ed25519 AAAAkey2 skypilot-two")  # escaped \n\n inside the inline literal
    assert runpod.get_user()["pubKey"] == "ssh-ed25519 AAAAkey1 skypilot-one\n\nssh-ed25519 AAAAkey2 skypilot-two"

    ids, errors = [], []

    def make(i):
        try:
            ids.append(runpod.create_pod(f"many-{i}", "img", gpu_type_id=H100, cloud_type="SECURE")["id"])
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=make, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(ids)) == 6 and len(fake.pods()) == 7
    assert len({p["ip"] for p in fake.pods()}) == 7


def test_docker_login_template_and_registry_auth(fake):
    from sky.provision.runpod import instance, utils

    _launch("priv", login={"username": "u", "password": "p4ss", "server": "ghcr.io"})
    (pod,) = fake.pods()
    assert pod["imageName"] == "ghcr.io/runpod/base:0.0.2" and pod["containerRegistryAuthId"]
    assert utils.get_registry_auth_resources("priv") == ("priv-docker-login-template", pod["containerRegistryAuthId"])
    instance.terminate_instances("priv")  # also deleteTemplate and deleteRegistryAuth
    state = fake.state()
    assert state["templates"] == [] and state["registryAuths"] == [] and state["pods"] == []
    assert "p4ss" not in (fake.state_dir / "api.log").read_text() + (fake.state_dir / "state.json").read_text()


def test_an_unknown_query_is_a_graphql_error_naming_it(fake):
    import runpod
    from runpod.api.graphql import run_graphql_query

    with pytest.raises(runpod.error.QueryError, match='Cannot query field "podStop" on type "Mutation"'):
        runpod.stop_pod("abc")  # SkyPilot never stops a RunPod pod (instance.py stop_instances raises)
    with pytest.raises(runpod.error.QueryError, match='Cannot query field "foo" on type "Pod"'):
        run_graphql_query("query { myself { pods { id foo } } }")
    with pytest.raises(runpod.error.QueryError, match="Syntax Error"):
        run_graphql_query('mutation { podTerminate(input: {podId: "x) }')
    with pytest.raises(runpod.error.QueryError, match="Pod nosuch not found"):
        runpod.terminate_pod("nosuch")
    aliased = run_graphql_query(
        'query Q($id: String) { gpuTypes(input: {id: $id}) { memory: memoryInGb } }'.replace(
            "$id: String", "$id: String = \"NVIDIA H100 80GB HBM3\""))
    assert aliased == {"data": {"gpuTypes": [{"memory": 80}]}}
    assert requests.head(f"{fake.url}/anything").status_code == 200  # SkyPilot's network check
    log = (fake.state_dir / "api.log").read_text()
    assert 'REJECTED Cannot query field "podStop"' in log and "ERRORS Pod nosuch not found" in log
