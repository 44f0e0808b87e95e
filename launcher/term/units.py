"""How sizes, dollars and durations are written everywhere launch prints them: one owner each (and
`number`, what of a run's own JSON is a number to print, for `status`, `down` and `compare` alike).
A leaf module (standard library only, and the payload's money formatter, which the machine's budget
messages use too), so any layer can use it without importing another's."""

from __future__ import annotations

import json
import math


def human_size(n: float) -> str:
    """Bytes in decimal units: `36 B`, `55.9 KB`, `1.2 GB`."""
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1000
    return f"{n} B"


def number(value):
    """A number read from a run's own JSON (status.json, its summary, metrics), or None: a string, a
    bool or anything else there is no number, and must not crash what prints it (`money`, `duration`)."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def money(x) -> str:
    """Dollars, cents shown; sub-cent amounts to four places; `-` when unknown: the payload's
    formatter (payload/volume/money.py `usd`), so the machine's budget lines and `launch` agree."""
    from payload.volume.money import usd

    return usd(x)


def duration(seconds) -> str:
    """`1h05m`, `4m09s`, `12s`; `-` when unknown."""
    if seconds is None:
        return "-"
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{s:02d}s" if m else f"{s}s")


def hours(h) -> str:
    """`45 min` under an hour, else `2.4 h`."""
    return f"{h * 60:.0f} min" if h < 1 else f"{h:.1f} h"


def hours_column(h) -> str:
    """Hours in a table's `hours` column: `2.4`, a plan under six minutes to two places (`0.02`), under
    36 seconds `<0.01`, never `0.0` beside the dollars that those minutes cost."""
    if h >= 0.1:
        return f"{h:.1f}"
    return f"{h:.2f}" if h >= 0.01 else "<0.01"


def money_row(values) -> list[str]:
    """Dollars side by side (a table's row or column): one precision for all, four places when any
    amount under a cent is among them (`$0.0042` beside `$0.0100`, not beside `$0.01`)."""
    known = [number(v) for v in values]
    if not any(v is not None and 0 < abs(v) < 0.01 for v in known):
        return [money(v) for v in values]
    return [money(v) if v is None or abs(v) < 0.0001 else f"${v:,.4f}" for v in known]  # `<$0.0001` kept


def json_text(value, indent: int = 2) -> str:
    """Every `--json` output: strict JSON (RFC 8259), so any JSON reader takes it. A number that is not
    finite (an infinite budget recorded by an older version, a NaN loss) is written `null`, never
    Python's `Infinity`/`NaN`; anything else that is not JSON (a path, a datetime) as its text."""
    def strict(x):
        if isinstance(x, float) and not math.isfinite(x):
            return None
        if isinstance(x, dict):
            return {k: strict(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [strict(v) for v in x]
        return x

    return json.dumps(strict(value), indent=indent, default=str, allow_nan=False)
