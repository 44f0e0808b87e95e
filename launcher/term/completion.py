"""Shell completion: `launch completion bash|zsh|fish` prints the script to source, and every argument
that takes a profile or a run completes its names.

The script is click's own (`_LAUNCH_COMPLETE`): on each TAB the shell runs `launch` with the words typed
so far, and click answers from the command tree. This module adds the names click cannot know, profile
names and run ids, from the sources launcher/cli.py hands over (the project's clusters/ and the local
run registry, read as they are: no backend is asked, no SkyPilot imported, so a TAB costs one short
process). Arguments are found by the names the commands give them (`profile`, `run_id`, a PROFILE
metavar), so a new command that takes a run completes its ids without a line here.
"""

from __future__ import annotations

from typing import Callable, Iterable

import click
from click.shell_completion import CompletionItem, get_completion_class

SHELLS = ("bash", "zsh", "fish")
COMPLETE_VAR = "_LAUNCH_COMPLETE"

# How to install each script, printed with it (the shells' own places for completions).
_INSTALL = {
    "bash": 'eval "$(launch completion bash)"   # in ~/.bashrc',
    "zsh": 'eval "$(launch completion zsh)"    # in ~/.zshrc, after compinit',
    "fish": "launch completion fish > ~/.config/fish/completions/launch.fish",
}


class Completed(click.types.StringParamType):
    """A string argument, as before, whose values complete from `choices()`: (value, help) pairs. A
    completion never fails the TAB: whatever `choices` raises (an unreadable registry, a broken
    clusters/) completes nothing rather than printing into the user's command line."""

    def __init__(self, name: str, choices: Callable[[], Iterable[tuple[str, str]]], paths: bool = False):
        self.name, self.choices, self.paths = name, choices, paths

    def shell_complete(self, ctx, param, incomplete):
        if self.paths and (incomplete.startswith((".", "/", "~")) or "/" in incomplete):
            return [CompletionItem(incomplete, type="file")]  # a path to a .yaml file: the shell's own
        try:
            choices = list(self.choices())
        except Exception:  # noqa: BLE001 - see docstring
            return []
        given = _given(ctx, param)
        return [CompletionItem(value, help=note or None) for value, note in choices
                if value.startswith(incomplete) and value not in given]


def _given(ctx, param) -> set:
    """The values already typed for a many-valued argument (`launch compare A B <TAB>` offers neither)."""
    value = ctx.params.get(param.name) if param.nargs != 1 else None
    return set(value or ())


def attach(group: click.Group, profiles, runs, sources=None) -> None:
    """Give every argument and option of the tree that takes a profile (`profiles()`: names) or a run
    (`runs()`: (id, help) pairs, the most recent first) its completion; `launch init --from` (a PROFILE
    option) takes `sources()` (the profiles and the shipped examples), else the profiles."""
    profile = Completed("profile", lambda: ((n, "") for n in profiles()), paths=True)
    source = Completed("profile", lambda: ((n, "") for n in (sources or profiles)()), paths=True)
    run = Completed("run", runs)
    for param in _params(group):
        if type(param.type) is not click.types.StringParamType:
            continue
        if param.name in ("profile", "profiles"):
            param.type = profile
        elif param.metavar == "PROFILE":
            param.type = source
        elif param.name in ("run_id", "run_ids"):
            param.type = run


def _params(cmd):
    yield from cmd.params
    for sub in getattr(cmd, "commands", {}).values():
        yield from _params(sub)


@click.command()
@click.argument("shell", type=click.Choice(SHELLS))
@click.pass_context
def completion(ctx, shell):
    """Print the shell completion script (commands, options, profiles, run ids) for bash, zsh or fish.

    \b
      bash: eval "$(launch completion bash)"   in ~/.bashrc
      zsh:  eval "$(launch completion zsh)"    in ~/.zshrc, after compinit
      fish: launch completion fish > ~/.config/fish/completions/launch.fish

    Example: launch completion bash
    """
    root = ctx.find_root()
    script = get_completion_class(shell)(root.command, {}, root.info_name or "launch", COMPLETE_VAR).source()
    # the note goes last: zsh reads `#compdef` on a completion file's first line
    click.echo(script.rstrip("\n"))
    click.echo(f"# launch's {shell} completion; install: {_INSTALL[shell]}")
