"""The data side of Zipper heads (Meta Lattice): K attribution windows W1 < ... < WK, each
impression hashed to one of them, and labelled with what was known within its window once that
window has closed. Head k of an objective trains on the impressions of window k only; the short
windows bring fresh impressions into the shared layers days before the long window closes, and
serving reads the longest window's head.

The labels are built here; the loader hands them to the model as `Batch.zipper_labels` /
`zipper_masks`, LatticeNet grows the K-1 shorter heads (`LatticeNet.zipper`) and the loss trains
each head on its own rows (lattice.training.loss). The window of an impression is a salted hash
of its example id, so it is the same in every run, independent of the train/validation/test
split's hash, and each window receives its declared share of the impressions.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from typing import Iterable, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from lattice.data import schema as S
from lattice.data.label_time import _cutoff_us, _to_us, delayed_objectives

_SALT = "zipper\x1f"  # keeps the window independent of the split's hash of the same id
_DIGITS = 13


def head_key(objective: str, k: int) -> str:
    """The training-mode output of an objective's Zipper head k (0 .. K-2; head K-1, the longest
    window, is the objective's own output)."""
    return f"{objective}~zipper{k}"


def window_index(example_ids: Iterable[str], shares: Sequence[float]) -> np.ndarray:
    """Each id's window (0..K-1), with probabilities `shares` (they must sum to 1)."""
    shares = np.asarray(shares, dtype=np.float64)
    if shares.ndim != 1 or not len(shares) or (shares <= 0).any() or abs(shares.sum() - 1) > 1e-9:
        raise ValueError(f"zipper shares {shares.tolist()} must be positive and sum to 1")
    u = np.fromiter((int(hashlib.sha256((_SALT + str(e)).encode()).hexdigest()[:_DIGITS], 16) / 16**_DIGITS
                     for e in example_ids), dtype=np.float64)
    edges = np.cumsum(shares)[:-1]
    return np.searchsorted(edges, u, side="right").astype(np.int64)


def head_arrays(window: np.ndarray, event_us: np.ndarray, known_us: np.ndarray | None, label: np.ndarray,
                mask: np.ndarray, cutoff_us: int | None, windows: Sequence[dt.timedelta]) -> tuple[np.ndarray, np.ndarray]:
    """The rule on arrays: (labels (N, K), masks (N, K)) int8, from each row's hashed `window`,
    its impression time, the time its positive was logged (`known_us`, int64 min where none; None:
    the source logs no time), its final label and domain mask. Row i is in head window[i] only,
    masked until event + W_k <= cutoff (None: every window has closed); its label is 1 where the
    positive was logged within W_k (without a time, a positive counts in the longest head only)."""
    if list(windows) != sorted(windows) or len(set(windows)) != len(windows):
        raise ValueError("zipper windows must be strictly increasing (W1 < ... < WK)")
    n, k = len(event_us), len(windows)
    labels, masks = np.zeros((n, k), np.int8), np.zeros((n, k), np.int8)
    positive, labelled = label > 0, mask > 0
    for j, w in enumerate(windows):
        closes = event_us + int(w / dt.timedelta(microseconds=1))
        if known_us is None:
            within = positive if j == k - 1 else np.zeros(n, bool)
        else:
            within = positive & (known_us != np.iinfo(np.int64).min) & (known_us <= closes)
        m = labelled & (window == j)
        if cutoff_us is not None:
            m &= closes <= cutoff_us
        masks[:, j], labels[:, j] = m, m & within
    return labels, masks


def head_labels(df: pd.DataFrame, objective: str, cutoff: dt.datetime | None, windows: Sequence[dt.timedelta],
                shares: Sequence[float]) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """Head k -> (label, mask) over all rows of `df` at `cutoff` (None: every window closed): mask
    1 only on the rows of window k whose window has closed; label 1 where the positive was logged
    within W_k of the impression (`known_<objective>`; without it a positive counts from the
    longest window only, since its time is unknown)."""
    if len(windows) != len(shares):
        raise ValueError(f"{len(windows)} zipper windows but {len(shares)} shares")
    known_col = S.known_column(objective)
    labels, masks = head_arrays(window_index(df["example_id"], shares), _to_us(df["event_timestamp"]),
                                _to_us(df[known_col]) if known_col in df else None,
                                df[S.label_column(objective)].to_numpy(), df[S.mask_column(objective)].to_numpy(),
                                None if cutoff is None else _cutoff_us(cutoff), windows)
    return {j: (labels[:, j], masks[:, j]) for j in range(len(windows))}


def zipper_heads_arrow(tbl: pa.Table, cutoff: dt.datetime | None, config) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """With `training.label_delay: zipper`: delayed objective -> (labels (N, K), masks (N, K)) of
    its Zipper heads on the table's rows at `cutoff` (None: every window closed), from the final
    labels (call before `apply_cutoff_arrow`, which masks open windows). Empty otherwise."""
    z = config.training.zipper
    if config.training.label_delay != "zipper" or z is None:
        return {}
    names = set(tbl.column_names)
    objs = [o for o in delayed_objectives(config) if S.label_column(o) in names and S.mask_column(o) in names]
    if not objs:
        return {}
    if "event_timestamp" not in tbl.column_names:
        raise ValueError("Zipper heads need the table's event_timestamp column; rebuild the table with `lattice features`")
    window = window_index(np.asarray(tbl.column("example_id").to_numpy(zero_copy_only=False)).astype(str), z.share_list())
    event = _to_us(tbl.column("event_timestamp").to_pandas())
    cut = None if cutoff is None else _cutoff_us(cutoff)
    out = {}
    for o in objs:
        kc = S.known_column(o)
        known = _to_us(tbl.column(kc).to_pandas()) if kc in tbl.column_names else None
        lab = pc.fill_null(tbl.column(S.label_column(o)), 0).to_numpy()
        msk = pc.fill_null(tbl.column(S.mask_column(o)), 0).to_numpy()
        out[o] = head_arrays(window, event, known, lab, msk, cut, z.spans())
    return out


def newly_known_heads(heads: dict[str, tuple[np.ndarray, np.ndarray]], tbl: pa.Table, rows: np.ndarray,
                      parent_cutoff: dt.datetime, config, event_us: np.ndarray | None = None
                      ) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """On `rows` (a matured day's rows, lattice.data.label_time.train_newly_known): a head whose
    window had closed by the parent's cutoff trained then, so its mask is 0 now; one that closed
    since keeps its mask (each row trains its head once, when its window closes)."""
    if not heads or not rows.any():
        return heads
    event = event_us if event_us is not None else _to_us(tbl.column("event_timestamp").to_pandas())
    before = _cutoff_us(parent_cutoff)
    out = {}
    for o, (lab, msk) in heads.items():
        msk = msk.copy()
        for j, w in enumerate(config.training.zipper.spans()):
            msk[rows & (event + int(w / dt.timedelta(microseconds=1)) <= before), j] = 0
        out[o] = (lab, msk)
    return out
