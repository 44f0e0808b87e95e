"""No import cycles in launcher/, payload/ or bench/, counting function-level and type-only imports
(scripts/import_cycles.py, AST only)."""

import importlib.util
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "import_cycles.py"


def _script():
    spec = importlib.util.spec_from_file_location("import_cycles", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_no_import_cycles_in_launcher_or_payload():
    found = _script().module_cycles()
    assert found == [], "\n".join(f"{' <-> '.join(c)}: {'; '.join(links)}" for c, links in found)



def test_a_cycle_hidden_in_a_function_is_found_and_named(source_tree):
    root = source_tree({
        "launcher/a.py": "from .b import thing\n",
        "launcher/b.py": "def thing():\n    from launcher.a import x\n",
        "payload/c.py": "from payload import d\n",
        "payload/d.py": "import payload.c\n",
    })
    found = _script().module_cycles(root)
    assert [c for c, _ in found] == [["launcher.a", "launcher.b"], ["payload.c", "payload.d"]]
    assert found[0][1] == ["launcher.a:1 -> launcher.b", "launcher.b:2 -> launcher.a (in a function)"]


def test_a_package_factory_is_a_cycle_only_when_its_submodules_import_the_package(source_tree):
    """`backends/__init__` importing `.local` lazily is fine while `local` takes the contract from a
    sibling (`base`); a submodule that imports its package closes a cycle (the 8-file one hid there)."""
    root = source_tree({
        "launcher/backends/__init__.py": "from .base import Backend\ndef get():\n    from .local import Local\n",
        "launcher/backends/base.py": "class Backend: ...\n",
        "launcher/backends/local.py": "from .base import Backend\n",
    })
    assert _script().module_cycles(root) == []
    (root / "launcher/backends/local.py").write_text("from . import Backend\n")
    found = _script().module_cycles(root)
    assert [c for c, _ in found] == [["launcher.backends", "launcher.backends.local"]]
    assert "launcher.backends:3 -> launcher.backends.local (in a function)" in found[0][1]


def test_a_type_only_import_that_closes_a_loop_is_a_cycle_and_named(source_tree):
    """A type hint is an arrow too (issue 31: trainer took `Run` from the recipe that imports the
    trainer): `if TYPE_CHECKING:` hides the loop from Python, not from the reader."""
    root = source_tree({
        "launcher/x.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from launcher.y import Y\n",
        "launcher/y.py": "import launcher.x\n",
        "payload/p.py": "import typing\nif typing.TYPE_CHECKING:\n    pass\nelse:\n    from payload.q import Q\n",
        "payload/q.py": "import payload.p\n",
    })
    found = _script().module_cycles(root)
    assert found == [(["launcher.x", "launcher.y"], ["launcher.x:3 -> launcher.y (type only)", "launcher.y:1 -> launcher.x"]),
                     (["payload.p", "payload.q"], ["payload.p:5 -> payload.q", "payload.q:1 -> payload.p"])]


def test_the_script_exits_zero_on_this_tree():
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "no import cycles in launcher, payload, bench" in done.stdout


def test_bench_scripts_importing_each_other_by_name_are_covered(source_tree):
    root = source_tree({
        "bench/gpu_a.py": "import gpu_b\nfrom payload import x\n",
        "bench/gpu_b.py": "def run():\n    from gpu_a import helper\n",
        "payload/x.py": "",
    })
    found = _script().module_cycles(root)
    assert found == [(["gpu_a", "gpu_b"], ["gpu_a:1 -> gpu_b", "gpu_b:2 -> gpu_a (in a function)"])]


def test_the_launcher_enters_the_payload_only_through_its_declared_doors():
    """Every launcher -> payload import (module level or in a function) goes through a door listed in
    launcher/doors.py with its reason; a listed door nobody uses is stale; the payload never imports
    the launcher."""
    from launcher.doors import PAYLOAD_DOORS

    script = _script()
    used: dict[str, set[str]] = {}
    back = []
    for a, b, _, line in script.edges(script.modules()):
        if a.startswith("launcher") and b.startswith("payload"):
            used.setdefault(b, set()).add(f"{a}:{line}")
        if a.startswith("payload") and b.startswith("launcher"):
            back.append(f"{a}:{line} -> {b}")
    undeclared = {door: sorted(users) for door, users in used.items() if door not in PAYLOAD_DOORS}
    assert not undeclared, f"launcher imports payload modules that are not declared doors: {undeclared}; add " \
                           "each to launcher/doors.py with the reason, or go through an existing door"
    assert not set(PAYLOAD_DOORS) - set(used), f"declared doors nobody uses: {set(PAYLOAD_DOORS) - set(used)}"
    assert all(len(reason) > 20 for reason in PAYLOAD_DOORS.values())
    assert not back, f"the payload imports the launcher: {back}"


def test_no_module_over_500_lines():
    """Past ~500 lines a module holds two ideas (../shared/STYLE.md): split where they part."""
    long = {str(p.relative_to(REPO)): n for folder in ("launcher", "payload", "bench") for p in (REPO / folder).rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 500}
    assert not long, f"modules over 500 lines: {long}"
