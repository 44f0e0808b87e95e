"""launcher/ imports at the top of each module; only what launcher/heavy.py names is imported inside a
function (issue 49): a HEAVY module (expensive to import, or possibly absent), or, in a module that
`import launcher.cli` loads (STARTUP), a launcher or payload module the start-up does not load.
Imports read as scripts/import_cycles.py reads them (AST only)."""

import ast
import importlib.util
import subprocess
import sys
from pathlib import Path

from launcher.heavy import HEAVY, STARTUP

REPO = Path(__file__).resolve().parents[2]
OURS = ("launcher", "payload")


def _script():
    spec = importlib.util.spec_from_file_location("import_cycles", REPO / "scripts" / "import_cycles.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def covered(name: str, heavy: dict) -> "str | None":
    """The HEAVY entry that covers module `name` (itself, or a package above it), else None."""
    return next((h for h in heavy if name == h or name.startswith(h + ".")), None)


def _targets(mod: str, path: Path, node, mods: dict) -> list[str]:
    """The modules an import statement names: `from pkg import sub` is the submodule when one exists."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    base = node.module or ""
    if node.level:
        package = (mod if path.name == "__init__.py" else mod.rpartition(".")[0]).split(".")
        base = ".".join(package[: len(package) - (node.level - 1)] + ([base] if base else []))
    return list(dict.fromkeys(f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names))


def imports(root: Path = REPO, where: str = "function") -> list[tuple[str, str, str, list[str]]]:
    """(module, file:line, the statement, the modules it names) for every import of launcher/ and payload/
    that runs `where`: "function" (when a function is called) or "module" (when its module is imported)."""
    script, out = _script(), []
    mods = script.modules(root)
    for mod, path in mods.items():
        if mod.split(".")[0] not in OURS:
            continue
        text = path.read_text()
        for node, runs in script._imports(ast.parse(text, str(path))):
            if runs == where:
                out.append((mod, f"{path.relative_to(root).as_posix()}:{node.lineno}",
                            " ".join(ast.get_source_segment(text, node).split()), _targets(mod, path, node, mods)))
    return out


def late_problems(root: Path = REPO, heavy: dict = HEAVY, startup=STARTUP) -> list[str]:
    """Every import inside a function of launcher/ that neither reason of launcher/heavy.py covers, one
    line each with its file:line and the fix."""
    out = []
    for mod, where, text, targets in imports(root):
        if mod.split(".")[0] != "launcher":
            continue  # the payload is its own program, with its own reasons (torch on the GPU machine)
        for t in targets:
            if covered(t, heavy) or (mod in startup and t.split(".")[0] in OURS and t not in startup):
                continue
            if mod in startup and t in startup:
                why = f"{t} is loaded at start-up anyway (launcher/heavy.py STARTUP): import it at the top"
            else:
                why = (f"{t} is not in launcher/heavy.py HEAVY: import it at the top, or add it to HEAVY with the "
                       "reason (its measured import time, what needs it)")
            out.append(f"{where}: `{text}` inside a function: {why}")
    return out


def stale_entries(root: Path = REPO, heavy: dict = HEAVY) -> list[str]:
    """HEAVY entries that defer nothing: no import inside a function names them, and (a third-party
    package) no launcher or payload entry imports them at its top; and launcher or payload entries whose
    top no longer reaches a heavy third-party package (then they are light: import them at the top)."""
    mods = _script().modules(root)
    top: dict[str, set] = {m: {".".join(m.split(".")[:i]) for i in range(1, m.count(".") + 1)} for m in mods}
    for mod, _, _, targets in imports(root, "module"):
        for t in targets:  # `import a.b.c` runs a, a.b and a.b.c
            top[mod] |= {".".join(t.split(".")[:i]) for i in range(1, t.count(".") + 2)}

    def reached(m: str) -> set:
        seen, todo = set(), [m]
        while todo:
            x = todo.pop()
            if x not in seen:
                seen.add(x)
                todo += sorted(top.get(x, ()))
        return seen

    used = {covered(t, heavy) for mod, _, _, ts in imports(root) if mod.split(".")[0] == "launcher" for t in ts}
    out = []
    for name in heavy:
        if name.split(".")[0] not in OURS:
            continue
        if name not in mods:
            out.append(f"{name}: no such module in launcher/ or payload/; drop it from launcher/heavy.py HEAVY")
            used.add(name)  # said once
            continue
        why = {covered(x, heavy) for x in reached(name) if x.split(".")[0] not in OURS} - {None}
        if not why:
            out.append(f"{name}: imports no HEAVY package at its top (directly or through what it imports): it is "
                       "light; drop it from launcher/heavy.py HEAVY and import it at the top")
        elif name in used:
            used |= why  # the packages that make a deferred module heavy are deferred through it
    out += [f"{name}: nothing in launcher/ imports it inside a function, or imports it at the top of a HEAVY "
            "module; drop it from launcher/heavy.py HEAVY" for name in heavy if name not in used]
    return out


def test_only_heavy_modules_are_imported_inside_functions():
    found = late_problems()
    assert not found, "\n".join(found)


def test_start_up_loads_no_heavy_module_and_exactly_the_startup_ones():
    """`launch --help` and TAB completion import launcher.cli and what it registers, nothing more."""
    code = "import sys, launcher.cli; print('\\n'.join(sorted(sys.modules)))"
    loaded = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                            check=True).stdout.split()
    heavy = sorted({covered(m, HEAVY) for m in loaded} - {None})
    assert not heavy, f"`import launcher.cli` loads HEAVY modules: {heavy}; import them inside the function " \
                      "that needs them (launcher/heavy.py)"
    ours = {m for m in loaded if m.split(".")[0] in OURS}
    assert ours == set(STARTUP), (f"`import launcher.cli` now loads {sorted(ours - set(STARTUP))} too, and not "
                                  f"{sorted(set(STARTUP) - ours)}: import a command's needs inside the command, "
                                  "or (measured, a decision) change launcher/heavy.py STARTUP")


def test_heavy_names_no_stale_entry_and_each_its_reason():
    found = stale_entries()
    assert not found, "\n".join(found)
    assert all(len(reason) > 20 for reason in HEAVY.values())
    assert not set(STARTUP) & set(HEAVY)



def test_a_late_import_of_a_light_module_is_named_with_its_line_and_the_fix(source_tree):
    root = source_tree({
        "launcher/cli.py": "def f():\n    from launcher import light\n    from launcher import slow\n    import json\n",
        "launcher/light.py": "",
        "launcher/slow.py": "import sqlite3\n",
        "launcher/deep.py": "def g():\n    import yaml.constructor\n    from .slow import x\n\n"
                            "    def h():\n        from launcher import light\n",
        "payload/gpu.py": "def train():\n    import torch\n",
    })
    found = late_problems(root, heavy={"yaml": "13 ms"}, startup=("launcher", "launcher.cli", "launcher.light"))
    assert found == [
        "launcher/cli.py:2: `from launcher import light` inside a function: launcher.light is loaded at start-up "
        "anyway (launcher/heavy.py STARTUP): import it at the top",
        "launcher/cli.py:4: `import json` inside a function: json is not in launcher/heavy.py HEAVY: import it at "
        "the top, or add it to HEAVY with the reason (its measured import time, what needs it)",
        "launcher/deep.py:3: `from .slow import x` inside a function: launcher.slow is not in launcher/heavy.py "
        "HEAVY: import it at the top, or add it to HEAVY with the reason (its measured import time, what needs it)",
        "launcher/deep.py:6: `from launcher import light` inside a function: launcher.light is not in "
        "launcher/heavy.py HEAVY: import it at the top, or add it to HEAVY with the reason (its measured import "
        "time, what needs it)",
    ]  # cli.py:3 defers what the start-up does not load; yaml.constructor is yaml's; the payload has its own rules


def test_an_entry_that_defers_nothing_or_a_light_module_is_stale(source_tree):
    root = source_tree({
        "launcher/a.py": "from launcher import b\n",
        "launcher/b.py": "import paramiko\n",
        "launcher/c.py": "from launcher import d\n",
        "launcher/d.py": "import json\n",
        "launcher/user.py": "def f():\n    from launcher import a, c\n",
    })
    heavy = {"paramiko": "110 ms", "psutil": "13 ms", "launcher.a": "b at its top", "launcher.c": "d at its top",
             "launcher.gone": "a module since removed"}
    assert stale_entries(root, heavy) == [
        "launcher.c: imports no HEAVY package at its top (directly or through what it imports): it is light; drop "
        "it from launcher/heavy.py HEAVY and import it at the top",
        "launcher.gone: no such module in launcher/ or payload/; drop it from launcher/heavy.py HEAVY",
        "psutil: nothing in launcher/ imports it inside a function, or imports it at the top of a HEAVY module; "
        "drop it from launcher/heavy.py HEAVY",
    ]  # paramiko is deferred through launcher.a (b imports it at its top)
