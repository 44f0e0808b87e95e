"""Merge stage: fold the best LoRA adapter into the base model, smoke-test it, optionally push it.

    python -m payload merge --config run.yaml

Reads `{run_dir}/outputs/adapter` (PEFT; verified against its SHA256SUMS first, payload/volume/verify.py),
writes `{run_dir}/outputs/merged` (safetensors, tokenizer and the base's processor/chat-template
files). Safe to re-run: the merged directory is written into a temporary sibling and swapped in with
a `MERGED` marker (adapter hash, base model, smoke text) written before the swap; a later run that
finds the marker for the same adapter and base says "already merged" and does nothing (as litgpt's
merge_lora.py does). A re-trained adapter changes the hash, so it is merged again.

The smoke test loads the merged model back from disk (the files that will be pushed, not the
in-memory copy) and generates a few greedy tokens from `outputs.smoke_prompt`.

Push (`outputs.push_to_hub`) needs HF_TOKEN in the environment, checked before any work; the repo
is created private if it does not exist. The token is never logged or written. It uploads the
merged model, or, when `outputs.merge` is false (or `train.method` is full), `outputs/adapter`, and
a model card (payload/outputs/card.py: base model, `library_name: peft` for an adapter, datasets, the
training summary's metrics, the command and config that made it).
QLoRA adapters are merged into the bf16 base, not into the 4-bit weights they were trained on.
"""

from __future__ import annotations

import gc
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Optional

from payload import layout
from payload.volume import verify
from payload.errors import PayloadError

log = logging.getLogger("payload.merge")

MARKER = "MERGED"  # JSON, written last into the merged directory
PUSHED = ".pushed.json"  # in outputs/: what was last pushed, so a re-run skips the upload
SMOKE_TOKENS = 16
# Small files copied from the base model when the merge did not write them (processor configs, ...).
SIDE_SUFFIXES = (".json", ".jinja", ".txt", ".model", ".tiktoken")
SIDE_SKIP = ("config.json", "generation_config.json", "adapter_config.json")


def main(cfg, env=None) -> dict:
    """Merge (unless already done or `outputs.merge` is off), smoke-test, push if asked."""
    env = os.environ if env is None else env
    token = push_token(cfg, env)  # fail before the slow part, not after it
    adapter_dir, merged_dir = cfg.run_dir / layout.ADAPTER_DIR, cfg.run_dir / layout.MERGED_DIR
    if adapter_dir.is_dir():  # checked against its SHA256SUMS; a damaged one is exported again
        verify.ensure_export(cfg.run_dir, "latest" if cfg.train.method == "full" else "best")
    if cfg.train.method == "full" or not cfg.outputs.merge:
        what = "full weights" if cfg.train.method == "full" else "adapter"
        if not adapter_dir.is_dir():
            raise PayloadError(f"no {what} in {adapter_dir}; run `python -m payload train` first")
        log.info("nothing to merge (%s): the %s in %s is the output", "train.method full"
                 if cfg.train.method == "full" else "outputs.merge is false", what, adapter_dir)
        summary = {"stage": "merge", "merged": False, "merged_dir": None, "smoke": None}
        upload = adapter_dir
    else:
        summary, upload = {"stage": "merge", "merged": True, **merge_once(cfg, adapter_dir, merged_dir)}, merged_dir
    summary["pushed"] = push(cfg, upload, token) if token else None
    return summary


def merge_once(cfg, adapter_dir: Path, merged_dir: Path) -> dict:
    """Merge unless the marker says this adapter was already merged into this base."""
    identity = {"adapter_sha256": adapter_fingerprint(adapter_dir), "base": base_identity(cfg)}
    marker = read_marker(merged_dir)
    if marker and all(marker.get(k) == v for k, v in identity.items()):
        log.info("already merged: %s (adapter %s)", merged_dir, identity["adapter_sha256"][:12])
        return {"already_merged": True, "merged_dir": str(merged_dir), "smoke": marker.get("smoke")}
    return {"already_merged": False, **merge_adapter(cfg, adapter_dir, merged_dir, identity)}


def push_token(cfg, env) -> Optional[str]:
    """HF_TOKEN when `outputs.push_to_hub` is set (PayloadError if missing), else None."""
    if not cfg.outputs.push_to_hub:
        return None
    token = env.get("HF_TOKEN")
    if not token:
        raise PayloadError(
            f"outputs.push_to_hub is `{cfg.outputs.push_to_hub}` but HF_TOKEN is not set in the environment; "
            "launch with `--secret HF_TOKEN` (a write token), or remove outputs.push_to_hub"
        )
    return token


def adapter_fingerprint(adapter_dir: Path) -> str:
    """sha256 over the adapter's config and weights (PayloadError if there is no adapter)."""
    files = [adapter_dir / "adapter_config.json", adapter_dir / "adapter_model.safetensors"]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise PayloadError(f"no adapter to merge in {adapter_dir} (missing {', '.join(missing)}); "
                           "run `python -m payload train` first")
    h = hashlib.sha256()
    for f in files:
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 24), b""):
                h.update(block)
    return h.hexdigest()


def base_identity(cfg) -> str:
    m = cfg.model
    if m.tiny is not None:
        return f"tiny:{m.tiny.model_dump_json()}"
    return f"{m.name_or_path}@{m.revision or 'main'}"


def read_marker(merged_dir: Path) -> Optional[dict]:
    try:
        return json.loads((merged_dir / MARKER).read_text())
    except (OSError, ValueError):
        return None


# ------------------------------------------------------------------------------------- merging


def merge_adapter(cfg, adapter_dir: Path, merged_dir: Path, identity: dict) -> dict:
    """Load base + adapter, merge, save to a temporary sibling, smoke-test from disk, swap in."""
    from peft import PeftModel

    from payload.model.modeling import base_model_path

    started = time.monotonic()
    base = base_model_path(cfg)
    if cfg.train.method == "qlora":
        log.info("QLoRA adapter: merging into the bf16 base (not the 4-bit weights it was trained on)")
    merged_dir.parent.mkdir(parents=True, exist_ok=True)
    for stale in merged_dir.parent.glob(f".{merged_dir.name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)  # left by a killed run
    tmp = Path(tempfile.mkdtemp(prefix=f".{merged_dir.name}.tmp-", dir=merged_dir.parent))
    try:
        log.info("merging %s into %s", adapter_dir, base)
        revision = cfg.model.revision if cfg.model.tiny is None else None
        model = PeftModel.from_pretrained(load_model(cfg, base, revision), str(adapter_dir)).merge_and_unload()
        model.save_pretrained(str(tmp))
        del model
        _free_memory()
        save_tokenizer(cfg, base, adapter_dir, tmp)
        smoke = smoke_generate(cfg, tmp, cfg.outputs.smoke_prompt) if cfg.outputs.smoke_prompt else None
        marker = {**identity, "smoke_prompt": cfg.outputs.smoke_prompt, "smoke": smoke,
                  "merged_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        (tmp / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        if merged_dir.exists():
            shutil.rmtree(merged_dir)
        os.rename(tmp, merged_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    seconds = round(time.monotonic() - started, 1)
    log.info("merged model saved to %s in %.1f s", merged_dir, seconds)
    return {"merged_dir": str(merged_dir), "smoke": smoke, "seconds": seconds}


def load_model(cfg, path: str, revision: Optional[str] = None):
    """The model class for `model.kind`, in the configured dtype; on the GPUs when there are any."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    from payload.model.attention import listed
    from payload.model.modeling import on_gpu, resolve_dtype

    cls = AutoModelForImageTextToText if cfg.model.kind == "image_text_to_text" else AutoModelForCausalLM
    kwargs = {"dtype": resolve_dtype(cfg.model), "trust_remote_code": cfg.model.trust_remote_code,
              "revision": revision}
    if on_gpu():
        kwargs["device_map"] = "auto"
    attn = [a for a in listed(cfg) if a != "flash_attention_2"] or ["sdpa"]
    return cls.from_pretrained(path, attn_implementation=attn[0], **kwargs).eval()


def save_tokenizer(cfg, base: str, adapter_dir: Path, dest: Path) -> None:
    """Tokenizer from the adapter dir when the trainer saved one there, else the base's; plus the
    base's small side files (processor configs, chat template) the merged save did not write."""
    from transformers import AutoTokenizer

    src = str(adapter_dir) if (adapter_dir / "tokenizer_config.json").is_file() else base
    kwargs = {"trust_remote_code": cfg.model.trust_remote_code}
    if src == base and cfg.model.tiny is None and cfg.model.revision:
        kwargs["revision"] = cfg.model.revision
    AutoTokenizer.from_pretrained(src, **kwargs).save_pretrained(str(dest))
    base_dir = _local_dir(cfg, base)
    if base_dir is None:
        log.warning("could not list %s's files: processor/chat-template files not copied", base)
        return
    for f in sorted(base_dir.iterdir()):
        name = f.name
        if (f.is_file() and f.suffix in SIDE_SUFFIXES and not name.startswith(".") and name not in SIDE_SKIP
                and ".index." not in name and not (dest / name).exists()):
            shutil.copyfile(f, dest / name)


def _local_dir(cfg, base: str) -> Optional[Path]:
    if Path(base).is_dir():
        return Path(base)
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(base, revision=cfg.model.revision,
                                      allow_patterns=[f"*{s}" for s in SIDE_SUFFIXES]))
    except Exception as e:  # noqa: BLE001 - side files are a convenience, never fatal
        log.warning("side files of %s unavailable: %s", base, type(e).__name__)
        return None


def smoke_generate(cfg, model_dir: Path, prompt: str, max_new_tokens: int = SMOKE_TOKENS) -> str:
    """Greedy-generate a few tokens from the saved model; log and return the text."""
    import torch
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = load_model(cfg, str(model_dir))
    text = prompt
    if tok.chat_template:
        text = tok.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                       add_generation_prompt=True)
    enc = tok(text, return_tensors="pt").to(model.device)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                             pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
    reply = tok.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
    del model
    _free_memory()
    log.info("smoke: %r -> %r", prompt, reply)
    return reply


def _free_memory() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------- push


def push(cfg, folder: Path, token: str) -> str:
    """Upload `folder` (merged model, or adapter / full weights) to `outputs.push_to_hub`, then its
    model card (payload/outputs/card.py) as the repo's README.md.

    The repo is created private if it does not exist. huggingface_hub 2.x's `upload_folder` is its
    large-folder upload (the separate `upload_large_folder` of 0.x is gone): with hf_xet installed, as in
    the GPU lock, files are hashed while they stream, committed in batches under the Hub's limits, and
    a re-run after a cut resumes (committed files are skipped, uploaded chunks deduplicated); without
    hf_xet it is one commit, and the log says so. The folder's own README.md (PEFT writes a template
    one) gives way to the card; the folder is never written to (it is checksummed). `outputs/.pushed.json`
    records what was pushed (repo + a listing fingerprint), so a re-run does not upload the same files again.
    """
    from huggingface_hub import HfApi

    from payload.outputs import card

    repo = cfg.outputs.push_to_hub
    record, done_path = {"repo": repo, "folder": str(folder), "files": listing_fingerprint(folder)}, \
        cfg.run_dir / layout.OUTPUTS_DIR / PUSHED
    if layout.read_json(done_path) == record:
        log.info("already pushed %s to %s", folder, repo)
        return repo
    card_path = card.write(cfg, adapter=cfg.train.method != "full" and folder.name == Path(layout.ADAPTER_DIR).name)
    api = HfApi(token=token)
    message = f"launch: {cfg.name} (run {cfg.runtime.run_id})"
    log.info("pushing %s (%.1f GB) to %s: %s", folder, folder_bytes(folder) / 1e9, repo, upload_path())
    try:
        api.create_repo(repo, repo_type="model", private=True, exist_ok=True)
        api.upload_folder(repo_id=repo, folder_path=str(folder), repo_type="model",
                          ignore_patterns=[MARKER, "README.md"], commit_message=message)
        api.upload_file(path_or_fileobj=card_path, path_in_repo="README.md", repo_id=repo, repo_type="model",
                        commit_message=f"{message}: model card")
    except Exception as e:  # noqa: BLE001 - network/auth errors become one line, token redacted
        msg = (str(e).replace(token, "***").splitlines() or [""])[0]
        raise PayloadError(f"push to {repo} failed ({type(e).__name__}: {msg}); check that HF_TOKEN has "
                           f"write access to `{repo}`, then re-run `python -m payload merge` "
                           "(finished work is kept)") from None
    done_path.write_text(json.dumps(record) + "\n")
    log.info("pushed %s to https://huggingface.co/%s", folder, repo)
    return repo


def upload_path() -> str:
    """How upload_folder will send the files here (hf_xet decides it)."""
    import importlib.util

    return ("streamed in batches, resumable (hf_xet)" if importlib.util.find_spec("hf_xet") is not None
            else "one commit, not resumable (hf_xet is not installed: pip install hf_xet)")


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def listing_fingerprint(folder: Path) -> str:
    """sha256 of (path, size, mtime) of every file: cheap, and changes whenever the files do."""
    h = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MARKER):
        st = f.stat()
        h.update(f"{f.relative_to(folder)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()
