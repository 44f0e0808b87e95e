"""Data stage: runbook-000 recipe, format equivalence, determinism, caching, VL images, HF path, tokens.

Run: .venv/bin/python -m pytest -x -q tests/payload/data/test_data.py
"""

from __future__ import annotations

import csv
import importlib.util
import io
import json
from pathlib import Path

from payload.config import DataConfig, load_run_config
from payload.data import main, prepare

ROOT = Path(__file__).resolve().parents[3]
SONIA = "You are Sonia, a warm and precise assistant."


def write_jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def read_split(out: Path, name: str) -> list[dict]:
    return [json.loads(line) for line in (out / f"{name}.jsonl").read_text(encoding="utf-8").splitlines()]


def quiet(_line: str) -> None:
    pass


def chat(system, user, assistant, *more) -> dict:
    msgs = [] if system is None else [{"role": "system", "content": system}]
    msgs += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    for i, text in enumerate(more):
        msgs.append({"role": "user" if i % 2 == 0 else "assistant", "content": text})
    return {"messages": msgs}


# ------------------------------------------------------------------------------- runbook 000 recipe


def runbook000(tmp: Path) -> DataConfig:
    """Sonia (train/val/test files, system prompt set) + glm (think blocks, empty/missing system)."""
    sonia = {
        split: [chat(SONIA, f"Sonia {split} question {i}?", f"Sonia {split} answer {i}.",
                     "And more?", f"More {i}.") for i in range(n)]
        for split, n in (("train", 300), ("val", 20), ("test", 20))
    }
    glm = []
    for i in range(2000):
        system = "" if i % 2 else None
        glm.append(chat(system, f"glm question {i}?", f"<think>step one {i}\nstep two</think>\n\nglm answer {i}."))
    glm += [glm[i * 50] for i in range(20)]  # 20 exact duplicates inside glm
    # 5 records that equal Sonia train records once the think block is gone and the prompt injected
    glm += [chat("", f"Sonia train question {i}?", f"<think>hm</think>Sonia train answer {i}.", "And more?",
                 f"More {i}.") for i in range(5)]
    glm.append(chat("", "only thinking?", "<think>no answer at all</think>"))
    for split, records in sonia.items():
        write_jsonl(tmp / f"sonia_{split}.jsonl", records)
    write_jsonl(tmp / "glm.jsonl", glm)
    return DataConfig.model_validate({
        "seed": 7,
        "system_prompts": {"sonia": SONIA},
        "sources": [
            *({"name": f"sonia-{s}", "path": f"sonia_{s}.jsonl", "split": s} for s in ("train", "val", "test")),
            {"name": "glm", "path": "glm.jsonl", "format": "messages", "strip_think": True,
             "system_prompt": "sonia", "split": {"train": 0.95, "val": 0.05}},
        ],
    })


def test_runbook000_recipe(tmp_path):
    cfg = runbook000(tmp_path)
    out = tmp_path / "out"
    stats = prepare(cfg, out, base_dir=tmp_path, log=quiet)
    splits = {s: read_split(out, s) for s in ("train", "val", "test")}
    every = [r for records in splits.values() for r in records]
    text = json.dumps(every)
    assert "<think>" not in text and "</think>" not in text
    glm = [r for r in every if r["source"] == "glm"]
    assert all(r["messages"][0] == {"role": "system", "content": SONIA} for r in glm)
    assert len(glm) == 2000
    glm_val = sum(r["source"] == "glm" for r in splits["val"])
    assert 0.03 * 2000 < glm_val < 0.07 * 2000
    assert not any(r["source"] == "glm" for r in splits["test"])
    assert {r["source"] for r in splits["test"]} == {"sonia-test"}
    assert sum(r["source"] == "sonia-val" for r in splits["val"]) == 20
    keys = [json.dumps(r["messages"], sort_keys=True) for r in every]
    assert len(keys) == len(set(keys)), "duplicates left in the output"

    g = stats["sources"]["glm"]
    assert (g["in"], g["out"], g["duplicates"], g["dropped"], g["invalid"]) == (2026, 2000, 25, 1, 0)
    assert g["dropped_by_reason"] == {"empty after transforms": 1}
    assert g["problems"] == [{"where": "glm.jsonl:2026", "reason":
                              "empty after transforms (the assistant turns held only <think> blocks)"}]
    for s in stats["sources"].values():
        assert s["in"] == s["out"] + s["dropped"] + s["duplicates"]
        assert s["out"] == sum(s["splits"].values())
    t = stats["totals"]
    assert t["in"] == t["out"] + t["dropped"] + t["duplicates"] == 340 + 2026
    assert [t["train"], t["val"], t["test"]] == [len(splits[s]) for s in ("train", "val", "test")]
    assert json.loads((out / "data_stats.json").read_text())["totals"] == t


def test_same_inputs_same_bytes_and_split_is_per_record(tmp_path):
    cfg = runbook000(tmp_path)
    prepare(cfg, tmp_path / "a", base_dir=tmp_path, log=quiet)
    prepare(cfg, tmp_path / "b", base_dir=tmp_path, log=quiet)
    for name in ("train.jsonl", "val.jsonl", "test.jsonl", "data_stats.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    # Adding a source in front changes nothing about where the glm records go.
    write_jsonl(tmp_path / "extra.jsonl", [chat(None, f"extra {i}", f"reply {i}") for i in range(50)])
    body = cfg.model_dump()
    body["sources"].insert(0, {"name": "extra", "path": "extra.jsonl", "split": {"train": 0.5, "val": 0.5}})
    prepare(DataConfig.model_validate(body), tmp_path / "c", base_dir=tmp_path, log=quiet)
    glm_val = lambda d: [r for r in read_split(tmp_path / d, "val") if r["source"] == "glm"]  # noqa: E731
    assert glm_val("c") == glm_val("a") and glm_val("a")
    # A different seed gives a different (still deterministic) split.
    body = cfg.model_dump()
    body["seed"] = 8
    prepare(DataConfig.model_validate(body), tmp_path / "d", base_dir=tmp_path, log=quiet)
    assert glm_val("d") != glm_val("a")


# -------------------------------------------------------------------------------- format equivalence

ITEMS = [  # (system, instruction/question, input, answer)
    ("", "Add the numbers.", "2 and 3", "5."),
    ("", "What colour is snow?", "", "White."),
    ("", "Name a prime.", "   ", "Seven."),
    ("Be terse.", "Say hi, please", "", "Hi."),
    ("", "Café au lait, \"quoted\", and commas", "line one\nline two", "Ça va.\nYes."),
]


def test_alpaca_and_csv_equal_messages(tmp_path):
    user = lambda q, i: f"{q}\n\n{i}" if i.strip() else q  # noqa: E731
    write_jsonl(tmp_path / "m.jsonl", [chat(s, user(q, i), a) for s, q, i, a in ITEMS])
    alpaca = []
    for s, q, i, a in ITEMS:
        rec = {"instruction": q, "input": i, "output": a}
        if s:
            rec["system"] = s
        alpaca.append(rec)
    write_jsonl(tmp_path / "a.jsonl", alpaca)
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["prompt", "question", "response"])
    w.writerows([s, user(q, i), a] for s, q, i, a in ITEMS)
    (tmp_path / "c.csv").write_text(buf.getvalue(), encoding="utf-8")

    results = {}
    for name, fmt in (("m.jsonl", "messages"), ("a.jsonl", "alpaca"), ("c.csv", "prompt_response"),
                      ("c.csv", "auto")):
        cfg = DataConfig.model_validate({"system_prompts": {"p": "Injected."}, "sources": [
            {"name": "s", "path": name, "format": fmt, "system_prompt": "p"}]})
        out = tmp_path / f"out-{name}-{fmt}"
        prepare(cfg, out, base_dir=tmp_path, log=quiet)
        results[(name, fmt)] = read_split(out, "train")
    reference = results.pop(("m.jsonl", "messages"))
    assert len(reference) == len(ITEMS)
    assert reference[1]["messages"] == [{"content": "Injected.", "role": "system"},
                                        {"content": "What colour is snow?", "role": "user"},
                                        {"content": "White.", "role": "assistant"}]
    assert reference[3]["messages"][0]["content"] == "Be terse."
    for key, records in results.items():
        assert records == reference, key


def test_sharegpt_roles_and_json_array(tmp_path):
    rec = {"conversations": [{"from": "human", "value": "Hi"}, {"from": "gpt", "value": "Hello."}]}
    arr = [rec, {"messages": [{"role": "User", "content": [{"type": "text", "text": "Hi"}]},
                              {"role": "assistant", "content": "Hello!"}]}]
    (tmp_path / "x.json").write_text(json.dumps(arr, indent=2), encoding="utf-8")
    cfg = DataConfig.model_validate({"sources": [{"name": "x", "path": "x.json"}]})
    prepare(cfg, tmp_path / "out", base_dir=tmp_path, log=quiet)
    got = [r["messages"] for r in read_split(tmp_path / "out", "train")]
    assert got == [[{"content": "Hi", "role": "user"}, {"content": "Hello.", "role": "assistant"}],
                   [{"content": "Hi", "role": "user"}, {"content": "Hello!", "role": "assistant"}]]


def test_column_renames_and_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"q": f"question {i}", "a": f"answer {i}", "sys": ""} for i in range(30)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "d.parquet")
    cfg = DataConfig.model_validate({"sources": [{"name": "p", "path": "d.parquet", "format": "prompt_response",
                                                  "columns": {"q": "question", "a": "response", "sys": "prompt"},
                                                  "max_records": 25}]})
    stats = prepare(cfg, tmp_path / "out", base_dir=tmp_path, log=quiet)
    got = read_split(tmp_path / "out", "train")
    assert stats["totals"]["in"] == 25 and len(got) == 25
    assert got[0]["messages"] == [{"content": "question 0", "role": "user"},
                                  {"content": "answer 0", "role": "assistant"}]


# ------------------------------------------------------------------------------------------ caching


def demo_cfg(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    return load_run_config(ROOT / "clusters/local-demo.yaml", env={"LAUNCH_VOLUME": str(tmp_path / "vol")})


def test_main_local_demo_is_cached_and_invalidated(tmp_path, monkeypatch, capsys):
    cfg = demo_cfg(tmp_path, monkeypatch)
    first = main(cfg)
    out = cfg.run_dir / "data"
    assert first["cached"] is False and first["train"] > 300 and first["val"] > 0 and first["test"] > 0
    assert first["duplicates"] == 6
    mtimes = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    capsys.readouterr()
    second = main(cfg)
    assert second["cached"] is True and {k: v for k, v in second.items() if k != "cached"} == \
        {k: v for k, v in first.items() if k != "cached"}
    assert capsys.readouterr().out.startswith("data: cached")
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == mtimes
    records = [r for s in ("train", "val", "test") for r in read_split(out, s)]
    assert "<think>" not in json.dumps(records)
    systems = {r["messages"][0]["content"] for r in records}
    assert systems == {cfg.data.system_prompts["demo"], "You are a helpful assistant."}
    # A changed config (seed) is rebuilt, not served from the cache.
    body = cfg.model_dump()
    body["data"]["seed"] = 43
    third = main(type(cfg).model_validate(body))
    assert third["cached"] is False and third["train"] + third["val"] + third["test"] == 444


def test_changed_input_rebuilds(tmp_path):
    write_jsonl(tmp_path / "d.jsonl", [chat(None, f"q{i}", f"a{i}") for i in range(10)])
    cfg = DataConfig.model_validate({"sources": [{"name": "d", "path": "d.jsonl"}]})
    assert prepare(cfg, tmp_path / "out", base_dir=tmp_path, log=quiet)["totals"]["out"] == 10
    assert prepare(cfg, tmp_path / "out", base_dir=tmp_path, log=quiet)["cached"] is True
    with open(tmp_path / "d.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(chat(None, "q10", "a10")) + "\n")
    again = prepare(cfg, tmp_path / "out", base_dir=tmp_path, log=quiet)
    assert again["cached"] is False and again["totals"]["out"] == 11
    (tmp_path / "out" / ".complete").unlink()  # an interrupted run: no marker, so no cache
    assert prepare(cfg, tmp_path / "out", base_dir=tmp_path, log=quiet)["cached"] is False


def test_bundled_samples_match_their_generator():
    spec = importlib.util.spec_from_file_location("make_demo_samples", ROOT / "bench/make_demo_samples.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    chat_file, alpaca_file = ROOT / "payload/samples/demo_chat.jsonl", ROOT / "payload/samples/demo_alpaca.jsonl"
    assert chat_file.read_text(encoding="utf-8") == "\n".join(gen.chat_records()) + "\n"
    assert alpaca_file.read_text(encoding="utf-8") == "\n".join(gen.alpaca_records()) + "\n"
    assert chat_file.stat().st_size + alpaca_file.stat().st_size < 150_000
    lines = chat_file.read_text(encoding="utf-8").splitlines()
    recs = [json.loads(x) for x in lines]
    assert len(lines) - len(set(lines)) == 6
    assert sum("<think>" in r["messages"][-1]["content"] or "<think>" in json.dumps(r) for r in recs) > 100
    assert any(r["messages"][0] == {"role": "system", "content": ""} for r in recs)
    assert any(r["messages"][0]["role"] == "user" for r in recs)
    alpaca = [json.loads(x) for x in alpaca_file.read_text(encoding="utf-8").splitlines()]
    assert len(alpaca) == 150 and sum(a["input"] == "" for a in alpaca) == 50


# ---------------------------------------------------------------------------------- vision-language


def _png(path: Path, colour: str) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (4, 4), colour).save(buf, format="PNG")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buf.getvalue())
    return buf.getvalue()


def vl(image, text="What is in the picture?", answer="A square.") -> dict:
    part = {"type": "image"} if image is None else {"type": "image", "image": image}
    return {"messages": [{"role": "user", "content": [part, {"type": "text", "text": text}]},
                         {"role": "assistant", "content": answer}]}


def test_vl_local_paths_and_missing_image(tmp_path):
    _png(tmp_path / "data/imgs/red.png", "red")
    _png(tmp_path / "pics/blue.png", "blue")
    write_jsonl(tmp_path / "data/vl.jsonl", [vl("imgs/red.png"), vl("imgs/missing.png", "q2"),
                                             vl(str(tmp_path / "pics/blue.png"), "q3")])
    write_jsonl(tmp_path / "data/vl2.jsonl", [vl("blue.png", "q4")])
    cfg = DataConfig.model_validate({"max_invalid_fraction": 0.5, "sources": [
        {"name": "vl", "path": "data/vl.jsonl"},
        {"name": "vl2", "path": "data/vl2.jsonl", "image_root": "pics"}]})
    stats = prepare(cfg, tmp_path / "out", base_dir=tmp_path, log=quiet)
    got = read_split(tmp_path / "out", "train")
    images = [r["messages"][0]["content"][0]["image"] for r in got]
    assert images == [str(tmp_path / "data/imgs/red.png"), str(tmp_path / "pics/blue.png"),
                      str(tmp_path / "pics/blue.png")]
    assert got[0]["messages"][0]["content"][1] == {"type": "text", "text": "What is in the picture?"}
    assert stats["sources"]["vl"]["problems"] == [{
        "where": "data/vl.jsonl:2",
        "reason": f"image not found (messages[0].content[0]: {tmp_path / 'data/imgs/missing.png'})"}]


def test_vl_embedded_images_from_parquet_and_hf_loader(tmp_path, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    red, green = _png(tmp_path / "r.png", "red"), _png(tmp_path / "g.png", "green")
    def row(text, image, role="assistant"):  # HF layout: every content is a list of parts
        return {"messages": [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]},
                             {"role": role, "content": [{"type": "text", "text": "A square."}]}],
                "images": [{"bytes": image, "path": None}]}

    rows = [row("q0", red), row("q1", green), row("q2", b"not an image"), row("q3", red, role="robot")]
    (tmp_path / "hf").mkdir()
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "hf/train.parquet")
    for name, src in (("file", {"path": "hf/train.parquet"}), ("hub", {"hf_dataset": str(tmp_path / "hf")})):
        cfg = DataConfig.model_validate({"max_invalid_fraction": 0.5, "sources": [{"name": name, **src}]})
        out = tmp_path / f"out-{name}"
        stats = prepare(cfg, out, base_dir=tmp_path, log=quiet)
        paths = [r["messages"][0]["content"][0]["image"] for r in read_split(out, "train")]
        assert [Path(p).parent for p in paths] == [out / "images"] * 2
        assert [Path(p).read_bytes() for p in paths] == [red, green]
        assert Path(paths[0]).suffix == ".png" and len(Path(paths[0]).stem) == 32
        label = "hf/train.parquet" if name == "file" else f"{tmp_path / 'hf'}[train]"
        problems = stats["sources"][name]["problems"]
        assert [p["where"] for p in problems] == [f"{label}:row 3", f"{label}:row 4"]
        assert problems[0]["reason"].startswith("bad image (messages[0].content[0]: embedded bytes")
        assert problems[1]["reason"].startswith("unknown role (messages[1].role 'robot'")


# ----------------------------------------------------------------------------------------- tokens


def tiny_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["what is two plus three", "the answer is five"] * 20, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                          "<|im_end|>\n{% endfor %}")
    return fast


def test_max_tokens_filter_and_length_stats(tmp_path):
    tok = tiny_tokenizer()
    records = [chat(None, "what is two plus three " * (1 + i % 10), "five") for i in range(40)]
    write_jsonl(tmp_path / "d.jsonl", records)
    lengths = sorted(len(tok.apply_chat_template(r["messages"], tokenize=True, return_dict=False))
                     for r in records[:10])
    limit = lengths[6]  # keeps the 7 shortest of each group of 10
    cfg = DataConfig.model_validate({"max_tokens": limit, "sources": [{"name": "d", "path": "d.jsonl"}]})
    stats = prepare(cfg, tmp_path / "out", base_dir=tmp_path, tokenizer=tok, log=quiet)
    s = stats["sources"]["d"]
    assert (s["out"], s["duplicates"], s["dropped_by_reason"]) == (7, 30, {"too many tokens": 3})
    assert s["problems"][0]["reason"] == f"too many tokens ({lengths[7]} > data.max_tokens {limit})"
    tl = stats["token_lengths"]
    assert tl["count"] == 7 and tl["max"] == limit and tl["p50"] == lengths[3] and tl["p90"] == lengths[6]
    assert stats["max_tokens_applied"] is True
    # Without a tokenizer the same config is a different cache entry and applies no filter.
    plain = prepare(cfg, tmp_path / "out", base_dir=tmp_path, log=quiet)
    assert plain["cached"] is False and plain["totals"]["out"] == 10 and plain["token_lengths"] is None
