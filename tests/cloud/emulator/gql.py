"""The small part of GraphQL (spec.graphql.org, October 2021) the emulated RunPod API needs: parse a
document, check its selections against a schema, and shape resolved values to what was selected.

It answers as a GraphQL server does, so the real `runpod` SDK reads it as it reads api.runpod.io:
- the SDK writes every argument inline (runpod/api/mutations/pods.py: strings, numbers, booleans,
  enums such as `cloudType: ALL`, `null`, lists and nested input objects such as `env: [{ key: "K",
  value: "V" }]`); variables (`$input`) and aliases (`d0: lowestPrice(...)`, used by the launcher's
  launcher/backends/skypilot/runpod_volumes.py gpu_stock) are parsed too;
- a field the schema lacks is a validation error naming it, worded as graphql-js words it
  (`Cannot query field "x" on type "Pod".`), and nothing is executed;
- the result holds exactly the selected fields, under their aliases, in the order asked.
Fragments and directives are not supported: they are reported as an error that names them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

SCALARS = {"String", "Int", "Float", "Boolean", "ID", "JSON", "Void"}


class GraphQLError(Exception):
    """One entry of a response's `errors` list."""

    def __init__(self, message: str, path: list | None = None):
        super().__init__(message)
        self.message = message
        self.path = path

    def as_dict(self) -> dict:
        d: dict = {"message": self.message}
        if self.path:
            d["path"] = self.path
        return d


class Enum(str):
    """An enum literal (`cloudType: ALL`): a str that remembers it was written without quotes."""


@dataclass
class Field:
    name: str
    alias: str | None = None
    args: dict = field(default_factory=dict)
    selections: list[Field] | None = None

    @property
    def key(self) -> str:
        return self.alias or self.name


@dataclass
class Operation:
    kind: str  # "query" | "mutation"
    name: str | None
    selections: list[Field]


# ---------------------------------------------------------------------------------------- lexer
_TOKEN = re.compile(r"""
    (?P<ignored>[\s,\ufeff]+|\#[^\n\r]*)
  | (?P<block>\"\"\"(?:\\\"\"\"|[^"]|"(?!""))*\"\"\")
  | (?P<string>"(?:[^"\\\n\r]|\\.)*")
  | (?P<number>-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)
  | (?P<name>[_A-Za-z][_0-9A-Za-z]*)
  | (?P<punct>\.\.\.|[!$&():=@\[\]{|}])
""", re.VERBOSE)
_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


def _unescape(body: str) -> str:
    out, i = [], 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        nxt = body[i + 1]
        if nxt in _ESCAPES:
            out.append(_ESCAPES[nxt])
            i += 2
        elif nxt == "u" and re.fullmatch(r"[0-9A-Fa-f]{4}", body[i + 2:i + 6]):
            out.append(chr(int(body[i + 2:i + 6], 16)))
            i += 6
        else:  # graphql-js: "Invalid character escape sequence"
            raise GraphQLError(f"Syntax Error: Invalid character escape sequence: \"\\{nxt}\".")
    return "".join(out)


def _tokens(source: str) -> list[tuple[str, str]]:
    toks, pos = [], 0
    while pos < len(source):
        m = _TOKEN.match(source, pos)
        if not m:
            ch = source[pos]
            what = "Unterminated string." if ch == '"' else f"Unexpected character: {ch!r}."
            raise GraphQLError(f"Syntax Error: {what}")
        pos = m.end()
        kind = m.lastgroup
        if kind == "ignored":
            continue
        text = m.group()
        if kind == "string":
            toks.append(("string", _unescape(text[1:-1])))
        elif kind == "block":
            toks.append(("string", text[3:-3].replace('\\"""', '"""')))
        else:
            toks.append((kind, text))
    toks.append(("eof", ""))
    return toks


# --------------------------------------------------------------------------------------- parser
class _Parser:
    def __init__(self, source: str, variables: dict | None):
        self.toks = _tokens(source)
        self.i = 0
        self.variables = variables or {}

    def peek(self, value: str | None = None, kind: str | None = None) -> bool:
        k, v = self.toks[self.i]
        return (value is None or v == value and k in ("punct", "name")) and (kind is None or k == kind)

    def take(self, value: str | None = None, kind: str | None = None) -> str:
        k, v = self.toks[self.i]
        if not self.peek(value, kind):
            want = value or kind
            got = "<EOF>" if k == "eof" else repr(v)
            raise GraphQLError(f"Syntax Error: Expected {want}, found {got}.")
        self.i += 1
        return v

    def document(self) -> list[Operation]:
        ops = []
        while not self.peek(kind="eof"):
            ops.append(self.operation())
        if not ops:
            raise GraphQLError("Syntax Error: Unexpected <EOF>.")
        return ops

    def operation(self) -> Operation:
        if self.peek("{"):
            return Operation("query", None, self.selection_set())
        kind = self.take(kind="name")
        if kind == "fragment":
            raise GraphQLError("Fragments are not supported by the emulated RunPod API.")
        if kind not in ("query", "mutation", "subscription"):
            raise GraphQLError(f'Syntax Error: Unexpected Name "{kind}".')
        name = self.take(kind="name") if self.peek(kind="name") else None
        if self.peek("("):  # variable definitions: ($input: PodFilter! = {...}, ...)
            self.take("(")
            while not self.peek(")"):
                self.take("$")
                var = self.take(kind="name")
                self.take(":")
                self.type_ref()
                if self.peek("="):
                    self.take("=")
                    default = self.value(const=True)
                    self.variables.setdefault(var, default)
            self.take(")")
        return Operation(kind, name, self.selection_set())

    def type_ref(self) -> None:
        if self.peek("["):
            self.take("[")
            self.type_ref()
            self.take("]")
        else:
            self.take(kind="name")
        if self.peek("!"):
            self.take("!")

    def selection_set(self) -> list[Field]:
        self.take("{")
        out = []
        while not self.peek("}"):
            if self.peek("..."):
                raise GraphQLError("Fragments are not supported by the emulated RunPod API.")
            if self.peek("@"):
                raise GraphQLError("Directives are not supported by the emulated RunPod API.")
            name = self.take(kind="name")
            alias = None
            if self.peek(":"):
                self.take(":")
                alias, name = name, self.take(kind="name")
            args = self.arguments() if self.peek("(") else {}
            if self.peek("@"):
                raise GraphQLError("Directives are not supported by the emulated RunPod API.")
            sub = self.selection_set() if self.peek("{") else None
            out.append(Field(name, alias, args, sub))
        self.take("}")
        if not out:
            raise GraphQLError("Syntax Error: Expected Name, found \"}\".")
        return out

    def arguments(self) -> dict:
        self.take("(")
        args = {}
        while not self.peek(")"):
            key = self.take(kind="name")
            self.take(":")
            args[key] = self.value()
        self.take(")")
        return args

    def value(self, const: bool = False) -> Any:
        k, v = self.toks[self.i]
        if k == "punct" and v == "$" and not const:
            self.take("$")
            var = self.take(kind="name")
            if var not in self.variables:
                raise GraphQLError(f'Variable "${var}" was not provided.')
            return self.variables[var]
        if k == "punct" and v == "[":
            self.take("[")
            items = []
            while not self.peek("]"):
                items.append(self.value(const))
            self.take("]")
            return items
        if k == "punct" and v == "{":
            self.take("{")
            obj = {}
            while not self.peek("}"):
                key = self.take(kind="name")
                self.take(":")
                obj[key] = self.value(const)
            self.take("}")
            return obj
        self.i += 1
        if k == "string":
            return v
        if k == "number":
            return float(v) if any(c in v for c in ".eE") else int(v)
        if k == "name":
            return {"true": True, "false": False, "null": None}[v] if v in ("true", "false", "null") \
                else Enum(v)
        raise GraphQLError(f"Syntax Error: Unexpected {'<EOF>' if k == 'eof' else repr(v)}.")


def parse(query: str, variables: dict | None = None, operation_name: str | None = None) -> Operation:
    """The operation to run: the one named `operation_name`, else the document's only one."""
    ops = _Parser(query, variables).document()
    if operation_name:
        found = [o for o in ops if o.name == operation_name]
        if not found:
            raise GraphQLError(f'Unknown operation named "{operation_name}".')
        return found[0]
    if len(ops) > 1:
        raise GraphQLError("Must provide operation name if query contains multiple operations.")
    return ops[0]


# ---------------------------------------------------------------------------- validate / shape
def _unwrap(type_ref: str) -> tuple[str, bool]:
    """'[Pod]' -> ('Pod', True); 'Pod' -> ('Pod', False)."""
    if type_ref.startswith("["):
        return type_ref[1:-1], True
    return type_ref, False


def validate(schema: dict[str, dict[str, str]], type_name: str, selections: list[Field]) -> None:
    """Every selected field exists on its type, objects have a selection and leaves none (graphql-js'
    FieldsOnCorrectType and ScalarLeafs rules, in its words)."""
    fields = schema[type_name]
    for f in selections:
        if f.name == "__typename":
            continue
        if f.name not in fields:
            raise GraphQLError(f'Cannot query field "{f.name}" on type "{type_name}".')
        inner, _ = _unwrap(fields[f.name])
        if inner in SCALARS:
            if f.selections is not None:
                raise GraphQLError(f'Field "{f.name}" must not have a selection since type '
                                   f'"{fields[f.name]}" has no subfields.')
        elif f.selections is None:
            raise GraphQLError(f'Field "{f.name}" of type "{fields[f.name]}" must have a selection of '
                               f'subfields. Did you mean "{f.name} {{ ... }}"?')
        else:
            validate(schema, inner, f.selections)


def shape(schema: dict[str, dict[str, str]], type_ref: str, value: Any, selections: list[Field] | None,
          path: list) -> Any:
    """`value` (dicts holding every field; a field that takes arguments is a callable of them)
    reduced to the selected fields, keyed by alias."""
    if value is None:
        return None
    inner, is_list = _unwrap(type_ref)
    if is_list:
        return [shape(schema, inner, v, selections, path + [i]) for i, v in enumerate(value)]
    if inner in SCALARS:
        return value
    out = {}
    for f in selections or []:
        if f.name == "__typename":
            out[f.key] = inner
            continue
        v = value.get(f.name)
        if callable(v):
            v = v(f.args)
        out[f.key] = shape(schema, schema[inner][f.name], v, f.selections, path + [f.key])
    return out
