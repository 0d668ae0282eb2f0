"""Refit of a parent's id maps for a warm start: known ids keep their rows, never reshuffled.

`vocab`: the parent's ids keep their rows and the out-of-vocabulary row keeps its place; ids of
the new days seen at least `min_count` times (most frequent first, ties by id) take the budget's
free rows after the parent's table (which grows by that many rows; the trainer copies the parent's
rows and the new ones start fresh); ids beyond the budget share the out-of-vocabulary row, as
unseen ids always did. `mixed` and `learned` keep the parent's maps frozen: their rows are
frequency ranks cut into width blocks (mixed) or clusters of the whole window (learned), so any
refit would move known ids; ids new since the parent take their hashed out-of-map rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from lattice.config import PlatformConfig
from lattice.data.window import DaySplits
from lattice.hashing.store import content_version


def train_id_counts(config: PlatformConfig, table: Path, days: DaySplits | None, columns: list[str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """column -> (ids ascending, training rows per id) over the run's train split."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from lattice.data.loader import _row_split, _unit_wanted, read_unit, scan_units

    seen: dict[str, list[np.ndarray]] = {c: [] for c in columns}
    for unit in scan_units(table):
        if not _unit_wanted(unit, days):
            continue
        tbl, part = read_unit(unit, ["example_id", "split", "date", "event_timestamp", *columns])
        keep = _row_split(config, tbl, part, "train", days)
        tbl = tbl.take(pa.array(np.flatnonzero(keep)))
        for c in columns:
            if c in tbl.column_names:
                seen[c].append(pc.drop_null(tbl.column(c)).cast(pa.int64()).to_numpy())
    out = {}
    for c, parts in seen.items():
        ids = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        u, n = np.unique(ids, return_counts=True)
        out[c] = (u.astype(np.int64), n.astype(np.int64))
    return out


def extend_vocab(old: dict[str, Any], ids: np.ndarray, counts: np.ndarray, min_count: int) -> dict[str, Any]:
    """The parent's vocab map with the new frequent ids in the free rows (see the module doc)."""
    known = np.asarray(old["ids"], np.int64)
    is_new = ~np.isin(ids, known)
    cand = np.flatnonzero(is_new & (counts >= min_count))
    cand = cand[np.lexsort((ids[cand], -counts[cand]))]
    start = int(old["table_rows"])
    take = cand[: max(0, int(old["budget"]) - start)]
    merged_counts = np.asarray(old["counts"], np.int64).copy()
    hit = np.isin(ids, known)
    merged_counts[np.searchsorted(known, ids[hit])] += counts[hit]
    all_ids = np.concatenate([known, ids[take]])
    rows = np.concatenate([np.asarray(old["rows_of"], np.int64), np.arange(start, start + len(take), dtype=np.int64)])
    cnt = np.concatenate([merged_counts, counts[take]])
    order = np.argsort(all_ids, kind="stable")
    out = {**old, "ids": all_ids[order], "rows_of": rows[order], "counts": cnt[order],
           "table_rows": start + len(take), "frequent": int(old.get("frequent", 0)) + len(take),
           "stats": {**(old.get("stats") or {}), "kept": int(len(all_ids)), "added_by_refit": int(len(take))},
           "parent_version": old.get("version")}
    out["version"] = content_version(out)
    return out


def refit(config: PlatformConfig, parent_maps: dict[str, dict], table: Path, days: DaySplits | None) -> dict[str, dict]:
    """feature -> {budget: map} for the warm-started model: vocab extended, the rest as the parent's."""
    feats = {f.name: f for f in config.features.sparse}
    vocab = [n for n in parent_maps if n in feats and feats[n].hashing == "vocab"]
    counts = train_id_counts(config, table, days, sorted({feats[n].column for n in vocab})) if vocab else {}
    out = {}
    for name, by_budget in parent_maps.items():
        if name in vocab:
            ids, n = counts[feats[name].column]
            out[name] = {r: extend_vocab(m, ids, n, feats[name].fit_min_count()) for r, m in by_budget.items()}
        else:
            out[name] = by_budget
    return out
