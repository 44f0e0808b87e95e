"""`launch init NAME --from PROFILE`: the source's text, comments kept, `name:` changed, validated,
never overwriting; one line of what to edit next."""

import shutil

import pytest
import yaml
from click.testing import CliRunner

from launcher import project
from launcher.profiles import profile as profiles
from launcher.cli import cli


@pytest.fixture
def clusters(tmp_path, monkeypatch):
    d = tmp_path / "clusters"
    d.mkdir()
    for name in ("sonia-h100", "local-demo"):
        shutil.copy(project.examples_dir() / f"{name}.yaml", d)
    monkeypatch.setenv("LAUNCH_PROJECT", str(tmp_path))
    return d


def launch(*args):
    return CliRunner().invoke(cli, list(args), terminal_width=200)


def test_init_copies_the_profile_with_its_comments_and_a_new_name(clusters):
    r = launch("init", "my-h100", "--from", "sonia-h100")
    assert r.exit_code == 0, r.output
    src = (clusters / "sonia-h100.yaml").read_text()
    new = (clusters / "my-h100.yaml").read_text()
    assert yaml.safe_load(new)["name"] == "my-h100"
    assert "# my-h100: runbook 000" in new and "launch plan my-h100" in new and "launch up my-h100" in new
    # every other line, comments included, is the source's
    changed = [(a, b) for a, b in zip(src.splitlines(), new.splitlines()) if a != b]
    assert len(src.splitlines()) == len(new.splitlines()) and all("sonia-h100" in a for a, _ in changed)
    assert "# HF cache (~65 GB model)" in new
    p = profiles.load_profile("my-h100")
    assert p.name == "my-h100" and p.cluster.accelerators == "H100-SXM:2"
    out = " ".join(r.output.split())
    assert "wrote" in out and "my-h100.yaml from sonia-h100" in out
    assert "cluster.volume.name `sonia-workspace` (shared with sonia-h100: give this profile its own)" in out
    assert "launch validate my-h100" in out


def test_init_refuses_to_overwrite_and_bad_names_without_writing(clusters):
    before = (clusters / "local-demo.yaml").read_text()
    r = launch("init", "local-demo", "--from", "sonia-h100")
    assert r.exit_code == 1 and "already exists: pick another name" in r.output and "Traceback" not in r.output
    assert (clusters / "local-demo.yaml").read_text() == before
    r = launch("init", "My_Profile", "--from", "local-demo")
    assert r.exit_code == 1 and "is not a valid name" in r.output and "my-profile" in r.output
    r = launch("init", "Köln-ö", "--from", "local-demo")  # accents dropped, not the letters under them
    assert r.exit_code == 1 and "e.g. `koln-o`" in r.output
    r = launch("init", "x-demo", "--from", "no-such-profile")
    assert r.exit_code == 1 and "no profile `no-such-profile`" in r.output
    assert sorted(p.name for p in clusters.iterdir()) == ["local-demo.yaml", "sonia-h100.yaml"]


def test_init_from_a_local_profile_validates_and_needs_no_volume_edit(clusters):
    r = launch("init", "tiny-cpu", "--from", "local-demo")
    assert r.exit_code == 0, r.output
    assert "shared with" not in r.output and "data.sources" in r.output
    assert profiles.load_profile("tiny-cpu").cluster.is_local
