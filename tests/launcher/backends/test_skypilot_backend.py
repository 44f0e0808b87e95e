"""The SkyPilot backend against the real `sky` package: tasks are SkyPilot's own parse of the rendered
sky/*.yaml, the price comes from SkyPilot's optimizer on the shipped catalog, and only the calls
that would reach an API server or a cloud (sky.launch, sky.jobs.*, sky.get, volumes...) are
replaced, by tests/sky_edge.py, whose answers go through SkyPilot's own encoders and decoders.
File transfer runs real ssh + rsync against a loopback OpenSSH server."""

import json
import os
import tempfile
from pathlib import Path

# tests/conftest.py sets these before anything imports sky; kept here for a lone run of this file.
if "SKY_RUNTIME_DIR" not in os.environ:
    os.environ["SKY_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="sky-runtime-")
os.environ.setdefault("SKYPILOT_DISABLE_USAGE_COLLECTION", "1")
os.environ.setdefault("SKYPILOT_DISABLE_LOCAL_API_SERVER", "1")

import io

import pytest
import sky
import sky.client.sdk
import sky.jobs
import sky.volumes
import yaml
from sky import exceptions as ex
from sky.jobs import ManagedJobStatus
from sky.skylet.job_lib import JobStatus
from sky.utils.status_lib import ClusterStatus

from launcher.store import registry
from launcher.profiles import render
from launcher.backends import BackendError, LaunchSpec
from launcher.backends import skypilot as sp
from launcher.backends.skypilot import control, run_state
from launcher.backends.skypilot.sdk import MANAGED_JOB_FIELDS
from launcher.project import PACKAGE_ROOT as REPO_ROOT
from launcher.profiles.profile import Profile, load_profile
from launcher.store.registry import Run

HF, WANDB = "hf_test_secret_value_1234", "wandb_test_secret_value_5678"


try:  # tests/ is a plain directory on sys.path (or, later, a package)
    from sky_edge import FakeSky
except ImportError:
    from tests.sky_edge import FakeSky


@pytest.fixture
def fake(monkeypatch):
    return FakeSky(monkeypatch)


def spec_for(name, run_id, secrets=None, with_run_id_env=True):
    profile = load_profile(name)
    run = Run(id=run_id, profile=name, backend="skypilot")
    envs = {"LAUNCH_PRICE_PER_HOUR": "5.3800", "LAUNCH_BUDGET_USD": "40"}
    if with_run_id_env:
        envs["LAUNCH_RUN_ID"] = run_id
    return LaunchSpec(run=run, profile=profile, task_yaml=render.task_path(name),
                      config_yaml=render.config_path(name), envs=envs, secrets=secrets or {})


def env_secrets():
    return {k: os.environ[k] for k in render.SECRETS if os.environ.get(k)}


# --------------------------------------------------------------------------------------- up


def test_sonia_cluster_volume_first_autostop_down_and_secrets_by_name_only(fake, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", HF)
    monkeypatch.setenv("WANDB_API_KEY", WANDB)
    rendered = render.task_path("sonia-h100").read_text()
    run = sp.SkyPilotBackend().up(spec_for("sonia-h100", "sonia-h100-20260102-030405", env_secrets()))

    names = fake.names()
    assert names.index("volumes.apply") < names.index("launch")
    assert "jobs.launch" not in names
    (volume,), _ = fake.one("volumes.apply")[1:]
    assert isinstance(volume, sky.volumes.Volume)
    assert (volume.name, volume.type, volume.size) == ("sonia-workspace", "runpod-network-volume", "420")
    # A datacenter of the snapshot with 2x H100-SXM, one with RunPod's S3 API first.
    assert (volume.cloud, volume.region, volume.zone) == ("runpod", "US", "US-CA-2")
    assert fake.one("volumes.ls")[1:] == ((), {})  # every volume: one made for this name has a suffix

    (task,), kwargs = fake.one("launch")[1:]
    assert kwargs == {"cluster_name": "sonia-h100-20260102-030405", "idle_minutes_to_autostop": 10,
                      "down": True}
    assert isinstance(task, sky.Task) and task.num_nodes == 1
    (res,) = task.resources
    assert str(res.cloud) == "RunPod" and res.accelerators == {"H100-SXM": 2} and not res.use_spot
    assert task.volumes == {"/workspace": "sonia-workspace"}
    assert task.envs["LAUNCH_RUN_ID"] == "sonia-h100-20260102-030405"
    assert task.envs["LAUNCH_PRICE_PER_HOUR"] == "5.3800"
    secrets = {k: v.get_secret_value() for k, v in task.secrets.items()}
    assert secrets == {"HF_TOKEN": HF, "WANDB_API_KEY": WANDB}
    assert task.managed_secret_refs == []  # else the API server refuses: "No value available for secret"
    assert HF not in getattr(task, "_user_specified_yaml", "")  # the copy SkyPilot stores server-side
    # The workdir is the staged upload allowlist (tests/launcher/backends/test_contract.py), gone once the request ended.
    assert Path(task.workdir).name == run.id and Path(task.workdir).parent.name == "workdirs"
    assert not Path(task.workdir).exists()
    assert fake.waited("launch") == [("stream_and_get", {"output_stream": None})]

    assert run.cluster == "sonia-h100-20260102-030405" and run.job_id == "7" and run.state == "starting"
    assert run.handle.kind == "cluster"
    assert run.handle.run_dir == "/workspace/runs/sonia-h100-20260102-030405"
    assert run.handle.volume["zone"] == "US-CA-2" and run.handle.volume["key_prefix"] == "runs"

    # Values only ever in memory: not in the rendered YAML, not in the registry.
    assert render.task_path("sonia-h100").read_text() == rendered and HF not in rendered
    registry.save(run)
    db = registry.db_path().read_bytes() + b"".join(
        p.read_bytes() for p in registry.db_path().parent.glob("runs.db*"))
    assert HF.encode() not in db and WANDB.encode() not in db
    assert registry.get(run.id).handle.to_dict() == json.loads(json.dumps(run.handle.to_dict()))


def test_lovecraft_spot_is_a_managed_job_with_recovery_on_the_volume(fake, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", HF)  # WANDB_API_KEY unset: dropped, not left as a dangling ref
    spec = spec_for("lovecraft-a100-spot", "lovecraft-a100-spot-1", env_secrets(), with_run_id_env=False)
    run = sp.SkyPilotBackend().up(spec)

    names = fake.names()
    assert names.index("volumes.apply") < names.index("jobs.launch") and "launch" not in names
    (volume,), _ = fake.one("volumes.apply")[1:]
    assert (volume.name, volume.size, volume.zone) == ("lovecraft-workspace", "100", "US-CA-2")
    (task,), kwargs = fake.one("jobs.launch")[1:]
    assert kwargs == {"name": "lovecraft-a100-spot-1"}
    (res,) = task.resources
    assert res.use_spot and res.accelerators == {"A100-80GB-SXM": 1}  # runbook 001: the SXM card
    # Only transient exits (75) and signals (143) are retried; a budget stop or config error never.
    assert res.job_recovery == {"strategy": "EAGER_NEXT_REGION", "max_restarts_on_errors": 0,
                                "recover_on_exit_codes": [75, 143]}
    # The controller (a billed pod on RunPod) is torn down when idle: the launch request says so.
    autostop = fake.client_config["jobs.launch"]["jobs"]["controller"]["resources"]["autostop"]
    assert autostop == {"idle_minutes": 10, "down": True} == render.CONTROLLER_AUTOSTOP
    assert "jobs" not in sky.skypilot_config.to_dict()  # only for that request
    assert task.volumes == {"/workspace": "lovecraft-workspace"}
    # The run id is explicit even when the caller gave none and the rendered spot task has none:
    # an env is part of the task, so it is the same on every recovery, and launch knows the run dir.
    assert task.envs["LAUNCH_RUN_ID"] == "lovecraft-a100-spot-1"
    assert {k: v.get_secret_value() for k, v in task.secrets.items()} == {"HF_TOKEN": HF}
    assert task.managed_secret_refs == []
    assert run.cluster is None and run.job_id == "3" and run.handle.kind == "managed_job"
    assert run.handle.run_dir == "/workspace/runs/lovecraft-a100-spot-1"


def test_qwen_multi_node_cluster_ordered_infra_bucket_no_volume(fake):
    run = sp.SkyPilotBackend().up(spec_for("qwen3-32b-4x4-a100", "qwen3-32b-4x4-a100-1"))

    assert "volumes.apply" not in fake.names() and "volumes.ls" not in fake.names()
    (task,), kwargs = fake.one("launch")[1:]
    assert kwargs == {"cluster_name": "qwen3-32b-4x4-a100-1", "idle_minutes_to_autostop": 10, "down": True}
    assert task.num_nodes == 2
    assert isinstance(task.resources, list)  # `ordered:` keeps the order
    assert [str(r.cloud) for r in task.resources] == ["Kubernetes", "Azure"]
    assert all(r.accelerators == {"A100-80GB": 8} for r in task.resources)
    (store,) = task.storage_mounts.values()
    assert list(task.storage_mounts) == ["/checkpoints"] and store.name == "qwen3-32b-checkpoints"
    assert task.volumes == {} and task.secrets == {} and task.managed_secret_refs == []
    assert run.handle.run_dir == "/checkpoints/runs/qwen3-32b-4x4-a100-1"
    assert run.handle.bucket["name"] == "qwen3-32b-checkpoints" and run.handle.volume is None


def test_existing_volume_is_reused_not_applied(fake):
    fake.results["volumes.ls"] = [{"name": "sonia-workspace", "region": "CA", "zone": "CA-MTL-1",
                                   "name_on_cloud": "sonia-workspace-ab12cd"}]
    run = sp.SkyPilotBackend().up(spec_for("sonia-h100", "sonia-h100-2"))
    assert "volumes.apply" not in fake.names() and "launch" in fake.names()
    assert run.handle.volume["zone"] == "CA-MTL-1" and run.handle.volume["created"] is False


def test_volume_in_another_region_than_the_profile_is_refused_before_launch(fake):
    fake.results["volumes.ls"] = [{"name": "sonia-workspace", "region": "CA", "zone": "CA-MTL-1"}]
    spec = spec_for("sonia-h100", "sonia-h100-8")
    spec.profile = with_region(spec.profile, "US")
    with pytest.raises(BackendError, match="sonia-workspace is in CA/CA-MTL-1 but cluster.region is US"):
        sp.SkyPilotBackend().up(spec)
    assert "launch" not in fake.names()


def with_region(profile, region):
    return profile.model_copy(update={"cluster": profile.cluster.model_copy(update={"region": region})})


def test_new_volume_datacenter_follows_cluster_region():
    from launcher.backends.skypilot.runpod_volumes import new_volume_infra

    sonia = load_profile("sonia-h100")
    assert new_volume_infra(with_region(sonia, "RO"), None) == "runpod/RO/EU-RO-1"
    assert new_volume_infra(with_region(sonia, "SE"), None) == "runpod/SE/EU-SE-1"
    with pytest.raises(BackendError, match="snapshot offers H100-SXM:2 in region ZZ: change cluster"):
        new_volume_infra(with_region(sonia, "ZZ"), None)


def test_no_credentials_says_what_to_run_and_launches_nothing(fake):
    fake.results["enabled_clouds"] = []
    with pytest.raises(BackendError) as e:
        sp.SkyPilotBackend().up(spec_for("sonia-h100", "sonia-h100-3"))
    msg = str(e.value)
    assert "\n" not in msg
    # SkyPilot 0.14's check reads ~/.runpod/config.toml only (RUNPOD_API_KEY alone fails it): `runpod config`
    assert "sky check runpod" in msg and "`runpod config`" in msg and "~/.runpod/config.toml" in msg
    assert "--backend local|ssh" in msg
    # The server's list is a cache: SkyPilot's own check ran once before "no credentials" was said.
    assert fake.names() == ["enabled_clouds", "get", "check", "get", "enabled_clouds", "get"]
    assert fake.one("check")[1:] == ((("runpod",),), {"verbose": False})


def test_without_an_api_server_the_real_sdk_error_becomes_one_line(monkeypatch):
    # Nothing replaced: the real SDK refuses (local API server disabled) and the message says why.
    monkeypatch.delenv("SKYPILOT_API_SERVER_ENDPOINT", raising=False)
    with pytest.raises(BackendError, match=r"cannot reach a SkyPilot API server: start one with `sky api"):
        sp.SkyPilotBackend().up(spec_for("sonia-h100", "sonia-h100-4"))


def test_failed_setup_tears_the_cluster_down_capacity_failure_does_not(fake):
    fake.results["launch"] = ex.CommandError(1, "python -m payload preflight", "HF_TOKEN missing", None)
    with pytest.raises(BackendError, match="torn down, nothing bills"):
        sp.SkyPilotBackend().up(spec_for("sonia-h100", "sonia-h100-5"))
    assert fake.one("down")[1] == ("sonia-h100-5",)

    fake.calls.clear()
    fake.results["launch"] = ex.ResourcesUnavailableError("Failed to provision all launchable resources.")
    with pytest.raises(BackendError, match=r"no capacity for H100-SXM:2 x1 on runpod"):
        sp.SkyPilotBackend().up(spec_for("sonia-h100", "sonia-h100-6"))
    assert "down" not in fake.names()


def test_push_to_hub_without_hf_token_refuses_before_anything_bills(fake):
    spec = spec_for("sonia-h100", "sonia-h100-7")
    spec.profile = spec.profile.model_copy(update={"outputs": spec.profile.outputs.model_copy(
        update={"push_to_hub": "me/sonia"})})
    with pytest.raises(BackendError, match="needs HF_TOKEN"):
        sp.SkyPilotBackend().up(spec)
    assert fake.calls == []


@pytest.mark.parametrize("run_id, name", [
    ("sonia-h100-20260102-030405", "sonia-h100-20260102-030405"),
    ("000_Big.Run", "launch-000-big-run"),
])
def test_cluster_names_are_valid_for_skypilot(run_id, name):
    from sky.utils import common_utils

    assert sp.cluster_name(run_id) == name
    common_utils.check_cluster_name_is_valid(sp.cluster_name(run_id))
    long = sp.cluster_name("x" * 100)
    assert len(long) <= 63 and long != sp.cluster_name("x" * 99)


# ------------------------------------------------------------------------------- error mapping


@pytest.mark.parametrize("exc, expected", [
    (ex.ResourcesUnavailableError("Failed to acquire resources in all zones in US"),
     "no capacity for H100-SXM:2 x1 on runpod right now: Failed to acquire resources"),
    (ex.ResourcesUnavailableError("Failed to provision", failover_history=[
        RuntimeError("Quota 'GPUS_ALL_REGIONS' exceeded. Limit: 0.0 globally.")]),
     "quota or spend limit reached for H100-SXM:2 x1 on runpod"),
    (ex.NoCloudAccessError("Cloud access is not set up."), "sky check runpod"),
    (ex.VolumeTopologyConflictError("Volume sonia-workspace can only be attached on zone:CA-MTL-1"),
     "the network volume lives in another zone"),
    (ex.ApiServerConnectionError("http://127.0.0.1:46580"), "`sky api start`"),
    (ex.ClusterDoesNotExist("Cluster 'x' does not exist."), "the cluster is gone"),
    (RuntimeError("No value available for secret(s): HF_TOKEN. A secret with\nno inline value"),
     "(export the variable before `launch up`)"),
    (ValueError("\x1b[31mweird\x1b[0m\nsecond line"), "SkyPilot ValueError: weird"),
])
def test_sky_exceptions_map_to_one_line_with_the_next_step(exc, expected):
    msg = str(sp.map_sky_error(exc, load_profile("sonia-h100")))
    assert expected in msg
    assert "\n" not in msg and "\x1b" not in msg


# --------------------------------------------------------------------------------------- price


def runpod_graphql(monkeypatch, answer):
    """RunPod's GraphQL endpoint, replaced at the HTTP edge (`requests.post` in the runpod SDK)."""
    import runpod.api.graphql as gql

    seen = []

    class Response:
        status_code = 200

        def json(self):
            return answer

    def post(url, headers, data, timeout):
        seen.append((url, headers["Authorization"], json.loads(data)["query"]))
        if isinstance(answer, BaseException):
            raise answer
        return Response()

    monkeypatch.setattr(gql.requests, "post", post)
    return seen


@pytest.mark.slow  # 39 s: SkyPilot's optimizer in a child, several times
def test_price_from_runpod_api_then_catalog_then_profile(monkeypatch):
    sonia = load_profile("sonia-h100")
    gpu = {"id": "NVIDIA H100 80GB HBM3", "securePrice": 2.99, "secureSpotPrice": 1.75,
           "lowestPrice": {"minimumBidPrice": 1.5, "uninterruptablePrice": 2.69}}
    seen = runpod_graphql(monkeypatch, {"data": {"gpuTypes": [gpu]}})
    monkeypatch.setenv("RUNPOD_API_KEY", "rp_key")
    assert sp.hourly_price(sonia) == (5.98, "runpod-api")  # 2.99 x 2 GPUs
    (url, auth, query), = seen
    assert url == "https://api.runpod.io/graphql" and auth == "Bearer rp_key"
    assert 'id: "NVIDIA H100 80GB HBM3"' in query and "gpuCount: 2" in query
    assert sp.hourly_price(load_profile("lovecraft-a100-spot")) == (1.75, "runpod-api")  # spot price

    # SkyPilot's optimizer on the snapshot (in a child process: see skypilot/price.py _optimize).
    runpod_graphql(monkeypatch, ConnectionError("api.runpod.io unreachable"))
    from launcher.catalog import SNAPSHOT_DATE

    assert sp.hourly_price(sonia) == (6.58, f"catalog {SNAPSHOT_DATE}")  # extract: 2x_H100-SXM $6.58/h
    monkeypatch.delenv("RUNPOD_API_KEY")
    assert sp.hourly_price(load_profile("lovecraft-a100-spot")) == (1.59, f"catalog {SNAPSHOT_DATE}")  # 1x_A100-80GB-SXM

    # No instance in the snapshot for 3 GPUs: the profile's own price is the last resort.
    body = yaml.safe_load((REPO_ROOT / "clusters/sonia-h100.yaml").read_text())
    body["cluster"]["accelerators"] = "H100-SXM:3"
    body["train"].pop("effective_batch_size")
    body["budget"]["price_per_hour"] = 9.0
    assert sp.hourly_price(Profile.model_validate(body)) == (9.0, "profile")


def test_sdk_refuses_launchs_offline_planning_runtime_dir(monkeypatch):
    from launcher.catalog import offline_runtime_dir

    monkeypatch.setenv("SKY_RUNTIME_DIR", str(offline_runtime_dir()))
    with pytest.raises(BackendError, match="imported SkyPilot for offline planning"):
        sp.SkyPilotBackend().status(cluster_run())


# ---------------------------------------------------------------------------- logs/status/down


def cluster_run(run_dir="/workspace/runs/r1", state="running"):
    return Run(id="r1", profile="sonia-h100", backend="skypilot", cluster="r1", job_id="7", state=state,
               handle={"kind": "cluster", "cluster": "r1", "job_id": 7, "job_name": "r1", "run_dir": run_dir,
                       "volume": None, "bucket": None, "push_to_hub": None})


def managed_run():
    return Run(id="m1", profile="lovecraft-a100-spot", backend="skypilot", job_id="3", state="running",
               handle={"kind": "managed_job", "job_id": 3, "job_name": "m1", "run_dir": "/workspace/runs/m1",
                       "volume": {"name": "lovecraft-workspace", "type": "runpod-network-volume",
                                  "zone": "US-CA-2", "key_prefix": "runs"}})


def test_logs_tail_the_cluster_job_or_the_managed_job(fake):
    out = io.StringIO()
    assert sp.SkyPilotBackend().logs(cluster_run(), follow=True, out=out) == 0
    assert fake.one("tail_logs")[1:] == (("r1", 7, True), {"output_stream": out})
    assert sp.SkyPilotBackend().logs(managed_run(), follow=False, out=out) == 0
    assert fake.one("jobs.tail_logs")[1:] == ((), {"job_id": 3, "follow": False, "output_stream": out})
    assert out.getvalue() == "log of tail_logs\nlog of jobs.tail_logs\n"


def test_managed_job_states(fake):
    rec = {"job_id": 3, "job_name": "m1", "status": ManagedJobStatus.RECOVERING, "recovery_count": 1}
    fake.results["jobs.queue"] = ([rec], 1, {}, 1)
    st = sp.SkyPilotBackend().status(managed_run())
    assert st.state == "starting" and "preempted" in st.reason and "recovery 2" in st.reason
    assert fake.one("jobs.queue_v2")[2] == {"refresh": False, "job_ids": [3], "fields": list(MANAGED_JOB_FIELDS)}

    rec.update(status=ManagedJobStatus.FAILED_NO_RESOURCE, failure_reason="no A100 anywhere")
    st = sp.SkyPilotBackend().status(managed_run())
    assert (st.state, st.reason) == ("failed", "FAILED_NO_RESOURCE: no A100 anywhere")
    rec.update(status=ManagedJobStatus.SUCCEEDED)
    assert sp.SkyPilotBackend().status(managed_run()).state == "completed"


def test_cluster_gone_and_unreachable_api(fake):
    st = sp.SkyPilotBackend().status(cluster_run())  # status [] = no such cluster any more
    assert st.state == "stopped" and "is gone" in st.reason
    fake.results["status"] = ex.ApiServerConnectionError("http://127.0.0.1:46580")
    st = sp.SkyPilotBackend().status(cluster_run(state="running"))
    assert st.state == "running" and "SkyPilot not reachable" in st.reason


def test_merge_keeps_the_runs_own_reason_for_ending():
    st = sp.merge_status("failed", "job FAILED", {"state": "budget_exhausted", "reason": "spent $40.01",
                                                  "step": 120, "loss": 0.8, "cost_usd": 40.01}, "running")
    assert (st.state, st.reason, st.step, st.cost_usd) == ("budget_exhausted", "spent $40.01", 120, 40.01)
    st = sp.merge_status("running", None, {"state": "training", "step": 5}, "starting")
    assert st.state == "running" and st.extra["payload_state"] == "training"
    assert sp.merge_status(None, "gone", {"state": "completed"}, "running").state == "completed"
    # `launch down`'s final save ends the trainer with exit 5, which SkyPilot calls FAILED.
    st = sp.merge_status("failed", "job FAILED: see `launch logs`",
                         {"state": "stopped", "reason": "stopped by launch down", "step": 752}, "running")
    assert (st.state, st.reason, st.step) == ("stopped", "stopped by launch down", 752)


def answers(*values):
    """A FakeSky result that gives `values` in turn, then the last one for ever."""
    it = iter(values)
    last = [values[-1]]

    def next_answer():
        last[0] = next(it, last[0])
        return last[0]
    return next_answer


@pytest.fixture
def fast_grace(monkeypatch):
    monkeypatch.setattr(control, "POLL_S", 0.01)
    monkeypatch.setattr(control, "DOWN_GRACE_S", 0.5)
    monkeypatch.setattr(control, "SKY_KILL_AFTER_S", 0.5)  # the bound on a trainer that never confirms (30 s)


def test_down_gives_the_trainer_its_sigterm_checkpoint_before_the_cluster_goes(fake, fast_grace, monkeypatch):
    fake.results["status"] = [{"name": "r1", "status": ClusterStatus.UP}]
    fake.results["job_status"] = {7: JobStatus.RUNNING}
    reports = iter([{"state": "training", "step": 40}, {"state": "training", "step": 40},
                    {"state": "stopped", "step": 40, "exit_code": 143}])
    monkeypatch.setattr(run_state, "status_json", lambda run, up: next(reports))
    sp.SkyPilotBackend().down(cluster_run())
    names = fake.names()
    assert fake.one("cancel")[1:] == (("r1",), {"job_ids": [7]})
    assert names.index("cancel") < names.index("down") and next(reports, None) is None  # waited for it
    assert fake.one("down")[1:] == (("r1",), {})  # no bucket: nothing to flush

    # A bucket-backed run: the teardown is graceful, so MOUNT_CACHED checkpoint uploads finish.
    fake.calls.clear()
    monkeypatch.setattr(run_state, "status_json", lambda run, up: {"state": "training"})
    run = cluster_run()
    run.handle.bucket = {"name": "b", "store": "azure", "mount": "/checkpoints", "mode": "MOUNT_CACHED"}
    sp.SkyPilotBackend().down(run)  # the trainer never confirms: the wait is bounded
    assert fake.one("down")[2] == {"graceful": True, "graceful_timeout": control.DOWN_GRACE_S}


def test_down_of_a_finished_or_gone_cluster_cancels_nothing(fake):
    fake.results["status"] = [{"name": "r1", "status": ClusterStatus.UP}]
    fake.results["job_status"] = {7: JobStatus.SUCCEEDED}  # waiting for autostop
    sp.SkyPilotBackend().down(cluster_run())
    assert "cancel" not in fake.names() and fake.one("down")[1] == ("r1",)
    fake.calls.clear()
    fake.results["status"] = []
    fake.results["down"] = ex.ClusterDoesNotExist("Cluster 'r1' does not exist.")
    sp.SkyPilotBackend().down(cluster_run())  # already gone: nothing to do
    assert "cancel" not in fake.names()


def test_down_of_a_managed_job_waits_until_the_controller_ended_it(fake, fast_grace):
    rec = {"job_id": 3, "job_name": "m1", "recovery_count": 0}
    fake.results["jobs.queue"] = answers(([{**rec, "status": ManagedJobStatus.CANCELLING}], 1, {}, 1),
                                         ([{**rec, "status": ManagedJobStatus.CANCELLED}], 1, {}, 1))
    sp.SkyPilotBackend().down(managed_run())
    assert fake.one("jobs.cancel")[2] == {"job_ids": [3], "graceful": True,
                                          "graceful_timeout": control.DOWN_GRACE_S}
    assert fake.names().count("jobs.queue_v2") == 2

    fake.results["jobs.queue"] = ([{**rec, "status": ManagedJobStatus.CANCELLING}], 1, {}, 1)
    with pytest.raises(BackendError, match=r"managed job 3 is still being cancelled after 1 s and may "
                                           r"bill until it ends: check `sky jobs queue`"):
        sp.SkyPilotBackend().down(managed_run())


@pytest.mark.parametrize("status, cluster, billing", [
    (ManagedJobStatus.PENDING, None, False),
    (ManagedJobStatus.STARTING, None, False),  # waiting for capacity: no machine yet
    (ManagedJobStatus.STARTING, "m1-3-abc", True),  # provisioning: the pod may bill already
    (ManagedJobStatus.RECOVERING, None, False),  # preempted, the old machine gone
    (ManagedJobStatus.RUNNING, "m1-3-abc", True),
    (ManagedJobStatus.CANCELLING, "m1-3-abc", True),
    (ManagedJobStatus.SUCCEEDED, None, False),
    (ManagedJobStatus.FAILED_NO_RESOURCE, None, False),
])
def test_managed_job_status_says_when_no_machine_bills(fake, status, cluster, billing):
    fake.results["jobs.queue"] = ([{"job_id": 3, "job_name": "m1", "status": status, "recovery_count": 0,
                                    "cluster_name_on_cloud": cluster}], 1, {}, 1)
    assert sp.SkyPilotBackend().status(managed_run()).billing is billing


def test_cluster_status_bills_while_the_cluster_exists(fake):
    fake.results["status"] = [{"name": "r1", "status": ClusterStatus.INIT}]
    assert sp.SkyPilotBackend().status(cluster_run()).billing is True
    fake.results["status"] = []
    assert sp.SkyPilotBackend().status(cluster_run()).billing is False
    fake.results["status"] = ex.ApiServerConnectionError("http://127.0.0.1:46580")
    assert sp.SkyPilotBackend().status(cluster_run()).billing is None  # unknown


@pytest.mark.parametrize("before, after, api_stop, expect", [
    ([], [4242], None, "; stopped the local SkyPilot API server this command started"),
    ([], [4242], RuntimeError("busy"), "still runs (~1.2 GB, pid 4242): stop it with `sky api stop`"),
    ([77], [77], None, None),  # it was running before: not ours to stop
    ([77], [78], None, "; stopped the local SkyPilot API server this command started"),  # ours beside it
    (None, None, None, None),  # a remote API server
])
def test_a_failed_up_stops_the_api_server_it_started(fake, monkeypatch, before, after, api_stop, expect):
    pids = iter([before, after])
    asked = []

    def server_pids(origin=None):
        asked.append(origin)
        return next(pids)

    monkeypatch.setattr(control, "local_api_server_pids", server_pids)
    from sky.utils import subprocess_utils

    killed = []
    monkeypatch.setattr(subprocess_utils, "kill_children_processes", lambda parent_pids, force: killed.extend(parent_pids))
    if api_stop:
        monkeypatch.setattr(sky, "api_stop", lambda: (_ for _ in ()).throw(api_stop))
    fake.results["enabled_clouds"] = []
    with pytest.raises(BackendError) as e:
        sp.SkyPilotBackend().up(spec_for("sonia-h100", "sonia-h100-9"))
    msg = str(e.value)
    assert msg.startswith("SkyPilot has no usable credentials") and "\n" not in msg
    if expect:
        assert msg.endswith(expect)
    else:
        assert "API server" not in msg
    assert ("api_stop" in fake.names()) is (expect is not None and api_stop is None and not before)
    assert killed == ([78] if before == [77] and after == [78] else [])  # only ours, by pid: 77 is not
    if before == []:  # only a server started from this process counts as this command's
        assert asked[0] is None and asked[1].startswith(f"{os.getpid()}-")
    assert control.ORIGIN_ENV not in os.environ  # the tag lasts as long as the launch


def test_only_a_server_started_from_this_process_is_ours(monkeypatch):
    import psutil

    class Server:  # an API server process as psutil sees it
        def __init__(self, pid, origin):
            self.info, self._env = {"pid": pid, "cmdline": ["python", "-m", "sky.server.server"]}, {}
            if origin:
                self._env[control.ORIGIN_ENV] = origin

        def environ(self):
            return self._env

    with control.marked_process() as origin:
        servers = [Server(11, None), Server(12, "someone-else"), Server(13, os.environ[control.ORIGIN_ENV])]
    monkeypatch.setattr(psutil, "process_iter", lambda attrs: iter(servers))
    assert control.local_api_server_pids() == [11, 12, 13]
    assert control.local_api_server_pids(origin) == [13]


# ------------------------------------------------------------------ files: real ssh + rsync


@pytest.fixture
def cluster_ssh(tmp_path):
    """A loopback OpenSSH server, reachable as host `r1` through the per-cluster SSH config file
    SkyPilot writes at launch (~/.sky/generated/ssh/<cluster>)."""
    try:
        from sshd import SSHServer, ensure_sshd
    except ImportError:
        from tests.sshd import SSHServer, ensure_sshd

    ensure_sshd()
    server = SSHServer(tmp_path / "sshd").start()
    known = tmp_path / "known_hosts"
    known.write_text(server.known_hosts_line())
    config = Path.home() / ".sky" / "generated" / "ssh" / "r1"
    config.parent.mkdir(parents=True)
    config.write_text(f"Host r1\n  HostName 127.0.0.1\n  Port {server.port}\n  User {server.user}\n"
                      f"  IdentityFile {server.client_key}\n  IdentitiesOnly yes\n"
                      f"  UserKnownHostsFile {known}\n  StrictHostKeyChecking yes\n")
    yield server
    server.stop()


def test_fetch_and_status_from_a_live_cluster(fake, cluster_ssh, tmp_path):
    run_dir = tmp_path / "volume" / "runs" / "r1"
    (run_dir / "outputs" / "adapter").mkdir(parents=True)
    import numpy as np
    from safetensors.numpy import save_file

    save_file({"lora_A": np.random.default_rng(0).standard_normal((300, 250), np.float32)},
              str(run_dir / "outputs" / "adapter" / "adapter_model.safetensors"))
    (run_dir / "outputs" / "adapter" / "adapter_config.json").write_text('{"r": 32}')
    (run_dir / "metrics.jsonl").write_text('{"step": 1, "loss": 2.0}\n')
    (run_dir / "status.json").write_text(json.dumps({"state": "training", "step": 40, "max_steps": 600,
                                                     "loss": 1.25, "cost_usd": 3.5}))
    fake.results["status"] = [{"name": "r1", "status": ClusterStatus.UP}]
    fake.results["job_status"] = {7: JobStatus.RUNNING}

    st = sp.SkyPilotBackend().status(cluster_run(str(run_dir)))
    assert (st.state, st.step, st.max_steps, st.loss, st.cost_usd) == ("running", 40, 600, 1.25, 3.5)
    assert fake.one("job_status")[1:] == (("r1",), {"job_ids": [7]})

    from launcher.store.artifacts import fetch

    dest = tmp_path / "artifacts" / "r1"
    report = fetch(sp.SkyPilotBackend(), cluster_run(str(run_dir)), dest)  # no MANIFEST: a run still going
    assert report.ok and report.checked == "size", report
    assert set(report.files) == {"adapter/adapter_model.safetensors", "adapter/adapter_config.json",
                                 "metrics.jsonl", "checkpoints.json", "logs/run.log"}  # no summary yet
    for rel, name in (("outputs/adapter/adapter_model.safetensors", "adapter/adapter_model.safetensors"),
                      ("outputs/adapter/adapter_config.json", "adapter/adapter_config.json"),
                      ("metrics.jsonl", "metrics.jsonl")):
        assert (dest / name).read_bytes() == (run_dir / rel).read_bytes()
    assert (dest / "logs/run.log").read_text() == "log of tail_logs\n"  # the job's log, from SkyPilot


def test_fetch_detects_a_short_copy(fake, cluster_ssh, tmp_path, monkeypatch):
    from launcher.store.artifacts import fetch

    run_dir = tmp_path / "volume" / "runs" / "r1"
    run_dir.mkdir(parents=True)
    (run_dir / "metrics.jsonl").write_text("x" * 1000)
    fake.results["status"] = [{"name": "r1", "status": ClusterStatus.UP}]
    from launcher.backends import rsync

    real_run = rsync._run

    def truncating_run(cmd, stdin):  # the transfer "succeeds" but leaves half a file
        done = real_run(cmd, stdin)
        target = Path(cmd[-1]) / "metrics.jsonl"
        target.write_text(target.read_text()[:500])
        return done

    monkeypatch.setattr(rsync, "_run", truncating_run)
    report = fetch(sp.SkyPilotBackend(), cluster_run(str(run_dir), state="completed"), tmp_path / "dest")
    assert "metrics.jsonl: 500 bytes arrived, 1000 on the machine (damaged in transfer: fetch again)" \
        in report.problems
    assert "adapter: missing, yet the run completed" in report.problems
    assert not (tmp_path / "dest" / "metrics.jsonl").exists()


# --------------------------------------------------------------- files: RunPod volume via S3 API


def test_managed_job_fetch_from_the_runpod_volume_s3_api(fake, monkeypatch, tmp_path):
    """The RunPod volume's S3 endpoint and bucket come from SkyPilot's volume record and RunPod's
    REST API; listings follow S3 pagination. (The full layout: tests/launcher/backends/test_contract.py.)"""
    import boto3
    import requests

    try:
        from artifact_fixtures import FakeS3
    except ImportError:
        from tests.artifact_fixtures import FakeS3
    from launcher.store.artifacts import fetch

    monkeypatch.setenv("RUNPOD_API_KEY", "rp_key")
    monkeypatch.setenv("RUNPOD_S3_ACCESS_KEY", "user_abc")
    monkeypatch.setenv("RUNPOD_S3_SECRET_KEY", "rps_def")
    fake.results["volumes.ls"] = [{"name": "lovecraft-workspace", "zone": "US-CA-2", "region": "US",
                                   "name_on_cloud": "lovecraft-workspace-1a2b3c"}]

    class Listing:  # RunPod's REST API, at the HTTP edge of SkyPilot's RunPod adaptor
        status_code, text = 200, "[...]"

        def json(self):
            return [{"id": "other", "name": "x", "dataCenterId": "US-CA-2"},
                    {"id": "vol123", "name": "lovecraft-workspace-1a2b3c", "dataCenterId": "US-CA-2"}]

    monkeypatch.setattr(requests, "request", lambda method, url, **kw: Listing())
    volume = tmp_path / "volume"
    for i in range(7):  # more objects than one listing page
        (volume / "runs/m1/outputs/adapter").mkdir(parents=True, exist_ok=True)
        (volume / f"runs/m1/outputs/adapter/part{i}.json").write_text(str(i) * (i + 1))
    clients = []
    monkeypatch.setattr(boto3, "client", lambda service, **kw: clients.append(FakeS3(volume, **{
        k: kw[k] for k in ("endpoint_url", "region_name")})) or clients[-1])
    report = fetch(sp.SkyPilotBackend(), managed_run(), tmp_path / "a")
    assert report.ok, report
    assert {f"adapter/part{i}.json" for i in range(7)} <= set(report.files)
    assert (tmp_path / "a/adapter/part6.json").read_text() == "6" * 7
    (client,) = clients
    assert client.meta.endpoint_url == "https://s3api-us-ca-2.runpod.io" and client.meta.region_name == "US-CA-2"
    assert {c[1]["Bucket"] for c in client.calls} == {"vol123"}


def test_managed_job_fetch_without_s3_keys_says_which(fake):
    with pytest.raises(BackendError, match="set RUNPOD_S3_ACCESS_KEY and RUNPOD_S3_SECRET_KEY"):
        sp.SkyPilotBackend().list_files(managed_run(), ("metrics.jsonl",))


def test_launch_up_with_a_live_price_keeps_the_committed_tasks_fresh(fake, monkeypatch):
    """The live RunPod price reaches the run (envs, registry); sky/ keeps the offline price, so
    `launch render --check` stays clean after a launch."""
    from click.testing import CliRunner

    from launcher.cli import cli

    gpu = {"id": "NVIDIA H100 80GB HBM3", "securePrice": 2.99, "secureSpotPrice": 1.75, "lowestPrice": {}}
    runpod_graphql(monkeypatch, {"data": {"gpuTypes": [gpu]}})
    monkeypatch.setenv("RUNPOD_API_KEY", "rp_key")
    committed = {p: p.read_text() for p in (render.task_path("sonia-h100"), render.config_path("sonia-h100"))}
    try:
        r = CliRunner().invoke(cli, ["up", "sonia-h100"], catch_exceptions=False)
        assert r.exit_code == 0, r.output
        assert {p: p.read_text() for p in committed} == committed
    finally:
        for p, text in committed.items():
            p.write_text(text)
    (task,), _ = fake.one("launch")[1:]
    assert task.envs["LAUNCH_PRICE_PER_HOUR"] == "5.9800"  # 2.99 x 2 GPUs, live
    assert registry.get().price_per_hour == pytest.approx(5.98)


# ------------------------------------------- what SkyPilot 0.14.1 really answers (issue 27)


def test_the_default_queue_fields_drop_what_billing_reads():
    """The server keeps only the fields a request names: queue(version=2) asks for the default list,
    where a job's cluster and its failure reason are not."""
    try:
        from sky_edge import queue_answer
    except ImportError:
        from tests.sky_edge import queue_answer

    rec = {"job_id": 3, "job_name": "m1", "status": ManagedJobStatus.RECOVERING,
           "cluster_name_on_cloud": "m1-3-abcd1234", "failure_reason": "spot preempted"}
    (got,) = queue_answer([rec], {"refresh": False, "job_ids": [3]})[0]
    assert (got.cluster_name_on_cloud, got.failure_reason) == (None, None)
    (got,) = queue_answer([rec], {"refresh": False, "job_ids": [3], "fields": list(MANAGED_JOB_FIELDS)})[0]
    assert (got.cluster_name_on_cloud, got.failure_reason) == ("m1-3-abcd1234", "spot preempted")


def test_a_recovering_managed_job_bills_and_a_failed_one_says_why(fake):
    rec = {"job_id": 3, "job_name": "m1", "status": ManagedJobStatus.RECOVERING, "recovery_count": 1,
           "cluster_name_on_cloud": "m1-3-abcd1234", "failure_reason": None}
    fake.results["jobs.queue"] = [rec]
    st = sp.SkyPilotBackend().status(managed_run())
    assert st.billing is True and st.state == "starting" and "recovery 2" in st.reason  # the new pod bills
    rec.update(status=ManagedJobStatus.FAILED_SETUP, cluster_name_on_cloud=None,
               failure_reason="setup failed: No module named 'trl'")
    st = sp.SkyPilotBackend().status(managed_run())
    assert (st.state, st.reason, st.billing) == ("failed", "FAILED_SETUP: setup failed: No module named 'trl'", False)


def test_a_cluster_without_a_job_yet_is_starting_not_unreachable(fake):
    fake.results["status"] = [{"name": "r1", "status": ClusterStatus.UP}]
    fake.results["job_status"] = {None: None}  # what the server answers for job_ids=None and no job
    run = cluster_run()
    run.handle.job_id = None  # detached while launching: no job id known
    st = sp.SkyPilotBackend().status(run)
    assert st.state == "starting" and "not reachable" not in (st.reason or "") and st.billing is True
    sp.SkyPilotBackend().down(run)  # nothing to cancel, the cluster goes
    assert "cancel" not in fake.names() and fake.one("down")[1] == ("r1",)


def test_a_fresh_api_servers_empty_cloud_cache_is_refreshed_not_reported(fake):
    fake.results["enabled_clouds"] = answers([], ["RunPod"])  # empty until the credential check ran
    sp.SkyPilotBackend().up(spec_for("sonia-h100", "sonia-h100-10"))
    assert fake.one("check")[1:] == ((("runpod",),), {"verbose": False}) and "launch" in fake.names()


def runpod_rest(monkeypatch, volumes):
    """RunPod's REST API at the HTTP edge of SkyPilot's RunPod adaptor: GET /networkvolumes."""
    import requests

    class Listing:
        status_code, text = 200, "[...]"

        def json(self):
            return volumes

    monkeypatch.setenv("RUNPOD_API_KEY", "rp_key")
    monkeypatch.setattr(requests, "request", lambda method, url, **kw: Listing())


def test_a_volume_skypilot_created_elsewhere_is_adopted_not_duplicated(fake, monkeypatch):
    made = "sonia-workspace-2ea4c1d0-9f3e1a"  # <name>-<user hash>-<uuid6>: another machine's SkyPilot
    runpod_rest(monkeypatch, [{"id": "v1", "name": "other-3bd2a1c0-aaaaaa", "dataCenterId": "US-CA-2", "size": 10},
                              {"id": "v2", "name": made, "dataCenterId": "EU-RO-1", "size": 420}])
    run = sp.SkyPilotBackend().up(spec_for("sonia-h100", "sonia-h100-11"))
    (volume,), _ = fake.one("volumes.apply")[1:]
    assert (volume.name, volume.zone, volume.use_existing) == (made, "EU-RO-1", True)
    (task,), _ = fake.one("launch")[1:]
    assert task.volumes == {"/workspace": made}
    assert run.handle.volume["name"] == made and run.handle.volume["adopted"] is True

    # Next launch: SkyPilot knows it under that name, so it is reused as it is.
    fake.calls.clear()
    fake.results["volumes.ls"] = [{"name": made, "region": "RO", "zone": "EU-RO-1", "name_on_cloud": made}]
    run = sp.SkyPilotBackend().up(spec_for("sonia-h100", "sonia-h100-12"))
    assert "volumes.apply" not in fake.names() and fake.one("launch")[1][0].volumes == {"/workspace": made}
    assert run.handle.volume["name"] == made


def test_ssh_config_missing_here_is_written_from_the_cluster_handle(fake, tmp_path):
    """With a remote API server nothing writes ~/.sky/generated/ssh/<cluster> on this machine: launch
    has SkyPilot write it as `sky status CLUSTER` does (status with credentials -> the handle), then
    `launch exec` reaches the cluster (here the loopback sshd) through it."""
    import subprocess

    from sky.backends.cloud_vm_ray_backend import CloudVmRayResourceHandle

    try:
        from sshd import SSHServer, ensure_sshd
    except ImportError:
        from tests.sshd import SSHServer, ensure_sshd
    ensure_sshd()
    server = SSHServer(tmp_path / "sshd").start()
    try:
        handle = CloudVmRayResourceHandle(
            cluster_name="r1", cluster_name_on_cloud="r1-abcd1234", cluster_yaml=None, launched_nodes=1,
            launched_resources=sky.Resources(infra="runpod", accelerators="H100-SXM:2"),
            stable_internal_external_ips=[("10.0.0.1", "127.0.0.1")], stable_ssh_ports=[server.port])
        fake.results["status"] = [{"name": "r1", "status": ClusterStatus.UP, "handle": handle, "credentials": {
            "ssh_user": server.user, "ssh_private_key_content": Path(server.client_key).read_text()}}]
        run_dir = tmp_path / "volume" / "runs" / "r1"
        run_dir.mkdir(parents=True)
        access = sp.SkyPilotBackend().access(cluster_run(str(run_dir)), "pwd; echo $LAUNCH_RUN_DIR", tty=False)
        assert (Path.home() / ".sky/generated/ssh/r1").is_file()
        assert fake.one("status")[2]["_include_credentials"] is True
        key = Path.home() / ".sky/generated/ssh-keys/r1.key"  # the config names it `~/...`, which ssh
        assert key.read_text() == Path(server.client_key).read_text()  # expands from passwd, not $HOME
        done = subprocess.run([access.argv[0], "-i", str(key), *access.argv[1:]], capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr
        assert done.stdout.split() == [str(run_dir), str(run_dir)]
    finally:
        server.stop()


def test_down_of_a_run_it_cannot_read_says_which_checkpoint_it_keeps(fake):
    """No S3 keys here: the managed job's status.json cannot be read, so no final checkpoint can be asked
    for; `launch down` says so instead of implying a SIGTERM save."""
    from click.testing import CliRunner

    from launcher.cli import cli

    fake.results["jobs.queue"] = answers([{"job_id": 3, "job_name": "m1", "status": ManagedJobStatus.RUNNING}],
                                         [{"job_id": 3, "job_name": "m1", "status": ManagedJobStatus.CANCELLED}])
    registry.save(managed_run())
    r = CliRunner().invoke(cli, ["down", "m1"])
    assert r.exit_code == 0, r.output
    assert "no status.json from the run yet (skypilot: still setting up, or not readable), so no final " \
           "checkpoint was asked for" in " ".join(r.output.split())
    assert "jobs.cancel" in fake.names()


@pytest.mark.slow  # 8 s: SkyPilot's optimizer in a child
def test_an_any_of_profile_prices_and_places_the_option_skypilot_takes(monkeypatch):
    """[H100:1, RTX4090:1]: SkyPilot's optimizer takes the cheaper RTX 4090, so the live price asks RunPod
    for the 4090 and a new volume goes where 4090s are, not where the first-listed H100 is."""
    from sky.provision.runpod.utils import GPU_NAME_MAP

    from launcher.backends.skypilot.price import picked_accelerator
    from launcher.backends.skypilot.runpod_volumes import catalog_zones, new_volume_infra

    body = yaml.safe_load((REPO_ROOT / "clusters/well-log-ocr-spot.yaml").read_text())
    body["cluster"]["accelerators"] = ["H100:1", "RTX4090:1"]
    p = Profile.model_validate(body)
    assert picked_accelerator(p) == "RTX4090:1"
    gpu = {"id": GPU_NAME_MAP["RTX4090"], "securePrice": 0.69, "secureSpotPrice": 0.35, "lowestPrice": {}}
    seen = runpod_graphql(monkeypatch, {"data": {"gpuTypes": [gpu]}})
    monkeypatch.setenv("RUNPOD_API_KEY", "rp_key")
    assert sp.hourly_price(p) == (0.35, "runpod-api")  # spot: the 4090's spot price
    (_, _, query), = seen
    assert f'id: "{GPU_NAME_MAP["RTX4090"]}"' in query
    # The new volume's datacenter: where RunPod has 4090s in stock (the stock query asks for the 4090).
    zones = [z for _, z in catalog_zones(p, "RTX4090:1")]
    stock = {f"d{i}": {"stockStatus": "High" if dc == "EU-RO-1" else None} for i, dc in enumerate(zones)}
    seen = runpod_graphql(monkeypatch, {"data": {"gpuTypes": [stock]}})
    assert new_volume_infra(p, "rp_key") == "runpod/RO/EU-RO-1"
    (_, _, query), = seen
    assert f'gpuTypes(input: {{id: "{GPU_NAME_MAP["RTX4090"]}"}})' in query


def test_down_tries_again_while_the_api_server_is_too_busy_to_answer(monkeypatch):
    """`launch down` just after a signalled `up` (the signal walk on the emulated RunPod): the local API
    server, busy with that launch, let the client's 5 s read time out, and down gave up with the
    cluster coming up. It tries again a few times; a server that never answers still ends in one line."""
    import requests

    from launcher.backends.skypilot import backend as sb
    from launcher.store.registry import Run

    monkeypatch.setattr(sb, "BUSY_WAIT_S", 0)
    monkeypatch.setattr(sb, "sdk", lambda: sky)
    calls = []

    def down_cluster(self, sky_, run):
        calls.append(run.id)
        if len(calls) < 3:
            raise requests.exceptions.ReadTimeout("Read timed out. (read timeout=5)")

    monkeypatch.setattr(sb.SkyPilotBackend, "_down_cluster", down_cluster)
    run = Run(id="sonia-h100-20261202-211308", profile="sonia-h100", backend="skypilot", state="starting",
              cluster="sonia-h100-20261202-211308", handle={"kind": "cluster"})
    sb.SkyPilotBackend().down(run)
    assert len(calls) == 3
    calls.clear()

    def never(self, sky_, run):
        calls.append(run.id)
        raise requests.exceptions.ReadTimeout("Read timed out. (read timeout=5)")

    monkeypatch.setattr(sb.SkyPilotBackend, "_down_cluster", never)
    with pytest.raises(BackendError, match="ReadTimeout"):
        sb.SkyPilotBackend().down(run)
    assert len(calls) == sb.BUSY_TRIES
