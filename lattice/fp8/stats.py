"""Running statistics of GEMM operands: what the LoKA-style probe learns during training, so the
error estimate can later draw inputs that look like the real ones without storing any.

`RunningMoments` keeps count, per-feature mean, the comoment matrix M = sum (x - mean)(x - mean)^T
(covariance = M / (count - 1)) and per-feature absmax of 2-D inputs (N, K), in float64. A batch
is merged whole (its own mean and comoment, then Chan et al.'s pairwise update), which is exact:
the result equals a two-pass mean and covariance over everything seen, up to float64 rounding.
The same merge combines two instances (`merge`) and all ranks of a torch.distributed group
(`all_reduce`).

`SiteProbe` is what a GEMM site holds: moments of operand A's rows (and of operand B's rows for
an activation x activation site), updated on every `every`-th call.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

DIAG_ABOVE_K = 2048
"""Above this K the moments keep only the variances (a K x K float64 matrix would be 32 MiB at
K = 2048 and its per-batch update O(N K^2))."""


_SHARED: list[tuple[tuple, torch.Tensor, tuple]] = []
"""The moments of the last few inputs seen (least recently used dropped), with the input they
came from: sites that read the same tensor (the demo teacher's four experts and two gates all read
the flattened tokens, K = 520) compute its K x K comoment once. The input is held, so its storage
(and data_ptr) cannot be reused while it is a key; `_version` changes on any in-place write."""
_SHARED_SIZE = 8


def _batch_moments(x: torch.Tensor, diagonal: bool) -> tuple[int, int, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(non-finite rows skipped, rows, mean (K,), comoment (K, K) or (K,), absmax (K,)) of a batch
    (N, K), in float64 on the CPU; computed where x lives."""
    key = (x.data_ptr(), tuple(x.shape), tuple(x.stride()), x.dtype, x.device, x._version, diagonal)
    for i, (k, _, moments) in enumerate(_SHARED):
        if k == key:
            _SHARED.insert(0, _SHARED.pop(i))  # least recently used goes first
            return moments
    # the batch's own centred comoment is exact enough in float32 (it is centred first) and
    # twice as fast as float64 (float64 input stays float64); the merge across batches is float64
    xf = x if x.dtype == torch.float64 else x.to(torch.float32)
    finite = torch.isfinite(xf).all(dim=1)  # (N,)
    n_bad = 0
    if not bool(finite.all()):
        n_bad = int((~finite).sum())
        xf = xf[finite]
    n_b = xf.shape[0]
    if n_b == 0:
        moments = (n_bad, 0, torch.zeros(0), torch.zeros(0), torch.zeros(0))
    else:
        mean_b = xf.mean(dim=0)  # (K,)
        xc = xf - mean_b  # (N, K)
        m2_b = (xc * xc).sum(dim=0) if diagonal else xc.t() @ xc  # (K,) or (K, K)
        # only K + K^2 numbers come to the CPU
        moments = (n_bad, n_b, mean_b.to(torch.float64).cpu(), m2_b.to(torch.float64).cpu(), xf.abs().amax(dim=0).double().cpu())
    _SHARED.insert(0, (key, x, moments))
    del _SHARED[_SHARED_SIZE:]
    return moments


class RunningMoments:
    """Running count, mean, covariance and absmax of the rows of (N, K) inputs.

    K > `DIAG_ABOVE_K` (or `diagonal=True`): only the diagonal of the covariance is kept, and
    `sample` draws the features independently; correlations between features are then lost.

    Rows with a NaN or inf are skipped (and counted in `n_nonfinite`): one diverged batch would
    otherwise make the statistics NaN for good.

    `all_reduce` makes every rank hold the moments of all ranks' data. It remembers what it
    reduced (also in `state_dict`), so calling it again later, or after each rank resumed from
    its own checkpoint, merges only what each rank has seen since. (Loading one rank's state on
    every rank is right only if it was saved right after an `all_reduce` with no update since.)
    """

    def __init__(self, k: int, diagonal: bool | None = None):
        self.k = int(k)
        self.diagonal = self.k > DIAG_ABOVE_K if diagonal is None else bool(diagonal)
        self.count = 0
        self.n_nonfinite = 0
        self.mean = torch.zeros(self.k, dtype=torch.float64)  # (K,)
        self.m2 = torch.zeros(self._m2_shape(), dtype=torch.float64)  # (K, K) or (K,)
        self.absmax = torch.zeros(self.k, dtype=torch.float64)  # (K,)
        # the moments last reduced across ranks (every rank holds the same); None: never reduced
        self._synced: tuple[int, torch.Tensor, torch.Tensor] | None = None
        self._synced_nonfinite = 0

    def _m2_shape(self) -> tuple[int, ...]:
        return (self.k,) if self.diagonal else (self.k, self.k)

    # -- merging ---------------------------------------------------------------------------
    @staticmethod
    def _chan(n_a: int, mean_a: torch.Tensor, m2_a: torch.Tensor, n_b: int, mean_b: torch.Tensor,
              m2_b: torch.Tensor, diagonal: bool) -> tuple[int, torch.Tensor, torch.Tensor]:
        """Moments of the union of two disjoint sets (Chan, Golub & LeVeque)."""
        n = n_a + n_b
        if n_b == 0:
            return n_a, mean_a, m2_a
        if n_a == 0:
            return n_b, mean_b.clone(), m2_b.clone()
        delta = mean_b - mean_a  # (K,)
        mean = mean_a + delta * (n_b / n)
        corr = delta * delta if diagonal else torch.outer(delta, delta)
        return n, mean, m2_a + m2_b + corr * (n_a * n_b / n)

    def update(self, x: torch.Tensor) -> None:
        """Merge a batch x (N, K) (any float dtype); its rows are the samples."""
        if x.dim() != 2 or x.shape[1] != self.k:
            raise ValueError(f"RunningMoments(k={self.k}) got a batch of shape {tuple(x.shape)}; want (N, {self.k})")
        # the batch's moments are computed where x lives; only K + K^2 numbers come to the CPU.
        # The batch's own centred comoment is exact enough in float32 (it is centred first) and
        # twice as fast as float64 (float64 input stays float64); the merge across batches is float64.
        n_bad, n_b, mean_b, m2_b, absmax_b = _batch_moments(x.detach(), self.diagonal)
        self.n_nonfinite += n_bad
        if n_b == 0:
            return
        self.count, self.mean, self.m2 = self._chan(self.count, self.mean, self.m2, n_b, mean_b, m2_b, self.diagonal)
        self.absmax = torch.maximum(self.absmax, absmax_b)

    def merge(self, other: "RunningMoments") -> None:
        """Fold another instance's moments (disjoint data, e.g. another rank's) into this one."""
        if other.k != self.k or other.diagonal != self.diagonal:
            raise ValueError(f"cannot merge moments of k={other.k} diagonal={other.diagonal} into k={self.k} diagonal={self.diagonal}")
        self.count, self.mean, self.m2 = self._chan(self.count, self.mean, self.m2, other.count, other.mean, other.m2,
                                                    self.diagonal)
        self.absmax = torch.maximum(self.absmax, other.absmax)
        self.n_nonfinite += other.n_nonfinite

    def _minus_synced(self) -> tuple[int, torch.Tensor, torch.Tensor]:
        """The moments of what this rank saw since the last reduction: the inverse Chan merge."""
        if self._synced is None:
            return self.count, self.mean, self.m2
        n_s, mean_s, m2_s = self._synced
        n_l = self.count - n_s
        if n_l <= 0:
            return 0, torch.zeros_like(self.mean), torch.zeros_like(self.m2)
        mean_l = (self.count * self.mean - n_s * mean_s) / n_l
        delta = mean_l - mean_s
        corr = delta * delta if self.diagonal else torch.outer(delta, delta)
        return n_l, mean_l, self.m2 - m2_s - corr * (n_s * n_l / self.count)

    def all_reduce(self, group=None) -> None:
        """Merge the moments of every rank of the default (or given) process group into every
        rank, exactly: global mean from the summed n * mean, then each rank's comoment about the
        global mean, summed. No-op when torch.distributed is not initialised or has one rank.
        Every rank must call it (it is a collective)."""
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size(group) == 1:
            return
        # NCCL reduces CUDA tensors only; gloo (and the CPU) take them as they are
        dev = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else torch.device("cpu")
        n_l, mean_l, m2_l = self._minus_synced()
        nonfinite_l = self.n_nonfinite - (self._synced_nonfinite if self._synced is not None else 0)
        nm = torch.cat([torch.tensor([float(n_l), float(nonfinite_l)], dtype=torch.float64), n_l * mean_l]).to(dev)  # (2 + K,)
        dist.all_reduce(nm, group=group)
        nm = nm.cpu()
        n_g = int(round(nm[0].item()))
        n_nonfinite = int(round(nm[1].item()))
        mean_g = nm[2:] / n_g if n_g else torch.zeros_like(mean_l)
        delta = mean_l - mean_g
        corr = delta * delta if self.diagonal else torch.outer(delta, delta)
        m2_g = (m2_l + corr * n_l).to(dev)  # this rank's comoment about the global mean
        dist.all_reduce(m2_g, group=group)
        m2_g = m2_g.cpu()
        absmax = self.absmax.to(dev, copy=True)
        dist.all_reduce(absmax, op=dist.ReduceOp.MAX, group=group)
        absmax = absmax.cpu()
        if self._synced is not None:
            n_s, mean_s, m2_s = self._synced
            n_g, mean_g, m2_g = self._chan(n_s, mean_s, m2_s, n_g, mean_g, m2_g, self.diagonal)
            n_nonfinite += self._synced_nonfinite
        self.count, self.mean, self.m2, self.absmax = n_g, mean_g, m2_g, absmax
        self.n_nonfinite = n_nonfinite
        self._synced = (self.count, self.mean.clone(), self.m2.clone())
        self._synced_nonfinite = n_nonfinite

    # -- reading ---------------------------------------------------------------------------
    def cov(self) -> torch.Tensor:
        """Unbiased covariance, float64 (K, K); (K,) variances when diagonal. Zeros below 2 samples."""
        return self.m2 / (self.count - 1) if self.count > 1 else torch.zeros_like(self.m2)

    def sample(self, n: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """n rows drawn from N(mean, cov) -> (n, K) float32. The covariance's square root comes
        from its eigendecomposition with negative eigenvalues (rounding, or a singular covariance
        from fewer samples than features or constant features) clamped to 0, so any PSD matrix
        works; a matrix eigh cannot decompose falls back to the diagonal."""
        if self.count == 0:
            raise ValueError("RunningMoments.sample: no statistics observed yet")
        z = torch.randn(n, self.k, generator=generator, dtype=torch.float64)  # (n, K)
        cov = self.cov()
        if self.diagonal:
            return (self.mean + z * cov.clamp_min(0).sqrt()).float()
        try:
            evals, evecs = torch.linalg.eigh((cov + cov.t()) / 2)  # (K,), (K, K)
        except RuntimeError:  # eigh did not converge: keep the variances, drop correlations
            return (self.mean + z * cov.diagonal().clamp_min(0).sqrt()).float()
        root = evecs * evals.clamp_min(0).sqrt()  # (K, K): root @ root.T == cov
        return (self.mean + z @ root.t()).float()

    # -- checkpoint ------------------------------------------------------------------------
    def state_dict(self) -> dict[str, torch.Tensor]:
        """Plain tensors (torch.save-able inside a checkpoint), including the moments last
        reduced across ranks, so a rank that resumes from its own checkpoint reduces only what
        is new."""
        n_s, mean_s, m2_s = self._synced if self._synced is not None else (0, torch.zeros_like(self.mean),
                                                                           torch.zeros_like(self.m2))
        return {"k": torch.tensor(self.k), "diagonal": torch.tensor(self.diagonal), "count": torch.tensor(self.count),
                "n_nonfinite": torch.tensor(self.n_nonfinite), "mean": self.mean.clone(), "m2": self.m2.clone(),
                "absmax": self.absmax.clone(), "synced": torch.tensor(self._synced is not None),
                "synced_count": torch.tensor(n_s), "synced_mean": mean_s.clone(), "synced_m2": m2_s.clone(),
                "synced_nonfinite": torch.tensor(self._synced_nonfinite)}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        k, diagonal = int(state["k"]), bool(state["diagonal"])
        if k != self.k or diagonal != self.diagonal:
            raise ValueError(f"moments state is for k={k} diagonal={diagonal}, not k={self.k} diagonal={self.diagonal}")
        self.count, self.n_nonfinite = int(state["count"]), int(state["n_nonfinite"])
        self.mean = state["mean"].to(torch.float64).clone()
        self.m2 = state["m2"].to(torch.float64).clone()
        self.absmax = state["absmax"].to(torch.float64).clone()
        self._synced, self._synced_nonfinite = None, 0
        if bool(state["synced"]):
            self._synced = (int(state["synced_count"]), state["synced_mean"].to(torch.float64).clone(),
                            state["synced_m2"].to(torch.float64).clone())
            self._synced_nonfinite = int(state["synced_nonfinite"])

    @classmethod
    def from_state_dict(cls, state: dict[str, torch.Tensor]) -> "RunningMoments":
        m = cls(int(state["k"]), bool(state["diagonal"]))
        m.load_state_dict(state)
        return m


MAX_ROWS = 512
"""Rows of one operand a probe update reads: an evenly strided subset of a larger batch. The
moments converge over many updates, and the K x K comoment of a wide site (K = 520 for the
demo teacher's experts) over every row of a 1024-row batch cost about 10% of a training step."""


def _rows(x: torch.Tensor) -> torch.Tensor:
    step = -(-x.shape[0] // MAX_ROWS)
    return x[::step] if step > 1 else x


class SiteProbe:
    """Statistics of one GEMM site's operands: `a` for the rows of the left operand (M, K), `b`
    for the rows of the right operand (N, K) when it is an activation (pair=True); a weight
    operand is read from the site itself at planning time. `observe` updates on the 1st,
    (every+1)-th, ... call: the site calls it only while training."""

    def __init__(self, k: int, every: int = 1, pair: bool = False, diagonal: bool | None = None):
        if every < 1:
            raise ValueError(f"SiteProbe every must be >= 1, got {every}")
        self.k, self.every, self.pair = int(k), int(every), bool(pair)
        self.calls = 0
        self.a = RunningMoments(k, diagonal)
        self.b = RunningMoments(k, diagonal) if pair else None

    def observe(self, a2d: torch.Tensor, b2d: torch.Tensor | None = None) -> None:
        """a2d (M, K) and, for a pair site, b2d (N, K)."""
        if a2d.dim() != 2 or a2d.shape[1] != self.k:  # checked on every call, not only on updates
            raise ValueError(f"SiteProbe(k={self.k}) got A of shape {tuple(a2d.shape)}; want (N, {self.k})")
        self.calls += 1
        if (self.calls - 1) % self.every:
            return
        self.a.update(_rows(a2d))
        if self.b is not None:
            if b2d is None:
                raise ValueError("SiteProbe(pair=True).observe needs the right operand b2d (N, K)")
            self.b.update(_rows(b2d))

    def all_reduce(self, group=None) -> None:
        """Merge every rank's statistics (collective: every rank calls it, same sites, same order)."""
        self.a.all_reduce(group)
        if self.b is not None:
            self.b.all_reduce(group)

    def state_dict(self) -> dict:
        state: dict = {"k": torch.tensor(self.k), "every": torch.tensor(self.every), "pair": torch.tensor(self.pair),
                       "calls": torch.tensor(self.calls), "a": self.a.state_dict()}
        if self.b is not None:
            state["b"] = self.b.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        if int(state["k"]) != self.k or bool(state["pair"]) != self.pair:
            raise ValueError(f"probe state is for k={int(state['k'])} pair={bool(state['pair'])}, "
                             f"not k={self.k} pair={self.pair}")
        self.every, self.calls = int(state["every"]), int(state["calls"])
        self.a = RunningMoments.from_state_dict(state["a"])
        self.b = RunningMoments.from_state_dict(state["b"]) if self.pair else None

    @classmethod
    def from_state_dict(cls, state: dict) -> "SiteProbe":
        p = cls(int(state["k"]), int(state["every"]), bool(state["pair"]))
        p.load_state_dict(state)
        return p
