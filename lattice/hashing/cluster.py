"""`learned` hashing: which tail ids share a row. Each id gets a small vector describing how its
rows behave, and ids with close vectors share a row (MiniBatchKMeans), so a shared embedding is
the one several look-alike ids would each have learnt, not an average of unrelated ids.

The representation, per id, from the training window only (counts summed exactly in Spark by
`id_stats`; the floats are derived here):

* per objective, the id's label lift in logit space: logit of its smoothed label rate minus
  logit of the rate its rows would have at their domains' base rates, both smoothed with
  `PRIOR_ROWS` pseudo-rows at the objective's overall rate. What an id's embedding is for is
  to move the prediction away from the base rate; ids that move it the same way are the ones
  whose embeddings would agree. Taking the lift rather than the raw rate keeps an id that
  happens to be shown mostly in a high-rate domain from looking like a high-rate id (the
  model's domain token already carries the domain's base rate). The smoothing pulls ids with
  few labelled rows to 0 (no evidence), so rare ids gather in "unremarkable" rows instead of
  being scattered by their noise. An id without labels for an objective, or with fewer than
  `MIN_LIFT_ROWS` of them, sits at 0: a rare id's own few labels would otherwise pick its row, and
  the model would learn those training labels through the row (a target leak).
* its share of rows per domain (omitted for one domain): where an id is shown is the context
  its embedding interacts with (the domain token, domain-weighted interactions).
* log(1 + count): keeps mid-frequency ids apart from the long tail, whose smoothed lifts are
  all near 0 anyway.

The columns stay in their natural units, which mean the same on any data: a logit of lift, a
share of rows, a factor e of traffic (weighted `COUNT_WEIGHT`, so it only separates ids whose
traffic differs by orders of magnitude). They are not z-scored: that would blow a column that is
pure noise (domain shares of ids shown evenly everywhere) up to the weight of the label lift and
let it decide the clusters. Dense
fields (price, activity) are left out: they describe the impression rather than the id, and
a mean per id would cost one more aggregate per dense column for little signal.

Cost: KMeans with as many centres as rows would be O(ids · rows) per pass (90k rows of the demo's
user table over millions of ids). So at most `MAX_CLUSTERS` centres are fitted, on at most
`FIT_SAMPLE` ids (weighted by count: clusters follow traffic); when the rows outnumber the
centres, each cluster gets rows in proportion to its ids and its ids are split into contiguous
runs along the representation's first principal direction, so ids sharing a row are still
neighbours. Everything is seeded and ordered by id: the same counts give the same rows.
"""

from __future__ import annotations

import numpy as np

from lattice.hashing.id_stats import IdStats, Window

PRIOR_ROWS = 20.0
MIN_LIFT_ROWS = 50
"""Labelled rows an id needs before its label lift counts (below: 0, like an id with no labels)."""
COUNT_WEIGHT = 0.25
MAX_CLUSTERS = 256  # a 6-d vector has few distinguishable regions; more centres cost linearly
FIT_SAMPLE = 200_000
BATCH_SIZE = 4096
_EPS = 1e-6


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, _EPS, 1 - _EPS)
    return np.log(p) - np.log1p(-p)


def representation(stats: IdStats, window: Window, sel: np.ndarray) -> np.ndarray:
    """(len(sel), d) float64 vectors of the ids at positions `sel` of `stats` (see the module doc)."""
    assert stats.labelled is not None and stats.positives is not None and stats.domain_rows is not None
    cell, overall = window.rates()  # (D, O), (O,)
    lab = stats.labelled[sel].astype(np.float64)  # (m, D, O)
    n_lab = lab.sum(1)  # (m, O)
    expected = (lab * cell[None]).sum(1)  # positives at the domains' base rates
    prior = PRIOR_ROWS * overall[None, :]
    own = (stats.positives[sel] + prior) / (n_lab + PRIOR_ROWS)
    base = (expected + prior) / (n_lab + PRIOR_ROWS)
    # an id's own labels decide its row only when they are many: grouping rare ids by the few labels
    # they have puts the ids that clicked in training into shared "clicker" rows, a target leak the
    # model learns on train rows and that fails on new ones (demo 1M rows, 16x: train loss 0.239
    # against 0.279 with exact ids, validation NE 1.148)
    lift = np.where(n_lab >= MIN_LIFT_ROWS, _logit(own) - _logit(base), 0.0)
    parts = [lift]
    counts = stats.counts[sel].astype(np.float64)
    if stats.domain_rows.shape[1] > 1:
        parts.append(stats.domain_rows[sel] / np.maximum(counts, 1)[:, None])
    parts.append(COUNT_WEIGHT * np.log1p(counts)[:, None])
    return np.concatenate(parts, axis=1)


def _allocate(sizes: np.ndarray, rows: int) -> np.ndarray:
    """Rows per cluster: proportional to its ids, at least 1, at most its ids, summing to `rows`
    (callers guarantee len(sizes) <= rows <= sizes.sum())."""
    share = sizes * (rows / sizes.sum())
    alloc = np.clip(np.floor(share).astype(np.int64), 1, sizes)
    while alloc.sum() > rows:  # the floor of 1 overshot: take from the largest allocations
        alloc[np.argmax(alloc - (alloc <= 1) * rows)] -= 1
    left = rows - int(alloc.sum())
    if left:
        # largest remainders first, among clusters with spare ids; ties by cluster index
        spare = np.flatnonzero(alloc < sizes)
        order = spare[np.lexsort((spare, -(share[spare] - alloc[spare])))]
        while left:
            take = order[alloc[order] < sizes[order]][:left]
            alloc[take] += 1
            left -= len(take)
    return alloc


def cluster_rows(x: np.ndarray, weights: np.ndarray, rows: int, seed: int) -> np.ndarray:
    """Row in [0, used) for each vector, `used` <= `rows` (rows no id lands in are dropped and
    the rest renumbered in first-use order of cluster index, so the table has no dead rows)."""
    from sklearn.cluster import MiniBatchKMeans

    n = len(x)
    if n <= rows:
        return np.arange(n, dtype=np.int64)
    k = min(rows, MAX_CLUSTERS)
    rng = np.random.default_rng(seed)
    fit_at = np.sort(rng.choice(n, FIT_SAMPLE, replace=False)) if n > FIT_SAMPLE else np.arange(n)
    km = MiniBatchKMeans(n_clusters=k, random_state=seed, batch_size=BATCH_SIZE, n_init=1, max_no_improvement=5)
    km.fit(x[fit_at], sample_weight=weights[fit_at])
    label = km.predict(x).astype(np.int64)
    if k == rows:
        _, dense = np.unique(label, return_inverse=True)
        return dense.astype(np.int64)
    used, label = np.unique(label, return_inverse=True)
    sizes = np.bincount(label, minlength=len(used)).astype(np.int64)
    alloc = _allocate(sizes, rows)
    # split each cluster along the first principal direction of all vectors (fitted on the sample)
    centred = x[fit_at] - x[fit_at].mean(0)
    axis = np.linalg.svd(centred, full_matrices=False)[2][0] if centred.size else np.zeros(x.shape[1])
    axis = axis * (1 if axis[np.argmax(np.abs(axis))] >= 0 else -1)  # SVD's sign is arbitrary
    order = np.lexsort((np.arange(n), x @ axis, label))  # by cluster, then along the axis, then index
    first_row = np.concatenate([[0], np.cumsum(alloc)[:-1]])
    start = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    rank = np.empty(n, np.int64)
    rank[order] = np.arange(n) - start[label[order]]  # position within its cluster
    out = first_row[label] + (rank * alloc[label]) // sizes[label]
    return out.astype(np.int64)
