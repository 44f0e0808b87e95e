"""Storage that bills after `down`: `launch volumes` lists and deletes it, `down` names it, and a
profile's RunPod volume is reused by name or created where the GPUs are in stock. The SkyPilot SDK is
replaced at its edge (the calls that would reach an API server), RunPod's APIs at the HTTP edge."""

import json
import os
import re
import tempfile
import time

if "SKY_RUNTIME_DIR" not in os.environ:  # tests/conftest.py sets it; kept for a lone run of this file
    os.environ["SKY_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="sky-runtime-")
os.environ.setdefault("SKYPILOT_DISABLE_LOCAL_API_SERVER", "1")

import pytest
import sky
import sky.volumes
from click.testing import CliRunner
from sky import exceptions as ex
from sky.data.storage import StoreType
from test_skypilot_backend import FakeSky, runpod_graphql, spec_for

from launcher.store import registry
from launcher.runs import volumes
from launcher.backends import BackendError
from launcher.backends import skypilot as sp
from launcher.cli import cli
from launcher.store.registry import Run

DAY = 86400


@pytest.fixture
def fake(monkeypatch):
    f = FakeSky(monkeypatch)
    for name, owner, full in [("delete", sky.volumes, "volumes.delete"), ("storage_ls", sky, "storage_ls"),
                              ("storage_delete", sky, "storage_delete")]:
        monkeypatch.setattr(owner, name, f._recorder(full))
    f.results.update({"volumes.delete": None, "storage_delete": None, "storage_ls": [], "volumes.ls": [
        {"name": "sonia-workspace", "type": "runpod-network-volume", "cloud": "RunPod", "region": "US",
         "zone": "US-CA-2", "size": "420", "launched_at": int(time.time() - 3 * DAY), "usedby_clusters": []}]})
    return f


def bucket(name="qwen3-32b-checkpoints"):
    return {"name": name, "launched_at": time.time() - DAY / 2, "store": [StoreType.AZURE], "last_use": "",
            "status": "READY"}


def save_run(rid, profile, state="completed", **handle):
    registry.save(Run(id=rid, profile=profile, backend="skypilot", cluster=rid, state=state,
                      price_per_hour=6.58, handle={"kind": "cluster", "cluster": rid, **handle}))


def launch(*args, input=None):
    return CliRunner().invoke(cli, list(args), input=input, terminal_width=80)


# --------------------------------------------------------------------------------------- listing


def test_lists_size_age_cost_per_month_and_last_run(fake, monkeypatch):
    from launcher.term import ui

    fake.results["storage_ls"] = [bucket()]
    save_run("sonia-h100-20261101-000000", "sonia-h100", volume={"name": "sonia-workspace"})
    r = launch("volumes")  # 80 columns: names, amounts and the run id whole
    assert r.exit_code == 0, r.output
    assert max(len(line) for line in r.output.splitlines()) <= 80
    for whole in ("sonia-workspace", "qwen3-32b-checkpoints", "$29.40", "$18.87", "sonia-h100-20261101-000000"):
        assert re.search(rf"(^|\s){re.escape(whole)}(\s|$)", r.output, re.M), (whole, r.output)
    monkeypatch.setenv("COLUMNS", "200")
    ui.console.cache_clear()
    r = launch("volumes")
    ui.console.cache_clear()
    assert r.exit_code == 0, r.output
    out = " ".join(r.output.split())
    lines = r.output.splitlines()
    row = next(line for line in lines if line.lstrip().startswith("sonia-workspace "))
    assert " ".join(row.split()).startswith("sonia-workspace volume (runpod-network-volume, RunPod")
    assert "$29.40" in row and "sonia-h100-20261101-000000" in row
    assert "420 GB" in out and "3 days old" in out and "US-CA-2" in out
    row = next(line for line in lines if line.lstrip().startswith("qwen3-32b-checkpoints "))
    assert "bucket (azure)" in row and "~1,048 GB" in row and "12 h old" in row and "$18.87" in row
    assert "total $48.27/month for 2 volume(s)/bucket(s)" in out
    d = json.loads(launch("volumes", "--json").output)
    assert d["total_usd_per_month"] == 48.27 and d["volumes"][0]["last_run_state"] == "completed"
    assert [c[0] for c in fake.calls if c[0] != "get"] == ["volumes.ls", "storage_ls"] * 3


def test_without_skypilot_it_lists_what_launch_runs_used_and_says_so(fake):
    fake.results["volumes.ls"] = ex.ApiServerConnectionError("http://127.0.0.1:46580")
    save_run("sonia-h100-1", "sonia-h100", volume={"name": "sonia-workspace", "type": "runpod-network-volume",
                                                   "zone": "US-CA-2"})
    r = launch("volumes")
    assert r.exit_code == 0, r.output
    assert "cannot reach a SkyPilot API server" in r.output and "unverified" in r.output
    assert "sonia-workspace" in r.output and re.search(r"\bsonia-h100-1\s", r.output)


# ---------------------------------------------------------------------------------------- delete


def test_rm_says_what_is_lost_asks_and_deletes_only_on_yes(fake, monkeypatch):
    save_run("sonia-h100-1", "sonia-h100", volume={"name": "sonia-workspace"})
    r = launch("volumes", "rm", "sonia-workspace")  # not a terminal, no --yes
    assert r.exit_code == 1 and "pass --yes to delete from a script" in r.output
    monkeypatch.setattr(volumes, "interactive", lambda: True)
    r = launch("volumes", "rm", "sonia-workspace", input="n\n")
    assert r.exit_code == 1 and "Aborted" in r.output
    assert "run sonia-h100-1 cannot --resume afterwards" in " ".join(r.output.split())
    assert "volumes.delete" not in fake.names()
    r = launch("volumes", "rm", "sonia-workspace", input="y\n")
    assert r.exit_code == 0, r.output
    assert "deleted volume sonia-workspace ($29.40/month less)" in r.output
    assert fake.one("volumes.delete")[1] == (["sonia-workspace"],)
    # who uses it is asked of the cloud, not the API server's cache (stale for a minute after a `down`)
    assert {c[0]: c[2] for c in fake.calls}["volumes.ls"] == {"refresh": True}


def test_rm_a_bucket_with_yes(fake):
    fake.results["storage_ls"] = [bucket()]
    r = launch("volumes", "rm", "qwen3-32b-checkpoints", "--yes")
    assert r.exit_code == 0, r.output
    assert fake.one("storage_delete")[1] == ("qwen3-32b-checkpoints",) and "volumes.delete" not in fake.names()


def test_rm_refuses_what_a_run_uses_and_unknown_names(fake):
    save_run("sonia-h100-2", "sonia-h100", state="running", volume={"name": "sonia-workspace"})
    r = launch("volumes", "rm", "sonia-workspace", "--yes")
    assert r.exit_code == 1 and "in use by sonia-h100-2: stop it first (`launch down sonia-h100-2`)" in r.output
    r = launch("volumes", "rm", "nope", "--yes")
    assert r.exit_code == 1 and "no volume or bucket named nope (known: sonia-workspace" in r.output
    assert "volumes.delete" not in fake.names() and "Traceback" not in r.output


# ------------------------------------------------------------------------------------------ down


def test_down_says_what_keeps_billing_and_how_to_stop_it(fake):
    save_run("sonia-h100-3", "sonia-h100", state="running", volume={"name": "sonia-workspace",
             "type": "runpod-network-volume"}, job_id=7, run_dir="/workspace/runs/sonia-h100-3")
    r = launch("down", "sonia-h100-3")
    assert r.exit_code == 0, r.output
    out = " ".join(r.output.split())
    assert "still billing: volume sonia-workspace (420 GB, runpod-network-volume) keeps billing ~$29.40/month" in out
    assert "delete: launch volumes rm sonia-workspace" in out
    assert fake.one("down")[1] == ("sonia-h100-3",)


def test_an_ssh_machine_is_the_users_to_stop():
    run = Run(id="r", profile="sonia-h100", backend="ssh", handle={"host": "root@1.2.3.4:22022"})
    assert volumes.still_billing_lines(run) == [
        "the machine root@1.2.3.4:22022 is yours: it bills until you stop it at your provider"]
    (line,) = volumes.still_billing_lines(run, "checkpoint step 71 (checkpoint-71, 1.2 GB)")
    assert line.endswith("; terminating it deletes checkpoint step 71 (checkpoint-71, 1.2 GB) unless its disk "
                         "outlives it (a network volume): copy the run's directory off first if you will "
                         "`--resume` elsewhere"), line  # what `down` kept there goes with a terminated pod


# ------------------------------------------------------------------- RunPod volume placement


def runpod_rest(monkeypatch, listed):
    import requests

    class Response:
        status_code, text = 200, "[...]"

        def json(self):
            return listed

    monkeypatch.setattr(requests, "request", lambda method, url, **kw: Response())


def stock_answer(zones, **status):
    return {"data": {"gpuTypes": [{f"d{i}": {"stockStatus": status.get(z.replace("-", "_"))}
                                   for i, z in enumerate(zones)}]}}


def test_an_existing_runpod_volume_is_adopted_by_name_not_created_again(fake, monkeypatch):
    monkeypatch.setenv("RUNPOD_API_KEY", "rp_key")
    fake.results["volumes.ls"] = []
    runpod_rest(monkeypatch, [{"id": "v9", "name": "sonia-workspace", "dataCenterId": "EU-RO-1", "size": 420}])
    seen = runpod_graphql(monkeypatch, {"data": {"gpuTypes": [{}]}})
    run = sp.SkyPilotBackend().up(spec_for("sonia-h100", "sonia-h100-4"))
    (volume,), _ = fake.one("volumes.apply")[1:]
    assert (volume.name, volume.use_existing, volume.region, volume.zone) == ("sonia-workspace", True, "RO", "EU-RO-1")
    assert run.handle.volume["adopted"] and not run.handle.volume["created"]
    assert seen == []  # adopted: no stock question asked


def test_a_new_volume_goes_where_the_gpus_are_in_stock(fake, monkeypatch):
    from launcher.backends.skypilot.runpod_volumes import catalog_zones

    monkeypatch.setenv("RUNPOD_API_KEY", "rp_key")
    fake.results["volumes.ls"] = []
    runpod_rest(monkeypatch, [])
    zones = [z for _, z in catalog_zones(spec_for("sonia-h100", "x").profile)]
    seen = runpod_graphql(monkeypatch, stock_answer(zones, US_KS_2="Low", EU_SE_1="High"))
    run = sp.SkyPilotBackend().up(spec_for("sonia-h100", "sonia-h100-5"))
    (volume,), _ = fake.one("volumes.apply")[1:]
    assert (volume.zone, volume.size) == ("EU-SE-1", "420")  # in stock beats "has S3 API"
    (url, auth, query), = seen
    assert 'id: "NVIDIA H100 80GB HBM3"' in query and 'gpuCount: 2, dataCenterId: "EU-SE-1"' in query
    assert run.handle.volume["created"]


def test_no_stock_anywhere_creates_nothing_and_launches_nothing(fake, monkeypatch):
    from launcher.backends.skypilot.runpod_volumes import catalog_zones

    monkeypatch.setenv("RUNPOD_API_KEY", "rp_key")
    fake.results["volumes.ls"] = []
    runpod_rest(monkeypatch, [])
    zones = [z for _, z in catalog_zones(spec_for("sonia-h100", "x").profile)]
    runpod_graphql(monkeypatch, stock_answer(zones, US_CA_2="None"))
    with pytest.raises(BackendError, match="RunPod has no H100-SXM:2 in stock in any datacenter right now"):
        sp.SkyPilotBackend().up(spec_for("sonia-h100", "sonia-h100-6"))
    assert "volumes.apply" not in fake.names() and "launch" not in fake.names()


def test_a_reused_volume_out_of_stock_is_said_before_launch(monkeypatch):
    from launcher.backends.skypilot.runpod_volumes import stock_note
    from launcher.profiles.profile import load_profile

    monkeypatch.setenv("RUNPOD_API_KEY", "rp_key")
    runpod_graphql(monkeypatch, stock_answer(["US-CA-2"]))
    note = stock_note(load_profile("sonia-h100"), "US-CA-2")
    assert "no H100-SXM:2 in stock in US-CA-2, where volume sonia-workspace lives" in note
    runpod_graphql(monkeypatch, stock_answer(["US-CA-2"], US_CA_2="Medium"))
    assert stock_note(load_profile("sonia-h100"), "US-CA-2") is None
