"""Wukong-style interaction layer: factorization-machine block + linear compression block,
residual and LayerNorm. Tokens in, tokens out, so layers stack."""

from __future__ import annotations

import torch
from torch import nn


class WukongLayer(nn.Module):
    def __init__(self, n_in: int, n_out: int, dim: int, fm_rank: int, dropout: float = 0.0):
        super().__init__()
        self.n_fm = max(1, n_out // 2)
        self.n_lc = n_out - self.n_fm
        self.dim = dim
        # FMB: low-rank pairwise interactions X (X^T Y): O(N·k·D) instead of O(N²·D)
        self.fm_proj = nn.Parameter(torch.randn(n_in, fm_rank) / n_in**0.5)  # (N, k)
        hidden = max(64, self.n_fm * dim)
        self.fm_mlp = nn.Sequential(
            nn.LayerNorm(n_in * fm_rank),
            nn.Linear(n_in * fm_rank, hidden), nn.ReLU(), nn.Dropout(dropout),
            nn.Linear(hidden, self.n_fm * dim),
        )
        # LCB: linear recombination of tokens, keeps low-order information
        self.lcb = nn.Parameter(torch.randn(n_in, self.n_lc) / n_in**0.5) if self.n_lc else None  # (N, n_lc)
        self.skip = None if n_in == n_out else nn.Parameter(torch.randn(n_in, n_out) / n_in**0.5)  # (N, n_out)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, N, D) -> (B, n_out, D)
        b = x.shape[0]
        z = torch.einsum("bnd,nk->bkd", x, self.fm_proj)  # (B, k, D)
        inter = torch.bmm(x, z.transpose(1, 2))  # (B, N, k)
        fm = self.fm_mlp(inter.flatten(1)).view(b, self.n_fm, self.dim)  # (B, n_fm, D)
        parts = [fm]
        if self.lcb is not None:
            parts.append(torch.einsum("bnd,nm->bmd", x, self.lcb))  # (B, n_lc, D)
        out = torch.cat(parts, dim=1)  # (B, n_out, D)
        res = x if self.skip is None else torch.einsum("bnd,nm->bmd", x, self.skip)
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
        # gather's backward is a scatter (3x slower on CPU at batch 1024)
        self.register_buffer("pick_i", eye[i], persistent=False)  # (P, N)
        self.register_buffer("pick_j", eye[j], persistent=False)  # (P, N)
        # Weighting the pairs by every domain and keeping each row's own costs n_domains times the
        # work but skips a per-example gather: faster up to 4 domains, slower beyond (fwd+bwd at
        # batch 1024, 10 tokens, 8 channels, 1 thread: 1.3x faster at 3 domains, 0.9x at 6).
        self.per_example = n_domains > 4

    @property
    def out_dim(self) -> int:
        return self.channels * self.pick_i.shape[0]

    def forward(self, x: torch.Tensor, domain: torch.Tensor) -> torch.Tensor:
        b, n_dom = x.shape[0], self.scale.shape[0]
        pairs = torch.matmul(self.pick_i, x) * torch.matmul(self.pick_j, x)  # (B, P, D): x_i ⊙ x_j
        if self.per_example:
            return torch.bmm(pairs, self.scale[domain].transpose(1, 2)).flatten(1)  # (B, P, C) -> (B, P·C)
        every = (pairs.reshape(-1, self.dim) @ self.scale.view(n_dom * self.channels, self.dim).t())
        every = every.view(b, -1, n_dom, self.channels)  # (B, P, n_dom, C)
        index = domain.view(b, 1, 1, 1).expand(b, every.shape[1], 1, self.channels)
        return every.gather(2, index).flatten(1)  # (B, P·C)


class DomainUntied(nn.Module):
    """One copy of a layer per domain; each example goes through its own domain's copy."""

    def __init__(self, make: callable, n_domains: int):
        super().__init__()
        self.layers = nn.ModuleList([make() for _ in range(n_domains)])

    def forward(self, x: torch.Tensor, domain: torch.Tensor) -> torch.Tensor:  # (B, N, D), (B,)
        out = torch.stack([layer(x) for layer in self.layers])  # (n_dom, B, n_out, D)
        return out[domain, torch.arange(x.shape[0])]  # (B, n_out, D)


def mlp(n_in: int, dims: list[int], n_out: int, dropout: float = 0.0) -> nn.Sequential:
    return nn.Sequential(*trunk(n_in, dims, dropout), nn.Linear(dims[-1] if dims else n_in, n_out))


def trunk(n_in: int, dims: list[int], dropout: float = 0.0) -> nn.Sequential:
    """Hidden layers only (Linear, ReLU, Dropout per width): a representation several heads share."""
    layers: list[nn.Module] = []
    for d in dims:
        layers += [nn.Linear(n_in, d), nn.ReLU(), nn.Dropout(dropout)]
        n_in = d
    return nn.Sequential(*layers)
