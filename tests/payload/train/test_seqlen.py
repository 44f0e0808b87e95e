"""A train.max_seq_length shorter than the prompts: counted and refused before a step, never a
crash at step 0 (TRL drops the records truncation leaves without a trained token).

Run: .venv/bin/python -m pytest -x -q tests/payload/train/test_seqlen.py
"""

from __future__ import annotations

import json

from train_fixtures import (
    _write_jsonl, make_config, run_payload, text_records, train_env, train_in_process, write_config,
)

from payload import layout

__all__ = ["train_env"]  # the fixture, imported for pytest

# text_records' prompts (system + user turn, chat template) are 43-46 tokens with the tiny tokenizer
LONG_SYSTEM = "You are Demo, a concise assistant who answers every question about animals. " * 4


def test_every_prompt_longer_than_max_seq_length_is_exit_2_with_one_line(train_env):
    cfg = make_config(train_env, "short", train={"max_seq_length": 20})
    _write_jsonl(cfg.run_dir / "data" / "train.jsonl", text_records(4, 1))
    done = run_payload("train", write_config(cfg, train_env / "short.yaml"))
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "num_samples" not in done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith("payload train: train.max_seq_length 20 leaves none of the 4 train records with a "
                           "token to train: their prompt fills train.max_seq_length 20 (prompt tokens: 43-44)"), line
    assert line.endswith("set train.max_seq_length above 44 plus room for the answer, or shorten the prompts"), line
    status = json.loads((cfg.run_dir / layout.STATUS).read_text())
    assert status["state"] == "failed" and status["exit_code"] == 2 and "max_seq_length" in status["reason"]
    assert not (cfg.run_dir / layout.LOGS_DIR / "rank_0_traceback.log").exists()


def test_some_prompts_too_long_train_and_the_drop_is_counted(train_env, capsys):
    cfg = make_config(train_env, "some", train={"max_seq_length": 64, "max_steps": 2, "logging_steps": 1,
                                                "checkpoints": {"save_steps": 2, "keep_best": 1, "keep_recent": 1}})
    records = text_records(8, 1)
    for rec in records[:3]:  # a long system prompt: no assistant token within 64 tokens
        rec["messages"][0]["content"] = LONG_SYSTEM
    _write_jsonl(cfg.run_dir / "data" / "train.jsonl", records)
    summary = train_in_process(cfg)  # the payload's log goes to stdout (observe.setup_logging)
    assert summary["state"] == "completed" and summary["dropped_records"] == {"train": 3}
    said = [line for line in capsys.readouterr().out.splitlines() if "dropped by TRL" in line]
    assert len(said) == 1 and "WARNING 3 of 8 train records dropped by TRL: their prompt fills " \
        "train.max_seq_length 64 (prompt tokens: 125-126)" in said[0], said
    assert said[0].endswith("set train.max_seq_length above 126 plus room for the answer to keep them")
    status = json.loads((cfg.run_dir / layout.STATUS).read_text())
    assert status["dropped_records"] == {"train": 3} and "3 of 8 train records" in status["dropped_reason"]


def test_packed_records_left_without_a_trained_token_are_refused_too(train_env):
    # Packing keeps a cut record in its pack (training nothing): counted per packed segment.
    import pytest

    import payload.train.recipe as recipe
    from payload.errors import PayloadError

    cfg = make_config(train_env, "packed", train={"max_seq_length": 20, "packing": True})
    _write_jsonl(cfg.run_dir / "data" / "train.jsonl", text_records(4, 1))
    run = recipe.Run(cfg=cfg, run_dir=cfg.run_dir)
    try:
        with pytest.raises(PayloadError, match=r"leaves none of the 4 train records with a token to train: .*"
                                               r"\(prompt tokens: 43-44\).* above 44 plus room for the answer"):
            recipe.setup(run)
    finally:  # setup installed the trainer's SIGINT/SIGTERM handlers (train's cleanup restores them):
        run.stop.restore()  # left here, they made a later test's forked workers ignore SIGTERM (a hang)


# ------------------------------------------------------------------------------ before money: the launcher


def test_plan_refuses_a_max_seq_length_no_prompt_fits_in(tmp_path):
    from walk import assert_one_line_error, launch

    r = launch(tmp_path, "plan", "local-demo", "--set", "train.max_seq_length=20")
    line = assert_one_line_error(r, "local-demo: train.max_seq_length 20 leaves none of the 380 train records a "
                                    "token to train: their prompts are 25-58 tokens (tokenized with the model's "
                                    "chat template)", "set train.max_seq_length above 58")
    assert "\n" not in line


def test_plan_counts_the_records_it_would_lose_and_leaves_them_out_of_the_steps(tmp_path):
    from walk import launch

    epochs = ("--set", "train.max_steps=null", "--set", "train.epochs=1")  # the steps follow the records
    r = launch(tmp_path, "plan", "local-demo", "--json", *epochs, "--set", "train.max_seq_length=40")
    assert r.returncode == 0, r.stderr
    plan = json.loads(r.stdout)
    # the payload's own run drops exactly these (TRL's preparation of the same 380 records: 279)
    assert plan["data_note"].startswith("279 of 380 train records have a prompt of 40-58 tokens (tokenized with "
                                        "the model's chat template), filling train.max_seq_length 40")
    assert plan["train_tokens"] == (380 - 279) * 40  # the 101 records left, each cut to 40 tokens
    kept = launch(tmp_path, "plan", "local-demo", "--json", *epochs, "--set", "train.max_seq_length=64")
    assert json.loads(kept.stdout)["data_note"] is None


def test_data_preview_says_it_in_one_line(tmp_path):
    from walk import assert_one_line_error, launch

    r = launch(tmp_path, "data", "preview", "local-demo", "-n", "1", "--set", "train.max_seq_length=20")
    assert_one_line_error(r, "leaves none of the 380 train records a token to train")


def test_without_the_tokenizer_the_count_is_an_estimate_that_warns_and_never_refuses():
    from launcher.profiles.data_count import count_local
    from launcher.project import PACKAGE_ROOT as REPO_ROOT
    from launcher.profiles.profile import read_profile, validate

    p = validate(read_profile("local-demo"), ("train.max_seq_length=8",))
    p = p.model_copy(update={"model": p.model.model_copy(update={"name_or_path": "nobody/not-cached", "tiny": None})})
    counted = count_local(p, REPO_ROOT)
    assert counted.refusal is None and counted.untrained == counted.records == 380
    assert "estimated at ~4 characters/token" in counted.untrained_note
    assert "of 380 train records have a prompt of ~" in counted.untrained_note


def test_up_refuses_before_renting_when_the_cached_tokenizer_says_no_prompt_fits(in_repo, tmp_path, monkeypatch):
    # `launch up`'s checks (every backend) and its budget gate plan the run before the machine is rented:
    # the refusal goes through both (tests/walks/test_walk_trust.py: the installed `launch`, every backend).
    import pytest
    from huggingface_hub import constants
    from test_preview import RECORDS, cache_tokenizer, qwen25_tokenizer

    from launcher.plan.budget_gate import confirm_over_budget
    from launcher.profiles.checks import load_checked
    from launcher import catalog
    from launcher.project import PACKAGE_ROOT as REPO_ROOT
    from launcher.profiles.profile import ProfileError, read_profile, validate

    def no_instance(p):  # SkyPilot's optimizer (a child process, seconds) is the edge: its price is the profile's
        raise catalog.PlanError("not in the snapshot")

    monkeypatch.setattr(catalog, "choice_apart", no_instance)
    cache = tmp_path / "hub"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    cache_tokenizer(cache, "Qwen/Qwen2.5-32B", qwen25_tokenizer())
    data = in_repo / "three.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    sets = (f"data.sources.0.path={data.relative_to(REPO_ROOT)}", "train.max_seq_length=8", "budget.price_per_hour=4")
    with pytest.raises(ProfileError, match="train.max_seq_length 8 leaves none of the 3 train records a token"):
        load_checked("lovecraft-a100-spot", overrides=sets)
    p = validate(read_profile("lovecraft-a100-spot"), sets)
    with pytest.raises(ProfileError, match="train.max_seq_length 8 leaves none of the 3 train records a token"):
        confirm_over_budget(p, "skypilot", interactive=False)


def test_status_shows_the_records_the_trainer_dropped_one_line_per_run(tmp_path):
    """status.json's `dropped_records`/`dropped_reason` (payload/data/trainset.py) is one `!` line
    under `launch status RUN` while the run trains, and one per run under `status --all` once it ended
    and its machine is no longer asked (kept with its last step)."""
    import os
    import subprocess

    from walk import launch

    from launcher.store import registry

    run_id, vol = "local-demo-20261126-120000", tmp_path / "volume"
    reason = ("3 of 8 train records dropped by TRL: their prompt fills train.max_seq_length 40 (prompt tokens: "
              "43-46), so no assistant token is left to train")
    rd = layout.run_dir(vol, run_id)
    rd.mkdir(parents=True)
    (rd / layout.STATUS).write_text(json.dumps({"state": "training", "step": 2, "max_steps": 8,
                                                "dropped_records": {"train": 3}, "dropped_reason": reason}))
    trainer = subprocess.Popen(["sleep", "60"], env={**os.environ, "LAUNCH_RUN_ID": run_id,  # the driver, alive
                                                     "LAUNCH_VOLUME": str(vol)})
    try:
        registry.save(registry.Run(id=run_id, profile="local-demo", backend="local", state="running",
                                   started_at=1.0, handle={"volume": str(vol), "pid": trainer.pid}))
        env = {"LAUNCH_HOME": os.environ["LAUNCH_HOME"]}
        said = " ".join(launch(tmp_path, "status", run_id, env=env).stdout.split())
        assert " running " in said and f"! {reason}; a larger train.max_seq_length keeps them" in said, said
    finally:
        trainer.kill()
        trainer.wait()
    registry.update(run_id, state="stopped", ended_at=2.0)
    (rd / layout.STATUS).unlink()  # the machine is gone: status says what it remembered
    r = launch(tmp_path, "status", "--all", env=env)
    lines = [line for line in r.stdout.splitlines() if line.startswith("!")]
    assert r.returncode == 0 and len(lines) == 1 and lines[0].startswith(f"! {run_id}: 3 of 8 train"), r.stdout
