"""`launch status` at 80 columns, the way a user watches a run (tests/walk.py: the installed `launch`,
COLUMNS=80): a run with a long id shows its step, loss, ETA and dollars, its id whole; and once it
has ended, its row still says where it ended (step and loss kept in the registry), its machine gone."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

from test_walk_small import local_run, user_home  # noqa: F401  (user_home: a fixture)
from walk import launch

RID = "qwen3-32b-4x4-a100-20261126-101500"  # the longest shipped profile's run id, as `launch up` makes it


def _status(user_home, *args) -> str:
    r = launch(user_home, "status", *args)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout + r.stderr
    assert max(len(line) for line in r.stdout.splitlines()) <= 80, r.stdout
    return r.stdout


def _row(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith(f"{RID} "))  # the id whole, first


def test_status_at_80_columns_shows_step_loss_eta_and_dollars_and_keeps_them_once_the_run_ended(user_home):
    from launcher.store import registry

    live = {"state": "training", "step": 1234, "max_steps": 3000, "loss": 1.23456, "eta_s": 7200.0,
            "cost_usd": 2.5}
    driver = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],  # the local driver
                              env={**os.environ, "LAUNCH_RUN_ID": RID, "LAUNCH_VOLUME": str(user_home / "volume")})
    try:
        rd = local_run(user_home, RID, "running", live, handle={"pid": driver.pid}, price_per_hour=65.54,
                       billed_s=68000.0, billed_usd=1234.5678)  # 19 h at $65.54/h: four-digit dollars
        registry.update(RID, profile="qwen3-32b-4x4-a100")
        out = _status(user_home)
    finally:
        driver.kill()
        driver.wait()
    head = out.splitlines()[0].split()
    assert head[:2] == ["run", "state"] and {"step", "loss", "spent", "ETA"} <= set(head), out
    assert re.search(r" running +1234/3000 +1\.235 +\$1,234\.\d\d +2h00m$", _row(out)), out  # the dollars whole

    # It ends: the payload's last status.json, the driver's exit code; a refresh sees it
    (rd / "status.json").write_text(json.dumps({"state": "completed", "exit_code": 0, "step": 3000, "max_steps": 3000,
                                                "loss": 0.4321, "eval_loss": 0.5, "eta_s": 0}))
    home = user_home / "user-launch-home" / "local" / RID
    home.mkdir(parents=True)
    (home / "exit_code").write_text("0")
    ended = json.loads(launch(user_home, "status", "--json").stdout)
    assert ended["state"] == "completed" and ended["step"] == 3000, ended

    shutil.rmtree(rd)  # and its machine (the run dir, status.json with it) is gone: nothing left to ask
    out = _status(user_home)
    assert re.search(r"completed +3000/3000 +0\.4321 ", _row(out)), out  # was `-` and `-`
    row = json.loads(launch(user_home, "status", RID, "--json").stdout)
    assert (row["step"], row["max_steps"], row["loss"], row["eval_loss"], row["eta_s"]) == (3000, 3000, 0.4321, 0.5,
                                                                                          None), row


def test_status_of_one_run_says_where_its_tracking_is_and_its_gpu_window(user_home):
    """The payload's links (payload/outputs/tracking.py) under the table, each whole at 80 columns."""
    url = "https://wandb.ai/someone/launch/runs/local-demo-20261126-101500-train"
    live = {"state": "training", "step": 10, "max_steps": 40, "loss": 2.5, "eta_s": 60.0, "cost_usd": 0.01,
            "wandb_url": url, "tensorboard": "tensorboard --logdir /v/runs/r/logs/tensorboard",
            "gpu_peak_memory_gb": 41.234, "gpu_util_mean_pct": 93.4, "gpu_not_measured": None}
    rid = "local-demo-20261126-101500"
    driver = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                              env={**os.environ, "LAUNCH_RUN_ID": rid, "LAUNCH_VOLUME": str(user_home / "volume")})
    try:
        rd = local_run(user_home, rid, "running", live, handle={"pid": driver.pid})
        lines = [line.strip() for line in _status(user_home, rid).splitlines()]
        assert f"W&B: {url}" in lines and "TensorBoard: tensorboard --logdir /v/runs/r/logs/tensorboard" in lines
        assert "GPU: 41.2 GB peak, 93% mean utilisation (last step window)" in lines
        row = json.loads(launch(user_home, "status", rid, "--json").stdout)
        assert row["wandb_url"] == url and row["gpu_util_mean_pct"] == 93.4
        (rd / "status.json").write_text(json.dumps({**live, "wandb_url": None, "tensorboard": None,
                                                    "gpu_peak_memory_gb": None, "gpu_util_mean_pct": None,
                                                    "gpu_not_measured": "no CUDA device"}))
        lines = [line.strip() for line in _status(user_home, rid).splitlines()]
        assert "GPU: not measured (no CUDA device)" in lines and not any(x.startswith("W&B") for x in lines)
    finally:
        driver.kill()
        driver.wait()
