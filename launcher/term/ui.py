"""Terminal output: one rich Console, `✓`/`✗` lines, tables, and the next useful commands."""

from __future__ import annotations

import errno
import functools
import re

from launcher.term.tables import Column, print_table
from launcher.term.units import duration, hours, money  # noqa: F401  (also used by callers through ui)


@functools.lru_cache(maxsize=1)
def console():
    return _console_class()(highlight=False)


@functools.lru_cache(maxsize=1)
def err_console():
    return _console_class()(stderr=True, highlight=False)


_TRAILING_SPACES = re.compile(r" +(?=\n)")


@functools.lru_cache(maxsize=1)
def _console_class():
    """rich's Console, except for a reader that has gone: rich exits 1 there (`on_broken_pipe`); the
    BrokenPipeError goes on to launcher/cli.py `closed_pipe_ends_quietly`, the one rule for every
    command's output (status 0, as a Unix tool stops when its reader stops); and no trailing spaces."""
    from rich.console import Console

    class _Console(Console):
        def _render_buffer(self, buffer) -> str:
            """No line ends in the spaces rich pads a table's last column with to its width (invisible on
            a terminal, not in a file or a pipe; removing them changes nothing seen)."""
            return _TRAILING_SPACES.sub("", super()._render_buffer(buffer))

        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError(errno.EPIPE, "the reader of launch's output has gone")

    return _Console


def printable(value) -> str:
    """User or remote text made safe for a terminal: control characters (ESC, BEL, CR, bidi overrides...)
    shown as `\\x1b`-style escapes instead of acting on the terminal; newlines and tabs kept. Every
    helper below that prints such text (esc, literal, cell) goes through here."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in "\n\t" else _escaped(c) for c in text)


def _escaped(c: str) -> str:
    return f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}"


def esc(value) -> str:
    """User or remote text for use inside a markup string: shown exactly, never read as markup."""
    from rich.markup import escape

    return escape(printable(value))


def literal(markup: str, *texts):
    """Our own markup (e.g. `[red]✗[/] `) followed by `texts` printed exactly as given (control
    characters escaped: `printable`)."""
    from rich.text import Text

    out = Text.from_markup(markup)
    for t in texts:
        out.append(printable(t))
    return out


def note(mark: str, *texts, out=None) -> None:
    """A `!`, `✓` or `✗` line that is no error (`mark`: our markup, e.g. "[yellow]![/] "; `texts`: printed
    literally, as by `literal`) on `out` (default: the console). On a terminal it is wrapped at the
    terminal's width under its text (a hanging indent); piped it is one line, whatever its length (a
    script greps it whole), as the one-line `✗` errors are."""
    from rich.table import Table
    from rich.text import Text

    out = out or console()  # every command's notes, ✓ and ✗ lines, and hints come through here
    if not out.is_terminal:
        out.print(literal(mark, *texts), soft_wrap=True)
        return
    head = Text.from_markup(mark)
    if not head.cell_len:  # nothing to hang the text under: wrapped at the terminal's width
        out.print(literal("", *texts))
        return
    grid = Table.grid()
    grid.add_column(no_wrap=True, width=head.cell_len)
    grid.add_column()
    grid.add_row(head, literal("", *texts))
    out.print(grid)


def cell(value):
    """A table cell holding user or remote text (rich would read a plain `str` cell as markup)."""
    from rich.text import Text

    return value if isinstance(value, Text) else Text("-" if value is None else printable(value))


def hints(*commands: str) -> None:
    """The next useful commands, each a `note`: whole on one line piped (a command is copied whole)."""
    for cmd in commands:
        note("  [dim]→[/] ", cmd)


def _columns():
    """`launch status`'s columns. The run id, its state and what it spent are always shown (the id and
    the dollars whole); at 80 columns the rest go in the order a user watching a run needs them least:
    backend first, then profile (the run id starts with its name), elapsed, the projected total, ETA,
    loss, and step last."""
    status = [
        Column("run", "id", must_copy=True),
        Column("profile", "profile", must_copy=True, priority=6),  # the run id starts with it
        Column("backend", "backend", priority=7),
        Column("state", _state, must_copy=True),  # one word of the state vocabulary: never folded
        Column("step", _step, priority=1, justify="right"),
        Column("loss", lambda r: f"{r['loss']:.4g}" if isinstance(r.get("loss"), (int, float)) else "-",
               priority=2, justify="right"),  # as `launch compare` and `launch down` round it
        Column("elapsed", lambda r: duration(r.get("elapsed_s")), priority=5, justify="right"),
        Column("spent", lambda r: money(r.get("cost_usd")), must_copy=True, justify="right"),
        Column("ETA", lambda r: duration(r.get("eta_s")), priority=3, justify="right"),
        Column("projected", lambda r: money(r.get("projected_cost_usd")), priority=4, justify="right"),
    ]
    return status


def _state(r: dict):
    from rich.text import Text

    color = {"running": "cyan", "completed": "green", "failed": "red", "preempted": "yellow",
             "budget_exhausted": "yellow"}.get(r["state"], "white")
    return Text(str(r["state"]), style=color)


def _step(r: dict) -> str:
    if r.get("step") is not None and r.get("max_steps"):
        step = f"{r['step']}/{r['max_steps']}"
    else:
        step = str(r["step"]) if r.get("step") is not None else "-"
    stage = r.get("stage")
    if isinstance(stage, dict) and stage.get("name"):  # a staged run: the stage and its place, then its step
        step = f"{stage['name']} {stage.get('index')}/{stage.get('of')} {step}"
    return printable(step)  # the stage's name comes from the run's status.json


def print_status(rows: list[dict], as_json: bool = False, json_value=None) -> None:
    """`launch status`: every run id, profile and dollar amount whole at any width (launcher.term.tables)."""
    print_table(rows, STATUS_COLUMNS, as_json, console=console(), json_value=json_value)


STATUS_COLUMNS = _columns()
