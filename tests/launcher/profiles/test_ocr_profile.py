"""The well-log-ocr-spot profile (runbook 002): validates, renders any_of accelerators that SkyPilot
parses, plans the cheapest option with the others as fallbacks, and rehearses."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from launcher.profiles.profile import ProfileError, load_profile

REPO = Path(__file__).resolve().parents[3]
NAME = "well-log-ocr-spot"


def test_profile_carries_the_runbook_values():
    p = load_profile(NAME)
    t = p.train
    assert p.model.name_or_path == "Qwen/Qwen3-VL-2B-Instruct" and p.model.kind == "image_text_to_text"
    assert t.method == "qlora" and t.quantization.bits == 4
    assert (t.lora.r, t.lora.alpha, t.lora.dropout) == (16, 16, 0.0)
    assert (t.learning_rate, t.per_device_batch_size, t.gradient_accumulation_steps, t.max_steps) == (2e-4, 2, 4, 500)
    assert (t.checkpoints.keep_best, t.checkpoints.keep_recent) == (5, 5) and t.early_stopping_patience
    assert (p.budget.max_usd, p.budget.warn_fraction) == (10, 0.9)
    assert p.cluster.use_spot and p.cluster.accelerator_options == ["RTX4090:1", "A100-80GB:1", "H100:1", "RTX3090:1"]
    assert p.data.sources[0].hf_dataset == "wrath/well-log-headers-ocr" and p.data.sources[0].format == "image_text"
    assert p.evaluation.metrics == ["cer", "wer", "exact_match"] and p.evaluation.metric_for_best == "cer"
    assert p.wandb.project == "well-log-ocr"


def test_rendered_task_has_any_of_and_skypilot_parses_it():
    import sky

    path = REPO / "sky" / f"{NAME}.yaml"
    raw = yaml.safe_load(path.read_text())
    assert raw["resources"]["any_of"] == [{"accelerators": a} for a in ("RTX4090:1", "A100-80GB:1", "H100:1", "RTX3090:1")]
    assert "accelerators" not in raw["resources"] and raw["resources"]["use_spot"] is True
    assert raw["secrets"] == {"HF_TOKEN": None, "WANDB_API_KEY": None}
    assert raw["volumes"] == {"/workspace": "well-log-ocr"}
    task = sky.Task.from_yaml(str(path))
    task.validate()
    assert {str(next(iter(r.accelerators))) for r in task.resources} == {"RTX4090", "A100-80GB", "H100", "RTX3090"}
    config = yaml.safe_load((REPO / "sky" / "config" / f"{NAME}.yaml").read_text())
    assert config["runtime"]["budget_warn_fraction"] == 0.9 and config["runtime"]["budget_usd"] == 10
    assert config["evaluation"]["final_split"] == "test" and config["wandb"]["project"] == "well-log-ocr"


def test_plan_takes_the_cheapest_and_lists_the_fallbacks():
    from launcher.plan.estimate import plan_profile

    plan = plan_profile(load_profile(NAME))
    assert plan.accelerators == "RTX4090:1" and plan.use_spot
    # RTX3090 (runbook 002's cheapest row) has no RunPod rows in the snapshot: listed, not placeable
    assert [o["accelerators"] for o in plan.any_of] == ["RTX4090:1", "A100-80GB:1", "H100:1", "RTX3090:1"]
    assert [o["chosen"] for o in plan.any_of] == [True, False, False, False]
    prices = [o["price_per_hour"] for o in plan.any_of if o["price_per_hour"] is not None]
    assert len(prices) == 3
    assert prices == sorted(prices) and plan.price_per_hour == prices[0]
    assert plan.total_usd < 10 and plan.memory["status"] == "fits"


def test_plan_command_shows_choice_and_fallbacks_and_rehearsal():
    from launcher.cli import cli

    out = CliRunner().invoke(cli, ["plan", NAME])
    assert out.exit_code == 0, out.output
    assert "Chosen" in out.output and out.output.count("Fallback") == 3 and "RTX4090:1" in out.output
    full = CliRunner().invoke(cli, ["plan", NAME, "--json"])
    short = CliRunner().invoke(cli, ["plan", NAME, "--rehearse", "--json"])
    import json

    a, b = json.loads(full.output), json.loads(short.output)
    assert b["train_tokens"] < a["train_tokens"] and b["total_usd"] < a["total_usd"]


def test_rehearsal_overrides():
    from launcher.profiles.profile import load_profile as load
    from launcher.runs.rehearse import is_rehearsal, overrides, run_id_prefix

    p = load(NAME)
    r = load(NAME, overrides(p))
    assert r.train.max_steps == 10 and all(s.max_records == 100 for s in r.data.sources)
    assert r.evaluation.max_samples <= 8 and r.evaluation.max_test_samples <= 8
    assert "rehearsal" in r.wandb.tags and r.train.checkpoints.save_steps == 5
    assert is_rehearsal(f"{run_id_prefix(NAME)}-20261123-101500") and not is_rehearsal(f"{NAME}-20261123-101500")


def test_up_rehearse_dry_run_leaves_sky_untouched():
    from launcher.cli import cli

    before = {p: p.read_text() for p in (REPO / "sky").rglob(f"{NAME}.yaml")}
    out = CliRunner().invoke(cli, ["up", NAME, "--rehearse", "--dry-run"])
    assert out.exit_code == 0, out.output
    assert f"{NAME}-rehearsal-" in out.output
    assert {p: p.read_text() for p in before} == before


@pytest.mark.parametrize("accelerators, expect", [
    ("[RTX4090:1, H100:2]", "same GPU count"),
    ("[RTX4090:1, RTX4090:1]", "twice"),
    ("[RTX4090:1, H101:1]", "does not know accelerator `H101`"),
])
def test_bad_accelerator_lists(tmp_path, accelerators, expect):
    text = (REPO / "clusters" / f"{NAME}.yaml").read_text()
    bad = tmp_path / "p.yaml"
    bad.write_text(text.replace("accelerators: [RTX4090:1, A100-80GB:1, H100:1, RTX3090:1]", f"accelerators: {accelerators}"))
    with pytest.raises(ProfileError, match=expect) as e:
        load_profile(str(bad))
    assert str(bad) in str(e.value) or "p.yaml" in str(e.value)


def test_accelerator_list_with_infra_list_is_refused(tmp_path):
    text = (REPO / "clusters" / f"{NAME}.yaml").read_text()
    bad = tmp_path / "p.yaml"
    bad.write_text(text.replace("infra: runpod", "infra: [runpod, azure]"))
    with pytest.raises(ProfileError, match="any_of and ordered"):
        load_profile(str(bad))
