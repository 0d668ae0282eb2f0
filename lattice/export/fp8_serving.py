"""The serving form of FP8 GEMM sites: what an exported artifact runs where training ran FP8.

A site's autograd Function (lattice.fp8.gemm) cannot be scripted, so the artifact swaps every
site with a recipe for one of these inference modules. A weight site keeps its weight in float8
(`torch.float8_e4m3fn`) with the recipe's scales (per tensor (), per row (N, 1), or per block of
32 along K (N, ceil(K/32))), quantised once by `lattice.fp8.recipes.quantize` from the trained
weight. At run time the input is quantised with the same recipe and the GEMM multiplies the
dequantised operands in fp32: the value the training-time FP8 forward computes with
(`dequantize(quantize(x))` on each operand, then the product).

The run-time quantisers repeat the recipe arithmetic of lattice.fp8.recipes op for op, written
so `torchrec.fx.symbolic_trace` can trace them and TorchScript can compile the trace: shapes
that decide padding are Python ints fixed by the site (its K), never read from a tensor, and no
branch looks at a tensor's values. The float8 weights and their scales are Parameters without
gradient, not buffers, because FX folds buffer arithmetic into fp32 constants at trace time
(the artifact would then hold an fp32 copy of every FP8 weight).
"""

# no `from __future__ import annotations`: FX codegen and TorchScript need real annotation objects

from typing import Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from lattice.models.gemm import GemmSite, Linear, PairMatmul, TokenMix

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0  # largest finite e4m3fn
E4M3_EMAX = 8  # exponent of e4m3fn's largest normal, 448 = 1.75 * 2^8
MX_BLOCK = 32
_MIN_SCALE = float(torch.finfo(torch.float32).tiny)
_MX_EXP_MIN, _MX_EXP_MAX = -126, 127
RECIPES = ("e4m3_tensor", "e4m3_row", "mx_block32")


def _finite_abs(x: torch.Tensor) -> torch.Tensor:
    a = x.abs()
    return torch.where(torch.isfinite(a), a, torch.zeros_like(a))


def _scale_from_amax(amax: torch.Tensor) -> torch.Tensor:
    scale = (amax / E4M3_MAX).clamp_min(_MIN_SCALE)
    return torch.where(amax > 0, scale, torch.ones_like(scale))


def _blocks(x: torch.Tensor, k: int) -> torch.Tensor:
    """(..., K) -> (..., nb, 32), zero-padded along K; K is the site's, a Python int."""
    pad = (-k) % MX_BLOCK
    xp = F.pad(x, (0, pad)) if pad else x
    return xp.unflatten(-1, ((k + pad) // MX_BLOCK, MX_BLOCK))


def _mx_scale(blocks: torch.Tensor) -> torch.Tensor:  # (..., nb, 32) -> (..., nb)
    amax = _finite_abs(blocks).amax(dim=-1)
    _, e = torch.frexp(torch.where(amax > 0, amax, torch.ones_like(amax)))  # amax = m * 2^e, m in [0.5, 1)
    exp = (e - 1 - E4M3_EMAX).clamp(_MX_EXP_MIN, _MX_EXP_MAX)
    scale = torch.ldexp(torch.ones_like(amax), exp)
    return torch.where(amax > 0, scale, torch.ones_like(scale))


def _cast(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)


def fake_quantize(x: torch.Tensor, recipe: str, k: int) -> torch.Tensor:
    """dequantize(quantize(x, recipe)) of an fp32 operand (..., K), traceable: the fp32 value the
    FP8 GEMM multiplies. `recipe` and `k` are Python constants of the site."""
    x = x.float()
    if recipe == "e4m3_tensor":
        # a zero appended so an empty batch has an amax (0: scale 1), as recipes.quantize gives
        amax = torch.cat([_finite_abs(x).flatten(), x.new_zeros(1)]).amax()  # ()
        scale = _scale_from_amax(amax)
        return _cast(x / scale).float() * scale
    if recipe == "e4m3_row":
        scale = _scale_from_amax(_finite_abs(x).amax(dim=-1, keepdim=True))  # (..., 1)
        return _cast(x / scale).float() * scale
    if recipe == "mx_block32":
        blocks = _blocks(x, k)  # (..., nb, 32)
        scale = _mx_scale(blocks).unsqueeze(-1)  # (..., nb, 1)
        return (_cast(blocks / scale).float() * scale).flatten(-2)[..., :k]
    raise ValueError(f"no serving form for FP8 recipe {recipe!r}; use one of {RECIPES}")


def dequantize_weight(w8: torch.Tensor, scale: torch.Tensor, recipe: str, k: int) -> torch.Tensor:
    """A stored float8 weight (N, K) and its scales -> the fp32 (N, K) the GEMM multiplies."""
    if recipe == "mx_block32":
        return (_blocks(w8.float(), k) * scale.unsqueeze(-1)).flatten(-2)[..., :k]
    return w8.float() * scale


def _float8_weight(weight: torch.Tensor, recipe: str) -> Tuple[nn.Parameter, nn.Parameter]:
    """The trained (N, K) weight as float8 values and fp32 scales, by the recipe's own quantiser."""
    from lattice.fp8.recipes import quantize

    if recipe not in RECIPES:
        raise ValueError(f"no serving form for FP8 recipe {recipe!r}; use one of {RECIPES}")
    w8, scale = quantize(weight.detach().float().contiguous(), recipe)
    return nn.Parameter(w8.contiguous(), requires_grad=False), nn.Parameter(scale.contiguous(), requires_grad=False)


class _ServingSite(nn.Module):
    """What every FP8 serving form keeps of its site: the recipe, the name and the GEMM's K."""

    def __init__(self, site: GemmSite, k: int):
        super().__init__()
        self.recipe: str = str(site.recipe)
        self.site_name: str = site.site_name
        self.k = k


class _WeightedServingSite(_ServingSite):
    """A site with a trained (N, K) weight, stored in float8 with its scales."""

    def __init__(self, site: GemmSite, weight: torch.Tensor):
        super().__init__(site, weight.shape[1])
        self.n = weight.shape[0]
        self.weight8, self.weight_scale = _float8_weight(weight, self.recipe)  # (N, K) float8, scales

    def _matmul(self, a: torch.Tensor) -> torch.Tensor:  # (M, K) -> (M, N)
        return fake_quantize(a, self.recipe, self.k) @ dequantize_weight(self.weight8, self.weight_scale, self.recipe, self.k).t()


class Fp8ServingLinear(_WeightedServingSite):
    """Inference form of an FP8 `Linear` site: (..., K) -> (..., N)."""

    def __init__(self, site: Linear):
        super().__init__(site, site.weight)
        self.bias: Optional[nn.Parameter] = (nn.Parameter(site.bias.detach().clone(), requires_grad=False)
                                             if site.bias is not None else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self._matmul(x.reshape(-1, self.k))  # (M, N)
        if self.bias is not None:
            out = out + self.bias
        return out.unflatten(0, x.shape[:-1])  # (..., N)


class Fp8ServingTokenMix(_WeightedServingSite):
    """Inference form of an FP8 `TokenMix` site: (B, N_in, D) -> (B, N_out, D)."""

    def __init__(self, site: TokenMix):
        super().__init__(site, site.weight.t())  # (N_out, N_in)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self._matmul(x.transpose(1, 2).reshape(-1, self.k))  # (B·D, N_out)
        return out.reshape(x.size(0), -1, self.n).transpose(1, 2)  # (B, N_out, D)


class Fp8ServingPairMatmul(_ServingSite):
    """Inference form of an FP8 `PairMatmul` site: both operands are quantised at run time."""

    def __init__(self, site: PairMatmul):
        super().__init__(site, site.k)
        self.batched = site.batched

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        # both quantised as their 2-D GEMM operands (rows, K), as the training-time site does
        qa = fake_quantize(a.reshape(-1, self.k), self.recipe, self.k)  # (rows, K)
        qb = fake_quantize(b.reshape(-1, self.k), self.recipe, self.k)  # (rows, K)
        if self.batched:
            return torch.bmm(qa.reshape(a.shape), qb.reshape(b.shape).transpose(1, 2))  # (B, M, N)
        return qa @ qb.t()  # (M, N)


SERVING_FORMS = {Linear: Fp8ServingLinear, TokenMix: Fp8ServingTokenMix, PairMatmul: Fp8ServingPairMatmul}
SERVING_TYPES = tuple(SERVING_FORMS.values())


def serving_form(site: GemmSite) -> nn.Module:
    """The inference module of an FP8 site (its recipe must be set)."""
    for cls, form in SERVING_FORMS.items():
        if isinstance(site, cls):
            return form(site)
    raise TypeError(f"no serving form for GEMM site {type(site).__name__}")
