"""Data stage on bad input: one clear line per problem (file:line: what), counted, never a traceback.
CSV quoting and line endings, images checked where they are read, max_tokens and the cache key too.

Run: .venv/bin/python -m pytest -x -q tests/payload/data/test_data_bad_input.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from payload.config import DataConfig
from payload.data import prepare
from payload.errors import PayloadError

ROOT = Path(__file__).resolve().parents[3]


def good(i: int) -> bytes:
    rec = {"messages": [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": f"answer {i}"}]}
    return json.dumps(rec).encode() + b"\n"


# line number -> (raw line, expected reason prefix): every record-level bad-input kind
BAD_LINES = {
    2: (b'{"messages": [{"role": "user", "content": "cut off', "invalid JSON (Unterminated string"),
    3: (b"{messages: nope}", "invalid JSON (Expecting property name enclosed in double quotes at column 2)"),
    4: (b'{"messages": [{"role": "user", "content": 42}, {"role": "assistant", "content": "x"}]}',
        "wrong type (messages[0].content is a number, expected a string or a list of parts)"),
    5: (b'{"messages": "hello"}', "wrong type ('messages' is a string that is not a JSON list)"),
    6: (b'{"prompt_text": "hi", "answer": "x"}', "missing key (expected 'messages', 'instruction'/'output'"),
    7: (b'{"messages": [{"role": "narrator", "content": "x"}, {"role": "assistant", "content": "y"}]}',
        "unknown role (messages[0].role 'narrator'; expected system, user or assistant"),
    8: (b'{"messages": [{"role": "user", "content": "hi"}]}',
        "no assistant turn (a training record needs a non-empty assistant reply)"),
    9: (b'{"messages": [{"role": "user", "content": "caf\xe9"}, {"role": "assistant", "content": "x"}]}',
        "not UTF-8 (byte 0xe9 at column 47)"),
    10: (b'[1, 2, 3]', "wrong type (record is a list, expected an object)"),
    11: (b'{"messages": [{"role": "user", "content": "\\ud800"}, {"role": "assistant", "content": "x"}]}',
         "invalid unicode (lone surrogate"),
    12: (b'{"instruction": "add", "output": 3}', "wrong type ('output' is a number, expected a string)"),
    13: (b'{"messages": [{"role": "user"}, {"role": "assistant", "content": "x"}]}',
         "missing key (messages[0] has no 'content')"),
    14: (b'{"messages": [{"role": ["user"], "content": "a"}, {"role": "assistant", "content": "x"}]}',
         "wrong type (messages[0].role is a list, expected a string)"),
}


def bad_corpus(path: Path, n_good: int = 40) -> Path:
    """Line 1 good, lines 2..14 bad (one of each kind), then good lines; a blank line is not a record."""
    lines = [good(0)] + [BAD_LINES[n][0] + b"\n" for n in sorted(BAD_LINES)] + [b"\n"]
    lines += [good(i) for i in range(1, n_good)]
    path.write_bytes(b"".join(lines))
    return path


def cfg_for(path: str, **data) -> DataConfig:
    return DataConfig.model_validate({"sources": [{"name": "bad", "path": path}], **data})


def run(tmp_path, cfg, lines=None):
    return prepare(cfg, tmp_path / "out", base_dir=tmp_path, log=(lines.append if lines is not None else print))


def test_each_bad_kind_is_one_line_with_file_and_line(tmp_path):
    bad_corpus(tmp_path / "bad.jsonl")
    lines: list[str] = []
    stats = run(tmp_path, cfg_for("bad.jsonl", max_invalid_fraction=0.5), lines)
    s = stats["sources"]["bad"]
    assert (s["in"], s["out"], s["invalid"], s["dropped"], s["duplicates"]) == (53, 40, 13, 13, 0)
    got = {p["where"]: p["reason"] for p in s["problems"]}
    assert list(got) == [f"bad.jsonl:{n}" for n in sorted(BAD_LINES)]
    for n, (_raw, reason) in BAD_LINES.items():
        assert got[f"bad.jsonl:{n}"].startswith(reason), (n, got[f"bad.jsonl:{n}"])
    problem_lines = [x for x in lines if x.startswith("data: bad: bad.jsonl:")]
    assert len(problem_lines) == 13 and all("\n" not in x for x in problem_lines)
    assert sum(s["dropped_by_reason"].values()) == 13


def test_threshold_both_sides(tmp_path):
    bad_corpus(tmp_path / "many.jsonl", n_good=2000)  # 13 / 2013 = 0.65% invalid
    stats = run(tmp_path, cfg_for("many.jsonl"), [])
    assert stats["sources"]["bad"]["invalid"] == 13 and stats["totals"]["out"] == 2000
    bad_corpus(tmp_path / "few.jsonl", n_good=200)  # 13 / 213 = 6.1% invalid
    with pytest.raises(PayloadError) as e:
        run(tmp_path, cfg_for("few.jsonl"), [])
    msg = str(e.value)
    assert "\n" not in msg
    assert msg == (
        "bad: 13 of 213 records invalid (6.1% > max_invalid_fraction 1%); first: few.jsonl:2: invalid JSON "
        "(Unterminated string starting at column 43; the line looks truncated); fix the file or raise "
        "data.max_invalid_fraction"
    )
    out = tmp_path / "out"
    assert not (out / "train.jsonl").exists() and not (out / ".complete").exists()
    failed = json.loads((out / "data_stats.json").read_text())
    assert failed["status"] == "failed" and failed["sources"]["bad"]["invalid"] == 13


def test_strict_fails_on_first(tmp_path):
    bad_corpus(tmp_path / "bad.jsonl")
    with pytest.raises(PayloadError) as e:
        run(tmp_path, cfg_for("bad.jsonl", strict=True, max_invalid_fraction=1.0), [])
    assert str(e.value).startswith("bad: bad.jsonl:2: invalid JSON (Unterminated string")
    assert str(e.value).endswith("(data.strict is on: fix the record, or set data.strict: false to skip and "
                                 "count invalid records)")


def test_50mb_line_is_reported_without_holding_it(tmp_path):
    path = tmp_path / "big.jsonl"
    head, tail = b'{"messages": [{"role": "user", "content": "', b'"}]}\n'
    with open(path, "wb") as f:
        f.write(good(1))
        f.write(head + b"x" * (50 * 2**20) + tail)
        f.write(good(2))
    cfg = cfg_for("big.jsonl", max_invalid_fraction=0.5, max_record_bytes=4 * 2**20)
    tracemalloc.start()
    try:
        stats = run(tmp_path, cfg, [])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    s = stats["sources"]["bad"]
    assert (s["in"], s["out"], s["invalid"]) == (3, 2, 1)
    size = 50 * 2**20 + len(head) + len(tail)
    assert s["problems"] == [{"where": "big.jsonl:2",
                              "reason": f"line too long ({size} bytes > data.max_record_bytes {4 * 2**20})"}]
    assert peak < 12 * 2**20, f"peak {peak / 2**20:.1f} MB: the long line was held in memory"


def test_default_cap_skips_a_50mb_line(tmp_path):
    path = tmp_path / "big.jsonl"
    with open(path, "wb") as f:
        f.write(good(1) + b"[" + b"0," * (25 * 2**20) + b"0]\n" + good(2))
    stats = run(tmp_path, cfg_for("big.jsonl", max_invalid_fraction=0.5), [])
    assert stats["sources"]["bad"]["problems"][0]["reason"].startswith("line too long (52428804 bytes > "
                                                                       "data.max_record_bytes 16777216)")


@pytest.mark.parametrize("name,content,expected", [
    ("empty.jsonl", b"", "bad: empty.jsonl is empty (0 bytes); point data.sources[0].path at the real file "
                         "or remove the source"),
    ("blank.jsonl", b"\n \n\n", "bad: blank.jsonl holds no records (only blank lines or no rows); point the "
                                "source at the real data or remove it"),
    ("data.txt", b"hello\n", "bad: data.txt: unknown file type '.txt'; use one of .jsonl, .ndjson, .json, .csv, "
                             ".parquet (or convert the file)"),
    ("cols.csv", b"prompt,query,answer\na,b,c\n",
     "bad: cols.csv: CSV header has [prompt, query, answer], none of the column sets [messages], [conversations], "
     "[instruction, output], [question, response]; rename the columns in the file, map them with "
     "data.sources[0].columns, or set data.sources[0].format"),
    ("broken.parquet", b"PAR1 not really", "bad: broken.parquet is not a readable Parquet file"),
    ("arr.json", b'[\n {"messages": []},\n {"messages": [oops]}\n]\n',
     "bad: arr.json:3: invalid JSON (Expecting value); a JSON array cannot be read past this point"),
    ("short.json", b'[\n {"instruction": "a", "output": "b"},\n', "bad: short.json:3: file ends before the "
                                                                  "closing ']'"),
])
def test_file_level_problems(tmp_path, name, content, expected):
    (tmp_path / name).write_bytes(content)
    with pytest.raises(PayloadError) as e:
        run(tmp_path, cfg_for(name), [])
    assert str(e.value).startswith(expected), str(e.value)
    assert "\n" not in str(e.value)


def test_csv_missing_columns_for_explicit_format(tmp_path):
    (tmp_path / "d.csv").write_text("prompt,question,answer\nsys,q,a\n", encoding="utf-8")
    cfg = DataConfig.model_validate({"sources": [{"name": "qa", "path": "d.csv", "format": "prompt_response"}]})
    with pytest.raises(PayloadError) as e:
        run(tmp_path, cfg, [])
    assert str(e.value) == ("qa: d.csv: CSV header has [prompt, question, answer], missing [response] for format "
                            "prompt_response; rename the columns in the file or map them with "
                            "data.sources[0].columns (e.g. {your_column: response})")
    fixed = DataConfig.model_validate({"sources": [{"name": "qa", "path": "d.csv", "format": "prompt_response",
                                                    "columns": {"answer": "response"}}]})
    assert run(tmp_path, fixed, [])["totals"]["out"] == 1


def test_missing_file(tmp_path):
    with pytest.raises(PayloadError) as e:
        run(tmp_path, cfg_for("nope/data.jsonl"), [])
    assert str(e.value) == (f"bad: data file nope/data.jsonl not found (looked for {tmp_path}/nope/data.jsonl); "
                            "fix data.sources[0].path or put the file there")


def test_unwritable_output_is_one_line(tmp_path):
    (tmp_path / "d.jsonl").write_bytes(good(1))
    (tmp_path / "occupied").write_text("a file where the data directory should be")
    with pytest.raises(PayloadError) as e:
        prepare(cfg_for("d.jsonl"), tmp_path / "occupied", base_dir=tmp_path, log=[].append)
    assert str(e.value) == (f"data: {tmp_path / 'occupied'}: File exists; check the file permissions and the "
                            f"free space on the volume holding {tmp_path / 'occupied'}")


@pytest.mark.slow  # 3 s: the datasets library's loader
def test_missing_hf_dataset_is_one_line(tmp_path, caplog):
    cfg = DataConfig.model_validate({"sources": [{"name": "hub", "hf_dataset": str(tmp_path / "absent")}]})
    with pytest.raises(PayloadError) as e:
        run(tmp_path, cfg, [])
    assert "not retried" in caplog.text and "try 1 of 3" not in caplog.text  # an answer: no backoff to wait out
    assert str(e.value).startswith(f"hub: cannot load Hugging Face dataset '{tmp_path / 'absent'}' (config None, "
                                   "split train): FileNotFoundError")
    assert str(e.value).endswith("check data.sources[0].hf_dataset/hf_config/hf_split, HF_TOKEN for private "
                                 "datasets, and network access")


def test_csv_row_problems_have_physical_line_numbers(tmp_path):
    rows = (b'prompt,question,response\n'
            b'sys,"two\nline question",ok\n'          # lines 2-3: a quoted newline
            b'sys,only two\n'                          # line 4: wrong number of fields
            b'sys,caf\xe9,x\n'                         # line 5: not UTF-8
            b',q,\n'                                   # line 6: empty response -> no assistant turn
            b'"",fine,"yes"\n')                        # line 7: good
    (tmp_path / "d.csv").write_bytes(rows)
    stats = run(tmp_path, cfg_for("d.csv", max_invalid_fraction=1.0), [])
    s = stats["sources"]["bad"]
    assert (s["in"], s["out"], s["invalid"]) == (5, 2, 3)
    assert [(p["where"], p["reason"].split(" (")[0]) for p in s["problems"]] == [
        ("d.csv:4", "wrong number of fields"), ("d.csv:5", "not UTF-8"), ("d.csv:6", "no assistant turn")]
    first = json.loads((tmp_path / "out/train.jsonl").read_text().splitlines()[0])
    assert first["messages"][1] == {"role": "user", "content": "two\nline question"}


def test_json_array_element_problems(tmp_path):
    arr = b'[\n  {"instruction": "a", "output": "b"},\n  "just a string",\n  {"instruction": "c"}\n]'
    (tmp_path / "a.json").write_bytes(arr)
    stats = run(tmp_path, cfg_for("a.json", max_invalid_fraction=1.0), [])
    assert [(p["where"], p["reason"]) for p in stats["sources"]["bad"]["problems"]] == [
        ("a.json:3", "wrong type (record is a string, expected an object)"),
        ("a.json:4", "missing key (no 'output'; alpaca records need 'instruction' and 'output')")]


def test_large_json_array_streams_across_chunks(tmp_path):
    """Elements straddle the reader's 64 KB chunks; the line of a late bad element is still exact."""
    elements = [json.dumps({"instruction": f"say {i} " + "word " * (i % 50), "output": f"{i}"}, indent=2)
                for i in range(3000)]
    elements[2500] = '"not a record"'
    text = "[\n" + ",\n".join(elements) + "\n]\n"
    (tmp_path / "big.json").write_text(text, encoding="utf-8")
    line = text[: text.index('"not a record"')].count("\n") + 1
    stats = run(tmp_path, cfg_for("big.json", max_invalid_fraction=0.01), [])
    s = stats["sources"]["bad"]
    assert (s["in"], s["out"], s["invalid"]) == (3000, 2999, 1) and len(text) > 8 * 65536
    assert s["problems"] == [{"where": f"big.json:{line}", "reason": "wrong type (record is a string, expected an "
                                                                     "object)"}]


def test_nothing_valid_remains(tmp_path):
    (tmp_path / "all_bad.jsonl").write_bytes(b"".join(BAD_LINES[n][0] + b"\n" for n in (2, 3, 7)))
    with pytest.raises(PayloadError) as e:
        run(tmp_path, cfg_for("all_bad.jsonl", max_invalid_fraction=1.0), [])
    assert str(e.value) == ("data: no valid records remain (3 read, 3 dropped, 0 duplicates); first problem: "
                            "all_bad.jsonl:1: invalid JSON (Unterminated string starting at column 43; the line "
                            "looks truncated); fix the sources in data.sources")


def test_only_payload_errors_escape(tmp_path):
    """Every malformed file of the corpus, default settings: a PayloadError each time, nothing else."""
    files = {"a.jsonl": b"\xff\xfe garbage\n", "b.jsonl": b"", "c.csv": b"x,y\n1,2\n", "d.json": b"[{",
             "e.jsonl": b"{" * 100 + b"\n", "f.parquet": b"", "g.jsonl": b'{"messages": [null]}\n'}
    for name, content in files.items():
        (tmp_path / name).write_bytes(content)
        with pytest.raises(PayloadError):
            run(tmp_path, cfg_for(name), [])


@pytest.mark.skipif(not (ROOT / "payload" / "__main__.py").exists(), reason="dispatcher not written yet")
def test_cli_exit_code_and_single_stderr_line(tmp_path):
    bad_corpus(tmp_path / "bad.jsonl", n_good=50)
    cfg = tmp_path / "run.yaml"
    cfg.write_text(json.dumps({  # JSON is YAML
        "data": {"sources": [{"name": "bad", "path": str(tmp_path / "bad.jsonl")}]},
        "model": {"name_or_path": "tiny", "tiny": {}},
        "runtime": {"volume": str(tmp_path / "vol"), "run_id": "r1"},
    }))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAUNCH_", "SKYPILOT_"))}
    proc = subprocess.run([sys.executable, "-m", "payload", "data", "--config", str(cfg)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr  # EXIT_CONFIG: the user must fix the input
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and "bad: 13 of 63 records invalid" in err[0] and "Traceback" not in proc.stderr


# --------------------------------------------------------------------------------------------- CSV


def qa_csv(n: int = 100) -> list[str]:
    return ["prompt,question,response"] + [f"sys,q{i},r{i}" for i in range(1, n + 1)]


@pytest.mark.parametrize("later_quote", [False, True])
def test_csv_unclosed_quote_is_reported_and_the_rest_is_kept(tmp_path, later_quote):
    """One unclosed quote on line 6 used to swallow the rest of the file into one field (100 in, 3 out,
    exit 0). Now: that line is counted and reported, the lines after it are read again as rows."""
    rows = qa_csv()
    rows[5] = 'sys,"unclosed q5,r5'
    if later_quote:  # a later quoted field closes the runaway one: the merge ends there, not at EOF
        rows[50] = 'sys,"quoted q50",r50'
    (tmp_path / "d.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    stats = run(tmp_path, cfg_for("d.csv"), [])
    s = stats["sources"]["bad"]
    assert (s["in"], s["out"], s["invalid"]) == (100, 99, 1)
    assert s["dropped_by_reason"] == {"unclosed quote": 1}
    to, detail, after = (("line 51", "',' expected after '\"'", 45) if later_quote else
                         ("the end of the file", "unexpected end of data", 95))
    assert s["problems"] == [{"where": "d.csv:6", "reason": f"unclosed quote (a quoted field opened on this line "
                              f"runs to {to} ({detail}); this line is skipped and the {after} lines after it are "
                              "read again as rows)"}]
    users = [json.loads(x)["messages"][1]["content"] for x in (tmp_path / "out/train.jsonl").read_text().splitlines()]
    assert "q6" in users and "q100" in users and not any("\n" in u for u in users)


def test_csv_unclosed_quote_counts_against_the_threshold(tmp_path):
    rows = qa_csv(20)
    rows[5] = 'sys,"unclosed q5,r5'
    (tmp_path / "d.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    with pytest.raises(PayloadError) as e:
        run(tmp_path, cfg_for("d.csv"), [])
    assert str(e.value).startswith("bad: 1 of 20 records invalid (5% > max_invalid_fraction 1%); first: "
                                   "d.csv:6: unclosed quote (a quoted field opened on this line runs to the end")


def test_csv_bare_cr_line_endings(tmp_path):
    (tmp_path / "mac.csv").write_bytes(("\r".join(qa_csv(30)) + "\r").encode())
    s = run(tmp_path, cfg_for("mac.csv"), [])["sources"]["bad"]
    assert (s["in"], s["out"], s["invalid"]) == (30, 30, 0)
    (tmp_path / "header.csv").write_bytes(b'prompt,"question"x,response\nsys,q,r\n')
    with pytest.raises(PayloadError) as e:
        run(tmp_path, cfg_for("header.csv"), [])
    assert str(e.value) == ("bad: header.csv:1: CSV header is not valid CSV (',' expected after '\"'); fix the first "
                            "line of the file")


def test_csv_stray_cr_inside_a_row_is_one_invalid_record(tmp_path):
    rows = qa_csv(200)
    rows[3] = "sys,q3\rtail,r3"
    (tmp_path / "d.csv").write_bytes(("\n".join(rows) + "\n").encode())
    s = run(tmp_path, cfg_for("d.csv"), [])["sources"]["bad"]
    assert (s["in"], s["out"], s["invalid"]) == (200, 199, 1)
    assert s["problems"][0]["where"] == "d.csv:4" and s["problems"][0]["reason"].startswith("invalid CSV (new-line")


# ------------------------------------------------------------------------------------------ images


def png(path: Path, size=(8, 8), noise: bool = False) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    img = Image.effect_noise(size, 60).convert("RGB") if noise else Image.new("RGB", size, "red")
    img.save(buf, format="PNG")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buf.getvalue())
    return buf.getvalue()


def vl_record(image) -> bytes:
    part = image if isinstance(image, dict) else {"type": "image", "image": image}
    rec = {"messages": [{"role": "user", "content": [part, {"type": "text", "text": "what is it?"}]},
                        {"role": "assistant", "content": "red"}]}
    return json.dumps(rec).encode() + b"\n"


def test_every_bad_image_is_dropped_at_the_data_stage_with_a_reason(tmp_path):
    import base64

    good = png(tmp_path / "ok.png")
    (tmp_path / "text.png").write_text("I am not a picture\n")
    (tmp_path / "empty.png").write_bytes(b"")
    noisy = png(tmp_path / "noisy.png", (64, 64), noise=True)
    (tmp_path / "cut.png").write_bytes(noisy[: len(noisy) // 2])  # header intact, pixel data cut
    png(tmp_path / "thin.png", (402, 2))
    png(tmp_path / "big.png", (300, 200))
    records = [
        ("ok.png", None),
        ("text.png", f"bad image (messages[0].content[0]: {tmp_path / 'text.png'}: not an image (no format PIL can read))"),
        ("empty.png", f"bad image (messages[0].content[0]: {tmp_path / 'empty.png'}: 0 bytes)"),
        ("cut.png", f"bad image (messages[0].content[0]: {tmp_path / 'cut.png'}: not a readable image ("),
        ("thin.png", f"bad image (messages[0].content[0]: {tmp_path / 'thin.png'}: 402x2 has an aspect ratio over "
                     "200, which the image processor refuses)"),
        ("big.png", f"bad image (messages[0].content[0]: {tmp_path / 'big.png'}: 300x200 is 60,000 pixels > "
                    "data.max_image_pixels 50,000; downscale it)"),
        ({"type": "image", "image": {"bytes": base64.b64encode(good).decode()}}, None),
        ("data:image/png;base64," + base64.b64encode(good).decode(), None),
        ({"type": "image", "image": {"bytes": "%%% not base64 %%%"}},
         "bad image (messages[0].content[0]: image 'bytes' is a string that is not base64)"),
        ({"type": "image", "image": {"bytes": 10 ** 12}},
         "wrong type (messages[0].content[0]: image 'bytes' is a number, expected bytes or a base64 string)"),
        ({"type": "image", "image": {"bytes": base64.b64encode(b"plain text").decode()}},
         "bad image (messages[0].content[0]: embedded bytes: not an image (no format PIL can read))"),
    ]
    (tmp_path / "vl.jsonl").write_bytes(b"".join(vl_record(ref) for ref, _ in records))
    stats = run(tmp_path, cfg_for("vl.jsonl", max_invalid_fraction=1.0, max_image_pixels=50_000), [])
    s = stats["sources"]["bad"]
    bad = {f"vl.jsonl:{i + 1}": reason for i, (_, reason) in enumerate(records) if reason}
    got = {p["where"]: p["reason"] for p in s["problems"]}
    assert list(got) == list(bad)
    for where, reason in bad.items():
        assert got[where].startswith(reason), (where, got[where])
    assert s["dropped_by_reason"] == {"bad image": 7, "wrong type": 1}
    # base64 and data-URI carry the same bytes: one stored file, the second record a duplicate
    assert (s["out"], s["duplicates"]) == (2, 1)
    stored = list((tmp_path / "out/images").iterdir())
    assert len(stored) == 1 and stored[0].read_bytes() == good


def test_each_distinct_image_file_is_decoded_once(tmp_path, monkeypatch):
    from payload.data.images import ImageChecker

    calls = []
    real = ImageChecker.inspect
    monkeypatch.setattr(ImageChecker, "inspect", lambda self, fp: calls.append(1) or real(self, fp))
    png(tmp_path / "a.png")
    png(tmp_path / "b.png", (9, 9))
    lines = []
    for i in range(300):
        rec = json.loads(vl_record("a.png" if i % 2 else "b.png"))
        rec["messages"][1]["content"] = f"answer {i}"
        lines.append(json.dumps(rec).encode() + b"\n")
    (tmp_path / "vl.jsonl").write_bytes(b"".join(lines))
    stats = run(tmp_path, cfg_for("vl.jsonl"), [])
    assert stats["totals"]["out"] == 300 and len(calls) == 2


# ------------------------------------------------------------------------------ tokens and the cache


@pytest.mark.slow  # 9 s: the payload's data stage in a subprocess
def test_standalone_data_stage_applies_max_tokens_with_the_models_tokenizer(tmp_path):
    """`python -m payload data` (main without a tokenizer) loads the tiny model's tokenizer itself."""
    from payload.config import RunConfig
    from payload.data import main

    short = good(1)
    long = json.dumps({"messages": [{"role": "user", "content": "tell me " + "more " * 200},
                                    {"role": "assistant", "content": "no"}]}).encode() + b"\n"
    (tmp_path / "d.jsonl").write_bytes(short + long + good(2))
    cfg = RunConfig.model_validate({
        "data": {"sources": [{"name": "d", "path": str(tmp_path / "d.jsonl")}], "max_tokens": 64},
        "model": {"name_or_path": "tiny", "tiny": {}},
        "runtime": {"volume": str(tmp_path / "vol"), "run_id": "r1"}})
    summary = main(cfg)
    assert (summary["in"], summary["train"], summary["dropped"]) == (3, 2, 1)
    stats = json.loads((tmp_path / "vol/runs/r1/data/data_stats.json").read_text())
    assert stats["max_tokens_applied"] is True and stats["token_lengths"]["max"] <= 64
    problem = stats["sources"]["d"]["problems"][0]
    assert problem["where"].endswith("d.jsonl:2") and problem["reason"].startswith("too many tokens (")
    assert problem["reason"].endswith(" > data.max_tokens 64)")
    assert stats["sources"]["d"]["dropped_by_reason"] == {"too many tokens": 1}
    assert stats["sources"]["d"]["invalid"] == 0  # a filter, not bad input


def _same_size_and_time(path: Path, new: bytes) -> None:
    st = path.stat()
    assert len(new) == st.st_size
    path.write_bytes(new)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_cache_key_covers_input_and_image_content_not_size_and_mtime(tmp_path):
    import io

    from PIL import Image

    def bmp(color: str) -> bytes:  # uncompressed: same size whatever the color
        buf = io.BytesIO()
        Image.new("RGB", (8, 8), color).save(buf, format="BMP")
        return buf.getvalue()

    (tmp_path / "img.bmp").write_bytes(bmp("red"))
    (tmp_path / "d.jsonl").write_bytes(good(1) + vl_record("img.bmp"))
    cfg = cfg_for("d.jsonl")
    assert run(tmp_path, cfg, [])["cached"] is False
    assert run(tmp_path, cfg, [])["cached"] is True
    _same_size_and_time(tmp_path / "d.jsonl", good(2) + vl_record("img.bmp"))  # question 1 -> 2
    assert run(tmp_path, cfg, [])["cached"] is False
    assert "question 2" in (tmp_path / "out/train.jsonl").read_text()
    assert run(tmp_path, cfg, [])["cached"] is True
    _same_size_and_time(tmp_path / "img.bmp", bmp("blue"))  # a referenced image changes
    assert run(tmp_path, cfg, [])["cached"] is False
    marker = json.loads((tmp_path / "out/.complete").read_text())
    assert list(marker["images"]) == [str(tmp_path / "img.bmp")]
