"""Deep models against the gradient-boosted-trees baselines, cell by cell: the first thing a user
of their own data needs to know is whether the deep model beats trees there at all.

For every (domain, objective) cell the reference is the best tree model's test NE (`gbdt`,
`gbdt_cell`, ...); each deep model's ΔNE = its NE - that reference (negative: the deep model is
better). Whether a difference is more than noise comes from the paired bootstrap of the two
models' test predictions (lattice.evaluation.compare) where the caller has it; otherwise a
difference within 2 standard errors of either NE (`ne_se`) is called a tie, a cruder (unpaired,
so wider) bound. On small test splits two NEs differ by noise alone.
"""

from __future__ import annotations

import math
from typing import Any

from lattice.models.build import GBDT_KINDS

TIE_SE = 2.0


def is_tree(name: str) -> bool:
    """A model name whose kind (before '@' or ':') is a LightGBM baseline."""
    return name.split("@")[0].split(":")[0] in GBDT_KINDS


def _num(x: Any) -> float | None:
    return float(x) if isinstance(x, (int, float)) and math.isfinite(x) else None


def _paired(comparisons: list[dict] | None) -> dict[tuple[str, str], dict]:
    """(a, b) -> compare_models entry, for the pairs that were compared."""
    return {(c["a"], c["b"]): c for c in comparisons or [] if "error" not in c}


def _paired_verdict(pairs: dict[tuple[str, str], dict], deep: str, tree: str, cell: str) -> str | None:
    """The bootstrap's verdict for the deep model against the tree on `cell`, or None."""
    if (deep, tree) in pairs:
        v = pairs[(deep, tree)]["cells"].get(cell, {}).get("verdict")
        return {"A better": "better", "B better": "worse", "within noise": "tie"}.get(v or "")
    if (tree, deep) in pairs:
        v = pairs[(tree, deep)]["cells"].get(cell, {}).get("verdict")
        return {"B better": "better", "A better": "worse", "within noise": "tie"}.get(v or "")
    return None


def versus_trees(models: dict[str, dict[str, Any]], comparisons: list[dict] | None = None) -> dict[str, Any] | None:
    """`models`: name -> {"cells": {cell: {"ne", "ne_se", ...}}} (metrics.json or the demo's report
    entries); `comparisons`: compare_models's pairs, if computed. None when there is no tree model
    or no deep model to compare."""
    trees = [m for m in models if is_tree(m)]
    deep = [m for m in models if not is_tree(m)]
    if not trees or not deep:
        return None
    cells = sorted({c for m in models.values() for c in m.get("cells", {})})
    pairs = _paired(comparisons)
    rows: dict[str, dict[str, Any]] = {}
    summary: dict[str, dict[str, Any]] = {d: {"better": 0, "tie": 0, "worse": 0, "cells": 0, "deltas": []} for d in deep}
    for cell in cells:
        scored: list[tuple[str, float]] = []
        for t in trees:
            t_ne = _num(models[t]["cells"].get(cell, {}).get("ne"))
            if t_ne is not None:
                scored.append((t, t_ne))
        if not scored:
            continue
        tree, tree_ne = min(scored, key=lambda x: x[1])
        tree_se = _num(models[tree]["cells"][cell].get("ne_se")) or 0.0
        row: dict[str, Any] = {"tree": tree, "tree_ne": tree_ne, "deep": {}}
        for d in deep:
            c = models[d].get("cells", {}).get(cell, {})
            ne = _num(c.get("ne"))
            if ne is None:
                continue
            delta = ne - tree_ne
            verdict, basis = _paired_verdict(pairs, d, tree, cell), "paired bootstrap 95%"
            if verdict is None:
                noise = TIE_SE * max(_num(c.get("ne_se")) or 0.0, tree_se)
                verdict, basis = ("tie" if abs(delta) <= noise else "better" if delta < 0 else "worse"), "2 standard errors"
            row["deep"][d] = {"ne": ne, "delta": delta, "verdict": verdict, "basis": basis}
            s = summary[d]
            s[verdict] += 1
            s["cells"] += 1
            s["deltas"].append(delta)
        rows[cell] = row
    for s in summary.values():
        deltas = s.pop("deltas")
        s["mean_delta"] = sum(deltas) / len(deltas) if deltas else None
    return {"trees": trees, "cells": rows, "summary": summary}


def versus_lines(versus: dict[str, Any] | None) -> list[str]:
    """One line per deep model, e.g. 'teacher vs trees (gbdt, gbdt_cell): better in 3, tie in 1,
    worse in 1 of 5 cells; mean ΔNE -0.0042 (negative: the deep model is better)'."""
    if not versus:
        return []
    lines = []
    for d, s in versus["summary"].items():
        if not s["cells"]:
            continue
        lines.append(f"{d} vs trees ({', '.join(versus['trees'])}): better in {s['better']}, tie in {s['tie']}, "
                     f"worse in {s['worse']} of {s['cells']} cells; mean ΔNE {s['mean_delta']:+.4f} "
                     "(negative: the deep model is better)")
    bases = sorted({v["basis"] for row in versus["cells"].values() for v in row["deep"].values()})
    if lines:
        lines.append(f"  (ΔNE = deep NE - best tree NE per cell; tie = within noise by {' / '.join(bases)})")
    return lines
