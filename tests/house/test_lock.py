"""The launcher/test environment is locked: requirements/dev.lock pins every package with hashes,
`make install` installs exactly it, and a lock older than its inputs fails CI (`make lock-check`,
scripts/lock_inputs.py). Also: the YAML depth guard is the project's own, whatever the parser, since
a new PyYAML/libyaml once changed the wording and turned a fresh clone's CI red.

Run: .venv/bin/python -m pytest -q tests/house/test_lock.py
"""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from payload.config import yamlio

REPO = Path(__file__).resolve().parents[2]
DEV_LOCK = REPO / "requirements" / "dev.lock"
CHECK = [sys.executable, str(REPO / "scripts" / "lock_inputs.py"), "--check"]


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def lock_pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)==([^\s;\\]+)", line)
        if m:
            pins[normalize(m.group(1))] = m.group(2)
    return pins


LOCK_FILES = ("pyproject.toml", "requirements/dev.in", "requirements/overrides.txt", "requirements/dev.lock",
              "requirements/dev-macos.lock", "requirements/sky-cli.in", "requirements/sky-cli.lock",
              "payload/requirements-gpu.txt", "payload/requirements-gpu.lock",
              "payload/requirements-local.txt", "payload/requirements-local.lock")


def copy_lock_inputs(root: Path) -> None:
    for rel in LOCK_FILES:
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / rel, root / rel)


def test_every_installed_package_is_the_locked_version():
    """What `pip freeze` would list for this environment, read through importlib.metadata."""
    pins = lock_pins(DEV_LOCK)
    installed = {normalize(d.metadata["Name"]): d.version for d in importlib.metadata.distributions()}
    installed.pop("launch", None)  # the project itself, installed editable
    off = {name: (version, pins.get(name)) for name, version in installed.items() if pins.get(name) != version}
    assert not off, f"installed != requirements/dev.lock (name: (installed, locked)); run `make install`: {off}"


def test_dev_lock_has_a_hash_for_every_pin_and_cpu_torch():
    text = DEV_LOCK.read_text()
    blocks = re.split(r"\n(?=[A-Za-z0-9])", text.split("\n", 3)[3])
    assert blocks and all("--hash=sha256:" in b for b in blocks if "==" in b.split("\n")[0])
    assert lock_pins(DEV_LOCK)["torch"].endswith("+cpu")
    assert not any(name.startswith("nvidia-") for name in lock_pins(DEV_LOCK)), "CUDA wheels in the CPU lock"


def test_locks_match_their_inputs():
    r = subprocess.run(CHECK, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("edit, named", [
    ("requirements/dev.in", "requirements/dev.in"),
    ("requirements/overrides.txt", "requirements/overrides.txt"),
    ("payload/requirements-gpu.txt", "payload/requirements-gpu.txt"),
    ("payload/requirements-local.txt", "payload/requirements-local.txt"),
    ("requirements/sky-cli.in", "requirements/sky-cli.in"),
])
def test_a_stale_lock_fails_and_names_the_input_and_the_fix(tmp_path, edit, named):
    copy_lock_inputs(tmp_path)
    target = tmp_path / edit
    target.write_text(target.read_text() + "\n# a comment changes no resolution\n")
    assert subprocess.run([*CHECK, "--root", str(tmp_path)], capture_output=True).returncode == 0
    target.write_text(target.read_text() + "six==1.17.0\n")
    r = subprocess.run([*CHECK, "--root", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 1
    locks = {"payload/requirements-gpu.txt": ["payload/requirements-gpu.lock"],
             "payload/requirements-local.txt": ["payload/requirements-local.lock"],
             "requirements/sky-cli.in": ["requirements/sky-cli.lock"]}.get(
        edit, ["requirements/dev.lock", "requirements/dev-macos.lock"])  # the Linux and the macOS lock
    assert r.stderr.strip().splitlines() == [f"✗ {lock}: older than {named} (changed since the lock was made); "
                                             f"run `make lock` and commit {lock}" for lock in locks]


def test_a_new_pyproject_dependency_makes_the_dev_lock_stale(tmp_path):
    copy_lock_inputs(tmp_path)
    py = tmp_path / "pyproject.toml"
    py.write_text(py.read_text().replace('    "click>=8.1",\n', '    "click>=8.1",\n    "six",\n', 1))
    r = subprocess.run([*CHECK, "--root", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 1 and "requirements/dev.lock: older than pyproject.toml" in r.stderr


def test_the_sky_cli_lock_pins_the_launchers_skypilot():
    """`launch` (SkyPilot's SDK in .venv) and `sky` (.tools/sky-cli) share one API server and one ~/.sky:
    one SkyPilot version, with SkyPilot's own click<8.2 in the CLI's lock (its CLI breaks on 8.2+)."""
    dev, cli = lock_pins(DEV_LOCK), lock_pins(REPO / "requirements" / "sky-cli.lock")
    assert cli["skypilot"] == dev["skypilot"]
    version = lambda v: tuple(int(x) for x in v.split(".")[:3])  # noqa: E731
    assert version(cli["click"]) < (8, 2) and version(dev["click"]) >= (8, 4, 2)


def test_a_different_skypilot_in_the_two_locks_fails_lock_check(tmp_path):
    copy_lock_inputs(tmp_path)
    lock = tmp_path / "requirements" / "sky-cli.lock"
    lock.write_text(re.sub(r"(?m)^skypilot==\S+", "skypilot==0.0.1", lock.read_text()))
    r = subprocess.run([*CHECK, "--root", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 1
    dev = lock_pins(DEV_LOCK)["skypilot"]
    assert r.stderr.strip() == (f"✗ skypilot differs between the locks (requirements/dev.lock: {dev}, "
                                "requirements/sky-cli.lock: 0.0.1); pin one version of skypilot in their "
                                "inputs and run `make lock`")


# ------------------------------------------------------------------------- the depth guard is ours


LOADERS = [yaml.SafeLoader] + ([yaml.CSafeLoader] if hasattr(yaml, "CSafeLoader") else [])


@pytest.mark.parametrize("loader", LOADERS, ids=lambda c: c.__name__)
@pytest.mark.parametrize("text, line", [
    ("x: " + "[" * 10000 + "]" * 10000 + "\n", 1),              # past libyaml's own limit
    ("a: 1\nx: " + "{k: " * 65 + "1" + "}" * 65 + "\n", 2),      # just past ours, in flow mappings
    ("a: 1\nb:\n" + "".join(" " * i + f"k{i}:\n" for i in range(1, 70)) + " " * 70 + "v\n", None),  # block
])
def test_nesting_past_the_limit_is_our_line_with_either_parser(monkeypatch, loader, text, line):
    monkeypatch.setattr(yamlio, "_Loader", loader)
    with pytest.raises(yamlio.YamlProblem) as e:
        yamlio.parse_yaml(text, "p.yaml")
    where = f"p.yaml:{line}" if line else r"p.yaml:\d+"
    assert re.fullmatch(f"{where}: nested more than {yamlio.MAX_DEPTH} levels deep; flatten the structure",
                        str(e.value)), str(e.value)


@pytest.mark.parametrize("loader", LOADERS, ids=lambda c: c.__name__)
def test_brackets_in_strings_and_comments_are_not_nesting(monkeypatch, loader):
    monkeypatch.setattr(yamlio, "_Loader", loader)
    text = ("a: '" + "[" * 100 + "'  # " + "{" * 100 + "\n" + 'b: "' + "{" * 100 + '\\""\n'
            + "c: don't [x]\n" + "d: " + "[" * 63 + "]" * 63 + "\n")
    data, _ = yamlio.parse_yaml(text, "p.yaml")
    assert data["a"] == "[" * 100 and data["b"] == "{" * 100 + '"' and data["c"] == "don't [x]"
