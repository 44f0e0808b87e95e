"""Everything checkable before money is checked before money: `validate`, `plan` and `up` name a
missing or unusable local data file (with the sizes of the ones present) together with the profile's
config problems, in one report, before credentials, prices or any SkyPilot call."""

import re
from pathlib import Path

import yaml
from click.testing import CliRunner

from launcher.store import registry
from launcher.profiles import render
from launcher.cli import cli

REPO = Path(__file__).resolve().parents[3]


def invoke(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def profile_copy(tmp_path, name="lovecraft-a100-spot", **data_sources):
    """clusters/<name>.yaml with its data sources replaced, written under tmp_path."""
    body = yaml.safe_load((REPO / "clusters" / f"{name}.yaml").read_text())
    if data_sources:
        body["data"]["sources"] = [{"name": k, "path": v, "format": "alpaca"} for k, v in data_sources.items()]
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return path


def test_a_missing_data_file_is_named_with_file_line_and_fix():
    r = invoke("validate", "lovecraft-a100-spot")
    assert r.exit_code == 1
    line, *example = r.output.strip().splitlines()
    # one line, then a 3-line example of what the file holds (launcher/profiles/datahints.py)
    assert len(example) == 3 and all(e.startswith('      {"instruction": ') for e in example), r.output
    m = re.fullmatch(r"✗ clusters/lovecraft-a100-spot.yaml:(\d+): data.sources.0.path: "
                     r"data/lovecraft/train_sft.jsonl not found \(looked for (.+)\); put the file there or fix "
                     r"the path; it holds your data, format alpaca: JSONL with `instruction`, `output` and "
                     r"optional `input`, e.g.:", line)
    assert m, line
    assert "path: data/lovecraft/train_sft.jsonl" in (REPO / "clusters/lovecraft-a100-spot.yaml").read_text() \
        .splitlines()[int(m.group(1)) - 1]
    assert m.group(2) == str(REPO / "data/lovecraft/train_sft.jsonl")


def test_plan_still_plans_but_warns_that_up_will_refuse_without_the_data():
    r = invoke("plan", "lovecraft-a100-spot")
    assert r.exit_code == 0, r.output
    flat = " ".join(r.output.split())
    assert "Duration" in r.output and "Cost" in r.output
    assert ("! clusters/lovecraft-a100-spot.yaml:") in flat and ("data/lovecraft/train_sft.jsonl not found") in flat
    assert "`launch up` refuses until it is fixed" in flat


def test_validate_shows_the_sizes_of_the_data_files_present():
    r = invoke("validate", "local-demo")
    assert r.exit_code == 0, r.output
    assert "  data: payload/samples/demo_chat.jsonl (55.9 KB)" in r.output


def test_config_and_data_problems_come_in_one_report(tmp_path):
    path = profile_copy(tmp_path, ok="payload/samples/demo_alpaca.jsonl", gone="data/none.jsonl",
                        home="/etc/hostname", up="../outside.jsonl")
    text = path.read_text().replace("  max_steps: 600\n", "  max_stepz: 600\n")
    path.write_text(text)
    r = invoke("validate", str(path))
    assert r.exit_code == 1
    lines = [ln for ln in r.output.strip().splitlines() if not ln.startswith("      {")]  # not the examples
    assert lines[0] == "✗ 4 problems in the profile:"
    assert "train.max_stepz: unknown key; did you mean `train.max_steps`?" in lines[1]
    assert "data.sources.1.path: data/none.jsonl not found" in lines[2]
    assert "data.sources.2.path: /etc/hostname is outside the project, and a run (on every backend, local included)" \
        in lines[3]
    assert re.search(r"data.sources.3.path: ../outside.jsonl is outside the project, which is all that is "
                     r"uploaded to the machine; move it under data/ \(present: "
                     r"payload/samples/demo_alpaca.jsonl \(13.4 KB\)\)$", lines[4]), lines[4]


def test_an_empty_data_file_is_a_problem(tmp_path, monkeypatch):
    from launcher.profiles import checks

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "x.jsonl").write_text("")
    (tmp_path / "clusters").mkdir()
    monkeypatch.setenv("LAUNCH_PROJECT", str(tmp_path))
    problems, present = checks.data_file_report(profile_copy(tmp_path, x="data/x.jsonl"))
    assert present == [] and problems[0].endswith(f"data/x.jsonl is empty ({tmp_path}/data/x.jsonl)")


def test_an_absolute_path_is_refused_on_every_backend_local_included(tmp_path, in_repo):
    """launcher/profiles/boundary.py: a run reads only repo files, by their path from the project root."""
    from launcher.profiles import checks

    data = tmp_path / "mine.jsonl"
    data.write_text('{"instruction": "a", "output": "b"}\n')
    problems, present = checks.data_file_report(profile_copy(tmp_path, "local-demo", mine=str(data)))
    assert present == [] and f"{data} is outside the project" in problems[0] and "e.g. data/mine.jsonl" in problems[0]
    (in_repo / "mine.jsonl").write_text(data.read_text())
    problems, _ = checks.data_file_report(profile_copy(tmp_path, "local-demo", mine=str(in_repo / "mine.jsonl")))
    assert problems[0].endswith(f"is an absolute path: a run reads its file by its path from the project root, on "
                                f"every backend; write it as {in_repo.relative_to(REPO)}/mine.jsonl")
    rel = f"{in_repo.relative_to(REPO)}/mine.jsonl"
    assert checks.data_file_report(profile_copy(tmp_path, "local-demo", mine=rel)) == ([], [f"{rel} (36 B)"])


def test_up_without_the_data_names_the_file_first_and_starts_nothing(monkeypatch):
    import launcher.backends as backends

    def refuse(*a, **k):
        raise AssertionError("nothing may start before the data check")

    monkeypatch.setattr(backends, "get_backend", refuse)
    monkeypatch.setattr("launcher.runs.start.price_for", refuse)
    committed = render.task_path("lovecraft-a100-spot").read_text()
    r = invoke("up", "lovecraft-a100-spot")
    assert r.exit_code == 1
    assert r.output.startswith("✗ clusters/lovecraft-a100-spot.yaml:") and "train_sft.jsonl not found" in r.output
    assert registry.all_runs() == []
    assert render.task_path("lovecraft-a100-spot").read_text() == committed
