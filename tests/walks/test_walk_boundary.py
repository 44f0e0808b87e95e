"""The boundaries, walked as the user walks them (tests/walk.py: the installed `launch` in a subprocess,
fresh HOME and LAUNCH_HOME, no credentials, stdin not a terminal, 80 columns).

- A data path that leads out of the project (a symlinked file, a symlinked directory, `..`), in the
  profile or through `--set`, is refused with one line naming the file:line and key; nothing is
  listed, uploaded or started (issue 32, item 3).
- A token-shaped value in `--env` or a profile's `envs:` is refused with one line naming the
  variable, never its value; the value reaches neither the terminal nor the state dir (item 4).
- A budget of `.inf`/`1e400` is refused at the schema; `--json` output is strict JSON (item 5).
- A profile given by path never writes into the committed sky/ (`render` refuses, `up --dry-run`
  writes nothing) (item 7).
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest

from walk import REPO, assert_one_line_error, launch

DEMO = (REPO / "clusters" / "local-demo.yaml").read_text()
SECRET_LINE = '{"instruction": "the secret below", "output": "not for the machine"}\n'


def demo_copy(tmp_path: Path, old: str = "", new: str = "", extra: str = "") -> Path:
    assert old in DEMO
    path = tmp_path / "mine.yaml"
    path.write_text(DEMO.replace(old, new) + extra)
    return path


def started_nothing(tmp_path: Path) -> None:
    """No run recorded (nor a run id reserved) in the walk's LAUNCH_HOME, no run directory made."""
    home = tmp_path / "user-launch-home"
    db = home / "runs.db"
    if db.exists():
        with sqlite3.connect(db) as con:
            tables = [t for (t,) in con.execute("select name from sqlite_master where type='table'")]
            assert all(con.execute(f"select count(*) from {t}").fetchone()[0] == 0 for t in tables
                       if t in ("runs", "run_ids"))
    assert not (home / "runs").exists() or not any((home / "runs").iterdir())


@pytest.fixture
def outside(tmp_path):
    d = tmp_path / "home-of-the-user"
    d.mkdir()
    (d / "secret.jsonl").write_text(SECRET_LINE)
    return d


def _route(kind: str, in_repo: Path, outside: Path) -> str:
    """A data path, as the profile names it, that leads to `outside/secret.jsonl`."""
    if kind == "linked file":
        (in_repo / "train.jsonl").symlink_to(outside / "secret.jsonl")
        return f"{in_repo.relative_to(REPO)}/train.jsonl"
    if kind == "linked directory":
        (in_repo / "linked").symlink_to(outside, target_is_directory=True)
        return f"{in_repo.relative_to(REPO)}/linked/secret.jsonl"
    return os.path.relpath(outside / "secret.jsonl", REPO)  # `..`


@pytest.mark.parametrize("kind", ["linked file", "linked directory", "dot-dot"])
def test_a_data_path_leading_out_of_the_repo_is_refused_and_nothing_starts(tmp_path, in_repo, outside, kind):
    rel = _route(kind, in_repo, outside)
    profile = demo_copy(tmp_path, "payload/samples/demo_alpaca.jsonl", rel)
    line_no = next(i for i, ln in enumerate(profile.read_text().splitlines(), 1) if rel in ln)
    r = launch(tmp_path, "validate", str(profile))
    line = assert_one_line_error(r, f"{profile}:{line_no}: data.sources.1.path: {rel}", "outside the project"
                                 if kind == "dot-dot" else "leads out of the project through a symbolic link")
    assert "copy the file under data/" in line or "move it under data/" in line
    r = launch(tmp_path, "up", str(profile), "--dry-run")
    assert_one_line_error(r, "data.sources.1.path")
    assert "secret below" not in r.stdout + r.stderr and "upload" not in r.stdout
    started_nothing(tmp_path)


def test_a_linked_data_path_through_set_is_refused_before_anything_starts(tmp_path, in_repo, outside):
    rel = _route("linked file", in_repo, outside)
    r = launch(tmp_path, "up", "local-demo", "--set", f"data.sources.0.path={rel}")
    assert_one_line_error(r, "data.sources.0.path: " + rel, "symbolic link")
    assert "secret below" not in r.stdout + r.stderr
    started_nothing(tmp_path)


def test_an_image_root_out_of_the_repo_is_refused(tmp_path):
    profile = demo_copy(tmp_path, "      format: alpaca\n", "      format: alpaca\n      image_root: ../elsewhere\n")
    assert_one_line_error(launch(tmp_path, "validate", str(profile)),
                          f"{profile}:", "data.sources.1.image_root: ../elsewhere is outside the project")


def test_a_reward_module_out_of_the_repo_is_refused(tmp_path, in_repo, outside):
    (outside / "reward.py").write_text("def score(*a, **k): return [0.0]\n")
    (in_repo / "reward.py").symlink_to(outside / "reward.py")
    rel = f"{in_repo.relative_to(REPO)}/reward.py"
    text = (REPO / "clusters" / "spatial-vl-t4.yaml").read_text()
    old = "rewards: [number_match, format]"
    assert old in text
    profile = tmp_path / "spatial.yaml"
    profile.write_text(text.replace(old, f"rewards: [number_match, {rel}:score, ../r.py:score]"))
    r = launch(tmp_path, "validate", str(profile))
    assert_one_line_error(r, f"stages.2.grpo.rewards.1: {rel} leads out of the project through a symbolic link",
                          "stages.2.grpo.rewards.2: ../r.py is outside the project")


# ------------------------------------------------------------------------------------------- secrets

# One made-up token of each shape (never a real one); the variable names say nothing secret.
TOKENS = {
    "hf": "hf_" + "Ab1" * 12,
    "ghp": "ghp_" + "Zz9" * 12,
    "github_pat": "github_pat_11" + "A" * 20 + "_" + "b" * 40,
    "wandb": "0123456789abcdef" * 2 + "01234567",
    "runpod": "rpa_" + "Q1W2E3R4T5" * 3,
    "aws": "AKIA" + "ABCDEFGH12345678",
    "openai": "sk-proj-" + "x1Y2" * 10,
    "private key": "-----BEGIN PRIVATE KEY-----MIIEvQIBADANBg",
}


def no_trace_of(value: str, tmp_path: Path, r) -> None:
    assert value not in r.stdout + r.stderr
    home = tmp_path / "user-launch-home"
    for f in home.rglob("*") if home.exists() else []:
        if f.is_file():
            assert value.encode() not in f.read_bytes(), f


@pytest.mark.parametrize("shape", ["hf", "ghp", "wandb", "aws"])
def test_a_token_shaped_env_value_is_refused_naming_the_variable_only(tmp_path, shape):
    token = TOKENS[shape]
    r = launch(tmp_path, "up", "local-demo", "--env", f"BUILD_INFO={token}")
    line = assert_one_line_error(r, "--env: `BUILD_INFO`'s value looks like")
    assert ("export HF_TOKEN" in line) if shape == "hf" else ("by name" in line)
    no_trace_of(token, tmp_path, r)
    started_nothing(tmp_path)


@pytest.mark.parametrize("shape", ["github_pat", "runpod", "openai", "private key"])
def test_a_token_shaped_value_in_a_profiles_envs_is_refused(tmp_path, shape):
    token = TOKENS[shape]
    profile = demo_copy(tmp_path, extra=f"\nenvs:\n  NOTES: {json.dumps(token)}\n")
    r = launch(tmp_path, "validate", str(profile))
    assert_one_line_error(r, f"{profile}:", "envs: `NOTES`'s value looks like")
    no_trace_of(token, tmp_path, r)


def test_up_of_a_profile_with_a_token_in_envs_records_nothing(tmp_path):
    token = TOKENS["hf"]
    profile = demo_copy(tmp_path, extra=f"\nenvs:\n  NOTES: {token}\n")
    r = launch(tmp_path, "up", str(profile))
    assert_one_line_error(r, "envs: `NOTES`'s value looks like a Hugging Face token", "export HF_TOKEN")
    no_trace_of(token, tmp_path, r)
    started_nothing(tmp_path)


# --------------------------------------------------------------------------------------------- money


def test_an_infinite_budget_is_refused_in_the_profile_and_through_set(tmp_path):
    profile = demo_copy(tmp_path, "max_usd: 1.00", "max_usd: .inf")
    line_no = profile.read_text().splitlines().index("  max_usd: .inf           # a notional cap, so the budget "
                                                     "logic runs in the demo too") + 1
    assert_one_line_error(launch(tmp_path, "validate", str(profile)),
                          f"{profile}:{line_no}: budget.max_usd: must be a finite number")
    r = launch(tmp_path, "up", "local-demo", "--set", "budget.max_usd=1e400")
    assert_one_line_error(r, "budget.max_usd: must be a finite number")
    assert "$inf" not in r.stdout
    started_nothing(tmp_path)


def test_json_output_is_strict_even_for_a_run_recorded_with_an_infinite_budget(tmp_path, monkeypatch):
    """A run an older version recorded with `budget $inf` (and a NaN price): `--json` stays JSON."""
    from launcher.store import registry

    monkeypatch.setenv("LAUNCH_HOME", str(tmp_path / "user-launch-home"))
    registry.save(registry.Run(id="local-demo-20261126-000000", profile="local-demo", backend="local",
                               state="failed", ended_at=1.0, started_at=0.5, budget_usd=float("inf"),
                               price_per_hour=float("nan"), billed_s=10.0, billed_usd=float("nan")))
    r = launch(tmp_path, "cost", "--json")
    assert r.returncode == 0, r.stdout + r.stderr

    def refuse(name):
        raise AssertionError(f"not JSON: {name}")

    body = json.loads(r.stdout, parse_constant=refuse)
    assert body["runs"][0]["budget_usd"] is None


# ------------------------------------------------------------------------------------ sky/ untouched


def test_a_profile_by_path_never_writes_the_committed_sky_files(tmp_path):
    """Copies named like committed profiles: `render` refuses, `up --dry-run` on SkyPilot renders for
    the run and writes nothing (sky/ byte-identical, no run id reserved)."""
    sky = {p: p.read_bytes() for p in (REPO / "sky").rglob("*") if p.is_file()}
    text = (REPO / "clusters" / "sonia-h100.yaml").read_text()
    assert "    r: 32" in text
    sonia = tmp_path / "sonia-copy.yaml"
    sonia.write_text(text.replace("    r: 32", "    r: 16"))
    r = launch(tmp_path, "render", str(sonia))
    assert_one_line_error(r, "only the profiles in clusters/ render into sky/", f"launch up {sonia} --dry-run")
    demo = demo_copy(tmp_path, "max_usd: 1.00", "max_usd: 2.00")  # the cheapest task SkyPilot parses
    r = launch(tmp_path, "up", str(demo), "--backend", "skypilot", "--dry-run")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "nothing started" in r.stdout and "a per-run copy" in r.stdout and "parsed by SkyPilot" in r.stdout
    assert {p: p.read_bytes() for p in (REPO / "sky").rglob("*") if p.is_file()} == sky
    started_nothing(tmp_path)
