"""The profile's JSON Schema, for editors: `sky/profile.schema.json`, generated from the models that
validate a profile (launcher/profiles/schema.py `Profile`, which is payload.config's `RunConfig` plus
the launcher's sections) with pydantic's `model_json_schema()`, each key's docstring as its
description. `launch render` writes it with the renders (and `--check` fails while it is stale); each
profile names it in its `# yaml-language-server: $schema=../sky/profile.schema.json` line, so an
editor with the YAML language server (VS Code's YAML extension, neovim's yamlls, Zed, JetBrains) checks
keys and types and completes them as you type. The schema holds what a key accepts on its own; the
checks across keys (a `qlora` with `method: full`...) stay `launch validate`'s.
"""

from __future__ import annotations

import ast
import functools
import inspect
import json
import textwrap
from pathlib import Path

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema

from launcher import project

FILE = "profile.schema.json"
MODELINE = f"# yaml-language-server: $schema=../sky/{FILE}"
"""The line each profile in clusters/ carries (the path is relative to the profile's file)."""


def schema_path() -> Path:
    return project.sky_dir() / FILE


def schema_text() -> str:
    from launcher.profiles.schema import Profile

    schema = Profile.model_json_schema(schema_generator=_WithKeyDocs)
    schema = {"$schema": _WithKeyDocs.schema_dialect, "title": "launch profile (clusters/*.yaml)",
              **{k: v for k, v in schema.items() if k != "title"}}
    return json.dumps(schema, indent=2, ensure_ascii=False) + "\n"


class _WithKeyDocs(GenerateJsonSchema):
    """pydantic's generator, with each field's docstring (the string under it in the class) as its
    description, and without the titles it derives from field names ("Max Steps": noise in an editor)."""

    def model_schema(self, schema):
        out = super().model_schema(schema)
        docs = key_docs(schema["cls"])
        for name, prop in out.get("properties", {}).items():
            if name in docs and "description" not in prop:
                prop["description"] = docs[name]
        return out

    def field_title_should_be_set(self, schema) -> bool:
        return False


@functools.lru_cache(maxsize=None)
def key_docs(cls: type) -> dict[str, str]:
    """{field: docstring} of a model and the models it extends: the string literal right after a
    field's annotated assignment, as pydantic's `use_attribute_docstrings` reads it (that setting is off
    in the models: `launch` would parse their source on every start)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not (isinstance(klass, type) and issubclass(klass, BaseModel)) or klass is BaseModel:
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):  # no source (a built model): no docs, the schema stands
            continue
        body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
        for node, after in zip(body, body[1:]):
            if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr)
                    and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
                docs[node.target.id] = _paragraphs(after.value.value)
    return docs


def _paragraphs(doc: str) -> str:
    """A docstring's paragraphs, each on one line (an editor wraps them to its own width)."""
    return "\n\n".join(" ".join(p.split("\n")) for p in inspect.cleandoc(doc).split("\n\n"))
