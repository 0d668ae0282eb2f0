"""FP8 quantisation recipes: how a tensor becomes real `torch.float8_*` values plus the scales
that bring them back, `x ≈ dequantize(*quantize(x, recipe), recipe)`.

Every forward recipe scales along the last dim K (the contraction dim of a GEMM operand laid out
(rows, K), as nn.Linear's input (M, K) and weight (N, K) are), so both operands of a GEMM
quantise the same way:

  e4m3_tensor  one fp32 scale for the whole tensor, amax / 448 (448: largest finite e4m3fn).
               Scale shape (): the form `torch._scaled_mm` takes on every backend.
  e4m3_row     one fp32 scale per row, amax_row / 448. Scale shape (..., 1): a row of A and a
               row of the weight each get their own, so one large row does not flush the others.
  mx_block32   OCP-MX style: each block of 32 consecutive elements along K shares a power-of-two
               scale 2^(floor(log2(amax_block)) - 8), 8 being e4m3's largest normal exponent
               (448 = 1.75 * 2^8). Elements of a block then lie in [0, 2^9) and the ones above
               448 saturate, as the MX spec says. Scale shape (..., ceil(K / 32)); a K that is not
               a multiple of 32 is zero-padded for the scale computation only (x8 keeps shape K).
  e5m2         for gradients: one fp32 scale per tensor, amax / 57344 (largest finite e5m2);
               e5m2 trades e4m3's mantissa bit for range, which gradients spanning orders of
               magnitude need.
  bf16         gradients in bfloat16, unscaled (scale 1): the backward option that is not FP8.

Non-finite inputs: scales come from the finite values only (never a NaN or zero scale); +-inf
saturate to the format's largest finite value and NaN stays NaN, so a NaN in an FP8 GEMM's input
gives NaN outputs just as it would in FP32, without poisoning the scale of the other rows.
An all-zero tensor, row or block gets scale 1 and quantises to exact zeros.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2
E4M3_MAX = float(torch.finfo(E4M3).max)  # 448
E5M2_MAX = float(torch.finfo(E5M2).max)  # 57344
E4M3_EMAX = 8  # exponent of e4m3fn's largest normal, 448 = 1.75 * 2^8 (OCP MX "emax_elem")
MX_BLOCK = 32

FORWARD_RECIPES = ("e4m3_tensor", "e4m3_row", "mx_block32")
GRAD_FORMATS = ("e5m2", "bf16")

# Unit roundoff of each element format under round-to-nearest: half an ulp relative to the value,
# 2^-(mantissa bits + 1). A normal element's relative rounding error is at most this; subnormals
# (tiny elements of a tensor with a much larger amax) lose more.
UNIT_ROUNDOFF = {"e4m3_tensor": 2.0**-4, "e4m3_row": 2.0**-4, "mx_block32": 2.0**-4, "e5m2": 2.0**-3, "bf16": 2.0**-8}

# fp32 scales are kept normal: a scale below this would make x / scale overflow or lose bits
_MIN_SCALE = float(torch.finfo(torch.float32).tiny)
# power-of-two exponents of the MX scale, kept inside fp32's normal range (E8M0 spans -127..127)
_MX_EXP_MIN, _MX_EXP_MAX = -126, 127


def _finite_abs(x: torch.Tensor) -> torch.Tensor:
    """|x| with NaN and inf replaced by 0, for scale computation."""
    return torch.nan_to_num(x.abs(), nan=0.0, posinf=0.0)


def _scale_from_amax(amax: torch.Tensor, fmt_max: float) -> torch.Tensor:
    """amax / fmt_max, with 1 where amax is 0 (nothing to scale) and never below a normal fp32."""
    scale = (amax / fmt_max).clamp_min(_MIN_SCALE)
    return torch.where(amax > 0, scale, torch.ones_like(scale))


def _cast(x_scaled: torch.Tensor, dtype: torch.dtype, fmt_max: float) -> torch.Tensor:
    """Saturating round-to-nearest cast: +-inf and overflow clamp to +-fmt_max, NaN stays NaN
    (clamp propagates NaN)."""
    return x_scaled.clamp(-fmt_max, fmt_max).to(dtype)


def _mx_blocks(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """x (..., K) zero-padded to (..., nb, 32) with nb = ceil(K / 32); also returns K."""
    k = x.shape[-1]
    pad = (-k) % MX_BLOCK
    xp = F.pad(x, (0, pad)) if pad else x
    return xp.reshape(*x.shape[:-1], -1, MX_BLOCK), k


def mx_scale(x: torch.Tensor) -> torch.Tensor:
    """Power-of-two scale per block of 32 along the last dim: (..., K) -> (..., ceil(K / 32))."""
    blocks, _ = _mx_blocks(x.float())
    amax = _finite_abs(blocks).amax(dim=-1)  # (..., nb)
    # floor(log2(amax)) from frexp, exact (log2 in float can round up just below a power of two)
    _, e = torch.frexp(torch.where(amax > 0, amax, torch.ones_like(amax)))  # amax = m * 2^e, m in [0.5, 1)
    exp = (e - 1 - E4M3_EMAX).clamp(_MX_EXP_MIN, _MX_EXP_MAX)
    scale = torch.ldexp(torch.ones_like(amax), exp)
    return torch.where(amax > 0, scale, torch.ones_like(scale))


def quantize(x: torch.Tensor, recipe: str) -> tuple[torch.Tensor, torch.Tensor]:
    """x (..., K) -> (x8, scale): x8 the same shape in the recipe's element dtype (float8_e4m3fn,
    float8_e5m2, or bfloat16 for "bf16"), scale fp32 shaped as the module docstring says.
    `dequantize(x8, scale, recipe)` is the value the FP8 GEMM computes with."""
    x = x.detach().float()
    if recipe == "e4m3_tensor":
        scale = _scale_from_amax(_finite_abs(x).amax() if x.numel() else x.new_zeros(()), E4M3_MAX)  # ()
        return _cast(x / scale, E4M3, E4M3_MAX), scale
    if recipe == "e4m3_row":
        scale = _scale_from_amax(_finite_abs(x).amax(dim=-1, keepdim=True), E4M3_MAX)  # (..., 1)
        return _cast(x / scale, E4M3, E4M3_MAX), scale
    if recipe == "mx_block32":
        scale = mx_scale(x)  # (..., nb)
        blocks, k = _mx_blocks(x)  # (..., nb, 32)
        x8 = _cast(blocks / scale.unsqueeze(-1), E4M3, E4M3_MAX)
        return x8.reshape(*x.shape[:-1], -1)[..., :k], scale
    if recipe == "e5m2":
        scale = _scale_from_amax(_finite_abs(x).amax() if x.numel() else x.new_zeros(()), E5M2_MAX)  # ()
        return _cast(x / scale, E5M2, E5M2_MAX), scale
    if recipe == "bf16":
        return x.to(torch.bfloat16), x.new_ones(())
    raise ValueError(f"unknown FP8 recipe {recipe!r}; use one of {FORWARD_RECIPES + GRAD_FORMATS}")


def dequantize(x8: torch.Tensor, scale: torch.Tensor, recipe: str) -> torch.Tensor:
    """The fp32 value of a quantised tensor: x8 * scale, broadcast per the recipe."""
    x = x8.float()
    if recipe == "mx_block32":
        blocks, k = _mx_blocks(x)  # (..., nb, 32)
        return (blocks * scale.unsqueeze(-1)).reshape(*x.shape[:-1], -1)[..., :k]
    if recipe not in FORWARD_RECIPES + GRAD_FORMATS:
        raise ValueError(f"unknown FP8 recipe {recipe!r}; use one of {FORWARD_RECIPES + GRAD_FORMATS}")
    return x * scale


def fake_quantize(x: torch.Tensor, recipe: str) -> torch.Tensor:
    """dequantize(quantize(x)): the fp32 value x takes in the recipe."""
    return dequantize(*quantize(x, recipe), recipe)
