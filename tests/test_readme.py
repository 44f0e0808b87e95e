"""README's command table lists exactly the commands `launch --help` lists, in the same order."""

import re
from pathlib import Path

from click.testing import CliRunner

from launcher.cli import cli

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_commands() -> list[str]:
    """The first word after `launch` in each `| \\`launch X...` row of the command table."""
    rows = re.findall(r"^\| `launch ([a-z][a-z-]*)", README.read_text(), re.M)
    return list(dict.fromkeys(rows))


def help_commands() -> list[str]:
    out = CliRunner().invoke(cli, ["--help"], terminal_width=80).output
    commands = out.split("\nOptions:")[1]
    return re.findall(r"^  ([a-z][a-z-]*)  ", commands, re.M)


def test_readme_table_matches_launch_help():
    listed = help_commands()
    assert len(listed) >= 13 and {"ssh", "exec", "init"} <= set(listed)
    assert readme_commands() == listed


def test_help_is_grouped_by_workflow_with_one_example_each():
    out = CliRunner().invoke(cli, ["--help"], terminal_width=80).output
    sections = [line for line in out.splitlines() if re.fullmatch(r"[A-Z][a-z]+:", line)]
    assert sections[:4] == ["Options:", "Plan:", "Run:", "Results:"]
    assert out.index("\n  plan ") < out.index("\n  up ") < out.index("\n  down ") < out.index("\n  cost ")
    examples = re.findall(r"^\s+e\.g\. launch \S+", out, re.M)
    assert len(examples) == len(help_commands())


def architecture_section() -> str:
    text = README.read_text()
    start = text.index("\n## Architecture\n")
    return text[start:text.index("\n## ", start + 5)]


def test_architecture_map_matches_the_tree():
    """Every path the map names exists, and every module of launcher/ and payload/ is on the map (as
    itself, or named inside its package's line)."""
    root = README.parent
    section = architecture_section()
    named = set(re.findall(r"`((?:launcher|payload|clusters|sky|requirements|scripts|bench|tests)/[^`\s<>]*)`", section))
    assert len(named) > 60
    missing = sorted(p for p in named if not (root / p).exists())
    assert not missing, f"README's architecture map names paths that do not exist: {missing}"
    words = set(re.findall(r"`([\w./]+)`", section))
    unlisted = []
    for pkg in ("launcher", "payload"):
        for path in sorted((root / pkg).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if "/catalog/" in rel:
                continue  # one line for the catalog folder (its README documents it)
            package = rel.rsplit("/", 1)[0] + "/"
            listed = rel in named or path.name in words and package in named
            if not listed and not (path.name == "__init__.py" and package in named):
                unlisted.append(rel)
    assert not unlisted, f"modules missing from README's architecture map: {unlisted}"
