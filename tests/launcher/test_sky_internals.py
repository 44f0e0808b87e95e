"""launcher/sky_internals.py is the one place launch reaches past SkyPilot's public SDK: every name it
lists still is where it says (else: re-audit for the installed SkyPilot), and no other module of
launcher/ imports or reaches a non-public `sky` name."""

import ast
import importlib
import importlib.metadata
import re
from pathlib import Path

import pytest

from launcher import sky_internals

REPO = Path(__file__).resolve().parents[2]
INTERNALS = "launcher/sky_internals.py"
INSTALLED = importlib.metadata.version("skypilot")


def resolve(name: str):
    """The object a dotted name stands for: its longest importable module, then attributes."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(name)


@pytest.mark.parametrize("name", list(sky_internals.AUDITED))
def test_every_audited_name_is_where_the_audit_says(name):
    moved = f"{name} moved: re-audit for SkyPilot {INSTALLED}"
    try:
        resolve(name)
    except (ImportError, AttributeError) as e:
        pytest.fail(f"{moved} ({type(e).__name__}: {e}; launcher/sky_internals.py AUDITED says "
                    f"{sky_internals.AUDITED[name]} in {sky_internals.AUDITED_FOR})")
    where, line = sky_internals.AUDITED[name].rsplit(":", 1)
    source = Path(importlib.import_module("sky").__file__).parent.parent / where
    lines = source.read_text().splitlines() if source.is_file() else []
    text = lines[int(line) - 1] if int(line) <= len(lines) else ""
    assert re.search(rf"\b{re.escape(name.rsplit('.', 1)[1])}\b", text), \
        f"{moved} ({sky_internals.AUDITED[name]} no longer defines it: `{text.strip()}`)"


def test_each_audited_name_has_one_accessor_that_names_where_it_is():
    tree = ast.parse((REPO / INTERNALS).read_text())
    docs = {f.name: ast.get_docstring(f) or "" for f in tree.body if isinstance(f, ast.FunctionDef)}
    cited = {}
    for fn, doc in docs.items():
        found = re.findall(r"sky/[\w/]+\.py:\d+", doc)
        assert len(found) == 1 and doc.rstrip().endswith(found[0]), \
            f"{INTERNALS} {fn}: its docstring says why launch needs it and ends with SkyPilot's file:line"
        cited.setdefault(found[0], []).append(fn)
    for name, where in sky_internals.AUDITED.items():
        assert where in cited, f"{name}: no accessor in {INTERNALS} names {where}"
    assert set(cited) == set(sky_internals.AUDITED.values()), "an accessor cites a place AUDITED does not list"


def _public_names(module: str) -> set[str]:
    mod = importlib.import_module(module)
    return set(getattr(mod, "__all__", None) or (n for n in vars(mod) if not n.startswith("_")))


def _public(dotted: str) -> bool:
    """`sky.X` or `sky.X.Y`: a public module, or a public name of one (`sky/__init__.py`'s exports...)."""
    module, _, name = dotted.rpartition(".")
    return dotted in sky_internals.PUBLIC_MODULES or module in sky_internals.PUBLIC_MODULES \
        and name in _public_names(module)


def private_uses(root: Path = REPO) -> list[str]:
    """Every import of, or `sky.` attribute reaching, a non-public SkyPilot name in launcher/ outside
    the internals module: file:line, the name, and the fix."""
    out = []
    for path in sorted((root / "launcher").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel == INTERNALS:
            continue
        tree = ast.parse(path.read_text())
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        found = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "sky"]
            elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "sky":
                found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "sky":
                up = parents.get(node)
                found.append((node.lineno, f"sky.{node.attr}.{up.attr}" if isinstance(up, ast.Attribute) and
                              f"sky.{node.attr}" in sky_internals.PUBLIC_MODULES else f"sky.{node.attr}"))
        out += [f"{rel}:{line}: {name} is not SkyPilot's public SDK: add an accessor for it (with the reason "
                f"and its sky/<file>.py:<line>) to {INTERNALS} AUDITED and call that"
                for line, name in sorted(set(found)) if not _public(name)]
    return out


def test_no_module_but_the_internals_reaches_past_the_public_sdk():
    found = private_uses()
    assert not found, "\n".join(found)


def test_a_private_use_is_named_with_its_file_line_and_fix(tmp_path):
    (tmp_path / "launcher" / "x").mkdir(parents=True)
    (tmp_path / "launcher" / "sky_internals.py").write_text("from sky.utils import registry\n")
    (tmp_path / "launcher" / "x" / "m.py").write_text(
        "import sky\nimport sky.jobs\nfrom sky import exceptions, skypilot_config\n"
        "def f():\n    from sky.adaptors import runpod\n    sky.get(sky.client.sdk.check())\n"
        "    sky.jobs.queue_v2()\n    sky.jobs.utils.x()\n    return sky.Task, exceptions.ClusterNotUpError\n")
    assert [f.split(" is not")[0] for f in private_uses(tmp_path)] == [
        "launcher/x/m.py:3: sky.skypilot_config",
        "launcher/x/m.py:5: sky.adaptors.runpod",
        "launcher/x/m.py:6: sky.client",
        "launcher/x/m.py:8: sky.jobs.utils",
    ]
    assert private_uses(tmp_path)[0].endswith(f"to {INTERNALS} AUDITED and call that")


def test_the_internals_import_skypilot_only_inside_their_accessors():
    """Importing `sky` takes 1-2 s: `launch --help` (and every module importing the internals) stays light."""
    tree = ast.parse((REPO / INTERNALS).read_text())
    top = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert [ast.unparse(n) for n in top] == ["from __future__ import annotations"]
    assert re.fullmatch(r"\d+\.\d+\.\d+", sky_internals.AUDITED_FOR)
