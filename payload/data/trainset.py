"""The training stage's inputs: canonical records from `{run_dir}/data/` as datasets TRL reads.

`{run_dir}/data/{train,val}.jsonl` hold records `{"messages": [{"role", "content": str | [{"type":
"text", "text"} | {"type": "image", "image": path}]}], "source": ...}` written by `python -m payload
data` (run here first when missing). Text records get plain `messages` (also for a vision-language
model: TRL's text path tokenizes them with its processor, and batches them padding-free); records
with images get `images` too (decoded lazily by `datasets`, collated padded by TRL's VL collator).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from payload import layout
from payload.errors import PayloadError

log = logging.getLogger("payload.train")


def ensure_data(cfg, tokenizer) -> tuple[list, list]:
    """Read train/val JSONL; run the data stage first when the data directory has no train.jsonl."""
    data_dir = cfg.run_dir / layout.DATA_DIR
    if not (data_dir / "train.jsonl").is_file():
        try:
            import payload.data as data_stage
        except ImportError:
            raise PayloadError(f"{data_dir}/train.jsonl is missing: run `python -m payload data --config ...` first")
        log.info("no prepared data in %s: running the data stage", data_dir)
        data_stage.main(cfg, tokenizer=tokenizer)
    train = read_jsonl(data_dir / "train.jsonl")
    if not train:
        raise PayloadError(f"{data_dir}/train.jsonl has no records: check data.sources and their splits")
    val_path = data_dir / "val.jsonl"
    return train, read_jsonl(val_path) if val_path.is_file() else []


def read_jsonl(path: Path) -> list[dict]:
    records = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except ValueError as e:
                raise PayloadError(f"{path}:{n}: not valid JSON ({e.msg}); rerun the data stage") from None
            if not isinstance(rec, dict) or not isinstance(rec.get("messages"), list):
                raise PayloadError(f"{path}:{n}: a record needs a `messages` list; rerun the data stage")
            records.append(rec)
    return records


def _parts(content, where: str) -> list[dict]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise PayloadError(f"{where}: `content` must be a string or a list of parts")
    return content


def text_row(rec: dict, where: str) -> dict:
    messages = []
    for m in rec["messages"]:
        texts = []
        for p in _parts(m.get("content", ""), where):
            if p.get("type") == "image":
                raise PayloadError(f"{where}: the record has an image but model.kind is causal_lm; "
                                   "use kind: image_text_to_text with a vision-language model")
            texts.append(p.get("text") or "")
        messages.append({"role": m["role"], "content": "".join(texts)})
    return {"messages": messages}


def vl_row(rec: dict, where: str, base: Path) -> dict:
    messages, images = [], []
    for m in rec["messages"]:
        parts = []
        for p in _parts(m.get("content", ""), where):
            if p.get("type") == "image":
                img = Path(str(p.get("image") or ""))
                img = img if img.is_absolute() or img.exists() else base / img
                if not img.is_file():
                    raise PayloadError(f"{where}: image {p.get('image')!r} not found; set image_root of the source")
                images.append(str(img))
                parts.append({"type": "image", "text": None})
            else:
                parts.append({"type": "text", "text": p.get("text") or ""})
        messages.append({"role": m["role"], "content": parts})
    return {"messages": messages, "images": images}


def build_dataset(records: list[dict], vl: bool, name: str):
    """A datasets.Dataset TRL understands: text `messages`; with `vl` (a vision-language model whose
    records carry images) also `images` (decoded lazily)."""
    from datasets import Dataset, Image, List

    base = Path(".")
    rows = []
    for i, rec in enumerate(records):
        where = f"{name} record {i + 1}"
        row = vl_row(rec, where, base) if vl else text_row(rec, where)
        row["record_index"] = i
        rows.append(row)
    ds = Dataset.from_list(rows)
    if vl:
        ds = ds.cast_column("images", List(Image()))
    return ds


def has_images(records: list[dict]) -> bool:
    """Whether any record has an image part (then a vision-language model takes TRL's VL collator)."""
    return any(isinstance(m.get("content"), list) and any(isinstance(p, dict) and p.get("type") == "image"
                                                          for p in m["content"])
               for rec in records for m in rec.get("messages") or [] if isinstance(m, dict))


def padding_free(cfg, images: bool) -> tuple[bool, str]:
    """(padding-free batches or not, why). The records of a step stay those of the padded batch, so
    the math does not change (tests/payload/train/test_padding_free.py); TRL pads batches with images."""
    setting = cfg.train.padding_free
    if cfg.train.packing:
        return True, "train.packing: several records per row"
    if setting is False:
        return False, "train.padding_free: false"
    if images:
        if setting is True:
            raise PayloadError("train.padding_free is true but the records carry images, which TRL batches "
                               "padded; set train.padding_free: auto")
        return False, "the records carry images: TRL pads vision-language batches"
    vl = cfg.model.kind == "image_text_to_text"
    return True, f"train.padding_free: {setting}" + (", records without images take the text path" if vl else "")


def use_padding_free_collator(trainer) -> None:
    """TRL's own collator in padding-free mode (one row per batch, position ids restarting per record,
    no attention mask) for a run that does not pack. Set after the trainer prepared its datasets:
    TRL 1.16 refuses `padding_free=True` without packing while `max_length` is set ("max_length is not
    enforced", true only for datasets it does not prepare), and it truncates the records it prepares
    to `max_length` either way (SFTTrainer._prepare_dataset), so the rows are those of a padded run."""
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    old = trainer.data_collator
    if not isinstance(old, DataCollatorForLanguageModeling):
        raise PayloadError(f"padding-free batches need TRL's text collator, the trainer has {type(old).__name__}")
    trainer.data_collator = DataCollatorForLanguageModeling(
        pad_token_id=old.pad_token_id, padding_free=True, pad_to_multiple_of=old.pad_to_multiple_of)
    trainer.padding_free = True


def check_trained_tokens(trainer, cfg, train_records: list[dict], val_records: list[dict]) -> dict:
    """The records TRL's preparation left without a trained token, counted, logged and refused.

    TRL (SFTTrainer._prepare_dataset) cuts each record to `max_length` and drops the ones left with
    no trained token (assistant-only loss: the prompt fills the window); packed records are cut the
    same way but kept, training nothing. None left to train (or fewer than one batch): a one-line
    PayloadError (exit 2), not the sampler's `num_samples=0` at step 0. Returns the counts that
    status.json and the summary carry (empty when no record lost its trained tokens)."""
    t = cfg.train
    # (dataset, records, packed): validation rows are never packed (sft_config's eval_packing=False)
    splits = {"train": (trainer.train_dataset, train_records, t.packing),
              "val": (trainer.eval_dataset, val_records, False)}
    lost = {name: _untrained(ds, records, packed) for name, (ds, records, packed) in splits.items() if ds is not None}
    if not any(n for n, _ in lost.values()):
        return {}
    template = getattr(trainer, "chat_template", None)
    tok = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
    measured = []  # the records that lost their tokens; packed, which ones is not known: the first ones
    for name, (n, idx) in lost.items():
        records, packed = splits[name][1], splits[name][2]
        measured += (records if packed else [records[i] for i in idx])[:MAX_PROMPTS_MEASURED] if n else []
    prompts, span = filling([prompt_tokens(rec, tok, template) for rec in measured], t.max_seq_length)
    why = (f"their prompt fills train.max_seq_length {t.max_seq_length} (prompt tokens: {span}), so no "
           f"assistant token is left to train")
    fix = raise_limit(f"{max(prompts):,}" if prompts else "the longest prompt")
    left = len(train_records) - lost.get("train", (0, []))[0]
    if left == 0 or left < t.per_device_batch_size:
        raise PayloadError(f"train.max_seq_length {t.max_seq_length} leaves {'none' if left == 0 else f'only {left:,}'}"
                           f" of the {len(train_records):,} train records with a token to train: {why}; {fix}, or "
                           "shorten the prompts")
    if val_records and lost.get("val", (0, []))[0] == len(val_records):
        raise PayloadError(f"train.max_seq_length {t.max_seq_length} leaves none of the {len(val_records):,} val "
                           f"records with a token to score: {why}; {fix}, or shorten the prompts")
    said = " and ".join(f"{n:,} of {len(splits[name][1]):,} {name} records "
                        + ("kept in the packs, training nothing" if splits[name][2] else "dropped by TRL")
                        for name, (n, _) in lost.items() if n)
    log.warning("%s: %s; %s to keep them", said, why, fix)
    return {"dropped_records": {name: n for name, (n, _) in lost.items() if n}, "dropped_reason": f"{said}: {why}"}


def filling(prompts: list, max_seq_length: int, exact: bool = True) -> tuple[list, str]:
    """The prompts (tokens before the first trained one; None: not known) that fill max_seq_length,
    leaving no assistant token to train, and their span as the lines about them say it: `1,024-2,048`,
    `~` before an estimate (`exact=False`), `unknown` when none. The data step's check above and the
    preview's and plan's count (payload/data/preview.py `untrained_lines`) build it here."""
    lost = [n for n in prompts if n is not None and n >= max_seq_length]
    if not lost:
        return lost, "unknown"
    low, high = int(min(lost)), int(max(lost))
    return lost, ("" if exact else "~") + f"{low:,}" + (f"-{high:,}" if high != low else "")


def raise_limit(longest: str) -> str:
    """The fix for prompts that fill the window, `longest` the longest of them as the line says it."""
    return f"set train.max_seq_length above {longest} plus room for the answer"


MAX_PROMPTS_MEASURED = 2000  # dropped records whose prompt is tokenized again for the line (the longest of them)


def _untrained(ds, records: list[dict], packing: bool) -> tuple[int, list[int]]:
    """(records without a trained token, indices of those known): unpacked, the ones TRL dropped;
    packed, the all-masked segments of the packs (their records are not known)."""
    if not packing:
        kept = set(ds["record_index"]) if "record_index" in ds.column_names else set(range(len(ds)))
        missing = [i for i in range(len(records)) if i not in kept]
        return len(missing), missing
    if "seq_lengths" not in ds.column_names:
        return 0, []
    import numpy as np

    n = 0
    for batch in ds.select_columns(["labels", "seq_lengths"]).with_format("numpy").iter(batch_size=256):
        for labels, lengths in zip(batch["labels"], batch["seq_lengths"]):
            trained = np.add.reduceat(np.asarray(labels) != -100, np.cumsum(lengths) - lengths)
            n += int((trained == 0).sum())
    return n, []


def prompt_tokens(rec: dict, tokenizer, chat_template=None):
    """Tokens before the first trained one, as SFTTrainer tokenizes the record (None for a record
    with images: the processor widens them)."""
    from trl.data_utils import _tokenize

    try:
        row = text_row(rec, "record")
    except PayloadError:
        return None
    try:
        out = _tokenize(tokenizer, row["messages"], return_assistant_tokens_mask=True, chat_template=chat_template)
    except (ValueError, TypeError, KeyError):
        return None
    mask = list(out.get("assistant_masks") or [])
    return mask.index(1) if 1 in mask else len(mask)
