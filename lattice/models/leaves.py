"""Leaf arch (issue 38): the fitted trees' leaf ids (lattice.trees.leaves) -> one token per
objective's forest. Its own EmbeddingBagCollection (the planner shards and the sparse optimizer
updates it like any table), one table per forest of `trees * num_leaves` rows, pooled over the
forest's trees by `models.leaves.pooling`: MEAN by default, so the token is on the scale of one
feature's embedding (a SUM over 50 trees is up to 50 times larger, and on the demo it swamped the
interaction layers); SUM, the booster's additive form, for models saved before the key."""

from __future__ import annotations

from typing import List

import numpy as np
import torch
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, PoolingType
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

KEY_PREFIX = "leaves_"
POOLING = {"mean": PoolingType.MEAN, "sum": PoolingType.SUM}
BAG_MODE = {"mean": 1, "sum": 0}  # aten embedding_bag's mode of each pooling


def leaf_key(objective: str) -> str:
    """The KJT key (and EBC feature) of one objective's forest (lattice.trees.leaves builds it)."""
    return f"{KEY_PREFIX}{objective}"


class LeafArch(nn.Module):
    """KJT of the forests' keys -> (B, O, D) tokens. `spec`: LeafForest.spec(); `pooling`:
    models.leaves.pooling."""

    def __init__(self, spec: dict, dim: int, pooling: str = "mean"):
        super().__init__()
        trees = spec["trees"]
        self.pooling = pooling
        self.keys: List[str] = [leaf_key(o) for o in sorted(trees)]
        self.lookups: int = sum(int(t) for t in trees.values())  # ids a row reads (one per tree): its cost
        rows = {leaf_key(o): max(1, int(t) * int(spec["num_leaves"])) for o, t in trees.items()}
        self.ebc = EmbeddingBagCollection(
            tables=[EmbeddingBagConfig(name=f"t_{k}", embedding_dim=dim, num_embeddings=rows[k], feature_names=[k],
                                       pooling=POOLING[pooling]) for k in self.keys],
            device=torch.device("cpu"),
        )

    @property
    def num_tokens(self) -> int:
        return len(self.keys)

    def forward(self, kjt: KeyedJaggedTensor) -> torch.Tensor:
        pooled = self.ebc(kjt).to_dict()  # key -> (B, D)
        return torch.stack([pooled[k] for k in self.keys], dim=1)  # (B, O, D)


class LeafMargin(nn.Module):
    """KJT of the forests' keys -> (B, O) raw scores: each forest's leaf values summed over its
    trees, which is the booster's own margin (LightGBM folds the base score into the first tree's
    leaves). Frozen (a buffer): the network's head learns the residual on top of the trees
    (`models.leaves.margin`). One `embedding_bag` over the O x B bags, so the same code runs in
    training, under the planner (nothing to shard) and in the exported artifact. `spec`:
    LeafForest.spec() with `values`."""

    def __init__(self, spec: dict):
        super().__init__()
        self.objectives: List[str] = sorted(spec["trees"])
        self.lookups: int = sum(int(t) for t in spec["trees"].values())  # one leaf value per tree and row
        tables = [torch.as_tensor(spec["values"][o], dtype=torch.float32) for o in self.objectives]
        self.n_keys = len(tables)
        rows = torch.tensor([int(t.numel()) for t in tables], dtype=torch.int64)
        self.register_buffer("values", torch.cat(tables).unsqueeze(1))  # (rows, 1)
        self.register_buffer("starts", torch.cumsum(rows, 0) - rows)

    def forward(self, kjt: KeyedJaggedTensor) -> torch.Tensor:
        return stacked_bags(self.values, self.starts, self.n_keys, kjt).squeeze(2)  # (B, O)


def stacked_bags(table: torch.Tensor, starts: torch.Tensor, n_keys: int, kjt: KeyedJaggedTensor,
                 mode: int = 0) -> torch.Tensor:
    """Pool a KJT of `n_keys` keys over one table that stacks the keys' tables (key k's rows
    begin at `starts[k]`): each id shifted to its key's first row, one `embedding_bag` over the
    n_keys x B bags. `mode`: aten's, 0 sum, 1 mean. Returns (B, n_keys, D). One call, not one
    per key: at batch 1 the per-key calls cost more than the lookups."""
    values, lengths = kjt.values(), kjt.lengths()
    per_key = lengths.view(n_keys, -1).sum(1)  # ids of each key
    ids = values + torch.repeat_interleave(starts, per_key)
    offsets = torch.cat([torch.zeros(1, dtype=lengths.dtype), torch.cumsum(lengths, 0)])
    pooled = torch.embedding_bag(table, ids, offsets, False, mode, False, None, True)[0]  # (n_keys*B, D)
    return pooled.view(n_keys, -1, pooled.shape[1]).transpose(0, 1)


def split_leaves(sparse: KeyedJaggedTensor, n_features: int, keys: List[str]) -> tuple[KeyedJaggedTensor, KeyedJaggedTensor]:
    """The batch's KJT -> (the features' keys, the forests' keys `keys`)."""
    if isinstance(sparse, KeyedJaggedTensor) and sparse.keys()[n_features:] != keys:  # eager only
        raise ValueError(f"this model reads leaf ids {keys} after its features, the batch has {sparse.keys()[n_features:]}: "
                         "build its batches with the model's leaf_forest (RowEncoder / BatchLoader / batch_from_frame leaves=)")
    parts = sparse.split([n_features, len(keys)])
    return parts[0], parts[1]


def leaf_keys(model: nn.Module) -> list[str]:
    """The forests' KJT keys `model` reads, for its tokens or its margin (in the order it reads them)."""
    keys: list[str] = []
    for m in model.modules():
        if isinstance(m, LeafArch):
            keys += [k for k in m.keys if k not in keys]
        elif isinstance(m, LeafMargin):
            keys += [leaf_key(o) for o in m.objectives if leaf_key(o) not in keys]
    return keys


def add_empty_leaves(kjt: KeyedJaggedTensor, model: nn.Module) -> KeyedJaggedTensor:
    """`kjt` with an empty bag per row for every forest `model` reads (stand-in and cost batches)."""
    keys = leaf_keys(model)
    if not keys:
        return kjt
    b = kjt.stride()
    return KeyedJaggedTensor(keys=kjt.keys() + keys, values=kjt.values(),
                             lengths=torch.cat([kjt.lengths(), torch.zeros(b * len(keys), dtype=kjt.lengths().dtype)]))


def leaf_values(arrs: dict[str, np.ndarray]) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(KJT key, values, lengths) per forest in `arrs` (sorted by objective): every row a bag of
    one id per tree, row-major; a negative id (a cross-fitted train row's, lattice.trees.leaves
    EMPTY) is left out of its bag, so such a row's bag is empty (a zero token under mean pooling)."""
    out = []
    for k in sorted(k for k in arrs if k.startswith("leaf:")):
        leaves = arrs[k]  # (n, T)
        if leaves.size and leaves.min() < 0:
            kept = leaves >= 0
            out.append((leaf_key(k.split(":", 1)[1]), leaves[kept], kept.sum(1).astype(np.int32)))
        else:
            out.append((leaf_key(k.split(":", 1)[1]), leaves.reshape(-1), np.full(leaves.shape[0], leaves.shape[1], np.int32)))
    return out
