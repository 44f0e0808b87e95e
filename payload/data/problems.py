"""What is wrong with one record: the exceptions the readers and parsers raise, counted by `kind`."""

from __future__ import annotations

from typing import Any


class RecordError(Exception):
    """One record cannot be used. `kind` is the short category counted in the stats."""

    invalid = True  # counts against data.max_invalid_fraction

    def __init__(self, kind: str, detail: str = ""):
        self.kind = kind
        self.detail = detail
        super().__init__(f"{kind} ({detail})" if detail else kind)


class Dropped(RecordError):
    """A well-formed record removed by a filter (empty after transforms, too many tokens)."""

    invalid = False


def tname(v: Any) -> str:
    if v is None:
        return "null"
    return {str: "a string", int: "a number", float: "a number", bool: "a boolean", list: "a list",
            dict: "an object"}.get(type(v), type(v).__name__)
