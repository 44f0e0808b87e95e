"""Data stage on bad input: one clear line per problem (file:line: what), counted, never a traceback.

Run: .venv/bin/python -m pytest -x -q tests/test_data_bad_input.py
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

ROOT = Path(__file__).resolve().parents[1]


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


def test_missing_hf_dataset_is_one_line(tmp_path):
    cfg = DataConfig.model_validate({"sources": [{"name": "hub", "hf_dataset": str(tmp_path / "absent")}]})
    with pytest.raises(PayloadError) as e:
        run(tmp_path, cfg, [])
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
