"""Tables that fit the terminal: what a user copies (run ids, profile names, paths, dollar amounts) is
never cut; other columns wrap, and the least important ones are dropped when the terminal is narrow.

Every table command prints through `print_table(rows, columns, as_json)`, so `--json` is the same
rows everywhere. Layout is rich's (`Table`, `Measurement`); this module only decides which columns
are shown and how each may shrink:

- a `must_copy` column gets its widest cell as its minimum width and never wraps;
- other columns wrap (`overflow="fold"`) when the table is too wide;
- while the table's minimum width exceeds the console's, a column with nothing in it (every cell
  `-`) goes first, then the one with the highest `priority` number (0 = never dropped; a must-copy
  column with a priority may be dropped, never cut: `launch status` drops `profile` before it cuts a
  run id, which starts with the profile's name);
- columns are two spaces apart, with no margin at the table's edges: at 80 columns that is a column
  more than rich's default spacing (three) leaves room for;
- when even that does not fit, each row is printed as `header: value` lines, values whole.
"""

from __future__ import annotations

from launcher.term.units import json_text
from dataclasses import dataclass
from typing import Any, Callable, Optional, Union

import click

Cell = Union[str, "Text"]  # noqa: F821 - rich.text.Text


@dataclass(frozen=True)
class Column:
    name: str
    """Header."""
    key: Union[str, Callable[[dict], Any]]
    """A row key, or a function of the row giving the cell (str, printed literally, or a rich Text)."""
    must_copy: bool = False
    """A value users copy into commands (id, name, path, amount): never truncated, never wrapped."""
    priority: int = 0
    """0: always shown; higher numbers are dropped first when the terminal is too narrow."""
    justify: str = "left"
    wrap_min: int = 0
    """A wrapping column's narrowest width (default `WRAP_MIN`, or its widest cell if narrower)."""

    def cell(self, row: dict):
        from rich.text import Text

        value = self.key(row) if callable(self.key) else row.get(self.key)
        if isinstance(value, Text):
            return value
        return Text("-" if value is None else str(value))


def print_table(rows: list[dict], columns: list[Column], as_json: bool = False, *, console, json_value=None,
                title: Optional[str] = None) -> None:
    """`rows` as a table that fits `console` (launcher.term.ui.console(), the one Console), or as JSON
    (`json_value` when given, else the rows)."""
    if as_json:
        click.echo(json_text(rows if json_value is None else json_value))
        return
    cells = [[col.cell(r) for col in columns] for r in rows]
    shown = _shown(console, columns, cells, title)
    if shown is None:
        _print_records(console, columns, cells, title)
    else:
        console.print(_table(columns, shown, cells, title))


def fits(rows: list[dict], columns: list[Column], width: int) -> list[str]:
    """The headers `print_table` shows at `width` columns (for tests and `--help` text)."""
    from rich.console import Console

    shown = _shown(Console(width=width), columns, [[col.cell(r) for col in columns] for r in rows], None)
    return [columns[i].name for i in shown or []]


def _shown(console, columns: list[Column], cells: list[list], title: Optional[str]) -> Optional[list[int]]:
    """The columns that fit `console`: an empty one dropped first, then the highest `priority`; None
    when even the undroppable ones are too wide (then the rows are printed as records)."""
    shown = list(range(len(columns)))
    while _min_width(console, _table(columns, shown, cells, title)) > console.width:
        droppable = [i for i in shown if columns[i].priority > 0]
        if not droppable:
            return None
        shown.remove(max(droppable, key=lambda i: (_empty(r[i] for r in cells), columns[i].priority, i)))
    return shown


def _empty(cells) -> bool:
    """Nothing in any row of a column (each cell `-` or blank): it says nothing at any width."""
    return all(c.plain.strip() in ("", "-") for c in cells)


def _table(columns: list[Column], shown: list[int], cells: list[list], title: Optional[str]):
    from rich import box
    from rich.table import Table

    t = Table(box=box.SIMPLE_HEAD, padding=(0, 1), collapse_padding=True, pad_edge=False, title=title,
              show_edge=False)
    for i in shown:
        col = columns[i]
        if col.must_copy:
            widest = max([len(col.name), *(_widest_line(r[i]) for r in cells)])
            t.add_column(col.name, no_wrap=True, min_width=widest, justify=col.justify)
        else:
            t.add_column(col.name, overflow="fold", justify=col.justify, min_width=col.wrap_min or None)
    for r in cells:
        t.add_row(*(r[i] for i in shown))
    return t


def _widest_line(text) -> int:
    return max((line.cell_len for line in text.split("\n")), default=0)


WRAP_MIN = 10
"""The narrowest a wrapping column is allowed to get (or its header, or its widest cell, if narrower)."""


def _min_width(console, table) -> int:
    """The table's width with must-copy columns whole and the others folded to `WRAP_MIN`."""
    from rich.measure import Measurement

    total = table._extra_width  # noqa: SLF001 - rich's edges and separators (no public accessor); padding below
    for i, col in enumerate(table.columns):
        wide = console.options.update_width(10_000)
        widest = max([Measurement.get(console, wide, x).maximum for x in (col.header, *col.cells)])
        total += widest if col.no_wrap else min(widest, max(col.min_width or WRAP_MIN, len(str(col.header))))
        total += table._get_padding_width(i)  # noqa: SLF001 - collapsed between columns, none at the edges
    return total


def _print_records(c, columns: list[Column], cells: list[list], title: Optional[str]) -> None:
    """Too narrow for any table: one block per row, the first column as its head, values whole."""
    from rich.text import Text

    if title:
        c.print(Text(title, style="bold"))
    for r in cells:
        head = r[0].copy()
        head.stylize("bold")
        c.print(head, soft_wrap=True)
        for col, value in zip(columns[1:], r[1:]):
            c.print(Text.assemble(f"  {col.name}: ", value), soft_wrap=True)
