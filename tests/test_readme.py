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
