"""A run config file to a `RunConfig` and back, with errors that name the file, line and key.

`load_run_config` is what the payload reads its `--config` with (a resolved run config, or a
profile: `cluster:`/`budget:` are ignored here); the launcher's profile loader
(launcher/profiles/profile.py) uses the same pieces: `load_yaml_with_lines` (bounded YAML, with the
line of every key), `format_validation_errors` (one `file:line: key.path: message` per problem, an
unknown key with the key meant: `suggest_keys`), `ConfigError`. `dump_run_config` writes the
resolved form `launch render` ships.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import yaml
from pydantic import BaseModel

from payload.config.runconfig import RunConfig


class ConfigError(Exception):
    """A config file is invalid. `problems` is a list of one-line messages (file:line: key: what)."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


def load_yaml_with_lines(path: Path, raw: Optional[bytes] = None) -> tuple[dict, dict[tuple, int]]:
    """Parse a YAML config file (bounded: size, UTF-8, depth, aliases; see `payload.config.yamlio`) and return
    (data, {key path tuple: 1-based line}) for error messages. `raw`: the file's bytes when they were
    already read (`yamlio.read_bounded`: a profile is read from disk once)."""
    from payload.config.yamlio import YamlProblem, parse_yaml_bytes, read_yaml_file

    try:
        data, lines = read_yaml_file(path) if raw is None else parse_yaml_bytes(raw, str(path))
    except YamlProblem as e:
        raise ConfigError([str(e)]) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError([f"{path}:1: the file must be a mapping of sections (data:, model:, train:, ...)"])
    return data, lines


def line_for(lines: dict[tuple, int], loc: tuple) -> Optional[int]:
    """Closest known line for a key path (falls back to the parent key)."""
    loc = tuple(loc)
    while loc:
        if loc in lines:
            return lines[loc]
        loc = loc[:-1]
    return None


def load_run_config(path: str | os.PathLike, env: Optional[dict] = None) -> RunConfig:
    """Load a resolved run config (or a profile: `cluster:`/`budget:` are ignored here) for the payload."""
    from pydantic import ValidationError

    path = Path(path)
    if not path.is_file():
        raise ConfigError([f"{path}: no such config file"])
    data, lines = load_yaml_with_lines(path)
    data = {k: v for k, v in data.items() if k not in ("cluster", "budget")}
    try:
        cfg = RunConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_validation_errors(e, path, lines)) from None
    return cfg.with_env(env)


def format_validation_errors(err, path, lines, root=None, where=None) -> list[str]:
    """pydantic ValidationError -> one line per problem: `file:line: key.path: message`. `where(loc)`,
    when given, names the place of a key instead (e.g. `--set train.lr` for a key set on the command
    line: launcher/profiles/profile.py)."""
    out = []
    for e in err.errors():
        loc = tuple(x for x in e["loc"] if not (isinstance(x, str) and "[" in x))
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key" + _did_you_mean(root or RunConfig, loc)
        elif e["type"] == "finite_number":  # Strict: .inf, .nan, 1e400
            msg = "must be a finite number (not .inf, .nan or beyond 1e308); give a plain number"
        out.append(f"{where(loc) if where else place(path, lines, loc)}: {msg}")
    return out


def place(path, lines, loc: tuple) -> str:
    """`file:line: key.path` of a key (the closest line known; the file alone when none is)."""
    line, key = line_for(lines, loc), ".".join(str(x) for x in loc) or "(top level)"
    return f"{path}:{line}: {key}" if line else f"{path}: {key}"


def _did_you_mean(root, loc: tuple) -> str:
    model = _model_at(root, loc[:-1])
    if model is None:
        return ""
    section = "".join(f"{x}." for x in loc[:-1])
    close = suggest_keys(str(loc[-1]), list(model.model_fields))
    if close:
        named = [f"`{section}{k}`" for k in close]
        return f"; did you mean {' or '.join([', '.join(named[:-1]), named[-1]] if len(named) > 1 else named)}?"
    return f"; valid keys: {', '.join(model.model_fields)}"


def suggest_keys(typed: str, names: list[str]) -> list[str]:
    """The keys among `names` (one section's) that `typed` most likely meant, best first, at most 3: the
    same key spelt otherwise (`Learning-Rate`), an abbreviation of every word (`lr`, `grad_accum_steps`),
    of some words (`warmup`, `accum_steps`), else a near spelling (difflib: `lerning_rate`)."""
    import difflib

    t = typed.lower().replace("-", "_")
    same = [n for n in names if n.lower() == t]
    if same:
        return same
    if len(t.replace("_", "")) >= 2:
        for whole in (True, False):
            hits = [n for n in names if _abbreviates(t, n.lower().split("_"), whole)]
            if 0 < len(hits) <= 3:
                return hits
    return difflib.get_close_matches(typed, names, n=1, cutoff=0.6)


def _abbreviates(t: str, words: list[str], whole: bool) -> bool:
    """Whether `t` is read as leading letters of `words` in order (`lr`: learning_rate; an `_` in `t`
    starts a new word): of every word when `whole`, else of some of them (skipping and stopping early)."""
    t = t.lstrip("_")
    if not t:
        return not whole or not words
    for j, word in enumerate(words if not whole else words[:1]):
        for k in range(min(len(t), len(word)), 0, -1):
            if "_" not in t[:k] and word.startswith(t[:k]) and _abbreviates(t[k:], words[j + 1:], whole):
                return True
    return False


def _model_at(model, loc: tuple):
    """Walk the schema along a key path (skipping list indices) to the model that owns the last key."""
    import typing

    for part in loc:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part) if hasattr(model, "model_fields") else None
        if field is None:
            return None
        ann = field.annotation
        candidates = [ann, *typing.get_args(ann)]
        for sub in list(candidates):
            candidates.extend(typing.get_args(sub))
        nxt = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if nxt is None:
            return None
        model = nxt
    return model


def dump_run_config(cfg: RunConfig) -> str:
    """The resolved YAML form (all defaults filled) that the payload reads."""
    body = cfg.model_dump(mode="json", exclude=None if cfg.stages else {"stages"})  # no stages: as before stages
    return yaml.safe_dump(body, sort_keys=False, width=100)
