"""What the house tests share: a small source tree of their own, to show a rule failing."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def source_tree(tmp_path):
    """`source_tree(files, packages=("launcher", "payload"))`: the files (path -> text) under tmp_path, with
    an empty `__init__.py` for each package not among them and a bench/ folder, as the checks expect."""
    def make(files: dict[str, str], packages=("launcher", "payload")) -> Path:
        (tmp_path / "bench").mkdir(exist_ok=True)
        for rel, text in {**{f"{p}/__init__.py": "" for p in packages}, **files}.items():
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / rel).write_text(text)
        return tmp_path
    return make
