#!/usr/bin/env python3
"""Find import cycles among the modules of launcher/, payload/ and bench/ (AST only: nothing is imported).

Every import between two modules is an edge: module-level ones (what runs when a module is imported),
those inside functions and those under `if TYPE_CHECKING:`, since a function-level or a type-only import
that closes a loop only hides the cycle (two modules that need each other hold one concept, and a type
both use belongs where both can import it). No exception:
a package's `__init__` that imports its submodules (a lazy factory such as
`launcher.backends.get_backend`) is fine as long as the submodules import their siblings (`base`),
never the package itself.

    python scripts/import_cycles.py          # exit 1 and one line per cycle when there is one
    python scripts/import_cycles.py --all    # also every function-level and type-only edge
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("launcher", "payload")
# Folders of scripts that import each other by their bare names (the folder is on sys.path).
SCRIPT_DIRS = ("bench", "bench/gpu")


def modules(root: Path = ROOT) -> dict[str, Path]:
    """{dotted name: file} for every module of the packages, and {name: file} for the scripts."""
    out = {}
    for folder in SCRIPT_DIRS:
        for path in sorted((root / folder).glob("*.py")):
            out[path.stem] = path
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


# Where an import runs: when its module is imported, when a function is called, or never (type checkers only).
MODULE, FUNCTION, TYPE_ONLY = "module", "function", "type only"
LABELS = {MODULE: "", FUNCTION: " (in a function)", TYPE_ONLY: " (type only)"}


def _imports(tree: ast.Module):
    """(node, MODULE | FUNCTION | TYPE_ONLY) for every import statement."""
    def walk(nodes, where: str):
        for node in nodes:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                yield node, where
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                yield from walk(ast.iter_child_nodes(node), FUNCTION if where == MODULE else where)
            elif isinstance(node, ast.If) and _is_type_checking(node):
                yield from walk(node.body, TYPE_ONLY)
                yield from walk(node.orelse, where)
            else:
                yield from walk(ast.iter_child_nodes(node), where)
    yield from walk(tree.body, MODULE)


def _resolve(name: str, mods: dict[str, Path]) -> str | None:
    """The longest known module that `name` is, or is inside."""
    while name:
        if name in mods:
            return name
        name = name.rpartition(".")[0]
    return None


def edges(mods: dict[str, Path]) -> list[tuple[str, str, str, int]]:
    """(importer, imported, where, line) for every import between the packages' modules; `where` is
    MODULE, FUNCTION or TYPE_ONLY."""
    out = []
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        package = mod if is_pkg else mod.rpartition(".")[0]
        for node, where in _imports(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    pkg_parts = package.split(".")
                    pkg_parts = pkg_parts[: len(pkg_parts) - (node.level - 1)]
                    base = ".".join(pkg_parts + ([base] if base else []))
                # `from pkg import sub` imports the submodule when one exists, else a name of pkg
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            for t in targets:
                dst = _resolve(t, mods)
                if dst and dst != mod:
                    out.append((mod, dst, where, node.lineno))
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def module_cycles(root: Path = ROOT) -> list[tuple[list[str], list[str]]]:
    """[(modules in the cycle, the imports that close it as `a:line -> b`, `(in a function)` and
    `(type only)` marked)]."""
    mods = modules(root)
    es = edges(mods)
    graph: dict[str, set[str]] = {}
    for a, b, _, _ in es:
        graph.setdefault(a, set()).add(b)
    out = []
    for comp in cycles(graph):
        members = set(comp)
        links = sorted({f"{a}:{line} -> {b}{LABELS[where]}"
                        for a, b, where, line in es if a in members and b in members})
        out.append((comp, links))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--all", action="store_true",
                    help="also list every function-level and type-only import between modules")
    args = ap.parse_args(argv)
    if args.all:
        for a, b, where, line in sorted(set(edges(modules()))):
            if where != MODULE:
                print(f"  {a}:{line} -> {b}{LABELS[where]}")
    found = module_cycles()
    for comp, links in found:
        print(f"import cycle: {' <-> '.join(comp)}  ({'; '.join(links)})")
    if found:
        print(f"{len(found)} import cycle(s): give one module the shared names "
              "(public, no leading underscore) and import it from the others", file=sys.stderr)
        return 1
    print("no import cycles in " + ", ".join(PACKAGES + SCRIPT_DIRS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
