"""Where things are: the user's project, and what this install of `launch` ships.

A project is a directory that holds `clusters/` (its profiles), found as git finds `.git`: the working
directory, then each directory above it, the nearest one wins. `--project DIR` (which sets
LAUNCH_PROJECT for the command and everything it starts) or LAUNCH_PROJECT itself names it instead.
Everything a run takes from this machine is the project's: profiles (`clusters/`), renders (`sky/`),
fetched results (`artifacts/`), and the data files a profile names, which lie inside the project
(launcher/profiles/boundary.py) and are written relative to its root. Nothing is ever read from or
written into the installed package for a run, except what the package ships: the payload that runs on
the GPU machine (`payload_dir`), the catalog snapshot, and the example profiles (`examples_dir`) that
`launch init NAME --from EXAMPLE` copies into a project.

This checkout is a project too: its `clusters/` are the shipped examples, so `make demo` and the tests
run from it as a user's project runs. A leaf module (standard library only).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

ENV = "LAUNCH_PROJECT"
MARKER = "clusters"
PACKAGE_ROOT = Path(__file__).resolve().parents[1]
"""The directory holding the `launcher` and `payload` packages of this install (site-packages, or a
checkout for an editable install)."""


class NoProject(Exception):
    """Raised where a command needs a project and none is found; its text is the one line to show."""


def find(start: Optional[Path] = None) -> Optional[Path]:
    """The project for `start` (default: the working directory): LAUNCH_PROJECT when set, else the
    nearest directory from `start` up that holds `clusters/`; None when there is none."""
    named = os.environ.get(ENV)
    if named:
        return Path(named).expanduser().absolute()
    here = Path(start or Path.cwd()).absolute()
    for d in (here, *here.parents):
        if (d / MARKER).is_dir():
            return d
    return None


def root() -> Path:
    """The project's root, or NoProject with the one line that says how to make one."""
    found = find()
    if found is None:
        raise NoProject(f"no launch project in {Path.cwd()} or above it (a project is a directory with "
                        f"clusters/): `launch init NAME --from local-demo` makes one here; or cd into "
                        f"your project, or name it with --project DIR")
    if not (found / MARKER).is_dir():
        raise NoProject(f"{ENV}/--project names {found}, which has no clusters/: `launch init NAME --from "
                        f"local-demo` there makes one, or name the directory that holds clusters/")
    return found


def clusters_dir() -> Path:
    return root() / MARKER


def sky_dir() -> Path:
    return root() / "sky"


def artifacts_dir() -> Path:
    """Where fetched results go by default: the project's artifacts/, or ./artifacts outside one."""
    found = find()
    return (found / "artifacts") if found is not None and (found / MARKER).is_dir() else Path("artifacts")


def payload_dir() -> Path:
    """The payload this install ships (what every run uploads and runs)."""
    return PACKAGE_ROOT / "payload"


def examples_dir() -> Path:
    """The example profiles this install ships: the checkout's clusters/ for an editable install, the
    wheel's launcher/examples/ (the same files, as package data) for an installed one."""
    shipped = PACKAGE_ROOT / "launcher" / "examples"
    return shipped if shipped.is_dir() else PACKAGE_ROOT / MARKER


def example_names() -> list[str]:
    return sorted(p.stem for p in examples_dir().glob("*.yaml") if p.is_file() and not p.is_symlink())


def is_checkout() -> bool:
    """Whether this install runs from the launch checkout (an editable install) rather than a wheel."""
    return (PACKAGE_ROOT / "pyproject.toml").is_file() and (PACKAGE_ROOT / MARKER).is_dir()


def artifacts_default() -> str:
    """`--dest`'s default (click calls it when the option is not given)."""
    return str(artifacts_dir())
