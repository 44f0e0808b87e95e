"""README's command table lists exactly the commands `launch --help` lists, in the same order."""

import re
from pathlib import Path

from click.testing import CliRunner

from launcher.cli import cli

README = Path(__file__).resolve().parents[2] / "README.md"


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


def map_entries(section: str) -> list[str]:
    """The map's lines: a `- ` line with its indented continuation lines, joined."""
    entries = []
    for line in section.splitlines():
        if line.startswith("- "):
            entries.append(line)
        elif line.startswith("  ") and entries:
            entries[-1] += " " + line.strip()
    return entries


def test_architecture_map_matches_the_tree():
    """Every path the map names exists; every group folder of launcher/ and payload/ has one line that
    names each of its modules, and every top-level module is named by its path."""
    root = README.parent
    section = architecture_section()
    named = set(re.findall(r"`((?:launcher|payload|clusters|sky|requirements|scripts|bench|tests)/[^`\s<>]*)`", section))
    assert len(named) > 30
    missing = sorted(p for p in named if not (root / p).exists())
    assert not missing, f"README's architecture map names paths that do not exist: {missing}"
    entries = map_entries(section)
    problems = []
    for pkg in ("launcher", "payload"):
        for path in sorted((root / pkg).glob("*.py")):
            rel = path.relative_to(root).as_posix()
            if path.name != "__init__.py" and rel not in named:
                problems.append(f"{rel}: not on the map")
        for init in sorted((root / pkg).rglob("__init__.py")):
            folder = init.parent.relative_to(root).as_posix() + "/"
            if folder == f"{pkg}/":
                continue
            lines = [e for e in entries if e.startswith(f"- `{folder}`")]
            if len(lines) != 1:
                problems.append(f"{folder}: {len(lines)} lines on the map (one per group)")
                continue
            words = set(re.findall(r"`([\w./]+)`", lines[0]))
            problems += [f"{folder}{m.name}: not named on its group's line" for m in sorted(init.parent.glob("*.py"))
                         if m.name != "__init__.py" and m.stem not in words and m.name not in words]
    assert not problems, "README's architecture map and the tree differ:\n" + "\n".join(problems)
