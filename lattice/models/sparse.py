"""Sparse arch: remap -> TorchRec EmbeddingBagCollection -> one token per feature."""

from __future__ import annotations

import torch
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, PoolingType
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from lattice.config import PlatformConfig
from lattice.config.schema import ModelSize
from lattice.models.remap import KJTRemap, make_remap


def table_shape(config: PlatformConfig, size: ModelSize) -> list[tuple[str, int, int]]:
    """(feature name, rows, dim) per sparse feature for a model size."""
    return [
        (f.name, max(2, int(round(f.num_embeddings * size.table_scale))), min(f.embedding_dim, size.embedding_dim))
        for f in config.features.sparse
    ]


class SparseArch(nn.Module):
    """KJT (one key per sparse feature) -> (B, F, D) tokens of width `size.embedding_dim`."""

    def __init__(self, config: PlatformConfig, size: ModelSize, fitted: dict | None = None):
        super().__init__()
        # fitted: feature -> fitted id map (lattice.hashing) for the schemes that need one
        shapes = table_shape(config, size)
        self.keys = [name for name, _, _ in shapes]
        self.dims = [dim for _, _, dim in shapes]
        self.remap = KJTRemap(self.keys, [make_remap(config, f, rows) for f, (_, rows, _) in zip(config.features.sparse, shapes)])
        self.ebc = EmbeddingBagCollection(
            tables=[
                EmbeddingBagConfig(name=f"t_{name}", embedding_dim=dim, num_embeddings=rows, feature_names=[name],
                                   pooling=PoolingType.SUM)
                for name, rows, dim in shapes
            ],
            device=torch.device("cpu"),
        )
        # tables narrower than the token width get their own projection
        self.proj = nn.ModuleDict({n: nn.Linear(d, size.embedding_dim, bias=False) for n, d in zip(self.keys, self.dims)
                                   if d != size.embedding_dim})

    @property
    def num_tokens(self) -> int:
        return len(self.keys)

    def pooled(self, kjt: KeyedJaggedTensor) -> dict[str, torch.Tensor]:
        return self.ebc(self.remap(kjt)).to_dict()  # feature -> (B, d_f)

    def forward(self, kjt: KeyedJaggedTensor) -> torch.Tensor:
        emb = self.pooled(kjt)
        tokens = [self.proj[n](emb[n]) if n in self.proj else emb[n] for n in self.keys]  # F x (B, D)
        return torch.stack(tokens, dim=1)  # (B, F, D)
