"""No import cycle in the project's own modules, type-only imports included (bench/import_graph.py
reads the sources' ASTs; a lazy import inside a function counts too, since it still ties the
two modules together: features.repo and features.store were tied that way once)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _tool():
    spec = importlib.util.spec_from_file_location("import_graph", ROOT / "bench" / "import_graph.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_no_import_cycles() -> None:
    tool = _tool()
    mods = tool.module_files(ROOT)
    assert len(mods) > 100  # it found the project
    assert tool.cycles(tool.graph_of(mods)) == []


def test_the_cycle_finder_finds_a_planted_cycle() -> None:
    tool = _tool()
    found = tool.cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}})
    assert [sorted(c) for c in found] == [["a", "b", "c"]]
