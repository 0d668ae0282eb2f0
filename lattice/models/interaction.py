"""Wukong-style interaction layer: factorization-machine block + linear compression block,
residual and LayerNorm. Tokens in, tokens out, so layers stack."""

from __future__ import annotations

import torch
from torch import nn
from torch.fx._symbolic_trace import is_fx_symbolic_tracing

from lattice.config.schema import ModelSize
from lattice.models.gemm import Linear, PairMatmul, TokenMix
from lattice.models.mods import Mods


class WukongLayer(nn.Module):
    def __init__(self, n_in: int, n_out: int, dim: int, fm_rank: int, dropout: float = 0.0,
                 size: ModelSize | None = None):
        super().__init__()
        mods = Mods.of(size)
        self.n_fm = max(1, n_out // 2)
        self.n_lc = n_out - self.n_fm
        self.dim = dim
        # FMB: low-rank pairwise interactions X (X^T Y): O(N·k·D) instead of O(N²·D)
        self.fm_proj = TokenMix(n_in, fm_rank, dim)  # weight (N, k)
        self.fm_pair = PairMatmul(dim, fm_rank, rows_per_example=n_in)  # x (B, N, D) · z (B, k, D)^T
        hidden = max(64, self.n_fm * dim)
        self.fm_mlp = nn.Sequential(
            nn.LayerNorm(n_in * fm_rank, bias=mods.bias),
            Linear(n_in * fm_rank, hidden, bias=mods.bias), *mods.after_hidden(hidden), nn.Dropout(dropout),
            Linear(hidden, self.n_fm * dim, bias=mods.bias),
        )
        # LCB: linear recombination of tokens, keeps low-order information
        self.lcb = TokenMix(n_in, self.n_lc, dim) if self.n_lc else None  # weight (N, n_lc)
        self.skip = None if n_in == n_out else TokenMix(n_in, n_out, dim)  # weight (N, n_out)
        self.norm = nn.LayerNorm(dim, bias=mods.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, N, D) -> (B, n_out, D)
        b = x.shape[0]
        z = self.fm_proj(x)  # (B, k, D)
        inter = self.fm_pair(x, z)  # (B, N, k)
        fm = self.fm_mlp(inter.flatten(1)).view(b, self.n_fm, self.dim)  # (B, n_fm, D)
        parts = [fm]
        if self.lcb is not None:
            parts.append(self.lcb(x))  # (B, n_lc, D)
        out = torch.cat(parts, dim=1)  # (B, n_out, D)
        res = x if self.skip is None else self.skip(x)
        return self.norm(out + res)


class DomainFM(nn.Module):
    """(B, N, D) tokens + (B,) domains -> (B, N(N-1)/2 · C): for every token pair i < j and channel c,
    x_i · (s[d, c] ⊙ x_j). The weights start near 1 (plain dot products, as an FM has) and learn a
    signed diagonal metric per domain, so an interaction can differ in sign and scale by domain."""

    def __init__(self, n_tokens: int, dim: int, n_domains: int, channels: int):
        super().__init__()
        self.channels, self.dim = channels, dim
        self.scale = nn.Parameter(1.0 + 0.1 * torch.randn(n_domains, channels, dim))  # (n_dom, C, D)
        i, j = torch.triu_indices(n_tokens, n_tokens, offset=1)
        eye = torch.eye(n_tokens)
        # pairs are picked by one-hot matmuls: their backward is a matmul too, where an index
        # gather's backward is a scatter (3x slower on CPU at batch 1024). They stay plain ops, not
        # FP8 sites: multiplying by a 0/1 matrix copies tokens, so FP8 would only round them.
        self.register_buffer("pick_i", eye[i], persistent=False)  # (P, N)
        self.register_buffer("pick_j", eye[j], persistent=False)  # (P, N)
        # Weighting the pairs by every domain and keeping each row's own costs n_domains times the
        # work but skips a per-example gather: faster up to 4 domains, slower beyond (fwd+bwd at
        # batch 1024, 10 tokens, 8 channels, 1 thread: 1.3x faster at 3 domains, 0.9x at 6).
        self.per_example = n_domains > 4
        # the pair weighting is the GEMM site: pairs (B, P, D) against each example's own
        # (C, D) weights (batched), or all pair rows (B·P, D) against every domain's (n_dom·C, D)
        n_pairs = int(i.numel())
        self.mix = (PairMatmul(dim, channels, batched=True, rows_per_example=n_pairs) if self.per_example
                    else PairMatmul(dim, n_domains * channels, batched=False, rows_per_example=n_pairs))

    @property
    def out_dim(self) -> int:
        return self.channels * self.pick_i.shape[0]

    def forward(self, x: torch.Tensor, domain: torch.Tensor) -> torch.Tensor:
        b, n_dom = x.shape[0], self.scale.shape[0]
        pairs = torch.matmul(self.pick_i, x) * torch.matmul(self.pick_j, x)  # (B, P, D): x_i ⊙ x_j
        if self.per_example:
            return self.mix(pairs, self.scale[domain]).flatten(1)  # (B, P, C) -> (B, P·C)
        every = self.mix(pairs, self.scale)  # (B·P, D) x (n_dom·C, D)^T -> (B·P, n_dom·C)
        every = every.view(b, -1, n_dom, self.channels)  # (B, P, n_dom, C)
        index = domain.view(b, 1, 1, 1).expand(b, every.shape[1], 1, self.channels)
        return every.gather(2, index).flatten(1)  # (B, P·C)


class DomainUntied(nn.Module):
    """One copy of a layer per domain; each example goes through its own domain's copy."""

    def __init__(self, make: callable, n_domains: int):
        super().__init__()
        self.layers = nn.ModuleList([make() for _ in range(n_domains)])
        first = self.layers[0]
        self.n_out, self.dim = first.n_fm + first.n_lc, first.dim

    def forward(self, x: torch.Tensor, domain: torch.Tensor) -> torch.Tensor:  # (B, N, D), (B,)
        if not self.training or is_fx_symbolic_tracing():
            # scoring (eval and the serving artifact) runs every copy on the whole batch and keeps
            # each row's own: a request from one domain would give the other copies 0 rows, which
            # the shapes of the FP8 serving forms cannot take, and an FP8 GEMM's scale follows the
            # rows it sees, so eval and the artifact see the same rows and agree
            every = torch.stack([layer(x) for layer in self.layers])  # (n_dom, B, n_out, D)
            return every[domain, torch.arange(x.shape[0])]  # (B, n_out, D)
        # training runs each copy on its own domain's rows only, skipping a domain absent from the
        # batch (an FP8 scale or a probe has nothing to read in 0 rows). Every copy on every row did
        # n_domains times the work: fwd+bwd of a 12-token layer, 2 threads, 4 domains, 7.6 -> 5.5 ms
        # at batch 128 and 40 -> 15 ms at 2048. The rows are grouped by one sort and put back by one
        # gather: a select and a copy per domain cost 1.2 ms of glue per step at batch 128 (4 domains)
        order = torch.argsort(domain, stable=True)  # rows grouped by domain
        counts = torch.bincount(domain, minlength=len(self.layers)).tolist()
        groups = x.index_select(0, order).split(counts)
        out = torch.cat([layer(g) for layer, g, n in zip(self.layers, groups, counts) if n])  # (B, n_out, D), sorted
        return out.index_select(0, torch.argsort(order))  # (B, n_out, D), the batch's order


def mlp(n_in: int, dims: list[int], n_out: int, dropout: float = 0.0, size: ModelSize | None = None,
        head: bool = True) -> nn.Sequential:
    """Hidden layers (`trunk`) and an output Linear. `head`: the output is a prediction layer,
    the one layer that keeps its bias under the Mod `bias: final`."""
    mods = Mods.of(size)
    return nn.Sequential(*trunk(n_in, dims, dropout, size), Linear(dims[-1] if dims else n_in, n_out, bias=head or mods.bias))


def trunk(n_in: int, dims: list[int], dropout: float = 0.0, size: ModelSize | None = None) -> nn.Sequential:
    """Hidden layers only (Linear, activation, [block norm,] Dropout per width): a representation
    several heads share. `size` carries the Mods (bias, block_norm, activation)."""
    mods = Mods.of(size)
    layers: list[nn.Module] = []
    for d in dims:
        layers += [Linear(n_in, d, bias=mods.bias), *mods.after_hidden(d), nn.Dropout(dropout)]
        n_in = d
    return nn.Sequential(*layers)
