"""Data is checked before money, the way the user meets it: `launch validate`, `launch plan` and
`launch up` run the data stage's own record check (the one `launch data preview` runs) on the local
sources of a profile and refuse data the trainer cannot read with its line (file:line, what, fix),
before anything starts. Each test runs the installed `launch` (tests/walk.py).

The profile is a copy of clusters/local-demo.yaml under tmp_path whose sources are files in a scratch
directory under the repo's data/ (a run reads only repo files, on every backend: launcher/profiles/boundary.py).
"""

from __future__ import annotations

import json
import sqlite3

import yaml

from walk import REPO, assert_one_line_error, launch


def _chat(i: int) -> str:
    return json.dumps({"messages": [{"role": "user", "content": f"question {i}"},
                                    {"role": "assistant", "content": f"answer {i}"}]})


# kind -> (file name, its bytes, what the ✗ line says after `file:`)
BAD = {
    "binary": ("binary.jsonl", b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 8, "binary.jsonl:1: not UTF-8 (byte 0x89"),
    "invalid JSON": ("broken.jsonl", (_chat(1) + "\n" + '{"messages": [{"role": "user",\n' + _chat(2) + "\n").encode(),
                     "broken.jsonl:2: invalid JSON"),
    "missing field": ("nofield.jsonl", (json.dumps({"prompt": "hi", "reply": "yo"}) + "\n").encode() * 3,
                      "nofield.jsonl:1: missing key (no 'messages' list (found keys: prompt, reply)"),
    "wrong type": ("wrongtype.jsonl", (json.dumps({"messages": 42}) + "\n").encode() * 3,
                   "wrongtype.jsonl:1: wrong type ('messages' is a number, expected a list of turns)"),
    "top-level array": ("array.jsonl", ("[" + ", ".join(_chat(i) for i in range(3)) + "]\n").encode(),
                        "array.jsonl:1: wrong type (record is a list, expected an object)"),
}


def profile_with(tmp_path, in_repo, files: dict[str, bytes]):
    """local-demo with one `messages` source per file (written in `in_repo`), as a tmp profile."""
    body = yaml.safe_load((REPO / "clusters/local-demo.yaml").read_text())
    sources = []
    for i, (name, content) in enumerate(files.items()):
        (in_repo / name).write_bytes(content)
        sources.append({"name": f"s{i}", "path": f"{in_repo.relative_to(REPO)}/{name}", "format": "messages",
                        "split": "train"})
    body["data"]["sources"] = sources
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def _errors(r) -> list[str]:
    return [line for line in (r.stdout + r.stderr).splitlines() if line.startswith("✗")]


def test_validate_names_every_kind_of_unreadable_data_with_its_line(tmp_path, in_repo):
    d = in_repo.relative_to(REPO)
    path = profile_with(tmp_path, in_repo, {name: content for name, content, _ in BAD.values()})
    r = launch(tmp_path, "validate", str(path))
    assert_one_line_error(r, *(f"{d}/{what}" for _, _, what in BAD.values()))
    errors = _errors(r)
    assert errors[0] == f"✗ {len(BAD)} problems in the profile:" and len(errors) == len(BAD) + 1, errors
    for i, line in enumerate(errors[1:]):  # every source's problem at once: where in the profile, which key
        assert line.startswith(f"✗ {path}:") and f": data.sources.{i}.path: s{i}: " in line, line


def test_up_and_plan_refuse_unreadable_data_before_anything_starts(tmp_path, in_repo):
    d = in_repo.relative_to(REPO)
    name, content, what = BAD["invalid JSON"]
    path = profile_with(tmp_path, in_repo, {name: content})
    r = launch(tmp_path, "up", str(path), "--backend", "local")
    assert_one_line_error(r, "data.sources.0.path: s0: 1 of 3 records invalid", f"{d}/{what}",
                          "fix the file")
    runs = tmp_path / "user-launch-home" / "runs.db"
    if runs.exists():  # the registry may exist; no run was recorded in it
        with sqlite3.connect(runs) as db:
            assert [t for t, in db.execute("SELECT name FROM sqlite_master WHERE type='table'")
                    if db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]] == []
    assert not list(tmp_path.glob("**/status.json"))
    # plan of data the run refuses: refused with the same line, not a plan of 0 tokens
    r = launch(tmp_path, "plan", str(path))
    assert_one_line_error(r, f"{d}/{what}")
    assert "Training" not in r.stdout


def test_a_large_file_is_read_as_a_sample_and_says_so(tmp_path, in_repo):
    d = in_repo.relative_to(REPO)
    lines = [_chat(i) for i in range(2600)]
    lines[9] = '{"messages": oops'  # one bad line of 2,000 read: dropped like the run drops it, named
    path = profile_with(tmp_path, in_repo, {"big.jsonl": ("\n".join(lines) + "\n").encode()})
    r = launch(tmp_path, "validate", str(path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert (f"data: {d}/big.jsonl (" in r.stdout and "the first 2,000 records read like the run's data "
            f"step, 1 dropped (first: {d}/big.jsonl:10: invalid JSON") in " ".join(r.stdout.split()), r.stdout
    # past the sample the whole file is read as `plan` counts its tokens: 60 more bad lines are refused
    # there, and so by `validate` and `up` (issue 37: `up` refuses what `plan` refuses)
    lines[2100:2160] = ["not json"] * 60
    (in_repo / "big.jsonl").write_text("\n".join(lines) + "\n")
    for command, *more in (("plan",), ("validate",), ("up", "--dry-run")):
        r = launch(tmp_path, command, str(path), *more)
        assert_one_line_error(r, "s0: 61 of 2600 records invalid", f"{d}/big.jsonl:10: invalid JSON",
                              "the run's data step would refuse it")
