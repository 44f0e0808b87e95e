"""The shell scripts `make lint` gives shellcheck (scripts/lint.sh), one path a line: every script of the
checkout (git's files named *.sh, or whose first line runs sh or bash: CI's `.ci/run`, the emulated
cloud's shims), and the `setup` and `run` of each rendered task in sky/ (bash that SkyPilot runs on
every node), written as one file each into the folder given.

    python scripts/shell_files.py DIR
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
SHEBANG = re.compile(rb"#!\s*(/usr/bin/env\s+|/bin/|/usr/bin/)(ba)?sh\b")


def scripts(root: Path = REPO) -> list[str]:
    """The checkout's shell scripts, relative to `root`."""
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, text=True, check=True)
    out = []
    for name in sorted(filter(None, tracked.stdout.split("\0"))):
        path = root / name
        if not path.is_file() or path.is_symlink():
            continue
        with path.open("rb") as f:
            first = f.readline(128)
        if name.endswith(".sh") or SHEBANG.match(first):
            out.append(name)
    return out


def task_scripts(into: Path, root: Path = REPO) -> list[Path]:
    """Each rendered task's setup/run as a file of `into`."""
    out = []
    for task in sorted((root / "sky").glob("*.yaml")):
        doc = yaml.safe_load(task.read_text()) or {}
        for key in ("setup", "run"):
            if doc.get(key):
                path = into / f"{task.stem}.{key}.sh"
                path.write_text("# shellcheck shell=bash\n" + doc[key])
                out.append(path)
    return out


if __name__ == "__main__":
    for line in [*scripts(), *map(str, task_scripts(Path(sys.argv[1])))]:
        print(line)
