"""Generation with the model's own chat template: what `payload eval` scores and `launch chat` shows.

`load(cfg, adapter)` gives the base model (plus a LoRA adapter directory when given) and its
tokenizer/processor, loaded the way training loads them (payload/model/modeling.py); `answer(...)`
generates greedily (do_sample off: the same inputs give the same text every time) for a batch of
canonical records or prompts. Records are the data stage's canonical chat records; the prompt is
every turn before the last assistant turn, the reference is that assistant turn's text.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Optional

log = logging.getLogger("payload.infer")


def load(cfg, adapter: Optional[Path] = None):
    """(model in eval mode, processing class). QLoRA quantizes only on a GPU; on CPU the base loads
    unquantized (bitsandbytes needs CUDA), which is what `launch chat` on a laptop wants."""
    from payload.model import modeling

    if cfg.train.method == "qlora" and not modeling.on_gpu():
        train = cfg.train.model_copy(update={"method": "lora", "quantization": None})
        cfg = cfg.model_copy(update={"train": train})
    path = modeling.base_model_path(cfg)
    processing = modeling.load_processing_class(path, cfg.model.kind, cfg.model.trust_remote_code,
                                                cfg.model.revision)
    model, _ = modeling.load_model(cfg, path)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter))
        log.info("adapter %s loaded on %s", adapter, cfg.model.name_or_path)
    model.eval()
    return model, processing


def split_record(rec: dict) -> tuple[list[dict], str]:
    """(prompt turns, reference text): everything before the last assistant turn, and its text."""
    msgs = rec["messages"]
    last = max((i for i, m in enumerate(msgs) if m["role"] == "assistant"), default=None)
    if last is None:
        return msgs, ""
    return msgs[:last], text_of(msgs[last]["content"])


def text_of(content: Any) -> str:
    """A turn's text: the string, or its text parts joined."""
    if isinstance(content, str):
        return content
    return "".join(p.get("text") or "" for p in content if p.get("type") == "text")


def images_of(turns: list[dict]) -> list[str]:
    """The image references of the turns' image parts, in order."""
    return [p["image"] for m in turns if isinstance(m["content"], list)
            for p in m["content"] if p.get("type") == "image"]


def _template_messages(turns: list[dict], vl: bool) -> tuple[list[dict], list]:
    """Turns as the chat template wants them, and the PIL images they reference (in order)."""
    from PIL import Image

    out, images = [], []
    for m in turns:
        c = m["content"]
        if not vl:
            out.append({"role": m["role"], "content": text_of(c)})
            continue
        parts = [{"type": "text", "text": c}] if isinstance(c, str) else []
        for p in [] if isinstance(c, str) else c:
            if p.get("type") == "image":
                with Image.open(p["image"]) as img:
                    images.append(img.convert("RGB"))
                parts.append({"type": "image"})
            else:
                parts.append({"type": "text", "text": p.get("text") or ""})
        out.append({"role": m["role"], "content": parts})
    return out, images


def answer(model, processing, prompts: list[list[dict]], max_new_tokens: int, batch_size: int = 8) -> list[str]:
    """Greedy answers to a list of prompts (each a list of turns), in batches, left-padded."""
    import torch

    tok = getattr(processing, "tokenizer", processing)
    vl = tok is not processing
    out: list[str] = []
    side = tok.padding_side
    tok.padding_side = "left"  # generation continues every row from its own last token
    try:
        for start in range(0, len(prompts), batch_size):
            texts, images = [], []
            for turns in prompts[start:start + batch_size]:
                msgs, imgs = _template_messages(turns, vl)
                texts.append(processing.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True))
                images.extend(imgs)
            if vl:
                inputs = processing(text=texts, images=images or None, return_tensors="pt", padding=True)
            else:
                inputs = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
            inputs = inputs.to(model.device)
            with torch.no_grad():
                ids = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                                     pad_token_id=tok.pad_token_id, temperature=None, top_p=None, top_k=None)
            new = ids[:, inputs["input_ids"].shape[1]:]
            out.extend(t.strip() for t in tok.batch_decode(new, skip_special_tokens=True))
    finally:
        tok.padding_side = side
    return out


def chat_turns(prompt: str, image: Optional[str] = None) -> list[dict]:
    """One user turn (text, and an image path for vision-language models)."""
    if image:
        return [{"role": "user", "content": [{"type": "image", "image": image}, {"type": "text", "text": prompt}]}]
    return [{"role": "user", "content": prompt}]
