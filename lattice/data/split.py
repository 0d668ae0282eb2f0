"""The train / validation / test split, the same for every model (teacher, student, baselines).

Rule: an example's split is a pure function of its `example_id`: the first 8 bytes of
blake2b(example_id) as a fraction u in [0, 1); u < test_fraction -> test, then the next
validation_fraction -> validation, the rest -> train. Why a hash and not time: the split does not
depend on how the table is partitioned or ordered, each worker and rank decides it locally without
a global pass, and a re-run on more data keeps every old example in its split.
"""

from __future__ import annotations

import hashlib
from typing import Iterable, Literal

import numpy as np

from lattice.config import PlatformConfig

Split = Literal["train", "validation", "test", "all"]
SPLITS = ("train", "validation", "test", "all")


def hash_fraction(example_ids: Iterable[str]) -> np.ndarray:
    """example_id -> u in [0, 1), stable across processes, machines and Python versions."""
    return np.fromiter(
        (int.from_bytes(hashlib.blake2b(str(e).encode(), digest_size=8).digest(), "big") / 2**64 for e in example_ids),
        dtype=np.float64,
    )


def split_mask(config: PlatformConfig, example_ids: Iterable[str], split: Split) -> np.ndarray:
    """Boolean mask of the rows of `split`."""
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; use one of {SPLITS}")
    u = hash_fraction(example_ids)
    if split == "all":
        return np.ones(len(u), dtype=bool)
    test = config.training.test_fraction
    val = config.training.validation_fraction
    if split == "test":
        return u < test
    if split == "validation":
        return (u >= test) & (u < test + val)
    return u >= test + val
