"""Errors that name the right thing, walked as the user walks them (tests/walk.py: the installed `launch`
in a subprocess, fresh HOME and LAUNCH_HOME, no credentials, stdin not a terminal, 80 columns).

- A key given by `--set` that is unknown or has a bad value is blamed on `--set KEY`, not on a line of
  the profile file, and an unknown key is answered with the nearest key of its own section, spelt as
  `--set` takes it (`lr` -> `train.learning_rate`; difflib alone said `lora`).
- `launch data preview` piped (no styling) prints no legend of dim and plain text.
- The repo reached through a link to it (/home/u/proj -> /data/proj, working from the link) is the repo:
  a path written through the link is inside it, and a link that leads out of it is still refused.
"""

from __future__ import annotations

import pytest

from walk import REPO, assert_one_line_error, launch


@pytest.mark.parametrize("command, item, says", [
    (("plan", "local-demo"), "train.lr=1e-4", "--set train.lr: unknown key; did you mean `train.learning_rate`?"),
    (("up", "local-demo", "--dry-run"), "train.learning_rate=abc",
     "--set train.learning_rate: Input should be a valid number"),
    (("validate", "local-demo"), "train.lorra.r=8",
     "--set train.lorra.r: train.lorra: unknown key; did you mean `train.lora`?"),
])
def test_a_bad_key_or_value_given_by_set_is_blamed_on_the_set(tmp_path, command, item, says):
    r = launch(tmp_path, *command, "--set", item)
    line = assert_one_line_error(r, says)
    assert "local-demo.yaml" not in line and "started" not in r.stdout


@pytest.mark.parametrize("typed, meant", [
    ("lr", ["learning_rate"]), ("Learning-Rate", ["learning_rate"]), ("grad_accum_steps", ["gradient_accumulation_steps"]),
    ("warmup", ["warmup_ratio"]), ("lerning_rate", ["learning_rate"]), ("max_stepz", ["max_steps"]),
    ("sched", ["lr_scheduler"]), ("zzz", []),
])
def test_an_unknown_key_suggests_abbreviations_first(typed, meant):
    from payload.config import TrainConfig, suggest_keys

    assert suggest_keys(typed, list(TrainConfig.model_fields)) == meant


@pytest.fixture
def linked_repo(tmp_path):
    """The user's checkout reached through a link: tmp/proj -> the repo."""
    link = tmp_path / "proj"
    link.symlink_to(REPO, target_is_directory=True)
    return link


def test_a_path_through_a_link_to_the_repo_is_inside_the_repo(tmp_path, linked_repo):
    r = launch(tmp_path, "validate", "local-demo", "--set",
               f"data.sources.0.path={linked_repo}/payload/samples/demo_chat.jsonl", cwd=linked_repo)
    line = assert_one_line_error(r, f"--set data.sources.0.path: {linked_repo}/payload/samples/demo_chat.jsonl "
                                    "is an absolute path", "write it as payload/samples/demo_chat.jsonl")
    assert "outside the project" not in line
    r = launch(tmp_path, "render", f"{linked_repo}/clusters/local-demo.yaml", "--check", cwd=linked_repo)
    assert r.returncode == 0 and "up to date" in r.stdout, r.stdout + r.stderr


def test_a_link_out_of_the_repo_is_refused_through_the_linked_repo(tmp_path, linked_repo, in_repo):
    (tmp_path / "secret.jsonl").write_text('{"instruction": "the secret below", "output": "no"}\n')
    (in_repo / "train.jsonl").symlink_to(tmp_path / "secret.jsonl")
    rel = f"{in_repo.relative_to(REPO)}/train.jsonl"
    r = launch(tmp_path, "validate", "local-demo", "--set", f"data.sources.0.path={rel}", cwd=linked_repo)
    assert_one_line_error(r, f"--set data.sources.0.path: {rel} leads out of the project through a symbolic link")
    r = launch(tmp_path, "validate", "local-demo", "--set", f"data.sources.0.path={linked_repo}/{rel}",
               cwd=linked_repo)
    assert_one_line_error(r, f"{linked_repo}/{rel} is outside the project")
    assert "secret below" not in r.stdout + r.stderr


def test_a_piped_data_preview_explains_no_styling_it_does_not_show(tmp_path):
    r = launch(tmp_path, "data", "preview", "lovecraft-a100-spot", "-n", "1",  # by role: no tokenizer cached
               "--set", "data.sources.0.path=payload/samples/demo_alpaca.jsonl")
    assert r.returncode == 0 and "── example 1 of 1" in r.stdout, r.stdout + r.stderr
    assert "\x1b[" not in r.stdout and "dim:" not in r.stdout and "plain: trained" not in r.stdout
    assert "Only assistant turns train (train.assistant_only_loss)." in r.stdout
