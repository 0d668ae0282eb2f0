"""GEMM sites: every matrix multiply of the dense networks is one of these modules, so the FP8
dispatcher (lattice.fp8.dispatch) can find it by name, probe its operands and switch it to FP8.

A site's `recipe` is None (the exact original FP32 op: same function, same operand order, so a
model with no FP8 site is bit for bit the model before sites existed) or a forward recipe name
of lattice.fp8.recipes; `backward` is the format of the output gradient in its backward GEMMs.
While training with a `probe` attached, a site hands the probe its 2-D GEMM operands: A with one
row per output row and the contraction dim K along the row, and B the (N, K) right operand for an
activation x activation site (None for a weight site: the probe reads `weight_matrix()`).

Sizes: `gemm_shape()` is (K, N); `flops_per_row()` is 2·K·N, the FLOPs of one row of A;
`rows_per_example` is how many A rows one example makes (1 for a Linear on (B, K) inputs), so
2·K·N·rows_per_example is the site's FLOPs per example.

Not sites, on purpose:
  - the gated expert mix `einsum("be,beh->bh")`: per example a (1, E) x (E, H) product with E the
    number of experts (about 4). A contraction that short has no FP8 win (quantising and scaling
    the operands costs about what the multiply does, and a batched GEMV is memory bound), and
    the softmax weights scale every head's input directly;
  - DomainFM's one-hot pick matrices: a matmul with a 0/1 matrix is an index gather written as a
    GEMM (for its faster backward). Its "products" are copies, so FP8 would only round the tokens
    and gain nothing a gather does not already have.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

BACKWARD_DEFAULT = "e5m2"


class GemmSite:
    """Mixin of the FP8 site attributes; subclasses are nn.Modules that call `_init_site`."""

    recipe: str | None
    backward: str
    probe: Any
    site_name: str
    rows_per_example: int

    def _init_site(self, rows_per_example: int = 1) -> None:
        self.recipe = None  # None: the exact FP32 op
        self.backward = BACKWARD_DEFAULT
        self.probe = None  # a lattice.fp8.stats.SiteProbe while the dispatcher learns statistics
        self.site_name = ""  # the dispatcher names the site (its qualified module name)
        self.rows_per_example = rows_per_example

    def weight_matrix(self) -> torch.Tensor | None:
        """The (N, K) right operand when it is a parameter; None for activation x activation."""
        return None

    def gemm_shape(self) -> tuple[int, int]:
        raise NotImplementedError

    def flops_per_row(self) -> int:
        k, n = self.gemm_shape()
        return 2 * k * n

    def _observe(self, a2d: torch.Tensor, b2d: torch.Tensor | None) -> None:
        # only while training: eval, scoring and export never touch the statistics
        if self.probe is not None and self.training:  # type: ignore[attr-defined]
            self.probe.observe(a2d.detach(), None if b2d is None else b2d.detach())


def _fp8():
    """lattice.fp8.gemm (fp8_mm, fp8_bmm, fp8_linear), imported on first FP8 use, not at the top:
    the dispatcher in lattice.fp8 imports the site classes from this module."""
    from lattice.fp8 import gemm

    return gemm


class Linear(GemmSite, nn.Linear):
    """nn.Linear as a site: the same parameters, state-dict keys and initialisation."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__(in_features, out_features, bias=bias)
        self._init_site()

    def weight_matrix(self) -> torch.Tensor:
        return self.weight  # (N, K)

    def gemm_shape(self) -> tuple[int, int]:
        return self.in_features, self.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (..., K) -> (..., N)
        if self.probe is not None:
            self._observe(x.reshape(-1, self.in_features), None)
        if self.recipe is None:
            return F.linear(x, self.weight, self.bias)
        return _fp8().fp8_linear(x, self.weight, self.bias, self.recipe, self.backward)


class TokenMix(GemmSite, nn.Module):
    """(B, N_in, D) -> (B, N_out, D): each output token a learned mix of the input tokens,
    `einsum("bnd,nm->bmd", x, weight)`. As a GEMM the contraction is over tokens: A is x with the
    tokens last, (B·D, N_in), and B is weight^T, (N_out, N_in)."""

    def __init__(self, n_in: int, n_out: int, dim: int = 1):
        super().__init__()
        # the init the Wukong layer always had for its token mixes (drawn here, in the same order)
        self.weight = nn.Parameter(torch.randn(n_in, n_out) / n_in**0.5)  # (N_in, N_out)
        self.n_in, self.n_out = n_in, n_out
        self._init_site(rows_per_example=dim)

    def weight_matrix(self) -> torch.Tensor:
        return self.weight.t()  # (N_out, N_in)

    def gemm_shape(self) -> tuple[int, int]:
        return self.n_in, self.n_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, N_in, D) -> (B, N_out, D)
        if self.probe is not None:
            self._observe(x.transpose(1, 2).reshape(-1, self.n_in), None)  # (B·D, N_in)
        if self.recipe is None:
            return torch.einsum("bnd,nm->bmd", x, self.weight)
        a = x.transpose(1, 2).reshape(-1, self.n_in)  # (B·D, N_in)
        out = _fp8().fp8_mm(a, self.weight.t(), self.recipe, self.backward)  # (B·D, N_out)
        return out.reshape(x.shape[0], -1, self.n_out).transpose(1, 2)  # (B, N_out, D)


class PairMatmul(GemmSite, nn.Module):
    """a @ b^T of two operands passed at call time, contracting their last dim K: batched
    (B, M, K) x (B, N, K) -> (B, M, N) with `torch.bmm`, or unbatched (..., K) x (..., K) ->
    (M, N) with `@`, each operand's leading dims flattened into rows. K and N are fixed by the
    network (they size the site); M is whatever rows the batch brings. Unbatched, b may be a
    parameter (DomainFM's scales): it is passed whole and viewed as (N, K) here, because a
    view made outside a module call under no_grad would reach the module's input hooks (the
    FLOP counter's) as a grad-requiring tensor without a grad_fn."""

    def __init__(self, k: int, n: int, batched: bool = True, rows_per_example: int = 1):
        super().__init__()
        self.k, self.n, self.batched = k, n, batched
        self._init_site(rows_per_example=rows_per_example)

    def gemm_shape(self) -> tuple[int, int]:
        return self.k, self.n

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if self.probe is not None:
            self._observe(a.reshape(-1, self.k), b.reshape(-1, self.k))
        if not self.batched:
            a, b = a.reshape(-1, self.k), b.reshape(-1, self.k)  # (M, K), (N, K)
        if self.recipe is None:
            return torch.bmm(a, b.transpose(1, 2)) if self.batched else a @ b.t()
        if self.batched:
            return _fp8().fp8_bmm(a, b, self.recipe, self.backward)  # (B, M, N)
        return _fp8().fp8_mm(a, b, self.recipe, self.backward)  # (M, N)


def sites(model: nn.Module) -> list[tuple[str, GemmSite]]:
    """(qualified name, site) for every GEMM site of `model`, in module order."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, GemmSite)]
