"""launcher/ and payload/ are grouped by idea: each folder one idea, the arrows between groups one way and
declared (GROUPS in each package's __init__), and a group reached from outside only through its face
(FACES). Imports counted as scripts/import_cycles.py counts them: module level, in functions, type only.
A package's __init__.py holds its docstring, its exports and those declarations, never its code.
"""

import ast
import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("import_cycles", REPO / "scripts" / "import_cycles.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def group_of(module: str) -> tuple[str, str]:
    """(group, the module's name inside its group): `launcher.plan.cost` -> (plan, cost), a top-level
    module is a group of its own (`launcher.cli` -> (cli, "")), the package itself is its own name."""
    parts = module.split(".")
    if len(parts) == 1:
        return parts[0], ""
    return parts[1], ".".join(parts[2:])


def declared(package: str, root: Path = REPO) -> tuple[dict, dict]:
    """GROUPS and FACES as written in `<package>/__init__.py` (read, not imported)."""
    tree = ast.parse((root / package / "__init__.py").read_text())
    found = {}
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            found[node.target.id] = ast.literal_eval(node.value)
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            found[node.targets[0].id] = ast.literal_eval(node.value)
    return found["GROUPS"], found["FACES"]


def violations(package: str, root: Path = REPO) -> list[str]:
    """Every way the package's imports break its declared groups, one line each."""
    script = _script()
    groups, faces = declared(package, root)
    mods = {m: p for m, p in script.modules(root).items() if m.split(".")[0] == package}
    out = [f"{m}: in no declared group (add `{group_of(m)[0]}` to GROUPS in {package}/__init__.py)"
           for m in sorted(mods) if group_of(m)[0] not in groups]
    seen = set()
    order = {g: i for i, g in enumerate(groups)}
    for g, below in groups.items():
        out += [f"GROUPS: {g} -> {b} runs up (declare groups bottom to top)" for b in below
                if order.get(b, len(order)) >= order[g]]
    arrows, faced = set(), set()
    for edge in script.edges(mods):
        a, b, line = edge[0], edge[1], edge[3]
        if b not in mods or (a, b, line) in seen:
            continue
        seen.add((a, b, line))
        (ga, _), (gb, inside) = group_of(a), group_of(b)
        if ga == gb or ga not in groups:
            continue
        where = f"{mods[a].relative_to(root).as_posix()}:{line} imports {b}"
        if gb not in groups[ga]:
            out.append(f"{where}: {ga} may not import {gb} (an arrow back up: move the code to the group "
                       "that owns the idea, or declare the arrow in GROUPS if it runs down)")
        else:
            arrows.add((ga, gb))
        if gb in faces and inside in faces[gb] or gb not in faces and inside == "":
            faced.add((gb, inside))
        else:
            out.append(f"{where}: not part of {gb}'s face (FACES: {', '.join(faces.get(gb, ())) or 'its __init__'})")
    out += [f"GROUPS: {g} -> {b} declared but no module of {g} imports {b}"
            for g, below in groups.items() for b in below if (g, b) not in arrows]
    out += [f"FACES: {g}.{m or '__init__'} declared but imported by no other group"
            for g, ms in faces.items() for m in ms if (g, m) not in faced]
    return out


@pytest.mark.parametrize("package", ["launcher", "payload"])
def test_groups_import_one_way_through_their_faces(package):
    found = violations(package)
    assert not found, "\n".join(found)



DECLARED = ('GROUPS = {"launcher": (), "low": (), "high": ("low",)}\n'
            'FACES = {"low": ("face",)}\n')


def test_an_import_back_up_or_past_a_face_is_named_with_its_line(source_tree):
    root = source_tree({
        "launcher/__init__.py": DECLARED,
        "launcher/low/__init__.py": "",
        "launcher/low/face.py": "def f():\n    from launcher.high import top\n",
        "launcher/low/private.py": "",
        "launcher/high/__init__.py": "",
        "launcher/high/top.py": "from launcher.low import face\nfrom launcher.low import private\n",
    }, packages=("payload",))
    found = violations("launcher", root)
    assert any(f.startswith("launcher/low/face.py:2 imports launcher.high.top: low may not import high (an "
                            "arrow back up") for f in found), found
    assert any(f.startswith("launcher/high/top.py:2 imports launcher.low.private: not part of low's face "
                            "(FACES: face)") for f in found), found
    assert not any("launcher/high/top.py:1" in f for f in found)  # down, through the face: fine


def test_a_declaration_nobody_uses_or_one_that_runs_up_is_stale(source_tree):
    root = source_tree({
        "launcher/__init__.py": 'GROUPS = {"launcher": (), "low": ("high",), "high": ("low",), "x": ()}\n'
                                'FACES = {"low": ("face", "gone")}\n',
        "launcher/low/__init__.py": "",
        "launcher/low/face.py": "",
        "launcher/high/__init__.py": "",
        "launcher/high/top.py": "from launcher.low import face\n",
        "launcher/other/__init__.py": "",
    }, packages=("payload",))
    found = violations("launcher", root)
    assert "launcher.other: in no declared group (add `other` to GROUPS in launcher/__init__.py)" in found
    assert "GROUPS: low -> high runs up (declare groups bottom to top)" in found
    assert "GROUPS: low -> high declared but no module of low imports high" in found
    assert "FACES: low.gone declared but imported by no other group" in found


def _group_folders():
    for package in ("launcher", "payload"):
        for init in sorted((REPO / package).glob("*/__init__.py")):
            yield init.parent


@pytest.mark.parametrize("folder", list(_group_folders()), ids=lambda p: p.relative_to(REPO).as_posix())
def test_every_group_says_what_it_owns_and_what_it_may_import(folder):
    doc = " ".join((ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or "").split())
    assert len(doc) > 200 and "may import" in doc, f"{folder.name}/__init__.py: a one-paragraph docstring " \
        "saying what the group owns and what it may import"


# A package's __init__.py is its table of contents, never where its code lives (issue 38): the file name
# says where the code is, as SkyPilot's `sky/provision/runpod/__init__.py` only re-exports.
INIT_NAMES = {"__all__": list, "__version__": str, "GROUPS": dict, "FACES": dict}  # literals only


def init_problems(root: Path = REPO) -> list[str]:
    """Every statement of an `__init__.py` under launcher/ or payload/ that is not its docstring, an
    import, `__all__`, `__version__` or the GROUPS/FACES declarations, one line each (file:line)."""
    out = []
    for package in ("launcher", "payload"):
        for init in sorted((root / package).rglob("__init__.py")):
            rel, text = init.relative_to(root).as_posix(), init.read_text()
            for i, node in enumerate(ast.parse(text).body):
                if i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) \
                        and isinstance(node.value.value, str):
                    continue
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    continue
                targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
                    if isinstance(node, ast.AnnAssign) and node.value is not None else []
                names = [t.id for t in targets if isinstance(t, ast.Name)]
                if len(names) == len(targets) == 1 and names[0] in INIT_NAMES:
                    try:
                        if isinstance(ast.literal_eval(node.value), INIT_NAMES[names[0]]):
                            continue
                    except ValueError:
                        pass
                code = " ".join(ast.get_source_segment(text, node).split())
                out.append(f"{rel}:{node.lineno}: `{code[:60]}{'...' if len(code) > 60 else ''}`: an __init__.py "
                           "holds only its docstring, imports, __all__/__version__ and GROUPS/FACES; move the code to a module "
                           "named by its idea and re-export it from here")
    return out


def test_every_init_holds_only_its_docstring_exports_and_declarations():
    found = init_problems()
    assert not found, "\n".join(found)


def test_code_in_an_init_is_named_with_its_file_and_line(source_tree):
    root = source_tree({
        "launcher/__init__.py": '"""The launcher."""\n__version__ = "1.0"\n' + DECLARED,
        "launcher/low/__init__.py": '"""Low."""\nfrom .face import f\n__all__ = ["f"]\nLIMIT = 3\n'
                                    "def g():\n    return f()\n",
        "launcher/low/face.py": "def f(): ...\n",
        "payload/x/__init__.py": "import os\nif os.environ.get('X'):\n    from .y import z\n",
    }, packages=("payload",))
    found = init_problems(root)
    assert [f.split(": an __init__.py")[0] for f in found] == [
        "launcher/low/__init__.py:4: `LIMIT = 3`",
        "launcher/low/__init__.py:5: `def g(): return f()`",
        "payload/x/__init__.py:2: `if os.environ.get('X'): from .y import z`",
    ]


# A module that grew long holds two ideas (cut it where they part, each into a module named by its idea) or
# one idea that is long: then its docstring says which, and why it stays whole (issue 38).
LONG_MODULE = 350


def long_modules_without_their_idea(root: Path = REPO) -> list[str]:
    """Every module under launcher/ or payload/ over LONG_MODULE lines whose docstring does not say its
    one idea ("One idea at ~N lines: ..."), one line each, naming the file and the fix."""
    out = []
    for package in ("launcher", "payload"):
        for path in sorted((root / package).rglob("*.py")):
            text = path.read_text()
            n = len(text.splitlines())
            if n > LONG_MODULE and "One idea at ~" not in (ast.get_docstring(ast.parse(text)) or ""):
                out.append(f"{path.relative_to(root).as_posix()}: {n} lines, and its docstring does not say "
                           f"its one idea: cut it where its ideas part (a module named by each, in the same "
                           f"group), or add a paragraph \"One idea at ~{round(n, -1)} lines: ...\" saying the "
                           "idea and why it stays whole")
    return out


def test_every_long_module_is_cut_by_idea_or_says_its_one_idea():
    found = long_modules_without_their_idea()
    assert not found, "\n".join(found)


def test_a_long_module_without_its_idea_is_named_with_the_fix(source_tree):
    body = "x = 1\n" * LONG_MODULE
    root = source_tree({
        "launcher/__init__.py": DECLARED,
        "launcher/low/long.py": '"""Long."""\n' + body,
        "launcher/low/said.py": '"""Long.\n\nOne idea at ~350 lines: one table, read whole."""\n' + body,
        "payload/short.py": '"""Short."""\n' + "x = 1\n" * (LONG_MODULE - 1),
    }, packages=("payload",))
    assert long_modules_without_their_idea(root) == [
        "launcher/low/long.py: 351 lines, and its docstring does not say its one idea: cut it where its ideas "
        "part (a module named by each, in the same group), or add a paragraph \"One idea at ~350 lines: ...\" "
        "saying the idea and why it stays whole"]


def test_no_folder_holds_more_than_twelve_modules():
    crowded = {}
    for package in ("launcher", "payload"):
        for folder in [REPO / package, *(p for p in (REPO / package).rglob("*") if p.is_dir())]:
            n = len([p for p in folder.glob("*.py") if p.name != "__init__.py"])
            if n > 12:
                crowded[folder.relative_to(REPO).as_posix()] = n
    assert not crowded, f"folders over 12 modules: {crowded}"


# "Where is ... decided?" (issue 31): the answer is a path a newcomer finds from the folder names. The
# README's architecture map gives the same answers; these keep them true.
DECIDED = {
    "a plan's dollars": ("launcher/plan/cost.py", "def billed"),
    "a run's resume rule": ("launcher/runs/experiment.py", "def check_resume"),
    "what may change on resume": ("payload/config/resume.py", "def changes_math"),
    "a fetch's verification": ("launcher/store/artifacts.py", "def _verify"),
    "a checkpoint's retention": ("payload/volume/checkpoints.py", "def apply_retention"),
    "the training step": ("payload/train/trainer.py", "class "),
}


@pytest.mark.parametrize("question", list(DECIDED))
def test_where_it_is_decided(question):
    path, needle = DECIDED[question]
    assert needle in (REPO / path).read_text(), f"{question}: {path} no longer holds `{needle}`"


def test_tests_mirror_the_groups():
    """tests/ is laid out like the code: tests/launcher/<group>/ and tests/payload/<group>/ name groups that
    exist, test files sit in a folder of their idea (never flat in tests/), and walks, house checks, the
    GPU harness's test and the emulated cloud have their own folders."""
    tests = REPO / "tests"
    problems = [f"tests/{p.name}: a test file flat in tests/ (move it to its group's folder)"
                for p in sorted(tests.glob("test_*.py"))]
    for pkg in ("launcher", "payload"):
        for folder in sorted(p for p in (tests / pkg).iterdir() if p.is_dir() and p.name != "__pycache__"):
            if not (REPO / pkg / folder.name / "__init__.py").exists():
                problems.append(f"tests/{pkg}/{folder.name}/: {pkg}/ has no group `{folder.name}`")
    assert {"walks", "house", "bench", "cloud"} <= {p.name for p in tests.iterdir() if p.is_dir()}
    assert not problems, "\n".join(problems)
