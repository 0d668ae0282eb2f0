"""Numeric encodings (lattice.models.numeric): finite for any input, `none` is today's model bit for
bit, edges are sorted and come from the train rows alone, a saved model rebuilds to the same
outputs, gradients reach every parameter."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import lattice.models.lattice_net as net_mod
from lattice.config import load_config
from lattice.data.batch import kjt_from_ids
from lattice.data.transforms import Z_CLIP, DenseColumn, StatsAccumulator
from lattice.models import MODEL_KINDS, build_model
from lattice.models.gemm import Linear
from lattice.models.mods import Mods
from lattice.models.numeric import NumericEncoder, fit_numeric, quantile_edges
from lattice.models.saved import rebuild, saved_blob
from lattice.training.tiny import tiny
from tolerances import assert_same_kernels_close

ROOT = Path(__file__).resolve().parents[2]
ENCODINGS = ("ple", "quantile", "periodic")
N_DENSE = 4


@pytest.fixture(scope="module")
def demo():
    return load_config(ROOT / "configs" / "demo.yaml")


def _with_numeric(cfg, kind: str, numeric: str, bins: int = 8):
    m = cfg.models
    update = {"numeric": numeric, "numeric_bins": bins}
    if kind in ("teacher", "student"):
        return cfg.model_copy(update={"models": m.model_copy(update={kind: getattr(m, kind).model_copy(update=update)})})
    size = m.baselines.size.model_copy(update=update)
    return cfg.model_copy(update={"models": m.model_copy(update={"baselines": m.baselines.model_copy(update={"size": size})})})


def _stats(n: int = N_DENSE, rows: int = 5_000, seed: int = 0):
    """Dense stats of heavy-tailed columns (lognormal, a binary flag, a mostly-zero count)."""
    rng = np.random.default_rng(seed)
    cols = [DenseColumn(f"c{j}", "none") for j in range(n)]
    raw = {f"c{j}": (rng.lognormal(0, 2, rows) if j % 3 == 0 else (rng.random(rows) < 0.3).astype(float) if j % 3 == 1
                     else rng.poisson(0.2, rows) * rng.lognormal(3, 1, rows)) for j in range(n)}
    acc = StatsAccumulator(cols)
    acc.add(raw, rows)
    return acc.finish(), raw


def _inputs(cfg, n: int = 6, seed: int = 1, dense: torch.Tensor | None = None):
    names = [f.name for f in cfg.features.sparse]
    g = torch.Generator().manual_seed(seed)
    kjt = kjt_from_ids(names, [np.arange(n) * 7 % 16 for _ in names], [np.arange(n) % 3 != 2 for _ in names])
    x = torch.randn(n, N_DENSE, generator=g) if dense is None else dense
    return x, kjt, torch.arange(n) % 3


BAD = torch.tensor([float("nan"), float("inf"), float("-inf"), 1e30, -1e30, 0.0])


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_output_is_finite_for_nan_inf_and_huge_inputs(encoding) -> None:
    stats, _ = _stats()
    enc = NumericEncoder(N_DENSE, encoding, 8)
    enc.fit(quantile_edges(stats.quantiles, stats.mean, stats.std, 8, Z_CLIP))
    x = BAD.repeat(N_DENSE, 1).t().contiguous()  # (6, n): every bad value in every column
    out = enc(x)
    assert out.shape == (6, N_DENSE * 8) and torch.isfinite(out).all()
    # ±inf and ±1e30 land on the column's outermost edges: the same code as the edge values
    hi, lo = enc(enc.edges[:, -1].repeat(2, 1)), enc(enc.edges[:, 0].repeat(2, 1))
    assert torch.equal(out[1], hi[0]) and torch.equal(out[3], hi[0])
    assert torch.equal(out[2], lo[0]) and torch.equal(out[4], lo[0])


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_a_whole_model_scores_bad_dense_inputs_finitely(demo, encoding) -> None:
    cfg = _with_numeric(tiny(demo), "teacher", encoding)
    torch.manual_seed(0)
    model = build_model(cfg, "teacher", N_DENSE).eval()
    fit_numeric(model, _stats()[0])
    out = model(*_inputs(cfg, dense=BAD.repeat(N_DENSE, 1).t().contiguous()))
    assert all(torch.isfinite(v).all() for v in out.values())


class _TodaysDenseArch(nn.Module):
    """DenseArch as it was before numeric encodings (a frozen copy)."""

    def __init__(self, n_dense, dim, tokens=net_mod.DENSE_TOKENS, size=None):
        super().__init__()
        self.tokens, self.dim = tokens, dim
        mods, w = Mods.of(size), tokens * dim
        self.net = nn.Sequential(Linear(n_dense, w, bias=mods.bias), *mods.after_hidden(w), Linear(w, w, bias=mods.bias))

    def forward(self, dense):
        return self.net(dense).view(dense.shape[0], self.tokens, self.dim)


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_none_is_todays_model(demo, monkeypatch, kind) -> None:
    cfg = _with_numeric(tiny(demo), kind, "none")
    torch.manual_seed(0)
    new = build_model(cfg, kind, N_DENSE)
    assert not any(isinstance(m, NumericEncoder) for m in new.modules())
    with monkeypatch.context() as mp:
        mp.setattr(net_mod, "DenseArch", _TodaysDenseArch)
        torch.manual_seed(0)
        old = build_model(cfg, kind, N_DENSE)
    a, b = new.state_dict(), old.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)  # the same seeded draws: no arithmetic
    inputs = _inputs(cfg)
    out_new, out_old = new(*inputs), old(*inputs)
    for o in out_old:  # two implementations of the dense arch (tests/tolerances.py)
        assert_same_kernels_close(out_new[o], out_old[o], o)


def test_edges_are_sorted_and_are_the_train_quantiles() -> None:
    stats, raw = _stats()
    edges = quantile_edges(stats.quantiles, stats.mean, stats.std, 8, Z_CLIP)  # (n, 9)
    assert edges.shape == (N_DENSE, 9) and (edges[:, 1:] >= edges[:, :-1]).all()
    for j in range(N_DENSE):
        x = np.clip(raw[f"c{j}"], stats.low[j], stats.high[j])
        want = np.clip((np.quantile(x, np.linspace(0, 1, 9)) - stats.mean[j]) / stats.std[j], -Z_CLIP, Z_CLIP)
        np.testing.assert_allclose(edges[j].numpy(), want, rtol=1e-5, atol=1e-5)


def test_edges_come_from_the_train_split_alone(tiny_demo, tmp_path) -> None:
    """Absurd prices on every validation and test row move no edge: the stats read train rows only."""
    import pyarrow.dataset as ds

    from lattice.data.loader import find_table, fit_dense_stats
    from lattice.data.local_consolidate import write_parquet
    from lattice.paths import Paths

    cfg, paths = tiny_demo("numeric_edges", 3_000)
    root = find_table(paths)
    frame = ds.dataset(str(root), format="parquet", partitioning="hive").to_table().to_pandas()
    frame["domain"] = frame["domain"].astype(str)
    held_out = frame.split != "train"
    assert held_out.any() and (~held_out).any()
    poisoned = frame.copy()
    poisoned.loc[held_out, "price"] = 1e30
    poisoned.loc[held_out, "activity"] = -1e30
    other = Paths.for_config(cfg, tmp_path / "work")
    write_parquet(poisoned, other.consolidated / "part-0.parquet")
    clean, dirty = fit_dense_stats(cfg, root), fit_dense_stats(cfg, other.consolidated)
    assert dirty.quantiles == clean.quantiles and len(clean.quantiles) == len(clean.columns)
    cfg = _with_numeric(cfg, "teacher", "ple", 16)
    model = build_model(cfg, "teacher", len(clean.columns))
    fit_numeric(model, dirty)
    enc = next(m for m in model.modules() if isinstance(m, NumericEncoder))
    assert torch.equal(enc.edges, quantile_edges(clean.quantiles, clean.mean, clean.std, 16, Z_CLIP))
    assert (enc.edges.abs() <= Z_CLIP).all()


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_saved_blob_rebuilds_to_identical_outputs(demo, encoding) -> None:
    cfg = _with_numeric(tiny(demo), "teacher", encoding)
    stats, _ = _stats()
    torch.manual_seed(0)
    model = build_model(cfg, "teacher", N_DENSE)
    fit_numeric(model, stats)
    with torch.no_grad():  # weights a trained model would have, not the init a rebuild draws again
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))
    model.eval()
    blob = saved_blob(name="teacher", kind="teacher", n_dense=N_DENSE, stats=stats, config=cfg.model_dump(mode="json"),
                      state_dict=model.state_dict())
    torch.manual_seed(123)  # another init: everything must come from the blob
    again = rebuild(blob)
    enc = next(m for m in again.modules() if isinstance(m, NumericEncoder))
    assert torch.equal(enc.edges, quantile_edges(stats.quantiles, stats.mean, stats.std, 8, Z_CLIP))
    inputs = _inputs(cfg, dense=torch.cat([torch.randn(6, N_DENSE) * 3, BAD.repeat(N_DENSE, 1).t()]), n=12)
    a, b = model(*inputs), again(*inputs)
    assert all(torch.equal(a[o], b[o]) for o in a)  # the same modules and weights on the same inputs: the same ops


@pytest.mark.parametrize("encoding", ENCODINGS)
@pytest.mark.parametrize("kind", ["teacher", "mmoe"])
def test_gradients_reach_every_parameter(demo, encoding, kind) -> None:
    cfg = _with_numeric(tiny(demo), kind, encoding)
    torch.manual_seed(0)
    model = build_model(cfg, kind, N_DENSE)
    fit_numeric(model, _stats()[0])
    dense = (torch.randn(6, N_DENSE) * 2).requires_grad_()
    out = model(*_inputs(cfg, dense=dense))
    sum(v.sum() for v in out.values()).backward()
    enc = next(m for m in model.modules() if isinstance(m, NumericEncoder))
    for name, p in enc.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0, name
    if encoding != "quantile":  # a bucket id is piecewise constant in its value: its table learns instead
        assert dense.grad is not None and torch.isfinite(dense.grad).all() and dense.grad.abs().sum() > 0


def test_stats_without_quantiles_say_how_to_refit(demo) -> None:
    stats, _ = _stats()
    stats.quantiles = None
    model = build_model(_with_numeric(tiny(demo), "teacher", "ple"), "teacher", N_DENSE)
    with pytest.raises(ValueError, match="refit"):
        fit_numeric(model, stats)
    fit_numeric(build_model(_with_numeric(tiny(demo), "teacher", "none"), "teacher", N_DENSE), stats)  # none: nothing to fit, no error


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_the_exported_artifact_carries_the_edges(demo, encoding, tmp_path) -> None:
    """The TorchScript artifact (lattice.export) holds the fitted edges and scores as the model does."""
    from lattice.export.serving_module import script

    cfg = _with_numeric(tiny(demo), "teacher", encoding)
    torch.manual_seed(0)
    model = build_model(cfg, "teacher", N_DENSE)
    fit_numeric(model, _stats()[0])
    model.eval()
    inputs = _inputs(cfg, dense=torch.cat([torch.randn(6, N_DENSE) * 3, BAD.repeat(N_DENSE, 1).t()]), n=12)
    path = tmp_path / "model.pt"
    script(model).save(str(path))
    with torch.no_grad():
        eager = {o: torch.sigmoid(v) for o, v in model(*inputs).items()}
        got = torch.jit.load(str(path))(*inputs)
    assert all(torch.isfinite(got[o]).all() for o in got)
    assert max(float((got[o] - eager[o]).abs().max()) for o in eager) <= 1e-6


def _teacher_with(cfg, **update):
    m = cfg.models
    return cfg.model_copy(update={"models": m.model_copy(update={"teacher": m.teacher.model_copy(update=update)})})


@pytest.mark.parametrize("shared", [True, False])  # experts and gates read the context, or the heads do
def test_dense_context_passes_the_encoded_columns_around_the_dense_tokens(demo, shared) -> None:
    """With the dense MLP silenced (its tokens no longer depend on the input), the prediction
    still moves with the dense columns under `dense_context`, and does not without it."""
    moved = {}
    for on in (False, True):
        cfg = _teacher_with(tiny(demo), dense_context=on, shared_dims=[16] if shared else [], experts=2 if shared else 1)
        torch.manual_seed(0)
        model = build_model(cfg, "teacher", N_DENSE).eval()
        with torch.no_grad():
            for p in model.dense.net.parameters():
                p.zero_()
            a, b = model(*_inputs(cfg, seed=1)), model(*_inputs(cfg, seed=2))  # same ids, other dense rows
        moved[on] = max(float((a[o] - b[o]).abs().max()) for o in a)
        if on:  # the heads' (or the experts') input grew by the code's width
            first = model.experts[0][0] if shared else model.heads["click"][0]
            torch.manual_seed(0)
            off = build_model(_teacher_with(cfg, dense_context=False), "teacher", N_DENSE)
            first_off = off.experts[0][0] if shared else off.heads["click"][0]
            assert first.in_features - first_off.in_features == model.dense.code_dim == N_DENSE * cfg.models.teacher.numeric_bins
    assert moved[False] == 0.0 and moved[True] > 1e-4
