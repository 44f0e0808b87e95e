"""The model card pushed with a run's model (`outputs.push_to_hub`): the README.md a Hub user reads first.

Its metadata is huggingface_hub's `ModelCardData` (the Hub's own keys, so the Hub links and filters it):
`base_model` (the Hub id trained on; none for a tiny model built from config), `library_name` (`peft`
for an adapter, which the Hub then loads onto its base; `transformers` for merged or full weights),
`datasets` (the Hub datasets among the data sources), `pipeline_tag` and `tags`. Its text says what was
trained and how (method, LoRA rank, steps), the metrics of `training_summary.json` (losses, evaluation
scores, throughput, cost), how to load it, the command that made it and the resolved config (runtime
excluded), as axolotl's cards carry theirs.
"""

from __future__ import annotations

from typing import Optional

import yaml

from payload import layout

FILE = "model_card.md"  # in outputs/: the card as pushed (README.md on the Hub)

# training_summary.json key -> the card's label, in the card's order
METRICS = (("steps", "steps"), ("epoch", "epochs"), ("first_loss", "first train loss"),
           ("final_loss", "final train loss"), ("final_eval_loss", "final eval loss"),
           ("best_eval_loss", "best eval loss"), ("tokens_per_s", "tokens/s"),
           ("total_seconds", "training seconds"), ("cost_usd", "training cost (USD)"))


def card_data(cfg, adapter: bool):
    from huggingface_hub import ModelCardData

    datasets = sorted({s.hf_dataset for s in cfg.data.sources if s.hf_dataset})
    tags = ["launch", cfg.train.method, "generated_from_trainer"]
    if adapter and cfg.train.method in ("lora", "qlora"):
        tags.append("lora")
    return ModelCardData(
        base_model=None if cfg.model.tiny is not None else cfg.model.name_or_path,
        library_name="peft" if adapter else "transformers", datasets=datasets or None, tags=tags,
        pipeline_tag="image-text-to-text" if cfg.model.kind == "image_text_to_text" else "text-generation",
        model_name=cfg.outputs.push_to_hub)


def model_card(cfg, adapter: bool):
    """The card (huggingface_hub.ModelCard) for the pushed folder: an adapter, or merged/full weights."""
    from huggingface_hub import ModelCard

    summary = layout.read_json(cfg.run_dir / layout.SUMMARY)
    data = card_data(cfg, adapter)
    return ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + body(cfg, adapter, summary))


def body(cfg, adapter: bool, summary: dict) -> str:
    repo, base = cfg.outputs.push_to_hub, cfg.model.name_or_path
    what = {"lora": "LoRA", "qlora": "QLoRA", "full": "full"}.get(cfg.train.method, cfg.train.method)
    lora = cfg.train.lora
    shape = f" (rank {lora.r}, alpha {lora.alpha})" if cfg.train.method != "full" else ""
    kind = "adapter" if adapter else ("weights" if cfg.train.method == "full" else "merged model")
    parts = [f"# {repo}\n",
             f"A {what} fine-tune{shape} of `{base}`: the {kind}, made with launch from the profile "
             f"`{cfg.runtime.profile}` (run `{cfg.runtime.run_id}`).\n",
             "## Training results\n", metrics_table(summary), "", usage(cfg, adapter),
             "## How it was made\n", "```sh", f"launch up {cfg.runtime.profile}", "```\n",
             f"Run `{cfg.runtime.run_id}`, config hash `{cfg.config_hash()}`. The resolved config:\n",
             "<details><summary>config</summary>\n", "```yaml", resolved_yaml(cfg).rstrip(), "```\n",
             "</details>\n"]
    return "\n".join(parts)


def metrics_table(summary: dict) -> str:
    rows = [(label, summary.get(key)) for key, label in METRICS if summary.get(key) is not None]
    for split, scores in (summary.get("evaluation") or {}).items():
        rows += [(f"{split} {k}", v) for k, v in scores.items() if v is not None and k != "n"]
    if not rows:
        return "No training summary was found for this run."
    return "\n".join(["| metric | value |", "| --- | --- |", *(f"| {k} | {_num(v)} |" for k, v in rows)])


def usage(cfg, adapter: bool) -> str:
    repo = cfg.outputs.push_to_hub
    if adapter:
        load = ["from peft import AutoPeftModelForCausalLM", "",
                f'model = AutoPeftModelForCausalLM.from_pretrained("{repo}")']
    else:
        cls = "AutoModelForImageTextToText" if cfg.model.kind == "image_text_to_text" else "AutoModelForCausalLM"
        load = [f"from transformers import {cls}, AutoTokenizer", "",
                f'model = {cls}.from_pretrained("{repo}")', f'tokenizer = AutoTokenizer.from_pretrained("{repo}")']
    return "\n".join(["## Use\n", "```python", *load, "```\n"])


def resolved_yaml(cfg) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json", exclude={"runtime"}), sort_keys=False, width=100)


def _num(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e5 else f"{v:.0f}"
    return str(v)


def write(cfg, adapter: bool) -> Optional[str]:
    """Write the card to outputs/model_card.md; its path."""
    path = cfg.run_dir / layout.OUTPUTS_DIR / FILE
    path.write_text(str(model_card(cfg, adapter)), encoding="utf-8")
    return str(path)
