"""GRPO reward functions: the built-in set and user functions named in the profile.

Every reward is called the way TRL's GRPOTrainer calls them: `f(prompts, completions, **columns)`
with the dataset's other columns as keyword lists (here `answer`), and returns one float per
completion. Completions are strings, or chat turns `[{"role": "assistant", "content": ...}]`.

- `exact_match`: the completion's answer (after `</think>`, inside `<answer>...</answer>` when
  present) equals the record's answer, ignoring case and surrounding space/punctuation.
- `number_match`: the last number in the completion equals the last number in the answer.
- `format`: the completion is `<think>...</think>` followed by a non-empty answer (or matches
  `grpo.format_regex`).
- `FILE.py:FUNCTION` (relative to the workdir) or `package.module:FUNCTION`: a user function.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import re
from pathlib import Path
from typing import Callable, Optional

from payload.errors import PayloadError

NUMBER = re.compile(r"-?\d+(?:,\d{3})*(?:\.\d+)?")
THINK_FORMAT = r"\s*<think>.*?</think>\s*\S.*"
ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.S)


def completion_text(completion) -> str:
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):  # conversational: the assistant turn(s)
        out = []
        for m in completion:
            c = m.get("content", "") if isinstance(m, dict) else m
            out.append(c if isinstance(c, str) else "".join(p.get("text") or "" for p in c if isinstance(p, dict)))
        return "".join(out)
    return str(completion)


def final_answer(text: str) -> str:
    """What the completion answers: after the last `</think>`, inside `<answer>` when present."""
    text = text.rsplit("</think>", 1)[-1]
    tagged = ANSWER_TAG.findall(text)
    return (tagged[-1] if tagged else text).strip()


def _norm(text: str) -> str:
    return text.strip().strip(".!?;:'\"").strip().lower()


def last_number(text: str) -> Optional[float]:
    found = NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def exact_match(prompts, completions, answer=None, **kwargs) -> list[float]:
    answers = answer if answer is not None else [""] * len(completions)
    return [1.0 if _norm(final_answer(completion_text(c))) == _norm(str(a)) else 0.0
            for c, a in zip(completions, answers)]


def number_match(prompts, completions, answer=None, **kwargs) -> list[float]:
    answers = answer if answer is not None else [""] * len(completions)
    out = []
    for c, a in zip(completions, answers):
        got, want = last_number(final_answer(completion_text(c))), last_number(str(a))
        out.append(1.0 if got is not None and want is not None and math.isclose(got, want, rel_tol=1e-6,
                                                                                abs_tol=1e-9) else 0.0)
    return out


def format_reward(pattern: Optional[str] = None) -> Callable:
    rx = re.compile(pattern or THINK_FORMAT, re.S)

    def format(prompts, completions, **kwargs) -> list[float]:  # noqa: A001 - the name TRL logs
        return [1.0 if rx.fullmatch(completion_text(c)) else 0.0 for c in completions]

    return format


BUILTIN = {"exact_match": lambda g: exact_match, "number_match": lambda g: number_match,
           "format": lambda g: format_reward(g.format_regex)}


def load_user_function(spec: str, base: Optional[Path] = None) -> Callable:
    """`FILE.py:FUNCTION` (relative to `base`, default the working directory) or `module:FUNCTION`."""
    target, _, name = spec.rpartition(":")
    if target.endswith(".py"):
        path = Path(target) if Path(target).is_absolute() else (base or Path.cwd()) / target
        if not path.is_file():
            raise PayloadError(f"grpo.rewards: {spec}: no file {path}; give a path relative to the workdir")
        mod_name = "launch_reward_" + re.sub(r"\W", "_", str(path))
        loader = importlib.util.spec_from_file_location(mod_name, path)
        module = importlib.util.module_from_spec(loader)
        try:
            loader.loader.exec_module(module)
        except Exception as e:  # noqa: BLE001 - the user's module: one line naming it
            raise PayloadError(f"grpo.rewards: {spec}: importing {path} failed: {type(e).__name__}: {e}") from None
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as e:
            raise PayloadError(f"grpo.rewards: {spec}: cannot import {target} ({e})") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise PayloadError(f"grpo.rewards: {spec}: {target} has no function {name!r}")
    return fn


def reward_functions(grpo, base: Optional[Path] = None) -> list[Callable]:
    """The functions named by `grpo.rewards`, in order (TRL names each after its __name__)."""
    out = []
    for spec in grpo.rewards:
        out.append(BUILTIN[spec](grpo) if spec in BUILTIN else load_user_function(spec, base))
    return out
