"""The package's import layering, read from the source with `ast` (nothing is imported).

Layers, bottom to top (a package may import its own modules and those of the layers it lists in
`ALLOWED`; a top-level module such as `connecting.py` counts as a package of its own):

    core -> state, migrations, timetravel -> backends -> connect, transfer -> strategies -> cli,
    the top-level `langgraph_ckpt_ext` (its `__init__` and `__main__`); `server` (the factory
    LangGraph's server loads) sits beside `connect`, above it

Every import counts for the layering, wherever it is written: at module level, inside a function
(a lazy import still binds the layers at run time) and under `if TYPE_CHECKING:` (a type names
the layer it lives in). Cycles are looked for among the imports that run: module-level and lazy
ones alike (a lazy import inside a function only hides a cycle: the two modules still need each
other), TYPE_CHECKING ones excluded (they never run; the layer table holds them). Importing
`a.b.c` runs the `__init__` of `a.b` first: those parent packages count as imported too (but not
the importer's own, which are loaded before it).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = "langgraph_ckpt_ext"
ROOT = Path(__file__).resolve().parents[2] / PACKAGE

# package (first name under langgraph_ckpt_ext) -> the packages it may import besides itself
_BELOW_BACKENDS = {"core", "state", "migrations", "timetravel"}
ALLOWED: dict[str, set[str]] = {
    "core": set(),
    "state": {"core"},
    "migrations": {"core"},
    "timetravel": {"core"},
    "backends": {"core", "migrations", "timetravel"},
    "strategies": {*_BELOW_BACKENDS, "backends", "connecting", "transfer"},
    "transfer": {*_BELOW_BACKENDS, "backends", "connecting"},
    "connecting": {*_BELOW_BACKENDS, "backends"},
    "server": {*_BELOW_BACKENDS, "backends", "connecting"},
    "cli": {*_BELOW_BACKENDS, "backends", "strategies", "transfer", "connecting", "__init__"},
    "__init__": {*_BELOW_BACKENDS, "backends", "strategies", "transfer", "connecting",
                 "server"},
    "__main__": {"cli"},
}

# Cycles known to be removed by work in flight, each as the set of its modules (none left).
KNOWN_CYCLES: frozenset[frozenset[str]] = frozenset()


@dataclass
class Module:
    name: str
    path: Path
    is_package: bool
    imports: set[str] = field(default_factory=set)
    """Every module of ours it imports, wherever the import is written."""
    runs: set[str] = field(default_factory=set)
    """Those whose import runs (at module level or in a function), not under TYPE_CHECKING."""


def _module_name(path: Path) -> tuple[str, bool]:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    if is_package:
        parts.pop()
    return ".".join(parts), is_package


def _resolve(mod: Module, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = mod.name.split(".")
    if not mod.is_package:
        base.pop()
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, node.module] if node.module else base)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _walk(body: list[ast.stmt], runs: bool) -> Iterator[tuple[ast.stmt, bool]]:
    """Every statement, with whether it ever runs (False under `if TYPE_CHECKING:`)."""
    for stmt in body:
        yield stmt, runs
        if isinstance(stmt, ast.If):
            yield from _walk(stmt.body, runs and not _is_type_checking(stmt.test))
            yield from _walk(stmt.orelse, runs)
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield from _walk(stmt.body, runs)
        elif isinstance(stmt, (ast.Try, ast.With, ast.AsyncWith, ast.For, ast.AsyncFor,
                               ast.While)):
            for part in ("body", "orelse", "finalbody"):
                yield from _walk(getattr(stmt, part, []), runs)
            for handler in getattr(stmt, "handlers", []):
                yield from _walk(handler.body, runs)


def _modules() -> dict[str, Module]:
    mods: dict[str, Module] = {}
    for path in sorted(ROOT.rglob("*.py")):
        name, is_package = _module_name(path)
        mods[name] = Module(name, path, is_package)
    for mod in mods.values():
        tree = ast.parse(mod.path.read_text(), str(mod.path))
        for stmt, runs in _walk(tree.body, True):
            targets: list[str] = []
            if isinstance(stmt, ast.Import):
                targets = [a.name for a in stmt.names]
            elif isinstance(stmt, ast.ImportFrom):
                base = _resolve(mod, stmt)
                # `from . import x` may name a submodule, `from .m import f` a function
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base
                           for a in stmt.names]
            for target in targets:
                while target and target not in mods and "." in target:
                    target = target.rsplit(".", 1)[0]
                for name in _with_parents(target):
                    if name in mods and name not in _with_parents(mod.name):
                        mod.imports.add(name)
                        if runs:
                            mod.runs.add(name)
    return mods


def _with_parents(name: str) -> set[str]:
    """`a.b.c` -> {a, a.b, a.b.c}: what importing it runs."""
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts) + 1)}


def _layer(name: str) -> str:
    parts = name.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


MODULES = _modules()


def test_every_module_has_a_layer() -> None:
    assert {_layer(m) for m in MODULES} <= ALLOWED.keys()


def test_core_imports_nothing_above_it() -> None:
    bad = sorted(
        f"{m.name} imports {t}"
        for m in MODULES.values() if _layer(m.name) == "core"
        for t in m.imports if _layer(t) != "core"
    )
    assert not bad, "core must import nothing else of the package:\n" + "\n".join(bad)


def test_no_layer_imports_one_above_it() -> None:
    bad = sorted(
        f"{m.name} imports {t}"
        for m in MODULES.values()
        for t in m.imports
        if _layer(t) != _layer(m.name) and _layer(t) not in ALLOWED[_layer(m.name)]
    )
    assert not bad, "imports against the layers (see ALLOWED):\n" + "\n".join(bad)


def _cycles() -> list[list[str]]:
    """Strongly connected components (more than one module) of the imports that run,
    the known ones left out (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in MODULES:
        if root in index:
            continue
        work = [(root, iter(sorted(MODULES[root].runs)))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(MODULES[nxt].runs))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        comp.append(top)
                        if top == node:
                            break
                    if len(comp) > 1 and frozenset(comp) not in KNOWN_CYCLES:
                        found.append(sorted(comp))
    return found


def test_no_import_cycle() -> None:
    cycles = _cycles()
    assert not cycles, "modules importing each other (some perhaps lazily):\n" + "\n".join(
        " <-> ".join(c) for c in cycles)


def test_core_rows_loads_only_core() -> None:
    code = (
        "import json, sys\n"
        f"import {PACKAGE}.core.rows\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.startswith('{PACKAGE}'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    loaded = json.loads(out)
    outside = [m for m in loaded if m != PACKAGE and not m.startswith(f"{PACKAGE}.core")]
    assert not outside, f"importing {PACKAGE}.core.rows loads {outside}"
