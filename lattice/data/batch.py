"""`Batch`: what every model sees (DESIGN.md contract)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor


@dataclass
class Batch:
    dense: torch.Tensor  # (B, n_dense) float32, transformed with the train split's stats
    sparse: KeyedJaggedTensor  # one key per sparse feature; a null value is an empty bag
    domain: torch.Tensor  # (B,) int64 index into config.domain_names
    labels: dict[str, torch.Tensor]  # objective -> (B,) float 0/1 (0 where masked)
    masks: dict[str, torch.Tensor]  # objective -> (B,) float 1 where the domain carries the label
    example_ids: np.ndarray  # (B,) str
    teacher: dict[str, torch.Tensor] | None = None  # objective -> (B,) teacher probability
    teacher_mask: torch.Tensor | None = None  # (B,) 1 where the teacher scored the example
    truth: dict[str, torch.Tensor] | None = field(default=None)  # objective -> (B,) true probability (NaN if unknown)
    # training.label_delay zipper: objective -> (B, K) labels / masks of its K window heads (lattice.data.zipper)
    zipper_labels: dict[str, torch.Tensor] | None = None
    zipper_masks: dict[str, torch.Tensor] | None = None

    def inputs(self) -> tuple[torch.Tensor, KeyedJaggedTensor, torch.Tensor]:
        """The model's forward arguments."""
        return self.dense, self.sparse, self.domain

    def __len__(self) -> int:
        return int(self.domain.shape[0])


def kjt_from_ids(keys: list[str], ids: list[np.ndarray], present: list[np.ndarray],
                 bags: list[tuple[str, np.ndarray, np.ndarray]] = ()) -> KeyedJaggedTensor:
    """One bag per (feature, example): length 1 with the id where present, 0 where null. `bags`:
    more keys after the features', each (key, values, lengths) already jagged (the forests' leaf
    ids, lattice.models.leaves.leaf_values), in the same one KJT."""
    parts = [v[p] for v, p in zip(ids, present)] + [v for _, v, _ in bags]
    lens = [p.astype(np.int32) for p in present] + [ls for _, _, ls in bags]
    values = np.concatenate(parts) if parts else np.zeros(0, np.int64)
    lengths = np.concatenate(lens) if lens else np.zeros(0, np.int32)
    return KeyedJaggedTensor(
        keys=list(keys) + [k for k, _, _ in bags],
        values=torch.from_numpy(values.astype(np.int64)),
        lengths=torch.from_numpy(lengths.astype(np.int32)),
    )
