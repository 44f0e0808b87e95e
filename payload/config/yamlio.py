"""Bounded YAML reading for profiles, run configs and `--set` values (torch-free, PyYAML only).

A YAML file is small, trusted-looking text that can still take a machine down: a few hundred bytes of
nested aliases expand to billions of nodes, a few KB of `[[[[` overflow the recursive composer, and
a binary or UTF-16 file fails deep inside the reader. `parse_yaml` refuses each of these before it
gets expensive, with one line naming the place (`where:line`) and the fix:

- size: at most `MAX_BYTES` (checked before reading the whole file),
- encoding: UTF-8 (a BOM is accepted), the first bad byte's line and column reported,
- nesting: at most `MAX_DEPTH` levels, counted by our own code whatever the parser: flow brackets
  (`[[[[`) in one linear pass over the text before any parser sees it (libyaml's scanner reads a
  flow collection far ahead and since PyYAML 6.0.4 stops at its own depth limit with its own
  wording), then every level on the event stream (no recursion), and again after alias expansion,
- aliases: at most `MAX_ALIASES`, and the document expanded through them at most `MAX_NODES` nodes;
  a recursive alias (`&a [*a]`) is refused,
- duplicate keys: a key given twice in one mapping is refused with both lines (YAML keeps the last).

It returns the data and `{key path tuple: 1-based line}` for error messages. libyaml is used when
PyYAML has it (about 10x faster; the pure-Python scanner is quadratic in nesting depth).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

MAX_BYTES = 1 << 20
MAX_DEPTH = 64
MAX_ALIASES = 256
MAX_NODES = 100_000

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_OPEN = (yaml.SequenceStartEvent, yaml.MappingStartEvent)
_CLOSE = (yaml.SequenceEndEvent, yaml.MappingEndEvent)
_FLOW_SPECIAL = re.compile(r"[\[\]{}\n'\"#]")


class YamlProblem(ValueError):
    """The text cannot be used; `str(e)` is one line `where[:line]: what; fix`."""


def read_yaml_file(path: str | Path) -> tuple[Any, dict[tuple, int]]:
    """Read and parse a YAML file within the bounds above."""
    return parse_yaml_bytes(read_bounded(path), str(path))


def read_bounded(path: str | Path) -> bytes:
    """A config file's bytes, refused before they are all read when larger than MAX_BYTES."""
    path = Path(path)
    if not path.is_file():
        raise YamlProblem(f"{path}: not a regular file; give the path of a .yaml file")
    with open(path, "rb") as f:
        raw = f.read(MAX_BYTES + 1)
    if len(raw) > MAX_BYTES:
        raise YamlProblem(f"{path}: larger than {MAX_BYTES // 1024} KB, too large for a config file; keep data "
                          "in data files (data.sources) and only settings here")
    return raw


def parse_yaml_bytes(raw: bytes, where: str) -> tuple[Any, dict[tuple, int]]:
    """(data, lines) of a file's bytes as read by `read_bounded` (UTF-8, then `parse_yaml`)."""
    return parse_yaml(decode_utf8(raw, where), where)


def decode_utf8(raw: bytes, where: str) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        column = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
        raise YamlProblem(f"{where}:{line}: not UTF-8 (byte 0x{raw[e.start]:02x} at column {column}); save the "
                          "file as UTF-8") from None
    return text.removeprefix("\ufeff")


def parse_yaml(text: str, where: str) -> tuple[Any, dict[tuple, int]]:
    """(data, lines) of one YAML document; raises YamlProblem (one line) instead of anything else."""
    if len(text) > MAX_BYTES:
        raise YamlProblem(f"{where}: larger than {MAX_BYTES // 1024} KB, too large for a config value")
    try:
        _check_events(text, where)
        loader = _Loader(text)
        try:
            node = loader.get_single_node()
            if node is None:
                return None, {}
            _check_expansion(node, where)
            _check_duplicate_keys(node, where)
            data = loader.construct_document(node)
        finally:
            loader.dispose()
    except yaml.reader.ReaderError as e:  # a control character: not text
        line = text.count("\n", 0, e.position) + 1
        raise YamlProblem(f"{where}:{line}: not valid YAML: character #x{e.character:04x} is not allowed in "
                          "YAML text; remove it (is this a text file?)") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
        at = f"{where}:{mark.line + 1}" if mark is not None else where
        what = getattr(e, "problem", None) or str(e)
        raise YamlProblem(f"{at}: not valid YAML: {' '.join(str(what).split())}") from None
    except YamlProblem:
        raise
    except (ValueError, TypeError, OverflowError) as e:  # e.g. a date `2024-13-45` the constructor rejects
        raise YamlProblem(f"{where}: not valid YAML: {' '.join(str(e).split())[:200]}; quote the value if it is "
                          "meant as text") from None
    return data, _lines(node)


def _too_deep(where: str, line: int) -> YamlProblem:
    return YamlProblem(f"{where}:{line}: nested more than {MAX_DEPTH} levels deep; flatten the structure")


def _check_flow_depth(text: str, where: str) -> None:
    """Refuse flow brackets nested deeper than MAX_DEPTH, before a parser reads ahead into them.

    Brackets inside quoted strings and comments do not count; a quote only opens a string where YAML
    allows one to start (after a space, a bracket, a comma or a colon), so `don't` opens nothing. It
    may overcount brackets in plain text, which only matters past MAX_DEPTH unclosed ones.
    """
    depth = 0
    line = 1
    skip_to = 0
    for m in _FLOW_SPECIAL.finditer(text):
        i, c = m.start(), m.group()
        if i < skip_to:
            continue
        if c == "\n":
            line += 1
        elif c in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                raise _too_deep(where, line)
        elif c in "]}":
            depth = max(0, depth - 1)
        elif i == 0 or text[i - 1] in " \t\n[{,:":  # a quote or comment starts here
            end = _skip_quoted(text, i) if c != "#" else text.find("\n", i)
            skip_to = len(text) if end < 0 else end
            line += text.count("\n", i, skip_to)


def _skip_quoted(text: str, start: int) -> int:
    """Index just past the string that opens at `start` ('..' with '' escapes, ".." with \\ escapes)."""
    quote = text[start]
    i = start + 1
    while True:
        j = text.find(quote, i)
        if j < 0:
            return len(text)
        if quote == "'" and text.startswith("''", j):
            i = j + 2
        elif quote == '"' and (j - start - 1 - len(text[start + 1:j].rstrip("\\"))) % 2:
            i = j + 1
        else:
            return j + 1


def _check_events(text: str, where: str) -> None:
    """Nesting depth and alias count from the event stream, stopping at the first excess."""
    _check_flow_depth(text, where)
    loader = _Loader(text)
    depth = aliases = 0
    try:
        while loader.check_event():
            ev = loader.get_event()
            if isinstance(ev, _OPEN):
                depth += 1
                if depth > MAX_DEPTH:
                    raise _too_deep(where, ev.start_mark.line + 1)
            elif isinstance(ev, _CLOSE):
                depth -= 1
            elif isinstance(ev, yaml.AliasEvent):
                aliases += 1
                if aliases > MAX_ALIASES:
                    raise YamlProblem(f"{where}:{ev.start_mark.line + 1}: more than {MAX_ALIASES} aliases (*name); "
                                      "write the values out")
    finally:
        loader.dispose()


def _check_expansion(root: yaml.Node, where: str) -> None:
    """Size and depth of the document with every alias expanded, computed once per distinct node."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    active: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        kids = _children(node)
        if done:
            active.discard(key)
            size[key] = 1 + sum(size[id(k)] for k in kids)
            depth[key] = 1 + max((depth[id(k)] for k in kids), default=0)
            if size[key] > MAX_NODES or depth[key] > MAX_DEPTH + 1:
                what = (f"expands to more than {MAX_NODES:,} values through its aliases" if size[key] > MAX_NODES
                        else f"nests more than {MAX_DEPTH} levels deep through its aliases")
                raise YamlProblem(f"{where}:{node.start_mark.line + 1}: this value {what}; write it out "
                                  "without aliases")
            continue
        if key in size:
            continue
        if key in active:
            raise YamlProblem(f"{where}:{node.start_mark.line + 1}: a recursive alias (a value that contains "
                              "itself); remove it")
        active.add(key)
        stack.append((node, True))
        stack.extend((k, False) for k in kids if id(k) not in size)


def _check_duplicate_keys(root: yaml.Node, where: str) -> None:
    """A key given twice in one mapping (YAML would keep the last one silently) is refused, naming both
    lines and the key's path. Keys a merge (`<<: *base`) brings in may be overridden: they are not
    in the mapping's own text."""
    seen_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, tuple]] = [(root, ())]
    while stack:
        node, prefix = stack.pop()
        if id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.MappingNode):
            first: dict[tuple, int] = {}
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode) and k.tag != "tag:yaml.org,2002:merge":
                    here = (k.tag, k.value)
                    if here in first:
                        path = ".".join(map(str, prefix + (k.value,)))
                        raise YamlProblem(f"{where}:{k.start_mark.line + 1}: key `{path}` is given twice (also at "
                                          f"line {first[here]}); YAML would silently keep the last one: keep one")
                    first[here] = k.start_mark.line + 1
                    stack.append((v, prefix + (k.value,)))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((v, prefix + (i,)) for i, v in enumerate(node.value))


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _lines(root: yaml.Node) -> dict[tuple, int]:
    """{key path: line} for every mapping key and sequence item (scalar keys only)."""
    lines: dict[tuple, int] = {}
    stack: list[tuple[yaml.Node, tuple]] = [(root, ())]
    while stack:
        node, prefix = stack.pop()
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                if isinstance(k, yaml.ScalarNode):
                    key = prefix + (k.value,)
                    lines.setdefault(key, k.start_mark.line + 1)
                    stack.append((v, key))
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                lines.setdefault(prefix + (i,), v.start_mark.line + 1)
                stack.append((v, prefix + (i,)))
    return lines
