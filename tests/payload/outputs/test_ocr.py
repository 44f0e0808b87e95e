"""Runbook 002 (well-log OCR): CER/WER scoring, the image_text data format, a CPU end-to-end run of
the well-log-ocr-spot profile's shape with a tiny Qwen3-VL on rendered-text images (in-training
generation metrics, best checkpoint by CER, final test evaluation that a re-run reproduces), W&B
offline, and the retry helper."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tests.train_fixtures import VL_MODEL, metrics, train_env, train_in_process  # noqa: F401

from payload import layout

# --------------------------------------------------------------------------------------- scores


def test_cer_wer_exact_match_on_known_predictions():
    from payload.outputs.evaluate import score

    refs = ["DEPTH 1200 FT", "WELL A-7", "OPERATOR ACME"]
    assert score(refs, list(refs), ["cer", "wer", "exact_match"]) == {"cer": 0.0, "wer": 0.0, "exact_match": 1.0}
    # one substituted character of 4, one wrong word of 2
    assert score(["abcd"], ["abxd"], ["cer"]) == {"cer": 0.25}
    assert score(["hello world"], ["hello there"], ["wer", "exact_match"]) == {"wer": 0.5, "exact_match": 0.0}
    # corpus-level: (0 + 1 + 13) character edits over 13 + 8 + 13 reference characters
    got = score(refs, ["DEPTH 1200 FT", "WELL A-1", ""], ["cer", "wer", "exact_match"])
    assert got["cer"] == pytest.approx(14 / 34, abs=1e-6)
    assert got["wer"] == pytest.approx(3 / 7, abs=1e-6)  # 0 + 1 (A-1) + 2 deleted words over 3 + 2 + 2
    assert got["exact_match"] == pytest.approx(1 / 3, abs=1e-6)
    assert score([""], ["x"], ["cer", "exact_match"]) == {"cer": None, "exact_match": 0.0}


def test_evaluation_config_rules():
    from pydantic import ValidationError

    from payload.config.evaluation import EvalConfig

    assert EvalConfig(metric_for_best="exact_match").greater_is_better
    assert EvalConfig(metric_for_best="cer").best_key == "eval_cer"
    with pytest.raises(ValidationError, match="not in evaluation.metrics"):
        EvalConfig(metrics=["wer"], metric_for_best="cer")


def test_retry_backs_off_then_gives_up(caplog):
    from payload.retry import with_retries

    waits, calls = [], []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("hub unreachable")
        return "ok"

    assert with_retries("loading dataset x", flaky, sleep=waits.append) == "ok"
    assert waits == [2.0, 4.0] and "try 1 of 3" in caplog.text
    with pytest.raises(ConnectionError):
        with_retries("wandb.init", lambda: (_ for _ in ()).throw(ConnectionError("down")), sleep=waits.append)
    assert "wandb.init failed 3 times" in caplog.text


def test_retry_if_ends_at_a_definite_answer_and_retries_the_networks_failure(caplog):
    from payload.errors import transient_cause
    from payload.retry import with_retries

    waits = []
    with pytest.raises(FileNotFoundError):  # `datasets`' DatasetNotFoundError is one
        with_retries("loading dataset x", lambda: (_ for _ in ()).throw(FileNotFoundError("no such dataset")),
                     retry_if=transient_cause, sleep=waits.append)
    assert waits == [] and "not retried (not a network failure)" in caplog.text

    def wrapped():  # a network failure under another exception (as `datasets` re-raises): retried
        try:
            raise ConnectionError("hub unreachable")
        except ConnectionError as e:
            raise FileNotFoundError("could not list the files") from e

    with pytest.raises(FileNotFoundError):
        with_retries("loading dataset y", wrapped, retry_if=transient_cause, sleep=waits.append)
    assert waits == [2.0, 4.0] and "loading dataset y failed 3 times" in caplog.text


# ----------------------------------------------------------------------------------------- data

WORDS = ["DEPTH", "WELL", "FT", "GR", "API", "ACME", "LOG", "UNIT", "NPHI", "RHOB"]


def ocr_rows(image_dir: Path, n: int, seed: int) -> list[dict]:
    """Rows in the dataset's schema (`image`, `text`): images of the rendered text."""
    from PIL import Image, ImageDraw

    image_dir.mkdir(parents=True, exist_ok=True)
    rnd = random.Random(seed)
    rows = []
    for i in range(n):
        text = f"{rnd.choice(WORDS)} {rnd.randint(10, 99)}"
        img = Image.new("RGB", (64, 32), "white")
        ImageDraw.Draw(img).text((2, 10), text, fill="black")
        path = image_dir / f"{seed}-{i}.png"
        img.save(path)
        rows.append({"image": path.name, "text": text})
    return rows


def write_ocr_set(root: Path) -> dict[str, Path]:
    out = {}
    for split, n, seed in (("train", 16, 1), ("val", 4, 2), ("test", 4, 3)):
        rows = ocr_rows(root / "images", n, seed)
        out[split] = root / f"{split}.jsonl"
        out[split].write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


def ocr_config(volume: Path, files: dict, run_id: str = "ocr", **over):
    from payload.config import RunConfig

    data = {
        "name": "well-log-ocr-spot",
        "data": {"sources": [{"name": f"ocr-{s}", "path": str(p), "format": "image_text", "split": s,
                              "image_root": str(p.parent / "images")} for s, p in files.items()]},
        "model": VL_MODEL,
        "train": {"method": "lora", "lora": {"r": 16, "alpha": 16, "dropout": 0.0}, "learning_rate": 2e-3,
                  "per_device_batch_size": 2, "gradient_accumulation_steps": 1, "max_steps": 6,
                  "max_seq_length": 256, "logging_steps": 1, "eval_steps": 3, "warmup_ratio": 0.0,
                  "high_loss_samples": 2, "checkpoints": {"save_steps": 3, "keep_best": 1, "keep_recent": 1}},
        "evaluation": {"metrics": ["cer", "wer", "exact_match"], "max_samples": 2, "max_new_tokens": 6,
                       "metric_for_best": "cer"},
        "wandb": {"project": "well-log-ocr", "tags": ["test"]},
        "outputs": {"merge": False, "export_mlx": False},
        "runtime": {"volume": str(volume), "run_id": run_id, "price_per_hour": 0.74, "budget_usd": 10},
    }
    for k, v in over.items():
        data[k] = {**data[k], **v} if isinstance(v, dict) else v
    return RunConfig.model_validate(data)


def test_image_text_records_become_image_chat(tmp_path):
    import payload.data as data_stage

    files = write_ocr_set(tmp_path / "set")
    cfg = ocr_config(tmp_path / "vol", files)
    summary = data_stage.main(cfg)
    assert (summary["train"], summary["val"], summary["test"]) == (16, 4, 4)
    rec = json.loads((cfg.run_dir / "data" / "test.jsonl").read_text().splitlines()[0])
    user, assistant = rec["messages"]
    assert user["role"] == "user" and user["content"][0]["type"] == "image"
    assert Path(user["content"][0]["image"]).is_file()
    assert user["content"][1] == {"type": "text", "text": "Transcribe all text in this image."}
    assert assistant["content"] == json.loads(files["test"].read_text().splitlines()[0])["text"]


# ---------------------------------------------------------------------------------- end to end


def test_ocr_run_end_to_end_with_eval_and_wandb_offline(train_env, monkeypatch):
    import payload.data as data_stage
    from payload.volume import checkpoints as ck
    from payload.outputs import evaluate

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.setenv("WANDB_SILENT", "true")
    files = write_ocr_set(train_env.parent / "set")
    cfg = ocr_config(train_env, files)
    data_stage.main(cfg)
    summary = train_in_process(cfg)
    rd = cfg.run_dir
    assert summary["state"] == "completed" and summary["steps"] == 6
    # the in-training evaluation: CER/WER/exact match beside the eval loss, at every eval step
    evals = [r for r in metrics(rd) if "eval_cer" in r]
    assert [r["step"] for r in evals] == [3, 6]
    assert all(0 <= r["eval_cer"] and 0 <= r["eval_wer"] and 0 <= r["eval_exact_match"] <= 1 for r in evals)
    # best-k by CER: the marker carries it, the exported adapter is the lowest-CER checkpoint
    markers = {s: ck.read_marker(p) for s, p, ok in ck.list_checkpoints(rd / "checkpoints") if ok}
    assert all("eval_cer" in m for m in markers.values())
    best = min(evals, key=lambda r: (r["eval_cer"], r["step"]))["step"]
    assert summary["best_checkpoint"] == f"checkpoint-{best}"
    assert summary["best_metric"]["key"] == "eval_cer"

    # final evaluation on the test split, twice: same numbers
    first = evaluate.main(cfg, "test")
    result = json.loads((rd / "outputs" / "eval_test.json").read_text())
    assert result["n"] == 4 and len(result["samples"]) == 4 and result["decoding"] == "greedy"
    assert set(result["metrics"]) == {"cer", "wer", "exact_match"}
    again = evaluate.main(cfg, "test")
    assert again == first
    assert json.loads((rd / "outputs" / "eval_test.json").read_text())["samples"] == result["samples"]
    test_lines = [r for r in metrics(rd) if r.get("split") == "test"]
    assert len(test_lines) == 1 and test_lines[0]["test_cer"] == first["cer"]
    saved = json.loads((rd / layout.SUMMARY).read_text())
    assert saved["evaluation"]["test"]["cer"] == first["cer"]

    # W&B offline: the run directory holds the training run (transaction log + media) and the eval run.
    # wandb 0.31 has no Python reader for the .wandb log; its records carry keys and values as UTF-8.
    runs = sorted((rd / "logs" / "wandb").glob("offline-run-*"))
    train_run = next(r for r in runs if r.name.endswith("-ocr-train"))
    log_bytes = (train_run / "run-ocr-train.wandb").read_bytes()
    for key in (b"well-log-ocr", b"cost_usd", b"budget/fraction", b"train/loss", b"eval/loss", b"eval/cer",
                b"train/learning_rate", b"train/epoch", b"high_loss_samples", b"run_table"):
        assert key in log_bytes, key
    tables = list((train_run / "files" / "media" / "table").glob("high_loss_samples_*.table.json"))
    table = json.loads(tables[0].read_text())
    assert table["columns"][:3] == ["loss", "val_index", "image"] and len(table["data"]) == 2
    assert [row[2] for row in table["data"]] == ["Image", "Image"]  # the images travel in the run_table artifact
    eval_run = next(r for r in runs if r.name.endswith("-ocr-eval"))
    eval_bytes = (eval_run / "run-ocr-eval.wandb").read_bytes()
    assert b"test/cer" in eval_bytes and b"test/predictions" in eval_bytes


def test_wandb_off_without_key_says_so_once(train_env, monkeypatch, caplog):
    from payload.outputs import tracking

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    cfg = ocr_config(train_env, {"train": Path("x.jsonl")})
    monkeypatch.setattr(tracking, "_SAID_OFF", False)
    assert tracking.report_to(cfg) == []
    assert tracking.start(cfg) is None and tracking.start(cfg) is None
    assert caplog.text.count("W&B off: WANDB_API_KEY is not set") == 1


# ------------------------------------------------------------------------- launch checkpoints/eval/chat


def test_checkpoints_eval_chat_commands_on_a_local_run(train_env, monkeypatch):
    from click.testing import CliRunner

    import payload.data as data_stage
    from launcher.store import registry
    from launcher.cli import cli
    from payload.config import dump_run_config

    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    files = write_ocr_set(train_env.parent / "set")
    run = registry.Run(id="well-log-ocr-spot-20261123-000000", profile="well-log-ocr-spot", backend="local",
                       state="completed", handle={"volume": str(train_env)})
    cfg = ocr_config(train_env, files, run_id=run.id, wandb=None)
    data_stage.main(cfg)
    assert train_in_process(cfg)["state"] == "completed"
    (cfg.run_dir / "config.yaml").write_text(dump_run_config(cfg))
    registry.save(run)
    runner = CliRunner()

    out = runner.invoke(cli, ["checkpoints", run.id, "--json"])
    assert out.exit_code == 0, out.output
    rows = json.loads(out.output)["checkpoints"]
    assert [r["step"] for r in rows] and all(r["verified"] and "eval_cer" in r for r in rows)
    # a damaged checkpoint file shows as not verified
    damaged = cfg.run_dir / "checkpoints" / rows[-1]["name"] / "adapter_model.safetensors"
    damaged.write_bytes(damaged.read_bytes()[:-1] + b"\0")
    rows = json.loads(runner.invoke(cli, ["checkpoints", run.id, "--json"]).output)["checkpoints"]
    assert rows[-1]["verified"] is False
    table = runner.invoke(cli, ["checkpoints", run.id])
    assert table.exit_code == 0 and run.id in table.output and "✗" in table.output

    dest = str(train_env.parent / "artifacts")  # the scores go to DEST/<run>/eval/, not into the run
    first = runner.invoke(cli, ["eval", run.id, "--split", "test", "--json", "--dest", dest])
    assert first.exit_code == 0, first.output
    again = runner.invoke(cli, ["eval", run.id, "--split", "test", "--json", "--dest", dest])
    a, b = json.loads(first.output[first.output.index("{"):]), json.loads(again.output[again.output.index("{"):])
    assert a["n"] == 4 and a["cer"] == b["cer"] and a["wer"] == b["wer"]

    chat = runner.invoke(cli, ["chat", run.id, "--prompt", "Transcribe.", "--max-new-tokens", "4",
                               "--image", str(files["test"].parent / "images" / "3-0.png")])
    assert chat.exit_code == 0, chat.output
    assert chat.output.strip() != ""

    missing = runner.invoke(cli, ["checkpoints", "nope-20261123-000000"])
    assert missing.exit_code == 1 and "✗" in missing.output
