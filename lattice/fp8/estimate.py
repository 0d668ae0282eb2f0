"""Offline error estimate of one GEMM site per FP8 recipe, the LoKA way: draw operands from the
statistics the probe learned during training, run the FP8 GEMM and the FP32 one, and score the
mean relative error MERE = sum |out - ref| / sum |ref|.

Each recipe is scored twice:
  learned  A drawn from N(mean, cov) of the probed A rows; B the site's real weight (N, K), or
           drawn from the probed B rows for an activation x activation site;
  random   A ~ N(0, 1) with the same weight (or B ~ N(0, 1) too for a pair site).
Random inputs are the usual way FP8 kernels are validated, and they hide what real activations
do: a shared offset across features (post-ReLU/LayerNorm activations) with a weight that nearly
cancels it makes each output a small difference of large products, and the FP8 rounding of the
large products dwarfs it. On N(0, 1) e4m3 scores about 0.037 whatever the site; learned inputs
can score 100x that. Only the learned figure decides; the random one is reported beside it.

The backward estimate (`backward_errors`) scores the gradients the FP8 backward produces, with
grad_out drawn as rows g_i = s_i z_i, z_i ~ N(0, I_N) and log s_i ~ N(0, 1.5^2): per-example
gradients of a ranking loss (p - y for BCE) span orders of magnitude between examples (a positive
at p = 0.02 gives about 1, a negative about 0.02), which is what a per-tensor e5m2 scale has to
cover; within a row the output units' gradients are of one size. MERE of grad_a = g @ B and
grad_b = g^T @ A against FP32.
"""

from __future__ import annotations

import math

import torch

from lattice.fp8.gemm import fp8_forward, fp8_mm
from lattice.fp8.stats import SiteProbe

GRAD_ROW_LOG_SIGMA = 1.5
"""Std of log(row scale) of the synthetic output gradient (see module docstring)."""
MIN_OUTPUTS = 1 << 16
"""A narrow site (an N = 1 output layer) draws more rows than `n_samples`, up to 64 x more, so
its MERE sums at least this many outputs: with 1024 outputs the estimate moves by +-0.01."""


def sample_rows(n_samples: int, n_out: int) -> int:
    """Rows of A to draw for a site with `n_out` outputs per row (see MIN_OUTPUTS)."""
    return min(max(n_samples, -(-MIN_OUTPUTS // max(n_out, 1))), 64 * n_samples)


def mere(out: torch.Tensor, ref: torch.Tensor) -> float:
    """sum |out - ref| / sum |ref| in float64; 0 when both are all zero, inf when only ref is."""
    out, ref = out.double(), ref.double()
    den = ref.abs().sum().item()
    num = (out - ref).abs().sum().item()
    if den == 0:
        return 0.0 if num == 0 else math.inf
    return num / den


def _operands(probe: SiteProbe, weight: torch.Tensor | None, n_samples: int, n_rows_b: int,
              g: torch.Generator) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{"learned": (A, B), "random": (A, B)}: A (n_samples, K), B (N, K) fp32."""
    if probe.a.count == 0:
        raise ValueError("site_errors: the probe has not observed any input")
    if weight is None and probe.b is None:
        raise ValueError("site_errors: an activation x activation site needs a probe with pair=True")
    k = probe.k
    n_samples = sample_rows(n_samples, n_rows_b if weight is None else weight.shape[0])
    a_learned = probe.a.sample(n_samples, g)  # (n, K)
    if weight is not None:
        b_learned = weight.detach().float().cpu()  # (N, K)
    else:
        assert probe.b is not None  # checked above
        b_learned = probe.b.sample(n_rows_b, g)  # (N, K)
    a_random = torch.randn(n_samples, k, generator=g)  # (n, K)
    b_random = weight.detach().float().cpu() if weight is not None else torch.randn(n_rows_b, k, generator=g)  # (N, K)
    return {"learned": (a_learned, b_learned), "random": (a_random, b_random)}


def site_errors(probe: SiteProbe, weight: torch.Tensor | None, recipes, n_samples: int = 1024, seed: int = 0,
                n_rows_b: int = 256) -> dict[str, dict[str, float]]:
    """{recipe: {"learned": MERE, "random": MERE}} of the FP8 forward a @ b^T against FP32.
    `weight` (N, K) is the site's weight, None for an activation x activation site (B is then
    drawn, `n_rows_b` rows). A is `n_samples` rows (more for a narrow site, `MIN_OUTPUTS`).
    The same seeded draws score every recipe."""
    g = torch.Generator().manual_seed(seed)
    ops = _operands(probe, weight, n_samples, n_rows_b, g)
    out: dict[str, dict[str, float]] = {}
    with torch.no_grad():
        refs = {kind: a @ b.t() for kind, (a, b) in ops.items()}  # (n, N) each
        for recipe in recipes:
            out[recipe] = {kind: mere(fp8_forward(a, b, recipe), refs[kind]) for kind, (a, b) in ops.items()}
    return out


def synthetic_grad(m: int, n: int, generator: torch.Generator) -> torch.Tensor:
    """A plausible output gradient (m, n): rows of N(0, 1) scaled by log-normal row sizes."""
    z = torch.randn(m, n, generator=generator)  # (m, n)
    s = torch.exp(GRAD_ROW_LOG_SIGMA * torch.randn(m, 1, generator=generator))  # (m, 1)
    return z * s


def backward_errors(probe: SiteProbe, weight: torch.Tensor | None, recipe: str, backward: str = "e5m2",
                    n_samples: int = 1024, seed: int = 0, n_rows_b: int = 256) -> dict[str, float]:
    """{"grad_a": MERE, "grad_b": MERE} of the FP8 backward (forward operands in `recipe`,
    grad_out in `backward`) against the FP32 gradients, on learned operands and a synthetic
    grad_out (module docstring)."""
    g = torch.Generator().manual_seed(seed)
    a, b = _operands(probe, weight, n_samples, n_rows_b, g)["learned"]
    grad_out = synthetic_grad(a.shape[0], b.shape[0], g)  # (n, N)
    a = a.clone().requires_grad_(True)
    b = b.clone().requires_grad_(True)
    fp8_mm(a, b, recipe, backward).backward(grad_out)
    assert a.grad is not None and b.grad is not None
    with torch.no_grad():
        return {"grad_a": mere(a.grad, grad_out @ b), "grad_b": mere(b.grad, grad_out.t() @ a)}
