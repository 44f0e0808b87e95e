"""`launch data preview` and alpaca's `instruction_as`: what the trainer sees, shown before a GPU.

Runbook 001's prompt layout (system = instruction, user = input, assistant = output) is the case
the issue names; the token view is compared with what TRL's SFTTrainer itself builds."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from launcher.cli import cli
from launcher.project import PACKAGE_ROOT as REPO
from payload.data.records import from_alpaca

RECORDS = [
    {"instruction": "Write in the style of H.P. Lovecraft.", "input": "Describe a foggy harbour.",
     "output": "The fog crept in from the sea."},
    {"instruction": "Write in the style of H.P. Lovecraft.", "input": "Describe an old library.",
     "output": "Shelves of crumbling tomes."},
    {"instruction": "Continue the story.", "input": "The door opened.", "output": "And the stars were right."},
]


@pytest.fixture
def alpaca(in_repo) -> str:
    """Three records in the repo (a run reads only repo files: launcher/profiles/boundary.py), by their
    path from the repo root."""
    path = in_repo / "three.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    return str(path.relative_to(REPO))


@pytest.fixture
def hub_cache(tmp_path, monkeypatch) -> Path:
    """An empty Hugging Face cache: no tokenizer is found unless a test puts one there."""
    from huggingface_hub import constants

    cache = tmp_path / "hf" / "hub"
    cache.mkdir(parents=True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


def qwen25_tokenizer():
    """The tiny tokenizer (payload/model/tiny.py, Qwen's special tokens) with Qwen2.5's own chat template
    (TRL ships a copy): no {% generation %} markers, so SFTTrainer swaps in its training template."""
    import trl

    from payload.model.tiny import build_tiny_tokenizer

    tok = build_tiny_tokenizer()
    tok.chat_template = (Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja").read_text()
    return tok


def cache_tokenizer(cache: Path, repo_id: str, tok) -> None:
    """Save `tok` where the hub's cache layout puts `repo_id`'s files (found offline by
    `snapshot_download(local_files_only=True)`, as a downloaded model's would be)."""
    repo, commit = cache / ("models--" + repo_id.replace("/", "--")), "0" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    tok.save_pretrained(repo / "snapshots" / commit)


def preview(path: str, *extra) -> str:
    out = CliRunner().invoke(cli, ["data", "preview", "lovecraft-a100-spot",
                                   "--set", f"data.sources.0.path={path}", *extra], terminal_width=200)
    assert out.exit_code == 0, out.output
    return out.output


def test_alpaca_instruction_as_system_is_the_runbook_001_layout():
    rec = {"instruction": "I", "input": "X", "output": "O"}
    assert from_alpaca(rec, "system") == [{"role": "system", "content": "I"}, {"role": "user", "content": "X"},
                                          {"role": "assistant", "content": "O"}]
    assert from_alpaca(rec) == [{"role": "system", "content": ""}, {"role": "user", "content": "I\n\nX"},
                                {"role": "assistant", "content": "O"}]
    # a record's own `system` column stays first; the instruction follows it in the system turn
    assert from_alpaca({**rec, "system": "S"}, "system")[0] == {"role": "system", "content": "S\n\nI"}


def test_lovecraft_profile_declares_the_runbook_layout():
    from launcher.profiles.profile import load_profile
    from payload.config import SourceConfig

    src = load_profile("lovecraft-a100-spot").data.sources[0]
    assert (src.format, src.instruction_as) == ("alpaca", "system")
    assert SourceConfig(name="x", path="x.jsonl").instruction_as == "user"  # other alpaca sources: as before


def test_preview_without_a_tokenizer_shows_roles_not_an_error(alpaca, hub_cache):
    out = preview(alpaca, "-n", "2")
    lines = out.splitlines()
    i = lines.index("system (masked)")
    assert lines[i:i + 6] == ["system (masked)", RECORDS[0]["instruction"], "user (masked)", RECORDS[0]["input"],
                              "assistant (trained)", RECORDS[0]["output"]]
    assert out.count("── example") == 2 and "example 1 of 2 (source lovecraft)" in out
    assert "needs the tokenizer of Qwen/Qwen2.5-32B in the Hugging Face cache" in out
    assert "hf download Qwen/Qwen2.5-32B" in out and "Traceback" not in out
    assert "dim:" not in out and "Only assistant turns train (train.assistant_only_loss)." in out  # nothing dimmed


def test_the_legend_explains_the_styling_where_it_is_shown(alpaca, hub_cache):
    out = CliRunner(env={"FORCE_COLOR": "1", "TERM": "xterm"}).invoke(
        cli, ["data", "preview", "lovecraft-a100-spot", "--set", f"data.sources.0.path={alpaca}", "-n", "1"])
    assert out.exit_code == 0, out.output
    assert "\x1b[2m" in out.output and "dim: masked (prompt, no loss); plain: trained." in out.output


def test_preview_with_the_cached_tokenizer_shows_the_chat_template(alpaca, hub_cache):
    cache_tokenizer(hub_cache, "Qwen/Qwen2.5-32B", qwen25_tokenizer())
    out = preview(alpaca, "-n", "1")
    assert ("<|im_start|>system\nWrite in the style of H.P. Lovecraft.<|im_end|>\n<|im_start|>user\n"
            "Describe a foggy harbour.<|im_end|>\n<|im_start|>assistant\nThe fog crept in from the sea.<|im_end|>") in out
    assert "example 1 of 1 (source lovecraft): " in out and " trained" in out and "needs the tokenizer" not in out


def test_token_view_masks_what_sft_trainer_masks(tmp_path, alpaca):
    """The preview's tokens and trained mask equal the ones TRL's SFTTrainer prepares for training."""
    from trl import SFTConfig, SFTTrainer

    from launcher.profiles.profile import load_profile
    from launcher.profiles.render import resolved_run_config
    from payload.data import trainset
    from payload.config import TinyModel
    from payload.data import preview as pv
    from payload.model.tiny import build_tiny_model

    p = load_profile("lovecraft-a100-spot", overrides=(f"data.sources.0.path={alpaca}",))
    cfg = resolved_run_config(p)
    records = pv.first_examples(cfg, 3, tmp_path, Path.cwd())
    assert [r["messages"][0]["content"] for r in records] == [r["instruction"] for r in RECORDS][:len(records)]
    tok = qwen25_tokenizer()
    assert pv.training_template(tok, True) is not None  # TRL's qwen2_5 training template, as SFTTrainer takes
    view = pv.token_view(records[0], tok, 2048, True, pv.training_template(tok, True))
    assert "".join(t for t, trained in view["spans"] if trained).strip() == RECORDS[0]["output"] + "<|im_end|>"
    assert "".join(t for t, trained in view["spans"] if not trained).startswith(
        f"<|im_start|>system\n{RECORDS[0]['instruction']}<|im_end|>\n<|im_start|>user\n{RECORDS[0]['input']}<|im_end|>")

    # activation_checkpointing named (as arguments.sft_config does): TRL 1.16 defaults the deprecated
    # `gradient_checkpointing` to True, and transformers 5.23 warns when only the old name is set
    args = SFTConfig(output_dir=str(tmp_path / "out"), max_length=2048, assistant_only_loss=True, report_to="none",
                     use_cpu=True, dataset_num_proc=None, activation_checkpointing=False)
    trainer = SFTTrainer(model=build_tiny_model(TinyModel(), tok), args=args, processing_class=tok,
                         train_dataset=trainset.build_dataset(records, False, "train.jsonl"))
    row = trainer.train_dataset[0]
    trained = row["assistant_masks"] if "assistant_masks" in row else [x != -100 for x in row["labels"]]
    assert len(row["input_ids"]) == view["tokens"] and sum(map(bool, trained)) == view["trained"]
    shown = tok("".join(t for t, _ in view["spans"]), add_special_tokens=False)["input_ids"]
    assert shown == list(row["input_ids"])


def test_preview_bad_data_is_one_line(in_repo, hub_cache):
    (in_repo / "bad.jsonl").write_text('{"instruction": "no output here"}\n' * 3)
    bad = (in_repo / "bad.jsonl").relative_to(REPO)
    out = CliRunner().invoke(cli, ["data", "preview", "lovecraft-a100-spot", "--set", f"data.sources.0.path={bad}"])
    assert out.exit_code == 1 and "Traceback" not in out.output
    lines = [ln for ln in out.output.splitlines() if ln.strip()]
    # the check `validate` and `up` run too: the key (set on the command line), the data stage's file:line
    assert lines[0].startswith("✗ --set data.sources.0.path: lovecraft: ") and \
        f"{bad}:1: missing key (no 'output'" in lines[0], out.output


def test_preview_of_a_missing_file_names_the_key(in_repo):
    out = CliRunner().invoke(cli, ["data", "preview", "lovecraft-a100-spot", "--set",
                                   f"data.sources.0.path={(in_repo / 'nope.jsonl').relative_to(REPO)}"])
    assert out.exit_code == 1 and "Traceback" not in out.output
    assert "data.sources.0.path" in out.output and "not found" in out.output


def test_image_parts_are_placeholders_in_the_role_view():
    from payload.data.preview import role_view

    rec = {"messages": [{"role": "user", "content": [{"type": "image", "image": "/d/a.png"},
                                                     {"type": "text", "text": "Read it."}]},
                        {"role": "assistant", "content": "HELLO"}]}
    assert role_view(rec, True) == [{"role": "user", "text": "[image: /d/a.png]Read it.", "trained": False},
                                    {"role": "assistant", "text": "HELLO", "trained": True}]
    assert all(t["trained"] for t in role_view(rec, False))


def test_preview_of_vision_language_records_shows_the_image_placeholder(in_repo):
    """local-demo's tiny model switched to Qwen3-VL: its tokenizer is built here, so the token view
    runs without any cache; each image is one <|image_pad|> between the vision markers."""
    from PIL import Image

    Image.new("RGB", (32, 32), "red").save(in_repo / "room1.jpg")
    rec = {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many chairs?"}]},
                        {"role": "assistant", "content": "Three."}], "images": ["room1.jpg"]}
    (in_repo / "vl.jsonl").write_text(json.dumps(rec) + "\n")
    d = in_repo.relative_to(REPO)
    out = CliRunner().invoke(cli, [
        "data", "preview", "local-demo", "-n", "1", "--set", "model.kind=image_text_to_text",
        "--set", "model.tiny.arch=qwen3_vl", "--set",
        f"data.sources=[{{name: vl, path: {d}/vl.jsonl, format: messages, image_root: {d}}}]"],
        terminal_width=200)
    assert out.exit_code == 0, out.output
    assert "1 image(s)" in out.output and "Casting" not in out.output
    assert "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>How many chairs?<|im_end|>" in out.output


def test_preview_of_hub_only_data_is_one_line_without_a_download(hub_cache):
    out = CliRunner().invoke(cli, ["data", "preview", "sonia-h100"])
    assert out.exit_code == 1 and "Traceback" not in out.output
    assert out.output.startswith("✗ sonia-h100: every data source is a Hugging Face dataset, which the preview "
                                 "does not download; preview a local sample: --set"), out.output
