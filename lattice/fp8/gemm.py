"""FP8 GEMMs with autograd: `fp8_mm(a, b) = a @ b.T` with both operands quantised by a forward
recipe (lattice.fp8.recipes) and the output gradient quantised to e5m2 (or bf16) in backward.

Layout: a (M, K), b (N, K), the weight layout of nn.Linear, so both operands are scaled along
their rows, i.e. along the contraction dim K.

How the product is computed. Operands are always real float8 tensors with their scales. On a
CUDA device with FP8 tensor cores (compute capability >= 8.9) a per-tensor-scaled 2-D product
with K and N multiples of 16 runs in `torch._scaled_mm` (fp32 accumulate and output); the row
and block recipes are emulated there too (no speed-up, so the dispatcher's speed filter turns
them down on GPU). Everywhere else it is emulated:
dequantise the float8 operands to fp32 and multiply in fp32. That is the same arithmetic
(float8 values are exact in fp32; the fp32 GEMM accumulates as _scaled_mm does), and the tests
check it equals `torch._scaled_mm` on CPU. The CPU `_scaled_mm` itself is a reference loop, about
200x slower than an fp32 GEMM (measured: 1024x256x256 in 5.6 s against 0.02 s), so training on
CPU never calls it.

Backward. grad_out is quantised to `backward` (e5m2: per-tensor amax/57344; bf16: plain cast),
then grad_a = g @ deq(b) and grad_b = g.T @ deq(a): the operands of the backward GEMMs are the
forward's quantised operands (saved in float8 with their scales, a quarter of fp32's memory), so
the gradients are those of the function the forward computed. Nothing is random: same inputs,
same outputs and gradients.
"""

from __future__ import annotations

import functools

import torch

from lattice.fp8.recipes import FORWARD_RECIPES, GRAD_FORMATS, dequantize, quantize


@functools.lru_cache(maxsize=None)
def _fp8_capable(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index) >= (8, 9)


def _scaled_mm_ok(a: torch.Tensor) -> bool:
    """True where torch._scaled_mm is the fast path: CUDA with FP8 tensor cores (sm89+)."""
    return a.is_cuda and _fp8_capable(a.device.index if a.device.index is not None else torch.cuda.current_device())


def _check(recipe: str, backward: str) -> None:
    if recipe not in FORWARD_RECIPES:
        raise ValueError(f"unknown FP8 forward recipe {recipe!r}; use one of {FORWARD_RECIPES}")
    if backward not in GRAD_FORMATS:
        raise ValueError(f"unknown FP8 backward format {backward!r}; use one of {GRAD_FORMATS}")


def qmm(a8: torch.Tensor, sa: torch.Tensor, b8: torch.Tensor, sb: torch.Tensor, recipe: str,
        use_scaled_mm: bool | None = None) -> torch.Tensor:
    """Product of two quantised operands, deq(a8) @ deq(b8)^T in fp32: a8 (..., M, K) and
    b8 (..., N, K) -> (..., M, N). `use_scaled_mm` forces (True) or forbids (False) the
    `torch._scaled_mm` kernel; None picks it where it is fast (see module docstring)."""
    fast = _scaled_mm_ok(a8) if use_scaled_mm is None else use_scaled_mm
    # the CUDA kernel needs K and N multiples of 16; other shapes are emulated
    aligned = not a8.is_cuda or (a8.shape[-1] % 16 == 0 and b8.shape[-2] % 16 == 0)
    if fast and aligned and recipe == "e4m3_tensor" and a8.dim() == 2 and b8.dim() == 2:
        # _scaled_mm wants mat2 column-major: b8 (N, K) row-major transposed is exactly that
        return torch._scaled_mm(a8.contiguous(), b8.contiguous().t(), scale_a=sa, scale_b=sb,
                                out_dtype=torch.float32)  # (M, N)
    return dequantize(a8, sa, recipe) @ dequantize(b8, sb, recipe).transpose(-1, -2)  # (..., M, N)


def fp8_forward(a: torch.Tensor, b: torch.Tensor, recipe: str) -> torch.Tensor:
    """Forward only, no autograd: a (..., M, K) @ b (..., N, K)^T in the recipe -> fp32 (..., M, N).
    What the error estimate scores."""
    a8, sa = quantize(a, recipe)
    b8, sb = quantize(b, recipe)
    return qmm(a8, sa, b8, sb, recipe)


class _FP8MatMul(torch.autograd.Function):
    """a (..., M, K), b (..., N, K) -> a @ b^T, both 2-D or both 3-D with the same batch."""

    @staticmethod
    def forward(ctx, a: torch.Tensor, b: torch.Tensor, recipe: str, backward: str) -> torch.Tensor:
        a8, sa = quantize(a, recipe)
        b8, sb = quantize(b, recipe)
        ctx.save_for_backward(a8, sa, b8, sb)
        ctx.recipe, ctx.backward = recipe, backward
        ctx.dtypes = (a.dtype, b.dtype)
        return qmm(a8, sa, b8, sb, recipe).to(a.dtype)  # (..., M, N)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):  # grad_out (..., M, N)
        a8, sa, b8, sb = ctx.saved_tensors
        g8, sg = quantize(grad_out, ctx.backward)
        g = dequantize(g8, sg, ctx.backward)  # (..., M, N)
        grad_a = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_a = (g @ dequantize(b8, sb, ctx.recipe)).to(ctx.dtypes[0])  # (..., M, K)
        if ctx.needs_input_grad[1]:
            grad_b = (g.transpose(-1, -2) @ dequantize(a8, sa, ctx.recipe)).to(ctx.dtypes[1])  # (..., N, K)
        return grad_a, grad_b, None, None


def fp8_mm(a: torch.Tensor, b: torch.Tensor, recipe: str, backward: str = "e5m2") -> torch.Tensor:
    """a (M, K) @ b (N, K)^T -> (M, N) in FP8, differentiable in a and b."""
    _check(recipe, backward)
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(f"fp8_mm wants a (M, K) and b (N, K); got {tuple(a.shape)} and {tuple(b.shape)}")
    return _FP8MatMul.apply(a, b, recipe, backward)


def fp8_bmm(a: torch.Tensor, b: torch.Tensor, recipe: str, backward: str = "e5m2") -> torch.Tensor:
    """Batched a (B, M, K) @ b (B, N, K)^T -> (B, M, N) in FP8, for activation x activation
    sites. "Per tensor" scales mean one scale for the whole batched operand, as one batched-GEMM
    launch would take; the row and block recipes scale each row of each batch element."""
    _check(recipe, backward)
    if a.dim() != 3 or b.dim() != 3 or a.shape[0] != b.shape[0] or a.shape[2] != b.shape[2]:
        raise ValueError(f"fp8_bmm wants a (B, M, K) and b (B, N, K); got {tuple(a.shape)} and {tuple(b.shape)}")
    return _FP8MatMul.apply(a, b, recipe, backward)


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, recipe: str,
               backward: str = "e5m2") -> torch.Tensor:
    """F.linear in FP8: x (..., K), weight (N, K), bias (N,) or None -> (..., N). The bias is
    added in the output precision (it is not part of the GEMM)."""
    out = fp8_mm(x.reshape(-1, x.shape[-1]), weight, recipe, backward)  # (M, N)
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], weight.shape[0])
