"""The offline catalog snapshot is generated from rows copied out of SkyPilot's own catalog, never typed."""

import ast
import csv
import datetime
import io
from pathlib import Path

import pytest

from launcher.catalog import build_snapshot as bs

REPO = Path(__file__).resolve().parents[3]


def extract_rows(name):
    meta, header, rows = bs.read_extract(bs.EXTRACT / name)
    return meta, [dict(zip(header, r)) for r in rows]


def test_a_fresh_build_from_the_extract_is_byte_identical_to_the_committed_snapshot():
    files = bs.build()
    assert {p.relative_to(bs.HERE).as_posix() for p in files} == {
        "v8/runpod/vms.csv", "v8/azure/vms.csv", "v8/azure/images.csv", "v8/common/accelerators.csv",
        "snapshot.json"}
    assert bs.stale(files) == [], "run `python -m launcher.catalog.build_snapshot` and commit"
    # Nothing else sits in v8/ (a stray hand-made CSV would reach SkyPilot's optimizer).
    assert sorted(p.relative_to(bs.V8).as_posix() for p in bs.V8.rglob("*") if p.is_file()) == sorted(
        rel for rel, _ in bs.OUTPUTS.values())


def test_no_hand_typed_price_anywhere():
    # The generator holds no number that could be a price: no float literal at all.
    tree = ast.parse((bs.HERE / "build_snapshot.py").read_text())
    floats = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, float)]
    assert floats == []
    # Every snapshot row is an extract row, field for field (prices included).
    for name, (rel, _) in bs.OUTPUTS.items():
        _, header, rows = bs.read_extract(bs.EXTRACT / name)
        shipped = list(csv.reader(io.StringIO((bs.V8 / rel).read_text())))
        assert shipped == [header, *rows], rel


def test_every_extract_names_its_source_commit_and_read_date():
    for name in bs.OUTPUTS:
        meta, _ = extract_rows(name)
        assert meta["repo"] == "skypilot-org/skypilot-catalog"
        assert meta["path"].startswith("catalogs/v") and meta["path"].endswith(".csv")
        assert len(meta["commit"]) == 40 and int(meta["commit"], 16) >= 0
        datetime.date.fromisoformat(meta["read"])


def test_on_demand_and_spot_are_distinct_columns_read_as_published():
    _, azure = extract_rows("azure_vms.csv")
    nc96 = next(r for r in azure if r["InstanceType"] == "Standard_NC96ads_A100_v4" and r["Region"] == "eastus")
    assert float(nc96["SpotPrice"]) < float(nc96["Price"])
    _, runpod = extract_rows("runpod_vms.csv")
    assert {r["AcceleratorName"] for r in runpod} >= {"H100-SXM", "A100-80GB", "RTX4090", "L4"}  # runbooks 000-003
    assert {r["AcceleratorName"] for r in azure} >= {"A100-80GB", "T4", "A10"}


def test_a_bad_extract_row_is_one_line_naming_the_file_and_row(tmp_path, monkeypatch):
    text = (bs.EXTRACT / "azure_vms.csv").read_text().replace(",32.77,", ",lots,", 1)
    (tmp_path / "azure_vms.csv").write_text(text)
    for name in bs.OUTPUTS:
        if name != "azure_vms.csv":
            (tmp_path / name).write_text((bs.EXTRACT / name).read_text())
    monkeypatch.setattr(bs, "EXTRACT", tmp_path)
    with pytest.raises(bs.ExtractError, match=r"extract/azure_vms.csv: row \d+: Price `lots` is not a number"):
        bs.build()


def test_plan_shows_the_snapshot_date_and_warns_when_it_is_old():
    from launcher import catalog

    made = datetime.date.fromisoformat(catalog.SNAPSHOT_DATE)
    assert catalog.snapshot_warning(made + datetime.timedelta(days=catalog.STALE_AFTER_DAYS)) is None
    warning = catalog.snapshot_warning(made + datetime.timedelta(days=90))
    assert "90 days old" in warning and "build_snapshot" in warning


def test_storage_prices_are_cited():
    from launcher.catalog import storage_price

    price, source = storage_price("runpod-network-volume")
    assert price == 0.07 and "runpod" in source
    assert storage_price("k8s-pvc")[0] is None
    assert storage_price("nfs")[0] is None


KEPT = """
import json, sys
from launcher.catalog import optimize
from launcher.profiles.profile import load_profile
p = load_profile("sonia-h100")
twin = p.model_copy(update={"cluster": p.cluster.model_copy(update={"accelerators": "H100-SXM:1"})})
print(json.dumps({"choice": optimize(p).__dict__, "sky": "sky" in sys.modules,
                  "other": None if len(sys.argv) < 2 else optimize(twin).__dict__, "sky_after": "sky" in sys.modules}))
"""


@pytest.mark.slow  # 6 s: SkyPilot's optimizer in a child
def test_the_optimizers_answer_is_kept_so_a_later_plan_imports_no_skypilot(tmp_path):
    """Issue 32 item 13: SkyPilot's import (~1.7 s) and optimizer (~0.9 s) were most of every `launch plan`.
    The answer is a function of the task, the snapshot and SkyPilot's version; a later process reuses it."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "LAUNCH_HOME": str(tmp_path / "lh"), "HOME": str(tmp_path)}
    env.pop("SKY_RUNTIME_DIR", None)

    def run(*args):
        done = subprocess.run([sys.executable, "-c", KEPT, *args], env=env, capture_output=True, text=True,
                              timeout=120, check=True)
        return json.loads(done.stdout.splitlines()[-1])

    first = run()
    assert first["sky"] and first["choice"]["instance_type"] == "2x_H100-SXM_SECURE"
    again = run("other")  # the same task: answered from what the first kept, SkyPilot not imported
    assert again["choice"] == first["choice"] and not again["sky"]
    assert again["other"]["accelerators"] == "H100-SXM:1" and again["sky_after"]  # another task: optimizer
    assert (tmp_path / "lh" / "sky-offline" / "optimizer-answers.json").exists()
