"""Preflight's network checks (runbook 002: dataset reachable, model exists, W&B key valid), with
exactly the calls that would leave the machine faked: `HfApi.dataset_info`, `HfApi.model_info` and
`wandb.Api`. Everything else (retry/backoff, classification, lines, the stage's exit code) is real."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import httpx2 as httpx
import pytest
import wandb
from huggingface_hub import HfApi
from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError
from wandb.errors import AuthenticationError

from payload import preflight
from payload.__main__ import main as payload_main
from payload.config import SourceConfig, dump_run_config, load_run_config

ROOT = Path(__file__).resolve().parents[3]
HF = "hf_REMOTEsecretTOKEN0123456789"
WB = "wandbREMOTEsecretKEY0123456789abcdef0123"
DATASET, MODEL = "wrath/well-log-headers-ocr", "Qwen/Qwen3-VL-2B-Instruct"


@pytest.fixture(autouse=True)
def online(monkeypatch):
    monkeypatch.delenv("LAUNCH_PREFLIGHT_OFFLINE", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)


def ocr_cfg(volume, wandb_section=True):
    cfg = load_run_config(ROOT / "sky" / "config" / "well-log-ocr-spot.yaml",
                          env={"LAUNCH_VOLUME": str(volume), "LAUNCH_RUN_ID": "t"})
    return cfg if wandb_section else cfg.model_copy(update={"wandb": None})


def demo_with_hub_data(volume):
    """local-demo (tiny model built from config: no model call) reading one Hub dataset."""
    cfg = load_run_config(ROOT / "clusters" / "local-demo.yaml",
                          env={"LAUNCH_VOLUME": str(volume), "LAUNCH_RUN_ID": "t"})
    srcs = [SourceConfig(name="hub", hf_dataset=DATASET, format="messages")]
    return cfg.model_copy(update={"data": cfg.data.model_copy(update={"sources": srcs})})


def response(status, url="https://huggingface.co/api/datasets/x"):
    return httpx.Response(status, request=httpx.Request("GET", url))


class Hub:
    """Stands in for the Hub API: per repo id, a list of answers (an exception is raised), in order."""

    def __init__(self, monkeypatch, answers):
        self.answers = {k: list(v) for k, v in answers.items()}
        self.calls: list[tuple[str, str, object]] = []
        for method in ("dataset_info", "model_info"):
            monkeypatch.setattr(HfApi, method, self._method(method))

    def _method(self, method):
        def call(api, repo_id, *, token=None, timeout=None, revision=None, **kw):
            self.calls.append((method, repo_id, token))
            answer = self.answers[repo_id].pop(0) if len(self.answers[repo_id]) > 1 else self.answers[repo_id][0]
            if isinstance(answer, BaseException):
                raise answer
            return answer
        return call


class FakeWandbApi:
    answers: list = []
    keys: list = []

    def __init__(self, api_key=None, timeout=None, overrides=None):
        FakeWandbApi.keys.append(api_key)
        answer = FakeWandbApi.answers.pop(0) if len(FakeWandbApi.answers) > 1 else FakeWandbApi.answers[0]
        if isinstance(answer, BaseException):
            raise answer


@pytest.fixture
def fake_wandb(monkeypatch):
    FakeWandbApi.answers, FakeWandbApi.keys = ["ok"], []
    monkeypatch.setattr(wandb, "Api", FakeWandbApi)
    return FakeWandbApi


def no_sleep(waits):
    return waits.append


def by_name(checks):
    return {c.name: c for c in checks}


def test_found_everywhere_is_ok_and_tokens_go_to_the_services_only(tmp_path, monkeypatch, fake_wandb, caplog):
    caplog.set_level(logging.DEBUG)
    hub = Hub(monkeypatch, {DATASET: ["info"], MODEL: ["info"]})
    env = {"HF_TOKEN": HF, "WANDB_API_KEY": WB}
    checks = by_name(preflight.check_remote(ocr_cfg(tmp_path), env, sleep=no_sleep([])))
    assert checks["hub[well-log-headers]"].status == "ok"
    assert checks["hub[well-log-headers]"].detail == f"hub dataset `{DATASET}` reachable (data.sources.0.hf_dataset)"
    assert checks["hub_model"].detail == f"hub model `{MODEL}` reachable (model.name_or_path)"
    assert checks["wandb"].status == "ok" and "value not shown" in checks["wandb"].detail
    assert hub.calls == [("dataset_info", DATASET, HF), ("model_info", MODEL, HF)]
    assert fake_wandb.keys == [WB]
    lines = " ".join(c.line() for c in checks.values()) + caplog.text
    assert HF not in lines and WB not in lines


def test_not_found_gated_and_401_are_fails_naming_the_key(tmp_path, monkeypatch, fake_wandb):
    waits = []
    Hub(monkeypatch, {DATASET: [RepositoryNotFoundError("404 Repository Not Found", response=response(404))],
                      MODEL: [GatedRepoError("403 gated", response=response(403))]})
    fake_wandb.answers = [AuthenticationError(f"Failed to verify credentials: 401 invalid API key {WB}")]
    checks = by_name(preflight.check_remote(ocr_cfg(tmp_path), {"WANDB_API_KEY": WB}, sleep=no_sleep(waits)))
    data, model, wb = checks["hub[well-log-headers]"], checks["hub_model"], checks["wandb"]
    assert (data.status, model.status, wb.status) == ("fail", "fail", "fail")
    assert data.detail.startswith(f"data.sources.0.hf_dataset: dataset `{DATASET}` not found on the Hub or private")
    assert "fix `data.sources.0.hf_dataset`" in data.detail
    assert model.detail.startswith(f"model.name_or_path: model `{MODEL}` is gated; accept the terms")
    assert wb.detail.startswith("WANDB_API_KEY: W&B rejected the key") and "--secret WANDB_API_KEY" in wb.detail
    assert WB not in wb.detail and "***" in wb.detail
    assert waits == [] and len(fake_wandb.keys) == 1  # definite answers are not retried


def test_a_rejected_hf_token_names_hf_token(tmp_path, monkeypatch):
    Hub(monkeypatch, {DATASET: [HfHubHTTPError("401 Unauthorized: Invalid credentials", response=response(401))],
                      MODEL: ["info"]})
    checks = by_name(preflight.check_remote(ocr_cfg(tmp_path, wandb_section=False), {"HF_TOKEN": HF},
                                            sleep=no_sleep([])))
    assert checks["hub[well-log-headers]"].status == "fail"
    assert checks["hub[well-log-headers]"].detail.startswith("HF_TOKEN: the Hub rejected HF_TOKEN (401)")
    assert "wandb" not in checks  # no W&B key: nothing to check


def test_network_errors_are_retried_with_backoff_then_succeed(tmp_path, monkeypatch, fake_wandb, caplog):
    caplog.set_level(logging.WARNING, logger="payload.retry")
    waits = []
    hub = Hub(monkeypatch, {DATASET: [httpx.ConnectError("connection refused"),
                                      HfHubHTTPError("503 Service Unavailable", response=response(503)), "info"],
                            MODEL: ["info"]})
    fake_wandb.answers = [AuthenticationError("An error occurred while verifying credentials: ConnectError"), "ok"]
    checks = by_name(preflight.check_remote(ocr_cfg(tmp_path), {"WANDB_API_KEY": WB}, sleep=no_sleep(waits)))
    assert all(c.status == "ok" for c in checks.values()), checks
    assert [c[1] for c in hub.calls] == [DATASET, DATASET, DATASET, MODEL]  # 3 tries for the dataset
    assert len(fake_wandb.keys) == 2
    assert waits == [2.0, 4.0, 2.0]  # payload/retry.py's backoff: 2 s, 4 s (dataset); 2 s (W&B)
    assert f"Hub dataset {DATASET} failed (try 1 of 3)" in caplog.text


def test_no_answer_after_the_retries_is_a_warning_and_the_stage_goes_on(tmp_path, monkeypatch, fake_wandb):
    waits = []
    Hub(monkeypatch, {DATASET: [httpx.ConnectTimeout("timed out")], MODEL: [TimeoutError("read timed out")]})
    fake_wandb.answers = [AuthenticationError("An error occurred while verifying credentials: timed out")]
    checks = by_name(preflight.check_remote(ocr_cfg(tmp_path), {"WANDB_API_KEY": WB}, sleep=no_sleep(waits)))
    assert {c.status for c in checks.values()} == {"warn"}
    assert "no answer after retries (ConnectTimeout: timed out)" in checks["hub[well-log-headers]"].detail
    assert "volume's HF cache" in checks["hub_model"].detail
    assert len(waits) == 6 and len(fake_wandb.keys) == 3


def test_local_tiny_offline_and_prepared_runs_make_no_call(tmp_path, monkeypatch, fake_wandb):
    hub = Hub(monkeypatch, {DATASET: ["info"], MODEL: ["info"]})
    demo = load_run_config(ROOT / "clusters" / "local-demo.yaml",
                           env={"LAUNCH_VOLUME": str(tmp_path), "LAUNCH_RUN_ID": "t"})
    assert preflight.check_remote(demo, {"WANDB_API_KEY": WB}) == []  # local files, tiny model, no W&B
    for switch in ("LAUNCH_PREFLIGHT_OFFLINE", "HF_HUB_OFFLINE"):
        (c,) = preflight.check_remote(ocr_cfg(tmp_path), {switch: "1", "WANDB_API_KEY": WB})
        assert (c.name, c.status, c.detail) == ("network", "ok", f"Hub/W&B checks skipped ({switch}=1)")
    cfg = ocr_cfg(tmp_path)
    (cfg.run_dir / "data").mkdir(parents=True)
    (cfg.run_dir / "data" / ".complete").write_text("")
    checks = preflight.check_remote(cfg, {"WANDB_MODE": "offline", "WANDB_API_KEY": WB})
    assert [c.name for c in checks] == ["hub_model"]  # data on the volume; W&B offline
    assert hub.calls == [("model_info", MODEL, None)] and fake_wandb.keys == []


def test_the_stage_exits_2_with_the_failing_line(tmp_path, monkeypatch, capsys, caplog):
    Hub(monkeypatch, {DATASET: [RepositoryNotFoundError("404 Repository Not Found", response=response(404))]})
    for k, v in {"LAUNCH_GPU_MEMORY_GB": "80", "LAUNCH_VOLUME": str(tmp_path / "volume"), "LAUNCH_RUN_ID": "t"}.items():
        monkeypatch.setenv(k, v)
    config = tmp_path / "run.yaml"
    config.write_text(dump_run_config(demo_with_hub_data(tmp_path / "volume")))
    assert payload_main(["preflight", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert f"data.sources.0.hf_dataset: dataset `{DATASET}` not found on the Hub" in err
    status = json.loads((tmp_path / "volume" / "runs" / "t" / "status.json").read_text())
    assert status.get("exit_code") == 2
