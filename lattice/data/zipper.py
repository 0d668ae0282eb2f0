"""The data side of Zipper heads (Meta Lattice): K attribution windows W1 < ... < WK, each
impression hashed to one of them, and labelled with what was known within its window once that
window has closed. Head k of an objective trains on the impressions of window k only; the short
windows bring fresh impressions into the shared layers days before the long window closes, and
serving reads the longest window's head.

Only the labels are built here; the K heads per objective and their loss are model work (see
docs/time-in-data.md). The window of an impression is a salted hash of its example id, so it is
the same in every run, independent of the train/validation/test split's hash, and each window
receives its declared share of the impressions.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from lattice.data import schema as S
from lattice.data.label_time import _cutoff_us, _to_us

_SALT = "zipper\x1f"  # keeps the window independent of the split's hash of the same id
_DIGITS = 13


def window_index(example_ids: Iterable[str], shares: Sequence[float]) -> np.ndarray:
    """Each id's window (0..K-1), with probabilities `shares` (they must sum to 1)."""
    shares = np.asarray(shares, dtype=np.float64)
    if shares.ndim != 1 or not len(shares) or (shares <= 0).any() or abs(shares.sum() - 1) > 1e-9:
        raise ValueError(f"zipper shares {shares.tolist()} must be positive and sum to 1")
    u = np.fromiter((int(hashlib.sha256((_SALT + str(e)).encode()).hexdigest()[:_DIGITS], 16) / 16**_DIGITS
                     for e in example_ids), dtype=np.float64)
    edges = np.cumsum(shares)[:-1]
    return np.searchsorted(edges, u, side="right").astype(np.int64)


def head_labels(df: pd.DataFrame, objective: str, cutoff: dt.datetime, windows: Sequence[dt.timedelta],
                shares: Sequence[float]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Head k -> (label, mask) over all rows of `df` at `cutoff`: mask 1 only on the rows of
    window k whose window has closed; label 1 where the positive was logged within W_k of the
    impression (`known_<objective>`; without it a positive counts from the longest window only,
    since its time is unknown)."""
    if list(windows) != sorted(windows) or len(set(windows)) != len(windows):
        raise ValueError("zipper windows must be strictly increasing (W1 < ... < WK)")
    if len(windows) != len(shares):
        raise ValueError(f"{len(windows)} zipper windows but {len(shares)} shares")
    k = window_index(df["example_id"], shares)
    event = _to_us(df["event_timestamp"])
    known_col = S.known_column(objective)
    known = _to_us(df[known_col]) if known_col in df else None
    label = df[S.label_column(objective)].to_numpy() > 0
    mask = df[S.mask_column(objective)].to_numpy() > 0
    t = _cutoff_us(cutoff)
    out = {}
    for j, w in enumerate(windows):
        closes = event + int(w / dt.timedelta(microseconds=1))
        if known is None:
            within = label if j == len(windows) - 1 else np.zeros(len(df), bool)
        else:
            within = label & (known != np.iinfo(np.int64).min) & (known <= closes)
        m = mask & (k == j) & (closes <= t)
        out[j] = (np.where(m, within, False).astype(np.int8), m.astype(np.int8))
    return out
