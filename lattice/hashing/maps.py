"""Per-id counts (`id_stats`) -> the fitted id map of one scheme and row budget (the dict whose
keys `lattice.hashing.store` documents).

* `vocab`: ids seen at least `min_count` times, most frequent first (ties: smaller id first),
  one row each, at most R - 1 of them; every other id shares the out-of-vocabulary row after
  them. The table needs kept + 1 rows.
* `mixed`: the same ranks; `rows_of` is the frequency rank (0 = most frequent) and `counts` are
  there for the model's α-power rule, which cuts the ranks into blocks of different widths.
* `learned`: the top `learned_frequent_share · R` ids get rows of their own; the other kept ids
  are clustered (`lattice.hashing.cluster`) into the rows left after the range reserved for ids
  never seen or seen fewer than `min_count` times (3 unless set), which hash into it. That range
  gets at least `learned_unseen_share · R` rows, more when the ids below `min_count` carry more
  of the traffic outside the head (rows follow traffic, as they do among clusters). The rare ids
  train it, so it is what an unseen id looks like, and they stay out of the map, which the
  served artifact carries. When the kept ids fit the budget outright, every one gets its own row,
  nothing is clustered, and the table is those rows and the `learned_unseen_share · R` range.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from lattice.config.schema import SparseFeature
from lattice.hashing import cluster
from lattice.hashing.id_stats import IdStats, Window
from lattice.hashing.store import content_version

log = logging.getLogger("lattice.hashing")
MIN_TABLE_ROWS = 2  # TorchRec tables (and table_shape) take at least two rows


def frequency_order(stats: IdStats, min_count: int) -> np.ndarray:
    """Positions of the ids with count >= min_count, most frequent first, ties by id."""
    kept = np.flatnonzero(stats.counts >= min_count)
    return kept[np.lexsort((stats.ids[kept], -stats.counts[kept]))]


def _finish(feature: SparseFeature, budget: int, stats: IdStats, window: Window, pos: np.ndarray, rows: np.ndarray,
            oov_start: int, oov_rows: int, frequent: int, seconds: float) -> dict[str, Any]:
    """Assemble the map: arrays sorted by id, table size, coverage, version."""
    order = np.argsort(stats.ids[pos], kind="stable")
    pos, rows = pos[order], np.asarray(rows, np.int64)[order]
    counts = stats.counts[pos].astype(np.int64)
    fitted: dict[str, Any] = {
        "feature": feature.name, "scheme": feature.hashing, "version": "",
        "table_rows": max(MIN_TABLE_ROWS, oov_start + oov_rows), "budget": int(budget),
        "ids": stats.ids[pos].astype(np.int64), "rows_of": rows, "counts": counts,
        "oov_start": int(oov_start), "oov_rows": int(oov_rows), "frequent": int(frequent),
        "window": {"split": "train", "rows": window.rows, "start": window.start, "end": window.end},
        "stats": {"distinct": int(len(stats.ids)), "kept": int(len(pos)),
                  "coverage": float(counts.sum() / stats.present_rows) if stats.present_rows else 0.0,
                  "seconds": round(float(seconds), 3)},
    }
    fitted["version"] = content_version(fitted)
    return fitted


def ranked_map(feature: SparseFeature, budget: int, stats: IdStats, window: Window, seconds: float = 0.0) -> dict[str, Any]:
    """`vocab` and `mixed`: frequency ranks, capped at budget - 1 ids, one out-of-vocabulary row."""
    order = frequency_order(stats, feature.fit_min_count())
    cap = budget - 1
    if len(order) > cap:
        dropped = len(order) - cap
        log.warning("sparse feature %r (hashing %s, %d rows): %d of %d ids seen >= %d times do not fit and share the "
                    "out-of-vocabulary row with unseen ids; raise num_embeddings or min_count",
                    feature.name, feature.hashing, budget, dropped, len(order), feature.fit_min_count())
        order = order[:cap]
    n = len(order)
    return _finish(feature, budget, stats, window, order, np.arange(n), oov_start=n, oov_rows=1, frequent=n, seconds=seconds)


def learned_split(budget: int, frequent_share: float, unseen_share: float) -> tuple[int, int, int]:
    """(frequent rows, clustered rows, unseen rows) of a budget; at least one unseen row."""
    unseen = min(budget - 1, max(1, int(round(unseen_share * budget))))
    frequent = min(budget - unseen, int(round(frequent_share * budget)))
    return frequent, budget - unseen - frequent, unseen


def unseen_rows_for_traffic(stats: IdStats, order: np.ndarray, n_freq: int, n_clu: int, n_unseen: int) -> tuple[int, int]:
    """(clustered rows, unseen rows) once the hashed range gets its share of the rows outside the
    frequent head by the traffic it serves there: the rows of ids below min_count (unseen ids
    have none in the window). Never fewer unseen rows than asked for, never no clustered row."""
    outside_head = stats.present_rows - int(stats.counts[order[:n_freq]].sum())
    below = stats.present_rows - int(stats.counts[order].sum())
    want = int(round((n_clu + n_unseen) * below / outside_head)) if outside_head > 0 else 0
    unseen = max(n_unseen, min(want, n_clu + n_unseen - 1))
    return n_clu + n_unseen - unseen, unseen


def learned_map(feature: SparseFeature, budget: int, stats: IdStats, window: Window, seed: int = 0,
                seconds: float = 0.0) -> dict[str, Any]:
    """`learned`: own rows for the frequent ids, clustered rows for the rest, a hashed unseen range."""
    n_freq, n_clu, n_unseen = learned_split(budget, feature.learned_frequent_share, feature.learned_unseen_share)
    order = frequency_order(stats, feature.fit_min_count())
    if len(order) <= n_freq + n_clu:  # every kept id fits: no id has to share
        n = len(order)
        # the table stops there: giving the range the rows the kept ids leave instead cost 3.8x
        # the bytes on Taobao at 2x for the same NE (bench/README.md, "Learned hashing")
        return _finish(feature, budget, stats, window, order, np.arange(n), oov_start=n, oov_rows=n_unseen,
                       frequent=n, seconds=seconds)
    n_clu, n_unseen = unseen_rows_for_traffic(stats, order, n_freq, n_clu, n_unseen)
    head, tail = order[:n_freq], order[n_freq:]
    if n_clu == 0:
        log.warning("sparse feature %r (hashing learned, %d rows): no rows left to cluster into; %d seen ids fall into "
                    "the unseen range", feature.name, budget, len(tail))
        return _finish(feature, budget, stats, window, head, np.arange(len(head)), oov_start=len(head),
                       oov_rows=n_unseen, frequent=len(head), seconds=seconds)
    tail = np.sort(tail)  # cluster in id order: the input order, and so the result, is fixed
    x = cluster.representation(stats, window, tail)
    shared = cluster.cluster_rows(x, stats.counts[tail].astype(np.float64), n_clu, seed)
    used = int(shared.max()) + 1 if len(shared) else 0
    pos = np.concatenate([head, tail])
    rows = np.concatenate([np.arange(len(head)), len(head) + shared])
    return _finish(feature, budget, stats, window, pos, rows, oov_start=len(head) + used, oov_rows=n_unseen,
                   frequent=len(head), seconds=seconds)


def build_map(feature: SparseFeature, budget: int, stats: IdStats, window: Window, seed: int = 0,
              seconds: float = 0.0) -> dict[str, Any]:
    if feature.hashing in ("vocab", "mixed"):
        return ranked_map(feature, budget, stats, window, seconds)
    if feature.hashing == "learned":
        return learned_map(feature, budget, stats, window, seed, seconds)
    raise ValueError(f"sparse feature {feature.name!r}: hashing {feature.hashing!r} has no fitted map")
