"""What the trainer sees, before any GPU: the first training examples as records, roles and tokens.

`launch data preview` (launcher/profiles/preview.py) calls these; nothing here re-implements a step:

- the records are the data stage's own output: `check_sample` (sources -> transforms -> dedup ->
  split; the check `launch validate`, `plan` and `up` run too) writes train.jsonl, read back with
  `trainset.read_jsonl` and turned into the rows SFTTrainer gets by `trainset.build_dataset`;
- the token view tokenizes those rows with TRL's functions in SFTTrainer's order: the training chat
  template (`get_training_chat_template`) when the tokenizer's has no `{% generation %}` markers,
  `data_utils._tokenize` with `return_assistant_tokens_mask`, then truncation at max_seq_length.

`prompt_lengths` / `untrained_lines` count the records whose prompt fills train.max_seq_length (TRL
drops them: no trained token left) for the preview and `launch plan` (launcher/profiles/data_count.py).

For vision-language rows the token view runs the tokenizer's template, where each image is one
`<|image_pad|>` placeholder; the processor widens it to the image's patch count when training.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from payload import layout
from payload.data import trainset
from payload.errors import PayloadError

from .pipeline import check_sample

def first_examples(cfg, n: Optional[int], work_dir: Path, base_dir: Path, tokenizer=None) -> list[dict]:
    """Run the data stage's record check on `cfg.data`'s local sources (`check_sample`: the first
    SAMPLE_RECORDS of each; hub datasets are not downloaded: `hub_sources` names them) into `work_dir`
    and return the first `n` train records (None: all) as train.jsonl holds them. Raises PayloadError (one line)."""
    if all(s.hf_dataset for s in cfg.data.sources):
        raise PayloadError("every data source is a Hugging Face dataset, which the preview does not download; "
                           "preview a local sample: --set 'data.sources=[{name: s, path: FILE, format: ...}]'")
    out = Path(work_dir) / layout.DATA_DIR
    _, problems = check_sample(cfg.data, out, base_dir=base_dir, tokenizer=tokenizer)
    if problems:
        raise PayloadError(problems[0][1])
    return trainset.read_jsonl(out / "train.jsonl")[:n]


def hub_sources(cfg) -> list[str]:
    """`name (dataset id)` of the sources the preview leaves out: Hugging Face datasets."""
    return [f"{s.name} ({s.hf_dataset})" for s in cfg.data.sources if s.hf_dataset]


def role_view(record: dict, assistant_only_loss: bool) -> list[dict]:
    """The record's turns: `{role, text, trained}`; images as `[image: path]`. Only assistant turns
    train with `assistant_only_loss` (TRL masks the rest); without it every token trains."""
    turns = []
    for m in record["messages"]:
        c = m.get("content", "")
        if not isinstance(c, str):
            c = "".join(f"[image: {p.get('image')}]" if p.get("type") == "image" else p.get("text") or "" for p in c)
        turns.append({"role": m["role"], "text": c,
                      "trained": m["role"] == "assistant" or not assistant_only_loss})
    return turns


def load_cached_tokenizer(cfg):
    """(tokenizer, None) loaded the way training loads it, from a local model directory or the
    Hugging Face cache's snapshot (never the network); or (None, why) when it is not there."""
    from payload.model import modeling

    m = cfg.model
    if m.tiny is not None:  # built in memory: materializing the tiny model would write (and show) its weights
        return modeling.tiny_tokenizer(cfg), None
    path = _local_snapshot(m.name_or_path, m.revision)
    if path is None:
        return None, f"not in {_hub_cache()}"  # checked first: transformers alone takes 5-10 s to import
    try:
        processing = modeling.load_processing_class(path, m.kind, m.trust_remote_code)
    except (OSError, ValueError, ImportError, KeyError, TypeError, AttributeError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
        return None, f"{path}: {first}"
    return getattr(processing, "tokenizer", processing), None


def _hub_cache() -> str:
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def _local_snapshot(name: str, revision: Optional[str]) -> Optional[str]:
    """A local model directory, or the cached snapshot of a hub id that holds its tokenizer config."""
    if Path(name).is_dir():
        return name
    from huggingface_hub import snapshot_download

    try:
        path = snapshot_download(name, revision=revision, local_files_only=True)
    except Exception:  # noqa: BLE001 - not cached, or not a repo id: no token view, said by the caller
        return None
    return path if (Path(path) / "tokenizer_config.json").is_file() else None


def training_template(tokenizer, assistant_only_loss: bool) -> Optional[str]:
    """The chat template SFTTrainer swaps in (None: the tokenizer's own)."""
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    if not tokenizer.chat_template:
        raise PayloadError("the tokenizer has no chat template, and chat records need one to train; "
                           "use the model's instruct variant or give the tokenizer a template")
    if assistant_only_loss and not has_generation_markers(tokenizer.chat_template):
        return get_training_chat_template(tokenizer)
    return None


def token_view(record: dict, tokenizer, max_length: int, assistant_only_loss: bool,
               chat_template: Optional[str] = None) -> dict:
    """Tokenize one record as SFTTrainer does: `spans` [(text, trained)], `tokens`, `trained`,
    `truncated` (tokens cut at max_length), `images`."""
    from trl.data_utils import _tokenize

    row = trainset.build_dataset([record], vl=_has_image(record), name="preview")[0]
    messages = [{"role": m["role"], "content": _plain(m["content"])} for m in row["messages"]]
    out = _tokenize(tokenizer, messages, return_assistant_tokens_mask=assistant_only_loss,
                    chat_template=chat_template)
    ids = list(out["input_ids"])
    mask = list(out.get("assistant_masks") or [1] * len(ids))
    truncated = max(0, len(ids) - max_length)
    ids, mask = ids[:max_length], mask[:max_length]
    spans: list[tuple[str, bool]] = []
    start = 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or bool(mask[i]) != bool(mask[start]):
            spans.append((tokenizer.decode(ids[start:i], skip_special_tokens=False), bool(mask[start])))
            start = i
    return {"spans": spans, "tokens": len(ids), "trained": sum(1 for x in mask if x),
            "truncated": truncated, "images": len(row.get("images") or [])}


def _has_image(record: dict) -> bool:
    return any(isinstance(m.get("content"), list) and any(p.get("type") == "image" for p in m["content"])
               for m in record["messages"])


def _plain(content):
    """A row's content for the tokenizer's template: text parts joined where there is no image."""
    if isinstance(content, list) and not any(p.get("type") == "image" for p in content):
        return "".join(p.get("text") or "" for p in content)
    return content


def prompt_lengths(records: list[dict], tokenizer, chat_template: Optional[str] = None) -> Optional[list]:
    """Tokens before the first trained one in each record, as SFTTrainer tokenizes it (None when a
    record has images: the processor widens them)."""
    out = [trainset.prompt_tokens(rec, tokenizer, chat_template) for rec in records]
    return None if any(n is None for n in out) else out


def untrained_lines(prompts: list, of: int, cfg, how: str, exact: bool) -> tuple[int, Optional[str], Optional[str]]:
    """(records whose prompt fills train.max_seq_length, the warning line, the refusal when that is
    every one of the `of` records and `prompts` are exact). SFTTrainer cuts each record to max_length
    and drops the ones left without a trained token (assistant-only loss); packed, it keeps them."""
    t = cfg.train
    lost, span = trainset.filling(prompts if t.assistant_only_loss else [], t.max_seq_length, exact)
    if not lost:
        return 0, None, None
    longest = f"{int(max(lost)):,}"
    fate = "they stay in the packs, training nothing" if t.packing else \
        "TRL drops them (the plan counts the records left)"
    note = (f"{len(lost):,} of {of:,} train records have a prompt of {span} tokens ({how}), filling "
            f"train.max_seq_length {t.max_seq_length} with no assistant token left to train: {fate}; "
            f"{trainset.raise_limit(longest)} to keep them")
    refusal = None
    if exact and len(lost) >= of:
        refusal = (f"train.max_seq_length {t.max_seq_length} leaves none of the {of:,} train records a token to "
                   f"train: their prompts are {span} tokens ({how}); "
                   f"{trainset.raise_limit(longest + ' (the longest prompt)')}, or shorten the prompts")
    return len(lost), note, refusal
