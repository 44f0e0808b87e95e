"""Hostile and broken input around the launcher: YAML that attacks the loader, profile values that try
to leave their directories or add keys to the rendered task, a damaged or racing run registry, `--set`
with list indices, and remote text full of rich markup. Each ends in one error line (no traceback), a
refusal, or literal output.

Run: .venv/bin/python -m pytest -q tests/launcher/profiles/test_hostile_input.py
"""

from __future__ import annotations

import json
import multiprocessing
import os
import stat
import tempfile
import tracemalloc
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from launcher.store import registry
from launcher.cli import cli

REPO = Path(__file__).resolve().parents[3]
DEMO = (REPO / "clusters" / "local-demo.yaml").read_text()


def invoke(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def one_error_line(result, starts: str) -> str:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"✗ {starts}"), result.output
    return lines[0]


# --------------------------------------------------------------------------------------------- YAML


def alias_bomb() -> str:
    """Nine levels of nine-fold aliases: ~400 million values from a few hundred bytes."""
    lines = ["a: &a [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        prev, cur = chr(96 + i), chr(97 + i)
        lines.append(f"{cur}: &{cur} [" + ", ".join([f"*{prev}"] * 9) + "]")
    return "\n".join(lines) + "\n"


HOSTILE_YAML = {
    "bomb": (alias_bomb(), ":6: this value expands to more than 100,000 values through its aliases; write it "
                           "out without aliases"),
    "deep": ("x: " + "[" * 10000 + "]" * 10000 + "\n", ":1: nested more than 64 levels deep; flatten the structure"),
    "recursive": ("name: demo\nx: &a [*a]\n", ":2: a recursive alias (a value that contains itself); remove it"),
    "latin1": ("name: démo\n".encode("latin-1"), ":1: not UTF-8 (byte 0xe9 at column 8); save the file as UTF-8"),
    "utf16": ("name: demo\n".encode("utf-16"), ":1: not UTF-8 (byte 0xff at column 1); save the file as UTF-8"),
    "binary": (b"name: demo\nx: \x00\x01\x02\n", ":2: not valid YAML: character #x0000 is not allowed in YAML text; "
                                                 "remove it (is this a text file?)"),
    "huge": ("x: '" + "y" * (1 << 20) + "'\n", ": larger than 1024 KB, too large for a config file; keep data in "
                                               "data files (data.sources) and only settings here"),
    "date": ("name: demo\nx: 2024-13-45\n", ": not valid YAML: month must be in 1..12; quote the value if it is "
                                            "meant as text"),
    "python": ("x: !!python/object/apply:os.system [echo hi]\n", ":1: not valid YAML: could not determine a "
                                                                  "constructor for the tag"),
    "list": ("- a\n- b\n", ":1: the file must be a mapping of sections (data:, model:, train:, ...)"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_YAML))
def test_hostile_yaml_is_one_line_naming_the_file(tmp_path, case):
    content, expected = HOSTILE_YAML[case]
    path = tmp_path / f"{case}.yaml"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    tracemalloc.start()
    try:
        result = invoke("validate", str(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    line = one_error_line(result, f"{path}")
    assert line.startswith(f"✗ {path}{expected}"), line
    assert peak < 64 * 2**20, f"{case}: {peak / 2**20:.0f} MB to refuse a config file"


def test_payload_run_config_uses_the_same_bounded_loader(tmp_path, capsys):
    from payload.__main__ import main

    path = tmp_path / "run.yaml"
    path.write_text(alias_bomb())
    assert main(["data", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"payload: {path}:6: this value expands to more than 100,000 values through its aliases; "
                   "write it out without aliases"]


# ----------------------------------------------------------------------------------- names and paths


def demo_with(tmp_path: Path, replace: dict) -> Path:
    text = DEMO
    for old, new in replace.items():
        assert old in text
        text = text.replace(old, new)
    path = tmp_path / "p.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("name,shown,fix", [
    ('"../../outside"', "'../../outside'", "outside"),
    ('"/tmp/abs"', "'/tmp/abs'", "tmp-abs"),
    ('"demo\\nfile_mounts: {/root: /etc}"', "'demo\\nfile_mounts: {/root: /etc}'", "demo-file-mounts-root-etc"),
    ("Demo_Run", "'Demo_Run'", "demo-run"),
    ('"$cash"', "'$cash'", "cash"),
    ("-dash", "'-dash'", "dash"),
    ("a" * 64, "'" + "a" * 57 + "...'", "a" * 63),
])
def test_profile_names_are_slugs(tmp_path, name, shown, fix):
    path = demo_with(tmp_path, {"name: local-demo": f"name: {name}"})
    before = sorted(p.name for p in (REPO / "sky").rglob("*"))
    result = invoke("render", str(path))
    line = one_error_line(result, f"{path}:")
    assert line.endswith(f": name: {shown} is not a valid name: use lowercase letters, digits and `-` (at most 63 "
                         f"characters, a letter or digit at each end), e.g. `{fix}`")
    assert sorted(p.name for p in (REPO / "sky").rglob("*")) == before
    assert not (tmp_path.parent / "outside.yaml").exists() and not Path("/tmp/abs.yaml").exists()


def test_a_valid_slug_of_63_characters_is_accepted(tmp_path):
    from launcher.profiles.profile import load_profile

    path = demo_with(tmp_path, {"name: local-demo": "name: " + "a1-" * 20 + "xyz"})
    assert len(load_profile(str(path)).name) == 63


def test_run_directories_stay_under_the_volume(tmp_path):
    from payload.config import ConfigError, load_run_config

    base = yaml.safe_load((REPO / "sky/config/local-demo.yaml").read_text())
    bad = tmp_path / "run.yaml"
    bad.write_text(yaml.safe_dump({**base, "runtime": {**base["runtime"], "run_id": "../../etc"}}))
    with pytest.raises(ConfigError) as e:
        load_run_config(bad, env={})
    assert e.value.problems[0].startswith(f"{bad}:") and "runtime.run_id: '../../etc' is not a valid run id" in \
        e.value.problems[0]
    cfg = load_run_config(REPO / "sky/config/local-demo.yaml",
                          env={"LAUNCH_VOLUME": str(tmp_path / "vol"), "LAUNCH_RUN_ID": "../../../escape"})
    assert cfg.run_dir.parent == tmp_path / "vol" / "runs" and cfg.run_dir.name == "escape"


@pytest.mark.parametrize("mount", ["../outside", "/workspace/../etc", "/", "relative"])
def test_mount_points_are_plain_absolute_paths(mount):
    from launcher.profiles.profile import ProfileError, load_profile

    with pytest.raises(ProfileError) as e:
        load_profile("sonia-h100", overrides=(f"cluster.volume.mount={mount}",))
    assert e.value.problems == [f"--set cluster.volume.mount: {mount!r} is not a usable mount "
                                "point: give an absolute path without `.`/`..` components (not `/` itself), e.g. "
                                "/workspace"]


EVIL = 'x\nfile_mounts: {/root: /etc}\n"q\' : {[&a *b]} # c\n  run: rm -rf / \\ \t%'
# RunPod takes any volume name up to 30 characters (SkyPilot checks only the length): keys and markup fit.
EVIL_VOLUME = 'v\nrun: rm -rf /\n"q\': {[&a *b]}'


def test_rendering_hostile_values_adds_no_keys(tmp_path):
    """Free-text values (description, system prompt, paths, model name, image, volume name) go through
    the safe dumper: SkyPilot's own parser sees exactly the keys it should, and every value round-trips."""
    from launcher.profiles.profile import Profile, load_profile
    from launcher.profiles.render import render_text, resolved_run_config
    from payload.config import load_run_config

    d = load_profile("sonia-h100").model_dump(mode="json")
    d["description"] = EVIL
    d["data"]["system_prompts"]["sonia"] = EVIL
    d["data"]["sources"][0] = {"name": "evil", "path": f"data/{EVIL}.jsonl", "image_root": EVIL}
    d["model"]["name_or_path"] = EVIL
    d["outputs"]["smoke_prompt"] = EVIL
    d["cluster"]["image_id"] = f"docker:{EVIL}"
    d["cluster"]["volume"]["name"] = EVIL_VOLUME
    p = Profile.model_validate(d)
    task_text, config_text = render_text(p, 5.38)

    task = yaml.safe_load(task_text)
    assert sorted(task) == ["envs", "name", "num_nodes", "resources", "run", "secrets", "setup", "volumes", "workdir"]
    assert sorted(task["resources"]) == ["accelerators", "disk_size", "image_id", "infra", "use_spot"]
    assert task["resources"]["image_id"] == f"docker:{EVIL}" and task["volumes"] == {"/workspace": EVIL_VOLUME}
    import sky

    parsed = sky.Task.from_yaml_config(task)  # SkyPilot's schema validation and parse
    assert parsed.name == "sonia-h100" and not parsed.file_mounts
    assert {r.image_id[None] for r in parsed.resources} == {f"docker:{EVIL}"}

    config_path = tmp_path / "sonia-h100.yaml"
    config_path.write_text(config_text)
    # (a config without stages is written without the empty `stages:` key, as before stages existed)
    assert yaml.safe_load(config_text) == json.loads(resolved_run_config(p, 5.38).model_dump_json(exclude={"stages"}))
    back = load_run_config(config_path, env={})
    assert back.description == EVIL and back.model.name_or_path == EVIL
    assert back.data.system_prompts["sonia"] == EVIL and back.data.sources[0].path == f"data/{EVIL}.jsonl"


# -------------------------------------------------------------------------------------------- state


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_state_dir_and_files_are_private(tmp_path, monkeypatch):
    from launcher.runs import start
    from launcher.profiles.profile import load_profile
    from launcher.store.state import state_dir

    home = tmp_path / "old-home"
    home.mkdir(mode=0o755)
    (home / "runs.db").touch(mode=0o644)  # what earlier versions left
    monkeypatch.setenv("LAUNCH_HOME", str(home))
    os.chmod(home, 0o755)
    os.chmod(home / "runs.db", 0o644)
    p = load_profile("local-demo")
    run = registry.Run(id=registry.new_run_id(p.name), profile=p.name, backend="local")
    registry.save(run)
    task, config = start.render_for_run(p, run, "local", "catalog")
    assert state_dir() == home and mode(home) == 0o700
    assert mode(home / "runs.db") == 0o600
    assert [mode(f) for f in (task, config)] == [0o600, 0o600]
    assert mode(task.parent) == 0o700 and mode(task.parent.parent) == 0o700
    wal = home / "runs.db-wal"
    assert not wal.exists() or mode(wal) == 0o600


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_corrupt_registry_is_moved_aside_with_one_line(tmp_path, damage):
    registry.save(registry.Run(id="old-run", profile="p", backend="local", state="completed"))
    db = registry.db_path()
    if damage == "garbage":
        db.write_bytes(b"this is not a database\n" * 100)
    else:
        raw = db.read_bytes()
        db.write_bytes(raw[:100] + b"\xff" * (len(raw) - 100))  # header kept, pages destroyed
    registry._CHECKED.clear()  # a fresh `launch` process
    result = invoke("status")
    lines = sorted(result.output.strip().splitlines())  # the warning (stderr) and the answer (stdout)
    assert result.exit_code == 0 and "Traceback" not in result.output
    assert lines[0].startswith(f"! run registry {db} was unreadable (") and lines[0].endswith(
        "started an empty one: runs it listed are no longer tracked, so check your provider (`sky status`, the "
        "RunPod console) for machines still running")
    assert lines[1:] == ["no runs yet: start one with `launch up PROFILE` (`launch profiles` lists them)"]
    aside = [p.name for p in db.parent.iterdir() if p.name.startswith("runs.db.corrupt-")]
    assert len(aside) == 1 and aside[0] in lines[0]
    registry.save(registry.Run(id="new-run", profile="p", backend="local"))
    assert [r.id for r in registry.all_runs()] == ["new-run"]
    assert "unreadable" not in invoke("status").output


def _reserve(args):
    home, barrier = args
    os.environ["LAUNCH_HOME"] = home
    registry.time.strftime = lambda fmt, t=None: "20260101-000000"  # this child only: all in one second
    barrier.wait()
    rid = registry.new_run_id("same-profile")
    registry.save(registry.Run(id=rid, profile="same-profile", backend="local"))
    return rid


def test_run_ids_are_unique_under_concurrent_launches(tmp_path, monkeypatch):
    """Six processes ask for an id of the same profile in the same second: six different ids."""
    ctx = multiprocessing.get_context("fork")
    home = str(tmp_path / "shared")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(6)
        with ctx.Pool(6) as pool:
            ids = pool.map(_reserve, [(home, barrier)] * 6)
    base = "same-profile-20260101-000000"
    assert sorted(ids) == sorted([base] + [f"{base}-{n}" for n in range(2, 7)])
    monkeypatch.setenv("LAUNCH_HOME", home)
    assert sorted(r.id for r in registry.all_runs()) == sorted(ids)


def test_set_with_list_index_works_and_leaves_no_temp_dirs(tmp_path, monkeypatch):
    from launcher.runs.start import load_with_overrides

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where a temp copy would go
    other = "payload/samples/demo_alpaca.jsonl"  # `up` checks the data files and their records: a real one
    p = load_with_overrides("local-demo", (f"data.sources.0.path={other}", "data.sources.0.format=alpaca",
                                           "data.sources.1.split=val"))
    assert p.data.sources[0].path == other and p.data.sources[1].split == "val"
    assert p.data.sources[1].path == "payload/samples/demo_alpaca.jsonl"
    r = invoke("up", "local-demo", "--set", "data.sources.7.path=x.jsonl")
    one_error_line(r, "--set data.sources.7.path: data.sources is a list of 2; use an index from 0 to 1, or set "
                      "the whole list with --set data.sources=[...]")
    r = invoke("up", "local-demo", "--set", "train.max_steps.deeper=1")
    one_error_line(r, "--set train.max_steps.deeper: train.max_steps is a value (40), not a section; use --set "
                      "train.max_steps=... instead")
    r = invoke("up", "local-demo", "--set", "train.max_steps=&a [*a]")
    one_error_line(r, "--set train.max_steps:1: a recursive alias")
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("launch-profile-")]
    assert registry.all_runs() == []
    assert (REPO / "clusters/local-demo.yaml").read_text() == DEMO


# ------------------------------------------------------------------------------------------- markup

MARKUP = "[/] [bold]not bold[/bold] [link=http://x]y[/link] \\[ ends\\"


def test_remote_failure_reason_is_printed_literally_by_logs_follow(tmp_path):
    """A run whose own status.json carries markup as its reason (local backend, finished)."""
    from launcher.store.state import state_dir

    run = registry.Run(id="r-markup", profile="local-demo", backend="local", state="running",
                       handle={"volume": str(tmp_path / "vol")})
    registry.save(run)
    home = state_dir() / "local" / run.id
    home.mkdir(parents=True)
    (home / "run.log").write_text(f"step 1 {MARKUP}\n")
    (home / "exit_code").write_text("1\n")
    run_dir = tmp_path / "vol" / "runs" / run.id
    run_dir.mkdir(parents=True)
    (run_dir / "status.json").write_text(json.dumps({"state": "failed", "exit_code": 1, "reason": MARKUP}))
    result = invoke("logs", run.id, "--follow")
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.splitlines() == [f"step 1 {MARKUP}", f"! r-markup: failed ({MARKUP})"]
    assert registry.get(run.id).reason == MARKUP


def test_errors_tables_and_summaries_print_markup_literally(tmp_path, capsys, monkeypatch):
    from rich.console import Console

    from launcher.runs import teardown as runs
    from launcher.term import ui

    wide = Console(width=200, highlight=False)  # tables wrap at 80 columns; the point here is markup
    monkeypatch.setattr(ui, "console", lambda: wide)

    registry.save(registry.Run(id="[bold]x[/]", profile="p[/]", backend="local", state="completed",
                               started_at=1.0, ended_at=2.0))
    one_error_line(invoke("status", "[/]"), "no run `[/]`; recent runs: [bold]x[/]")
    out = invoke("status", "--all").output + invoke("cost").output
    assert out.count("[bold]x[/]") == 2 and out.count("p[/]") == 2
    target = tmp_path / "artifacts"
    target.mkdir()
    (target / "training_summary.json").write_text(json.dumps(
        {"state": MARKUP, "global_step": "[red]", "duration_s": "[/]", "cost_usd": {"x": 1}}))
    runs.print_summary(registry.get("[bold]x[/]"), target)
    printed = capsys.readouterr().out
    assert f"[bold]x[/]: {MARKUP}" in printed and "steps [red]" in printed


def test_loss_plot_title_with_dollars_and_mathtext(tmp_path):
    from payload.volume.observe import plot_losses

    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"step": s, "loss": 2.0 / s}) + "\n" for s in range(1, 6)))
    out = plot_losses(metrics, tmp_path / "loss.png", title="run $5 budget, $x^{$ \\frac{")
    assert out is not None and out.stat().st_size > 0


# ------------------------------------------------------------------------------ non-finite numbers


def _float_keys(model, prefix=()) -> list[tuple]:
    """Every float key of the profile schema (sections as found in the demo profile's shape)."""
    import typing

    from pydantic import BaseModel

    out = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        args = [ann, *typing.get_args(ann)]
        if float in args:
            out.append((*prefix, name))
        sub = next((a for a in args if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if sub is not None and name not in ("stages", "runtime"):
            out += _float_keys(sub, (*prefix, name))
    return out


def test_the_schema_has_float_keys_to_check():
    from launcher.profiles.profile import Profile

    keys = {".".join(k) for k in _float_keys(Profile)}
    assert {"budget.max_usd", "budget.price_per_hour", "train.learning_rate", "train.epochs",
            "train.checkpoints.save_every_minutes"} <= keys


@pytest.mark.parametrize("key", [".".join(k) for k in _float_keys(__import__("launcher.profiles.profile").profiles.profile.Profile)])
@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan", "1e400"])
def test_no_float_key_takes_a_non_finite_number(key, value):
    from launcher.profiles.profile import ProfileError, load_profile

    with pytest.raises(ProfileError) as e:
        load_profile("local-demo", overrides=(f"{key}={value}",))
    assert f"--set {key}: must be a finite number" in e.value.problems[0], e.value.problems
