"""What may cross from this machine to a run: the two rules every entry point applies, stated once.

- Paths (`inside`): a path a profile, a `--set` value or a command line names is used only when it
  lies inside its root (the repo for data and image roots, `clusters/` for profiles that render into
  the committed `sky/`, `sky/` for what `launch render` writes) by every route.
- Environment values (`secret_shape`): a value shaped like a token of a hub or cloud the project talks
  to is a secret whatever its variable is called, and secrets are never written to a profile, a
  task, the run registry or the terminal: they stay in the user's environment and are passed by name.

One rule on every backend, the local one included: a path a profile names for a run (a data file, an
image root, a reward module) is used only when it is inside the project, and it is written from the repo
root. An absolute path is refused everywhere (naming the file, line and key, and the fix: its path from
the repo root when it is in the project, else a copy under data/ or a Hub dataset), `plan` included. Why
not let the local backend read `/home/me/data.jsonl` where it lies: (1) a run reads its files from the
repo's copy by their repo path on every backend, so a profile that runs locally runs unchanged on a
cloud, and the local backend stays the rehearsal of a cloud run rather than a backend with its own
rules; (2) the same file is already refused when reached through a link or `..` (a side door out of
the project): letting its absolute path through would reopen that door under another spelling; (3) a run's
provenance records its data files' sha256 only for files in the project (launcher/runs/experiment.py). `launch data
preview` loads profiles the same way and refuses the same paths.

A leaf module (standard library only), so the profile loader, the checks, the upload list and the
renderer can all apply the same rule.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Optional, Union


def inside(root: Path, value: Union[str, Path]) -> Optional[str]:
    """THE boundary rule: `value` (relative to `root`, or absolute; `~` expanded) as a clean relative
    POSIX path when it names a place strictly inside `root` by every route, else None.

    Both routes must stay inside: the path as written (`..` components applied), and the path the file
    system reaches (every symbolic link along it followed, at any level: the file itself, a directory
    above it, or `root` reached through a link). So `../x`, `/etc/x`, `data/link.jsonl -> /home/me/x`
    and `data/linkdir/x` with `data/linkdir -> /tmp` are all outside. `root` itself is not inside.
    What is outside is never read, listed, uploaded or written: callers refuse it, naming the key.
    `root` may be spelt another way than `value` spells it (the repo reached through a link to it,
    /home/u/proj -> /data/proj): as written, `value` is then inside a directory that is `root` resolved."""
    root = Path(os.path.normpath(Path(root).absolute()))
    p = Path(value).expanduser()
    p = Path(os.path.normpath(p if p.is_absolute() else root / p))
    try:
        real = root.resolve()
        p.resolve().relative_to(real)
        base = root if p.is_relative_to(root) else next((a for a in p.parents if a.resolve() == real), root)
        rel = p.relative_to(base)
    except (ValueError, OSError, RuntimeError):  # outside, or a link loop
        return None
    return rel.as_posix() if rel.parts and rel.parts[0] != ".." else None


# ------------------------------------------------------------------------------------------- secrets

PASSED_BY_NAME = ("HF_TOKEN", "WANDB_API_KEY")
"""The secrets a run may use: read from the user's environment at launch and passed by name only."""

# (what it looks like, the pattern, the variable launch passes it as or None). Anchored at a word
# boundary, searched anywhere in the value (a token inside a URL or a JSON blob is still a token).
SECRET_SHAPES: tuple[tuple[str, re.Pattern, Optional[str]], ...] = tuple(
    (what, re.compile(pattern), passed_as) for what, pattern, passed_as in (
        ("a Hugging Face token (hf_...)", r"(?<![A-Za-z0-9])hf_[A-Za-z0-9]{20,}", "HF_TOKEN"),
        ("a Hugging Face organization token (api_org_...)", r"(?<![A-Za-z0-9])api_org_[A-Za-z0-9]{20,}", "HF_TOKEN"),
        ("a GitHub token (ghp_/gho_/ghu_/ghs_/ghr_...)", r"(?<![A-Za-z0-9])gh[pousr]_[A-Za-z0-9]{30,}", None),
        ("a GitHub token (github_pat_...)", r"(?<![A-Za-z0-9])github_pat_[A-Za-z0-9_]{30,}", None),
        # either case, anywhere in the value (`key=<40 hex>`), but not a run of 40 inside a longer one (sha256)
        ("a W&B API key (40 hex digits)", r"(?<![A-Za-z0-9])(?:local-)?[0-9a-fA-F]{40}(?![A-Za-z0-9])",
         "WANDB_API_KEY"),
        ("a RunPod API key (rpa_...)", r"(?<![A-Za-z0-9])rpa_[A-Za-z0-9]{20,}", None),
        ("an AWS access key id (AKIA/ASIA...)", r"(?<![A-Z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Z0-9])", None),
        ("an OpenAI/Anthropic API key (sk-...)", r"(?<![A-Za-z0-9])sk-[A-Za-z0-9_-]{20,}", None),
        ("a Google API key (AIza...)", r"(?<![A-Za-z0-9])AIza[0-9A-Za-z_-]{35}", None),
        ("a private key (-----BEGIN ... PRIVATE KEY-----)", r"-----BEGIN[A-Z ]*PRIVATE KEY", None),
        ("a GCP service-account key (JSON with a private_key)", r'"private_key(?:_id)?"\s*:', None),
        ("a Slack token (xox...)", r"(?<![A-Za-z0-9])xox[abposr]-[A-Za-z0-9-]{10,}", None),
        ("a GitLab token (glpat-...)", r"(?<![A-Za-z0-9])glpat-[A-Za-z0-9_-]{20,}", None),
        ("a JSON web token (eyJ...)", r"(?<![A-Za-z0-9])eyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.", None),
    ))


def secret_shape(value: object) -> Optional[tuple[str, Optional[str]]]:
    """(what the value looks like, the variable launch passes it as or None) when `value` has the shape
    of a token of a hub or cloud (SECRET_SHAPES), else None. The value itself is never returned."""
    text = str(value).strip()
    for what, pattern, passed_as in SECRET_SHAPES:
        if pattern.search(text):
            return what, passed_as
    return None


def secret_refusal(name: str, value: object) -> Optional[str]:
    """One line naming variable `name` (never its value) and how to pass the secret instead, when its
    value is shaped like a token; else None. `launch up --env` and a profile's `envs:` both ask this."""
    shape = secret_shape(value)
    if shape is None:
        return None
    what, passed_as = shape
    if passed_as:
        how = (f"export {passed_as} in your shell instead: launch reads it from your environment at launch "
               "and passes it by name, never writing it")
    else:
        how = (f"a run is given secrets only by name ({', '.join(PASSED_BY_NAME)} from your environment), "
               "never in a profile, a task or the run registry; remove it")
    extra = "; if it is not a secret (a commit id), shorten it to 12 digits" if "hex" in what else ""
    return f"`{name}`'s value looks like {what}: {how}{extra}"
