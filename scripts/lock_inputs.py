"""Is each lock as new as its inputs? `--write` records the inputs' digests in the lock's header
(`make lock` calls it after resolving); `--check` (`make lock-check`, CI) fails while a lock is older
than what it was resolved from, naming the input that changed and the command that refreshes it.

Only what changes a resolution is digested: requirement lines without comments or blank lines, and
from pyproject.toml the `[project]` dependencies and requires-python. Editing a comment needs no
re-lock; adding, removing or re-pinning a package does. Standard library only (runs before install).

Also: the launcher's lock and the `sky` CLI's lock (requirements/sky-cli.lock, its own environment
because of click) pin the same SkyPilot, since `launch` and `sky` share one API server and one ~/.sky.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# lock -> its inputs, in the order `make lock` passes them
LOCKS = {
    "requirements/dev.lock": ("pyproject.toml", "requirements/dev.in", "requirements/overrides.txt"),
    "requirements/dev-macos.lock": ("pyproject.toml", "requirements/dev.in", "requirements/overrides.txt"),
    "payload/requirements-local.lock": ("payload/requirements-local.txt",),
    "payload/requirements-gpu.lock": ("payload/requirements-gpu.txt",),
    "requirements/sky-cli.lock": ("requirements/sky-cli.in",),
}
# locks that must pin the same version of a package (one API server, one ~/.sky for `launch` and `sky`)
SAME_PIN = {"skypilot": ("requirements/dev.lock", "requirements/sky-cli.lock")}
MARK = "# inputs:"


def input_digest(root: Path, name: str) -> str:
    """A short digest of what in this input file changes a resolution."""
    path = root / name
    if name.endswith("pyproject.toml"):
        project = tomllib.loads(path.read_text()).get("project", {})
        lines = [f"requires-python {project.get('requires-python', '')}", *project.get("dependencies", [])]
    else:
        lines = [re.sub(r"\s+#.*$", "", ln).strip() for ln in path.read_text().splitlines()]
        lines = [ln for ln in lines if ln and not ln.startswith("#")]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def pinned(lock_text: str, package: str) -> str | None:
    """The version a lock pins `package` at (`name==version`, name compared as pip does), else None."""
    want = re.sub(r"[-_.]+", "-", package).lower()
    for line in lock_text.splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==([^\s;\\]+)", line)
        if m and re.sub(r"[-_.]+", "-", m.group(1)).lower() == want:
            return m.group(2)
    return None


def recorded(lock_text: str) -> dict[str, str]:
    for line in lock_text.splitlines():
        if line.startswith(MARK):
            return dict(item.split("=", 1) for item in line[len(MARK):].split())
    return {}


def write(root: Path) -> None:
    for lock, inputs in LOCKS.items():
        path = root / lock
        lines = [ln for ln in path.read_text().splitlines(keepends=True) if not ln.startswith(MARK)]
        mark = MARK + "".join(f" {name}={input_digest(root, name)}" for name in inputs) + "\n"
        at = next((i for i, ln in enumerate(lines) if not ln.startswith("#")), len(lines))
        path.write_text("".join(lines[:at] + [mark] + lines[at:]))


def check(root: Path) -> list[str]:
    """One line per stale lock; empty when every lock matches its inputs."""
    problems = []
    for lock, inputs in LOCKS.items():
        path = root / lock
        if not path.is_file():
            problems.append(f"{lock}: missing; run `make lock` and commit it")
            continue
        have = recorded(path.read_text())
        if not have:
            problems.append(f"{lock}: no '{MARK}' line in its header; run `make lock` and commit it")
            continue
        changed = [name for name in inputs if have.get(name) != input_digest(root, name)]
        if changed:
            problems.append(f"{lock}: older than {', '.join(changed)} (changed since the lock was made); "
                            f"run `make lock` and commit {lock}")
    for package, locks in SAME_PIN.items():
        paths = [root / lock for lock in locks]
        if not all(p.is_file() for p in paths):
            continue  # named as missing above
        versions = {lock: pinned(p.read_text(), package) for lock, p in zip(locks, paths)}
        if len(set(versions.values())) > 1:
            problems.append(f"{package} differs between the locks ("
                            + ", ".join(f"{lock}: {v or 'not pinned'}" for lock, v in versions.items())
                            + f"); pin one version of {package} in their inputs and run `make lock`")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="record the inputs' digests in each lock")
    ap.add_argument("--check", action="store_true", help="fail while a lock is older than its inputs")
    ap.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.write:
        write(args.root)
    problems = check(args.root)
    for p in problems:
        print(f"✗ {p}", file=sys.stderr)
    if not problems and args.check:
        print(f"✓ locks match their inputs: {', '.join(LOCKS)}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
