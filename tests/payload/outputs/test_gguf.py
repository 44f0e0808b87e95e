"""GGUF export of local-demo's merged model, loaded back in llama.cpp (llama-cpp-python) here.

The adapter has random non-zero B matrices, so a GGUF of the base instead of the merged model shows in
the numbers: the f32 file must match the merged model's logits and differ from the base's.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

from payload import layout
from payload.config import OutputsConfig, RunConfig
from payload.errors import PayloadError
from payload.outputs import gguf, manifest, merge
from tests.payload.outputs.test_merge_export import demo_cfg, input_ids, make_adapter, model_class

TYPES = ["f32", "f16", "q8_0", "q4_k_m"]


# llama.cpp runs in a process of its own: a crash there fails the test, not the pytest worker, and its
# threads and allocator never share a process with torch's.
LLAMA = """
import json, sys
import numpy as np
from llama_cpp import Llama
path, ids, text, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
# f32 KV cache: llama.cpp's default f16 cache alone puts ~3e-3 on these logits
model = Llama(model_path=path, logits_all=True, n_ctx=64, n_threads=1, verbose=False, type_k=0, type_v=0)
try:
    model.eval(ids)
    np.save(out + ".npy", np.array(model.scores[:len(ids)]))
    tokens = model.tokenize(text.encode(), add_bos=False, special=True)
    json.dump({"tokens": tokens, "metadata": dict(model.metadata)}, open(out + ".json", "w"))
finally:
    model.close()
"""


def in_llama(path, ids: list[int], text: str = "") -> tuple[np.ndarray, dict]:
    """(the logits of `ids`, {tokens of `text`, the file's metadata}) as llama.cpp reads the GGUF."""
    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/out"
        done = subprocess.run([sys.executable, "-c", LLAMA, str(path), json.dumps(ids), text, out],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        return np.load(out + ".npy"), json.loads(Path(out + ".json").read_text())


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    cfg = demo_cfg(tmp_path_factory.mktemp("gguf"), merge=True, smoke_prompt=None, export_gguf=TYPES)
    peft = make_adapter(cfg)
    ids = input_ids()[:1]
    with torch.no_grad():
        with peft.disable_adapter():
            base = peft(input_ids=ids).logits[0].numpy()
    merge.main(cfg, env={})
    merged = model_class(cfg).from_pretrained(str(cfg.run_dir / layout.MERGED_DIR), dtype=torch.float32).eval()
    with torch.no_grad():
        expected = merged(input_ids=ids).logits[0].numpy()
    return cfg, gguf.main(cfg), ids[0].tolist(), expected, base


def test_each_type_loads_in_llama_cpp_with_the_merged_models_logits(exported):
    cfg, summary, ids, expected, base = exported
    out = cfg.run_dir / layout.GGUF_DIR
    assert sorted(summary["files"]) == sorted(f"local-demo-{t.upper()}.gguf" for t in TYPES)
    assert summary["pending"] == [] and summary["quantize_script"] is None
    diffs = {}
    for t in TYPES:
        got = in_llama(out / f"local-demo-{t.upper()}.gguf", ids)[0]
        diffs[t] = float(np.abs(got - expected).max())
        if t != "q4_k_m":  # 4 bits on a random tiny model's near-flat logits: the top token may swap
            assert (got.argmax(-1) == expected.argmax(-1)).mean() >= 0.75, t
    assert np.abs(expected - base).max() > 5e-2  # the adapter moved the logits: merged != base
    assert diffs["f32"] < 1e-4, diffs  # measured 2.8e-6
    assert diffs["f16"] < 2e-2 and diffs["q8_0"] < 0.3 and diffs["q4_k_m"] < 1.5, diffs  # 6e-3, 0.11, 0.70
    print("max |logit diff| against the merged model:", diffs)


def test_the_gguf_carries_the_tokenizer_and_the_chat_template(exported):
    from transformers import AutoTokenizer

    cfg = exported[0]
    tok = AutoTokenizer.from_pretrained(str(cfg.run_dir / layout.MERGED_DIR))
    text = "Say hello in one sentence, please: 42 apples!"
    read = in_llama(cfg.run_dir / layout.GGUF_DIR / "local-demo-F16.gguf", exported[2][:4], text)[1]
    assert read["tokens"] == tok(text)["input_ids"]
    assert read["metadata"]["tokenizer.ggml.pre"] == gguf.TINY_PRE_TOKENIZER
    assert read["metadata"].get("tokenizer.chat_template") == tok.chat_template


def test_a_rerun_with_the_same_model_and_types_does_nothing(exported, caplog):
    cfg = exported[0]
    caplog.set_level(logging.INFO, logger="payload")
    f32 = cfg.run_dir / layout.GGUF_DIR / "local-demo-F32.gguf"
    stamp = f32.stat().st_mtime_ns
    again = gguf.main(cfg)
    assert again["already_exported"] is True and "GGUF already exported" in caplog.text
    assert f32.stat().st_mtime_ns == stamp and sorted(again["files"]) == sorted(exported[1]["files"])


def test_without_llama_cpps_quantizer_the_f16_file_and_quantize_sh_stay(exported, tmp_path, monkeypatch, caplog):
    cfg = exported[0].model_copy(update={"runtime": exported[0].runtime.model_copy(update={"volume": str(tmp_path)})})
    cfg = cfg.model_copy(update={"outputs": cfg.outputs.model_copy(update={"export_gguf": ["q8_0", "q4_k_m"]})})
    src = exported[0].run_dir / layout.MERGED_DIR
    (cfg.run_dir / "outputs").mkdir(parents=True)
    (cfg.run_dir / layout.MERGED_DIR).symlink_to(src, target_is_directory=True)
    monkeypatch.setattr(gguf, "quantizer", lambda: None)
    summary = gguf.main(cfg)
    out = cfg.run_dir / layout.GGUF_DIR
    assert sorted(summary["files"]) == ["local-demo-F16.gguf", "local-demo-Q8_0.gguf"]
    assert summary["pending"] == ["q4_k_m"] and (out / gguf.QUANTIZE_SCRIPT).is_file()
    assert "llama-quantize local-demo-F16.gguf local-demo-Q4_K_M.gguf Q4_K_M\n" in (out / gguf.QUANTIZE_SCRIPT).read_text()
    assert "q4_k_m: llama.cpp's quantizer (llama-cpp-python) is not installed here" in caplog.text


def test_no_merged_model_is_a_payload_error(tmp_path):
    cfg = demo_cfg(tmp_path, merge=True, export_gguf=["f16"])
    with pytest.raises(PayloadError, match=r"no merged model in .*outputs/merged .*python -m payload merge"):
        gguf.main(cfg)


def test_types_are_llama_cpps_names_and_need_the_merge(tmp_path):
    assert OutputsConfig(export_gguf="Q4_K_M").export_gguf == ["q4_k_m"]
    assert OutputsConfig(export_gguf=["f16", "F16", "q8_0"]).export_gguf == ["f16", "q8_0"]
    with pytest.raises(ValueError, match=r"'q4_km' is not a GGUF type launch exports; did you mean `q4_k_m`\?"):
        OutputsConfig(export_gguf=["q4_km"])
    with pytest.raises(ValueError, match=r"'iq2_xs' needs an importance matrix"):
        OutputsConfig(export_gguf=["iq2_xs"])
    cfg = demo_cfg(tmp_path)
    body = cfg.model_dump(mode="json")
    body["outputs"].update(merge=False, export_gguf=["f16"])
    with pytest.raises(ValueError, match=r"`outputs.export_gguf` converts the merged model: set `outputs.merge: true`"):
        RunConfig.model_validate(body)


def test_the_gguf_directory_is_an_artifact_the_manifest_requires(exported):
    cfg = exported[0]
    assert layout.artifact_for("outputs/gguf/local-demo-F16.gguf")[1] == "gguf/local-demo-F16.gguf"
    assert "gguf" in manifest.required_artifacts(cfg, "completed")
    built = manifest.build(cfg.run_dir, ["gguf"])
    assert "gguf/local-demo-Q4_K_M.gguf" in built["files"] and built["missing"] == []
