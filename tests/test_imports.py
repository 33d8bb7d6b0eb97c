"""No import cycle in gdn_lab, and every import points down the layers of ARCHITECTURE.md.

The imports are read with `ast` from the source files (nothing is imported). The rules that turn
them into edges of the module graph:

- Every `import` and `from ... import` statement counts, at module level and inside functions and
  classes (a function-level import is a dependency too), except inside `if TYPE_CHECKING:`
  blocks, which never run.
- Relative imports are resolved against the importing module's package.
- `import gdn_lab.a.b` and `from gdn_lab.a import b`, where gdn_lab.a.b is a module, are one edge,
  to gdn_lab.a.b only. Python also initialises the parent packages (gdn_lab, gdn_lab.a) on the
  way, but those are not edges: otherwise every module would depend on every package __init__
  above it, and `gdn_lab.ops.decode_attention` importing `gdn_lab.ops.spec` would close a cycle
  through `gdn_lab/ops/__init__.py`, which imports every op folder.
- `from gdn_lab.a import name`, where `name` is not a module, is an edge to gdn_lab.a (its __init__).
- An import of a gdn_lab module that does not exist is a failure.
- Dynamic imports (`importlib.import_module(name)`, `routing.lazy(...)`, `ops/__init__`'s loop over
  its op folders) are not seen: they run at call time or name their targets by string.

One idiom is allowed and checked rather than assumed, the registration idiom: an op folder's
__init__ defines its spec and `OP`, then imports its backend modules at its end, and those import
`OP` from it (`from gdn_lab.ops.gdn_decode import OP` in gdn_decode/triton.py). The edge from such
a submodule back to its own parent package is left out of the cycle search only when every name it
imports from the parent is bound in the parent's __init__ above the line that imports the
submodule, so the partially initialised parent always has it. Any other back edge is a cycle.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "gdn_lab"

# The layers, lowest first; a module may import its own layer or lower ones, never a higher one.
# A module's layer is that of the longest dotted prefix listed here ("gdn_lab" itself only by name).
LAYERS: dict[str, int] = {
    "gdn_lab": 0,  # the package root: __version__ only, imports nothing
    # platform facts, the backend registry, input checks
    "gdn_lab.device": 1,
    "gdn_lab.routing": 1,
    "gdn_lab.checks": 1,
    # where the data files are (a wheel's copies, or the checkout's folders): imports nothing
    "gdn_lab.package_data": 1,
    # Triton's interpreter without the work it repeats (imports triton only when installing)
    "gdn_lab.interpreter": 1,
    # the interpreter's out-of-bounds check (imports triton only inside its block)
    "gdn_lab.out_of_bounds": 1,
    # what the ops stand on. rules sit below ops because a backend carries its dispatch rule
    # (Backend.rule) and kernels read rule tables; aiter below ops because AITER's backends load
    # through it; rules may import aiter (its install hint, emulated devices, installed tables).
    "gdn_lab.quant": 2,
    "gdn_lab.cache": 2,
    "gdn_lab.aiter": 2,
    "gdn_lab.rules": 2,
    "gdn_lab.ops": 3,
    "gdn_lab.workloads": 4,
    # environment composes the fingerprint from device, aiter and git: above what it asks, beside
    # the experiments, below the report and the CLI that print it.
    "gdn_lab.experiments": 5,
    "gdn_lab.trace": 5,
    "gdn_lab.model": 5,
    "gdn_lab.testing": 5,
    "gdn_lab.environment": 5,
    "gdn_lab.report": 6,
    # the regression gate runs the experiments and writes its files with the report's atomic
    # writer; report.compare reads its fingerprints (same layer)
    "gdn_lab.gate": 6,
    "gdn_lab.cli": 7,
}


@dataclass(frozen=True)
class Edge:
    source: str
    target: str
    line: int
    names: tuple[str, ...]  # names taken by a from-import (empty for `import x`)
    module_level: bool


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES: dict[str, Path] = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_package(name: str) -> bool:
    return MODULES[name].name == "__init__.py"


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.Module) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """(import statement, at module level) for every import that can run."""
    found: list[tuple[ast.Import | ast.ImportFrom, bool]] = []

    def visit(node: ast.AST, module_level: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child, module_level)
            return
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append((node, module_level))
        inner = module_level and not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
        for child in ast.iter_child_nodes(node):
            visit(child, inner)

    for stmt in tree.body:
        visit(stmt, True)
    return found


def _resolve_base(module: str, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    package = module if _is_package(module) else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


def _ours(name: str) -> bool:
    return name == "gdn_lab" or name.startswith("gdn_lab.")


def read_edges() -> list[Edge]:
    edges = []
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node, module_level in _import_nodes(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if _ours(alias.name):
                        edges.append(Edge(module, alias.name, node.lineno, (), module_level))
                continue
            base = _resolve_base(module, node)
            if not _ours(base):
                continue
            plain: list[str] = []
            for alias in node.names:
                child = f"{base}.{alias.name}"
                if child in MODULES:
                    edges.append(Edge(module, child, node.lineno, (), module_level))
                else:
                    plain.append(alias.name)
            if plain:
                edges.append(Edge(module, base, node.lineno, tuple(plain), module_level))
    return edges


def _bound_lines(tree: ast.Module) -> dict[str, int]:
    """Module-level names of a module and the first line that binds each."""
    bound: dict[str, int] = {}

    def bind(name: str, line: int) -> None:
        bound.setdefault(name, line)

    def visit(stmts: list[ast.stmt]) -> None:
        for s in stmts:
            if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                bind(s.name, s.lineno)
            elif isinstance(s, ast.Assign | ast.AnnAssign | ast.AugAssign):
                targets = s.targets if isinstance(s, ast.Assign) else [s.target]
                for t in targets:
                    for n in ast.walk(t):
                        if isinstance(n, ast.Name):
                            bind(n.id, s.lineno)
            elif isinstance(s, ast.Import | ast.ImportFrom):
                for a in s.names:
                    bind((a.asname or a.name).split(".")[0], s.lineno)
            elif isinstance(s, ast.If | ast.Try | ast.For | ast.While | ast.With):
                for field in ("body", "orelse", "finalbody"):
                    visit(getattr(s, field, []) or [])
                for h in getattr(s, "handlers", []):
                    visit(h.body)

    visit(tree.body)
    return bound


def registration_edges(edges: list[Edge]) -> tuple[set[Edge], list[str]]:
    """The back edges of the registration idiom that are safe, and why each unsafe one is not."""
    trees = {m: ast.parse(MODULES[m].read_text(encoding="utf-8")) for m in MODULES if _is_package(m)}
    imports_child: dict[tuple[str, str], int] = {}
    for e in edges:
        key = (e.source, e.target)
        imports_child[key] = min(e.line, imports_child.get(key, e.line))
    safe, problems = set(), []
    for e in edges:
        parent = e.source.rpartition(".")[0]
        if e.target != parent or not _is_package(parent) or (parent, e.source) not in imports_child:
            continue
        if not e.module_level:
            safe.add(e)  # runs at call time, after the parent finished initialising
            continue
        child_line = imports_child[(parent, e.source)]
        bound = _bound_lines(trees[parent])
        late = [n for n in e.names if n not in bound or bound[n] >= child_line]
        if e.names and not late:
            safe.add(e)
        else:
            problems.append(
                f"{e.source} imports {list(late) or 'itself'} from {parent} (line {e.line}), which imports it at "
                f"line {child_line} before binding those names"
            )
    return safe, problems


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1 on the stack, 2 done
    for start in sorted(graph):
        if state.get(start):
            continue
        stack = [(start, iter(sorted(graph[start])))]
        path = [start]
        state[start] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[node] = 2
                stack.pop()
                path.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append((nxt, iter(sorted(graph.get(nxt, ())))))
    return None


def layer_of(module: str) -> int | None:
    if module in LAYERS:
        return LAYERS[module]
    prefixes = [p for p in LAYERS if p != "gdn_lab" and module.startswith(p + ".")]
    return LAYERS[max(prefixes, key=len)] if prefixes else None


EDGES = read_edges()


def test_the_reader_sees_imports_of_every_kind():
    def has(source, target, **kw):
        return any(
            e.source == source and e.target == target and all(getattr(e, k) == v for k, v in kw.items()) for e in EDGES
        )

    assert has("gdn_lab.ops.aiter_paged", "gdn_lab.aiter")  # from gdn_lab import aiter (a package)
    assert has("gdn_lab.ops.aiter_paged", "gdn_lab.checks", module_level=True)  # from gdn_lab.checks import x
    assert has("gdn_lab.cli", "gdn_lab.report.runner", module_level=False)  # a function-level import
    assert has("gdn_lab.ops.gdn_decode.triton", "gdn_lab.ops.gdn_decode", names=("OP",))
    assert not any(e.target == "gdn_lab.ops" for e in EDGES if e.source.startswith("gdn_lab.ops."))


def test_the_reader_resolves_relative_imports_and_skips_type_checking(tmp_path, monkeypatch):
    pkg = tmp_path / "gdn_lab"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "low.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from . import mod\n")
    (pkg / "sub" / "mod.py").write_text(
        "from typing import TYPE_CHECKING\nfrom .. import low\nif TYPE_CHECKING:\n    from gdn_lab import cli\n"
        "def f():\n    from ..sub import mod\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", pkg)
    monkeypatch.setattr(sys.modules[__name__], "MODULES", {_module_name(p): p for p in sorted(pkg.rglob("*.py"))})
    got = {(e.source, e.target, e.module_level) for e in read_edges()}
    assert got == {
        ("gdn_lab.sub", "gdn_lab.sub.mod", True),
        ("gdn_lab.sub.mod", "gdn_lab.low", True),
        ("gdn_lab.sub.mod", "gdn_lab.sub.mod", False),
    }


def test_every_import_names_an_existing_module():
    missing = [f"{e.source}:{e.line} imports {e.target}" for e in EDGES if e.target not in MODULES]
    assert not missing, "\n".join(missing)


def test_no_import_cycle():
    safe, problems = registration_edges(EDGES)
    assert not problems, "\n".join(problems)
    graph: dict[str, set[str]] = {m: set() for m in MODULES}
    for e in EDGES:
        if e not in safe and e.target != e.source:
            graph[e.source].add(e.target)
    cycle = find_cycle(graph)
    if cycle:
        lines = {(e.source, e.target): e.line for e in EDGES}
        hops = [f"{a} (line {lines[(a, b)]}) -> {b}" for a, b in zip(cycle, cycle[1:])]
        pytest.fail("import cycle:\n  " + "\n  ".join(hops))


def test_the_cycle_search_finds_a_cycle_and_the_idiom_check_catches_a_late_name():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    late = Edge("gdn_lab.ops.gdn_decode.triton", "gdn_lab.ops.gdn_decode", 1, ("NOT_BOUND_ANYWHERE",), True)
    safe, problems = registration_edges([*EDGES, late])
    assert late not in safe and any("NOT_BOUND_ANYWHERE" in p for p in problems)


def test_every_module_has_a_layer():
    unplaced = sorted(m for m in MODULES if layer_of(m) is None)
    assert not unplaced, f"place these in LAYERS: {unplaced}"


def test_nothing_imports_a_layer_above_it():
    placed = [e for e in EDGES if layer_of(e.source) is not None and layer_of(e.target) is not None]
    upward = [
        f"{e.source} (layer {layer_of(e.source)}, line {e.line}) imports {e.target} (layer {layer_of(e.target)})"
        for e in placed
        if layer_of(e.target) > layer_of(e.source)
    ]
    assert not upward, "\n".join(upward)


def test_the_lowest_layer_imports_nothing_of_the_lab_at_run_time():
    """The same, observed: importing device, routing or checks loads no other gdn_lab module but the root."""
    code = (
        "import sys\nimport gdn_lab.device, gdn_lab.routing, gdn_lab.checks\n"
        "print(sorted(m for m in sys.modules if m.startswith('gdn_lab')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(["gdn_lab", "gdn_lab.checks", "gdn_lab.device", "gdn_lab.routing"])
