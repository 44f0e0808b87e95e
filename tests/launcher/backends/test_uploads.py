"""Uploads are an allowlist: the payload's code, the run config, the data files the profile names.

A `.env` or a key beside a profile, in data/ or even in payload/ stays home; a symlink in payload/
is never followed; a data path that leaves the repo is not uploaded (and said so). The same list is
the local/ssh workdir, the directory SkyPilot is handed, and what `launch up --dry-run` prints.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from click.testing import CliRunner

from launcher.profiles import uploads
from launcher.cli import cli
from launcher.project import PACKAGE_ROOT as REPO_ROOT
from launcher.profiles.profile import load_profile, profile_names
from launcher.profiles.render import render_text


def _profile(*sources, kind="causal_lm"):
    srcs = [SimpleNamespace(path=p, image_root=root) for p, root in sources]
    return SimpleNamespace(data=SimpleNamespace(sources=srcs), model=SimpleNamespace(kind=kind))


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A repo with secrets lying around everywhere an upload could pick them up."""
    root = tmp_path / "repo"
    files = {
        "payload/__init__.py": "", "payload/train/recipe.py": "x = 1\n", "payload/requirements-gpu.txt": "torch\n",
        "payload/data/sources.py": "", "payload/__pycache__/train.cpython-311.pyc": "cache",
        "payload/.env": "HF_TOKEN=hf_secret", "payload/id_ed25519": "KEY", "payload/notes.ipynb": "{}",
        "data/a.jsonl": '{"x": 1}\n', "data/b.jsonl": "unnamed\n", "data/.env": "SECRET=1",
        "data/vl/train.jsonl": '{"images": ["img/1.png"]}\n', "data/vl/img/1.png": "png",
        "data/vl/img/key.pem": "KEY", "data/vl/.cache/2.png": "cached",
        "clusters/mine.yaml": "name: mine\n", "clusters/.env": "RUNPOD_API_KEY=rp", "secret.key": "KEY",
        "sky/config/mine.yaml": "run config\n", "sky/mine.yaml": "task\n",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (tmp_path / "outside.jsonl").write_text("{}\n")
    (tmp_path / "home-secret").write_text("KEY")
    (root / "payload" / "linked.py").symlink_to(tmp_path / "home-secret")
    from launcher import project

    monkeypatch.setattr(project, "PACKAGE_ROOT", root)  # this "install" ships root/payload
    monkeypatch.setenv("LAUNCH_PROJECT", str(root))  # and root is the project
    return root


def test_only_payload_code_the_config_and_named_data_travel(repo, tmp_path):
    p = _profile(("data/a.jsonl", None), ("data/vl/train.jsonl", None), (str(tmp_path / "outside.jsonl"), None),
                 ("../outside.jsonl", None), ("data/missing.jsonl", None), kind="image_text_to_text")
    up = uploads.upload_plan(p, repo / "sky/config/mine.yaml", "sky/config/mine.yaml")
    assert set(up.files) == {"payload/__init__.py", "payload/train/recipe.py", "payload/requirements-gpu.txt",
                             "payload/data/sources.py", "data/a.jsonl", "data/vl/train.jsonl",
                             "data/vl/img/1.png", "sky/config/mine.yaml"}
    assert up.bytes == sum(p.stat().st_size for p in up.files.values())
    assert [why.split(":")[0] for _, why in up.not_uploaded] == [
        "outside the project", "outside the project", "not found here"]
    # Without a profile (the ssh tests' scripted task): code and config only.
    bare = uploads.upload_plan(None, repo / "sky/config/mine.yaml", "sky/config/mine.yaml")
    assert set(bare.files) == {f for f in up.files if f.startswith("payload/")} | {"sky/config/mine.yaml"}


def test_image_root_uploads_its_images_only(repo):
    up = uploads.upload_plan(_profile(("data/vl/train.jsonl", "data/vl/img")), repo / "sky/config/mine.yaml",
                             "sky/config/mine.yaml")
    assert {f for f in up.files if f.startswith("data/")} == {"data/vl/train.jsonl", "data/vl/img/1.png"}


@pytest.mark.parametrize("name", profile_names())
def test_every_payload_file_the_rendered_scripts_name_is_uploaded(name):
    """A file the GPU machine's setup/run reads (a requirements or lock file) must be in the list."""
    p = load_profile(name)
    task_text, _ = render_text(p, 1.0)
    task = yaml.safe_load(task_text)
    named = set(re.findall(r"payload/[\w./-]+", (task.get("setup") or "") + (task.get("run") or "")))
    config_rel = task["envs"]["LAUNCH_CONFIG"]
    up = uploads.upload_plan(p, REPO_ROOT / config_rel, config_rel)
    assert named and named <= set(up.files), named - set(up.files)
    assert config_rel in up.files


def test_skypilot_gets_a_staged_workdir_of_exactly_the_list(monkeypatch):
    """build_task points SkyPilot's workdir at a directory holding the allowlist (hard links) and a
    .skyignore that excludes nothing; the committed .skyignore is not in it."""
    from launcher.backends import LaunchSpec
    from launcher.backends import skypilot as sp
    from launcher.store.registry import Run
    from launcher.profiles.render import config_path, task_path

    spec = LaunchSpec(run=Run(id="sonia-h100-1", profile="sonia-h100", backend="skypilot"),
                      profile=load_profile("sonia-h100"), task_yaml=task_path("sonia-h100"),
                      config_yaml=config_path("sonia-h100"), envs={})
    task = sp.build_task(spec)
    staged = Path(task.workdir)
    files = {p.relative_to(staged).as_posix() for p in staged.rglob("*") if p.is_file()}
    expected = uploads.upload_plan(spec.profile, spec.config_yaml, "sky/config/sonia-h100.yaml").files
    assert files == set(expected) | {".skyignore"}
    assert (staged / ".skyignore").read_text().startswith("#") and len((staged / ".skyignore").read_text().splitlines()) == 1
    assert (staged / "payload/train/recipe.py").stat().st_ino == (REPO_ROOT / "payload/train/recipe.py").stat().st_ino
    uploads.remove_staged(spec.run.id)
    assert not staged.exists()


def test_committed_skyignore_keeps_secrets_out_of_a_plain_sky_launch(tmp_path):
    """For `sky launch sky/<p>.yaml` (no launch involved) SkyPilot's own exclusion, on a copy of
    the repo's top level with secrets planted: none of them would be uploaded."""
    from sky.data import storage_utils

    root = tmp_path / "repo"
    for rel in ("payload/train/recipe.py", "sky/config/x.yaml", "data/a.jsonl", ".skyignore"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes((REPO_ROOT / rel).read_bytes() if (REPO_ROOT / rel).is_file() else b"x")
    secrets = ("clusters/.env", ".env", "data/.env.local", "data/id_rsa", "payload/key.pem",
               "data/aws_credentials.json", "launcher/cli.py", "tests/test_x.py")
    for rel in secrets:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text("secret")
    excluded = set(storage_utils.get_excluded_files(str(root)))
    kept = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()
            and not any(p.relative_to(root).as_posix() == e or p.relative_to(root).as_posix().startswith(e.rstrip("/") + "/")
                        for e in excluded)}
    assert kept == {"payload/train/recipe.py", "sky/config/x.yaml", "data/a.jsonl", ".skyignore"}


def test_up_dry_run_lists_the_upload_and_starts_nothing(tmp_path):
    from launcher.store import registry

    r = CliRunner().invoke(cli, ["up", "local-demo", "--dry-run"])
    assert r.exit_code == 0, r.output
    up = uploads.upload_plan(load_profile("local-demo"), REPO_ROOT / "sky/config/local-demo.yaml",
                             "sky/config/local-demo.yaml")
    assert f"upload    {len(up.files)} files" in r.output
    assert "payload/samples/demo_chat.jsonl" in r.output and "sky/config/local-demo.yaml" in r.output
    assert "nothing started" in r.output and "setup (preflight), then run (data, train, post)" in r.output
    assert registry.all_runs() == []
    assert not (tmp_path / "launch-home" / "local").exists() and not (tmp_path / "launch-home" / "rendered").exists()


def test_a_data_path_that_leads_out_of_the_repo_by_any_route_is_not_uploaded(repo, tmp_path):
    """A link to a file outside, a path through a linked directory, `..`: each stays home."""
    (repo / "data" / "link.jsonl").symlink_to(tmp_path / "outside.jsonl")
    (repo / "data" / "linkdir").symlink_to(tmp_path, target_is_directory=True)
    (repo / "data" / "inner.jsonl").symlink_to(repo / "data" / "a.jsonl")  # a link inside the project is fine
    p = _profile(("data/link.jsonl", None), ("data/linkdir/outside.jsonl", None), ("data/../../outside.jsonl", None),
                 ("data/inner.jsonl", None), ("data/a.jsonl", "data/linkdir"))
    up = uploads.upload_plan(p, repo / "sky/config/mine.yaml", "sky/config/mine.yaml")
    assert {f for f in up.files if f.startswith("data/")} == {"data/inner.jsonl", "data/a.jsonl"}
    assert [named for named, _ in up.not_uploaded] == ["data/link.jsonl", "data/linkdir/outside.jsonl",
                                                       "data/../../outside.jsonl", "data/linkdir"]
    assert all(f.resolve().is_relative_to(repo) for f in up.files.values())


def test_the_boundary_rule(tmp_path):
    from launcher.profiles.boundary import inside

    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    (root / "d" / "f").write_text("x")
    (root / "d" / "out").symlink_to(tmp_path)
    (root / "d" / "in").symlink_to(root / "d" / "f")
    (root / "loop").symlink_to(root / "loop")
    (tmp_path / "via").symlink_to(root, target_is_directory=True)
    assert inside(root, "d/f") == "d/f" and inside(root, str(root / "d/f")) == "d/f"
    assert inside(root, "d/in") == "d/in" and inside(root, "d/./x/../f") == "d/f"
    assert inside(tmp_path / "via", "d/f") == "d/f"  # the root itself reached through a link
    assert inside(root, "d/out/root/d/f") == "d/out/root/d/f"  # out and back in: the file is the repo's
    for outside in ("../x", "d/../../x", "/etc/hostname", "d/out", "d/out/x", "loop", ".", ""):
        assert inside(root, outside) is None, outside


def test_a_user_reward_module_travels_when_it_is_inside_the_repo(repo, tmp_path):
    (repo / "data" / "reward.py").write_text("def score(*a, **k): return [0.0]\n")
    (repo / "data" / "linked.py").symlink_to(tmp_path / "home-secret")
    grpo = SimpleNamespace(rewards=["number_match", "data/reward.py:score", "data/linked.py:f", "../x.py:f",
                                    "my_pkg.rewards:f"])
    p = _profile(("data/a.jsonl", None))
    p.stages = [SimpleNamespace(grpo=None), SimpleNamespace(grpo=grpo)]
    up = uploads.upload_plan(p, repo / "sky/config/mine.yaml", "sky/config/mine.yaml")
    assert {f for f in up.files if f.startswith("data/")} == {"data/a.jsonl", "data/reward.py"}
    assert up.not_uploaded == [("data/linked.py", "reward module outside the project: the machine must have it at "
                                                  "that path"),
                               ("../x.py", "reward module outside the project: the machine must have it at that path")]
