"""A model's lineage: its parent (the warm start it continued from), the days it has seen and the
window it was judged on. Written by the trainer into model.pt (`lineage`) and `lineage.json` in
the model folder; the registry copies it into tags, the export into metadata.json, serving into
`/metadata`, and the gate reads its test day (lattice.promotion.next_day).

    {"warm_start": "none" | "last" | "champion",
     "parent": null | {"mode", "path", "version", "checksum", "days_seen"},
     "days_seen": ["2026-01-01", ...],     every day the model (and its ancestors) trained on
     "trained_days": [...],                 the days this run trained on (new days)
     "replayed_days": [...], "replay_share": 0.1,
     "matured_days": [...],                 days trained again on the labels known since the parent (mask)
     "window": null | {"train", "validation", "test", "end"},
     "judged_on": null | "2026-01-15",      the day after the window (next-day judgment)
     "chain_started": null | "2026-01-04",  the interval end of the chain's first (scratch) run
     "refreshed": null | {"every", "chain_started", "parent"}}  why this run left its parent's chain
"""

from __future__ import annotations

import json
from pathlib import Path

from lattice.data.window import DaySplits, TrainWindow


def build(mode: str, parent_json: dict | None, window: TrainWindow | None, days: DaySplits | None,
          chain_started: str | None = None, refreshed: dict | None = None) -> dict:
    """`chain_started`: the parent's (a warm start); a run from scratch starts its own chain at its
    interval end. `refreshed`: training.refresh_every sent this run back to scratch."""
    trained = days.train_days() if days is not None else []
    seen = sorted(set(parent_json["days_seen"] if parent_json else []) | set(trained))
    return {"warm_start": mode if parent_json else "none", "parent": parent_json, "days_seen": seen,
            "trained_days": trained, "replayed_days": list(days.replay) if days is not None else [],
            "replay_share": days.replay_share if days is not None else 0.0,
            "matured_days": list(days.matured) if days is not None else [],
            "window": window.to_json() if window is not None else None,
            "judged_on": window.test if window is not None else None,
            "splits": days.to_json() if days is not None else None,
            "chain_started": chain_started if parent_json else (window.end if window is not None else None),
            "refreshed": refreshed}


def chain_started(parent_lineage: dict) -> str | None:
    """When the chain a parent belongs to began; a parent written before lineages kept it counts
    from its own interval end (its judged day), so a refresh comes no earlier than the rule says."""
    return parent_lineage.get("chain_started") or parent_lineage.get("judged_on")


def read(model_dir: Path) -> dict | None:
    """The lineage of a trained model folder (or a registered copy of it); None before lineage existed."""
    f = Path(model_dir) / "lineage.json"
    if f.exists():
        return json.loads(f.read_text())
    pt = Path(model_dir) / "model.pt"
    if pt.exists():
        import torch

        return torch.load(pt, map_location="cpu", weights_only=False).get("lineage")
    return None


def tags(lineage: dict | None) -> dict[str, str]:
    """MLflow tags of a lineage (values are text; days as first..last and a count)."""
    if not lineage:
        return {}
    parent = lineage.get("parent") or {}
    days = lineage.get("days_seen") or []
    out = {"lattice.lineage.warm_start": str(lineage.get("warm_start", "none")),
           "lattice.lineage.days_seen": json.dumps(days) if len(days) <= 60 else f"{days[0]}..{days[-1]} ({len(days)} days)",
           "lattice.lineage.trained_days": json.dumps(lineage.get("trained_days") or [])[:5000]}
    if parent:
        out["lattice.lineage.parent_checksum"] = str(parent.get("checksum"))
        out["lattice.lineage.parent"] = str(parent.get("version") or parent.get("path"))
    if lineage.get("trees"):  # the tree fit whose leaf ids the model reads (models.leaves)
        out["lattice.lineage.trees"] = f"v{lineage['trees'].get('version')} sha256:{lineage['trees'].get('sha256')}"
    if lineage.get("judged_on"):
        out["lattice.lineage.judged_on"] = str(lineage["judged_on"])
    return out
