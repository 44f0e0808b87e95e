"""The payload's own resume check (payload/config/resume.py): a run resumed without the launcher (plain
`sky jobs launch`, `python -m payload train`) with a config whose math differs from the resolved
config recorded in its run directory is refused before anything trains; cadence changes and
changes allowed with LAUNCH_ALLOW_CHANGE are accepted and appended to `config_history.jsonl`."""

import json

import pytest
import yaml

from train_fixtures import make_config, train_env, train_in_process

from payload import layout
from payload.config import resume as runconfig
from payload.config import dump_run_config
from payload.errors import PayloadError

__all__ = ["train_env"]

MATH = ["model.name_or_path", "data.sources.0.path", "data.seed", "train.method", "train.lora.r",
        "train.learning_rate", "train.lr_scheduler", "train.warmup_ratio", "train.max_seq_length",
        "train.per_device_batch_size", "train.gradient_accumulation_steps", "train.seed", "cluster.num_nodes",
        "stages.1.train.learning_rate", "stages.0.kind"]
CADENCE = ["budget.max_usd", "train.max_steps", "train.epochs", "train.logging_steps", "train.eval_steps",
           "train.checkpoints.save_steps", "outputs.merge", "evaluation.max_samples", "wandb.project",
           "stages.1.train.max_steps", "runtime.budget_usd", "cluster.accelerators"]


@pytest.mark.parametrize("key", MATH)
def test_keys_that_change_the_math_of_a_run_in_flight(key):
    assert runconfig.changes_math(key)


@pytest.mark.parametrize("key", CADENCE)
def test_keys_that_only_change_cadence_or_money(key):
    assert not runconfig.changes_math(key)


def test_flatten_and_diff_name_the_keys_that_differ():
    old = {"train": {"learning_rate": 1e-3, "lora": {"target_modules": ["q", "v"]}},
           "data": {"sources": [{"path": "a.jsonl"}]}, "runtime": {"run_id": "x"}}
    new = {"train": {"learning_rate": 1e-4, "lora": {"target_modules": ["q", "v"]}},
           "data": {"sources": [{"path": "b.jsonl"}]}, "runtime": {"run_id": "y"}}
    assert runconfig.diff(old, new) == {"data.sources.0.path": ("a.jsonl", "b.jsonl"),
                                        "train.learning_rate": (0.001, 0.0001)}
    assert runconfig.flatten(runconfig.flatten(old)) == runconfig.flatten(old)  # idempotent: stored flat


def test_the_payload_refuses_a_math_change_on_resume_before_training(train_env):
    cfg = make_config(train_env, "pinned", train={"learning_rate": 1e-3})
    rd = cfg.run_dir
    rd.mkdir(parents=True)
    runconfig.write_resolved(rd, dump_run_config(cfg))  # what the run started with
    changed = make_config(train_env, "pinned", train={"learning_rate": 1e-4})
    with pytest.raises(PayloadError) as e:
        train_in_process(changed)
    assert e.value.exit_code == 2
    msg = str(e.value)
    assert "train.learning_rate: 0.001 -> 0.0001 would change the math of the run in flight" in msg
    assert "LAUNCH_ALLOW_CHANGE=train.learning_rate" in msg
    status = json.loads((rd / layout.STATUS).read_text())
    assert status["state"] == "failed" and status["exit_code"] == 2 and "train.learning_rate" in status["reason"]
    assert yaml.safe_load((rd / layout.RESOLVED_CONFIG).read_text())["train"]["learning_rate"] == 1e-3
    assert not (rd / layout.CHECKPOINTS_DIR).exists() and not (rd / runconfig.HISTORY).exists()


def test_cadence_and_allowed_changes_are_accepted_and_recorded(tmp_path):
    cfg = make_config(tmp_path / "vol", "extended", train={"max_steps": 12})
    rd = tmp_path / "rd"
    rd.mkdir()
    runconfig.write_resolved(rd, dump_run_config(cfg))
    longer = yaml.safe_load(dump_run_config(make_config(tmp_path / "vol", "extended", train={"max_steps": 20})))
    assert runconfig.check_resume(rd, longer, environ={}) == {"train.max_steps": (12, 20)}
    slower = make_config(tmp_path / "vol", "extended", train={"max_steps": 20, "learning_rate": 1e-5})
    changes = runconfig.check_resume(rd, yaml.safe_load(dump_run_config(slower)),
                                     environ={runconfig.ALLOW_ENV: "train.learning_rate"})
    assert set(changes) == {"train.max_steps", "train.learning_rate"}
    first, second = [json.loads(x) for x in (rd / runconfig.HISTORY).read_text().splitlines()]
    assert first["changes"] == {"train.max_steps": [12, 20]} and first["allowed"] == []
    assert second["allowed"] == ["train.learning_rate"] and second["by"] == "payload"
    assert runconfig.check_resume(tmp_path / "new-run", longer) == {}  # nothing recorded: a new run
