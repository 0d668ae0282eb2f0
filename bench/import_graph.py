"""List the import cycles among the repo's own packages (lattice, pipelines, features).

Reads every `import`/`from` statement with `ast`, at module level and inside functions alike,
because a function-level import still ties two modules together for a reader even when it is
safe at run time. An import of a package counts as an edge to its `__init__`, and `from pkg
import name` counts as an edge to `pkg.name` when that is a module, else to `pkg`.

Run: PYTHONPATH=$PWD python bench/import_graph.py   (prints the cycles and the edge count)
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOTS = ("lattice", "pipelines", "features")


def module_files(repo: Path) -> dict[str, Path]:
    mods: dict[str, Path] = {}
    for root in ROOTS:
        for path in sorted((repo / root).rglob("*.py")):
            parts = list(path.relative_to(repo).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = path
    return mods


def _resolve(name: str, mods: dict[str, Path]) -> str | None:
    # Walk up to the longest prefix that is one of our modules.
    parts = name.split(".")
    while parts:
        cand = ".".join(parts)
        if cand in mods:
            return cand
        parts.pop()
    return None


def _type_only_nodes(tree: ast.AST) -> set[int]:
    """ids of the import nodes under `if TYPE_CHECKING:` (annotations only, never run)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for stmt in node.body:
                out.update(id(n) for n in ast.walk(stmt))
    return out


def edges_of(mod: str, path: Path, mods: dict[str, Path], runtime_only: bool = False) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    skip = _type_only_nodes(tree) if runtime_only else set()
    is_pkg = path.name == "__init__.py"
    package = mod if is_pkg else mod.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names] or [base]
        for t in targets:
            hit = _resolve(t, mods)
            if hit and hit != mod:
                out.add(hit)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = [0]
    sys.setrecursionlimit(10000)

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
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
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def graph_of(mods: dict[str, Path], runtime_only: bool = False) -> dict[str, set[str]]:
    graph = {m: edges_of(m, p, mods, runtime_only) for m, p in mods.items()}
    # A package __init__ importing its own submodules is not a design circle; drop edges
    # from a package to its children so only real two-way ties remain.
    return {m: {t for t in ts if not t.startswith(m + ".")} for m, ts in graph.items()}


def main() -> int:
    repo = Path(__file__).resolve().parents[1]
    mods = module_files(repo)
    for runtime_only in (False, True):
        graph = graph_of(mods, runtime_only)
        n_edges = sum(len(v) for v in graph.values())
        found = cycles(graph)
        what = "run-time imports only (without `if TYPE_CHECKING:`)" if runtime_only else "all imports"
        print(f"== {what}: modules: {len(mods)}  edges: {n_edges}  cycles: {len(found)}")
        for comp in found:
            members = set(comp)
            print("cycle:", " , ".join(comp))
            for m in comp:
                for t in sorted(graph[m] & members):
                    print(f"    {m} -> {t}")
    # Layering: lattice/ is the library; pipelines/ and features/ are built on it, so an
    # arrow from lattice into them points the wrong way even when it closes no cycle.
    upward = sorted((m, t) for m in graph for t in graph[m]
                    if m.startswith("lattice") and t.split(".")[0] in ("pipelines", "features"))
    print(f"lattice -> pipelines/features edges: {len(upward)}")
    for m, t in upward:
        print(f"    {m} -> {t}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
