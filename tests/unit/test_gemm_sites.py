"""GEMM sites (lattice.models.gemm): with no recipe every network is bit for bit what it was
before sites existed; every GEMM is a named site; the Mods change the model as documented and
it still trains; FP8 sites train and their TorchScript serving form matches the eager model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import lattice.models.baselines as baselines_mod
import lattice.models.lattice_net as net_mod
from lattice.config import load_config
from lattice.config.schema import FP8
from lattice.data.batch import kjt_from_ids
from lattice.export.fp8_serving import SERVING_TYPES, fake_quantize, serving_form
from lattice.export.serving_module import fp8_sites, script, serving_module
from lattice.fp8.dispatch import apply_plan, attach_probes, find_sites, make_plan
from lattice.fp8.recipes import FORWARD_RECIPES, dequantize, quantize
from lattice.models import MODEL_KINDS, build_model
from lattice.models.gemm import GemmSite, Linear, PairMatmul, TokenMix, sites
from lattice.models.interaction import WukongLayer, mlp
from lattice.models.mods import BlockRMSNorm
from lattice.training.tiny import tiny
from tolerances import assert_same_kernels_close

ROOT = Path(__file__).resolve().parents[2]
B = 6


@pytest.fixture(scope="module")
def demo():
    return load_config(ROOT / "configs" / "demo.yaml")


def _with_size(cfg, kind: str, **update):
    """cfg with the model size of `kind` (teacher, student or the baselines') updated."""
    m = cfg.models
    if kind in ("teacher", "student"):
        return cfg.model_copy(update={"models": m.model_copy(update={kind: getattr(m, kind).model_copy(update=update)})})
    size = m.baselines.size.model_copy(update=update)
    return cfg.model_copy(update={"models": m.model_copy(update={"baselines": m.baselines.model_copy(update={"size": size})})})


def _inputs(cfg, n: int = B, seed: int = 1):
    names = [f.name for f in cfg.features.sparse]
    g = torch.Generator().manual_seed(seed)
    kjt = kjt_from_ids(names, [np.arange(n) * 7 % 16 for _ in names], [np.arange(n) % 3 != 2 for _ in names])
    return torch.randn(n, 4, generator=g), kjt, torch.arange(n) % 3


# ------------------------------------------------------------------ the networks before sites
# A frozen copy of the dense layers as they were written before GEMM sites (plain nn.Linear,
# bare Parameters, einsum / bmm / @). Building a model with these patched in gives the "before"
# model with the same seed; it must equal the site model exactly, initialisation included.


class _OldWukong(nn.Module):
    def __init__(self, n_in, n_out, dim, fm_rank, dropout=0.0, size=None):
        super().__init__()
        self.n_fm = max(1, n_out // 2)
        self.n_lc = n_out - self.n_fm
        self.dim = dim
        self.fm_proj = nn.Parameter(torch.randn(n_in, fm_rank) / n_in**0.5)
        hidden = max(64, self.n_fm * dim)
        self.fm_mlp = nn.Sequential(nn.LayerNorm(n_in * fm_rank), nn.Linear(n_in * fm_rank, hidden), nn.ReLU(),
                                    nn.Dropout(dropout), nn.Linear(hidden, self.n_fm * dim))
        self.lcb = nn.Parameter(torch.randn(n_in, self.n_lc) / n_in**0.5) if self.n_lc else None
        self.skip = None if n_in == n_out else nn.Parameter(torch.randn(n_in, n_out) / n_in**0.5)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        b = x.shape[0]
        z = torch.einsum("bnd,nk->bkd", x, self.fm_proj)
        inter = torch.bmm(x, z.transpose(1, 2))
        fm = self.fm_mlp(inter.flatten(1)).view(b, self.n_fm, self.dim)
        parts = [fm] + ([torch.einsum("bnd,nm->bmd", x, self.lcb)] if self.lcb is not None else [])
        res = x if self.skip is None else torch.einsum("bnd,nm->bmd", x, self.skip)
        return self.norm(torch.cat(parts, dim=1) + res)


class _OldDomainFM(nn.Module):
    def __init__(self, n_tokens, dim, n_domains, channels):
        super().__init__()
        self.channels, self.dim = channels, dim
        self.scale = nn.Parameter(1.0 + 0.1 * torch.randn(n_domains, channels, dim))
        i, j = torch.triu_indices(n_tokens, n_tokens, offset=1)
        eye = torch.eye(n_tokens)
        self.register_buffer("pick_i", eye[i], persistent=False)
        self.register_buffer("pick_j", eye[j], persistent=False)
        self.per_example = n_domains > 4

    @property
    def out_dim(self):
        return self.channels * self.pick_i.shape[0]

    def forward(self, x, domain):
        b, n_dom = x.shape[0], self.scale.shape[0]
        pairs = torch.matmul(self.pick_i, x) * torch.matmul(self.pick_j, x)
        if self.per_example:
            return torch.bmm(pairs, self.scale[domain].transpose(1, 2)).flatten(1)
        every = pairs.reshape(-1, self.dim) @ self.scale.view(n_dom * self.channels, self.dim).t()
        every = every.view(b, -1, n_dom, self.channels)
        index = domain.view(b, 1, 1, 1).expand(b, every.shape[1], 1, self.channels)
        return every.gather(2, index).flatten(1)


class _OldDenseArch(nn.Module):
    def __init__(self, n_dense, dim, tokens=net_mod.DENSE_TOKENS, size=None):
        super().__init__()
        self.tokens, self.dim = tokens, dim
        self.net = nn.Sequential(nn.Linear(n_dense, tokens * dim), nn.ReLU(), nn.Linear(tokens * dim, tokens * dim))

    def forward(self, dense):
        return self.net(dense).view(dense.shape[0], self.tokens, self.dim)


def _old_trunk(n_in, dims, dropout=0.0, size=None):
    layers = []
    for d in dims:
        layers += [nn.Linear(n_in, d), nn.ReLU(), nn.Dropout(dropout)]
        n_in = d
    return nn.Sequential(*layers)


def _old_mlp(n_in, dims, n_out, dropout=0.0, size=None, head=True):
    return nn.Sequential(*_old_trunk(n_in, dims, dropout), nn.Linear(dims[-1] if dims else n_in, n_out))


def _old_linear(n_in, n_out, bias=True):
    return nn.Linear(n_in, n_out)


def _run(model, cfg):
    torch.manual_seed(5)  # dropout draws, if any
    out = model(*_inputs(cfg))
    sum(v.sum() for v in out.values()).backward()
    return out, {n: p.grad for n, p in model.named_parameters()}


def _old_name(name: str) -> str:
    # bare Parameters became sites: fm_proj -> fm_proj.weight (and lcb, skip)
    for p in ("fm_proj", "lcb", "skip"):
        name = name.replace(f".{p}.weight", f".{p}")
    return name


@pytest.mark.parametrize("kind", MODEL_KINDS)
@pytest.mark.parametrize("which", ["demo", "tiny"])  # tiny: Wukong layers, untied per domain
def test_sites_without_recipe_are_the_old_network_bit_for_bit(demo, monkeypatch, kind, which) -> None:
    cfg = demo if which == "demo" else tiny(demo)
    # the old network predates the numeric encoders and the dense columns in the context
    cfg = _with_size(cfg, kind, numeric="none", **({"dense_context": False} if kind in ("teacher", "student") else {}))
    if kind == "teacher" and which == "tiny":
        cfg = _with_size(cfg, "teacher", domain_fm=2)  # every site type in one model
    torch.manual_seed(0)
    new = build_model(cfg, kind, 4)
    new_out, new_grad = _run(new, cfg)
    with monkeypatch.context() as mp:
        for name, obj in [("WukongLayer", _OldWukong), ("DomainFM", _OldDomainFM), ("DenseArch", _OldDenseArch),
                          ("trunk", _old_trunk), ("mlp", _old_mlp), ("Linear", _old_linear)]:
            mp.setattr(net_mod, name, obj)
        mp.setattr(baselines_mod, "mlp", _old_mlp)
        mp.setattr(baselines_mod, "Linear", _old_linear)
        torch.manual_seed(0)
        old = build_model(cfg, kind, 4)
    assert not any(isinstance(m, GemmSite) for m in old.modules()) and sites(new)
    old_out, old_grad = _run(old, cfg)
    # outputs and gradients: two implementations of the same layers, which may group their float32
    # additions differently on another CPU (tests/tolerances.py)
    assert set(new_out) == set(old_out)
    for o in old_out:
        assert_same_kernels_close(new_out[o], old_out[o], o)
    old_params = dict(old.named_parameters())
    assert {_old_name(n) for n in dict(new.named_parameters())} == set(old_params)
    for n, p in new.named_parameters():
        assert torch.equal(p, old_params[_old_name(n)]), n  # the same seeded draws in the same order: no arithmetic
        g, h = new_grad[n], old_grad[_old_name(n)]
        assert (g is None) == (h is None), n
        if g is not None:
            assert_same_kernels_close(g, h, n)


def test_standalone_layers_keep_their_seeded_numbers() -> None:
    """Values the layers gave before sites (same seed, same init order), to 1e-5."""
    torch.manual_seed(0)
    w = WukongLayer(10, 8, 8, 4)
    torch.manual_seed(1)
    got = w(torch.randn(3, 10, 8)).flatten()[:6]
    want = [-1.885953, -0.156621, -1.276647, 1.027224, 0.618011, 1.077199]
    assert torch.allclose(got, torch.tensor(want), atol=1e-5)
    torch.manual_seed(0)
    m = mlp(12, [16, 8], 1)
    torch.manual_seed(1)
    assert torch.allclose(m(torch.randn(3, 12)).flatten(), torch.tensor([0.280104, 0.153573, -0.062279]), atol=1e-5)
    torch.manual_seed(0)
    d = net_mod.DenseArch(4, 8)
    torch.manual_seed(1)
    want = [0.19261, 0.420169, 0.18218, 0.208752, -0.268739, -0.066108]
    assert torch.allclose(d(torch.randn(3, 4)).flatten()[:6], torch.tensor(want), atol=1e-5)


# ------------------------------------------------------------------ every GEMM is a site

DEMO_TEACHER_SITES = {
    # dense.net.0 reads the 4 dense columns after `ple` (16 bins each: models.teacher.numeric)
    # the experts and gates read 13 tokens x 16 + 78 pairs x 8 channels + those 64 encoded columns
    # (models.teacher.dense_context)
    "dense.net.0": (64, 64), "dense.net.2": (64, 64), "domain_fm.mix": (16, 24),
    **{f"experts.{e}.0": (896, 128) for e in range(4)}, **{f"experts.{e}.3": (128, 64) for e in range(4)},
    "gates.click": (896, 4), "gates.conversion": (896, 4),
    "heads.click.0": (64, 64), "heads.click.3": (64, 1), "heads.conversion.0": (64, 64), "heads.conversion.3": (64, 1),
}


def test_demo_teacher_sites_by_name_and_shape(demo) -> None:
    model = build_model(demo, "teacher", 4)
    found = find_sites(model)
    assert {n: tuple(s.gemm_shape()) for n, s in found.items()} == DEMO_TEACHER_SITES
    assert [n for n, _ in sites(model)] == list(found)  # the dispatcher and the models agree
    # no dense GEMM is left outside a site (the sparse arch's table projections are its own)
    plain = [n for n, m in model.named_modules() if isinstance(m, nn.Linear) and not isinstance(m, GemmSite)]
    assert all(n.startswith("sparse.") for n in plain)


class _CountGemms(torch.utils._python_dispatch.TorchDispatchMode):
    OPS = {"mm", "addmm", "bmm", "baddbmm"}

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += func.__name__.split(".")[0] in self.OPS
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("kind", ["teacher", "student", "mmoe", "shared_bottom"])
def test_every_aten_gemm_of_a_forward_is_a_site_or_a_documented_exception(demo, kind) -> None:
    cfg = _with_size(tiny(demo), kind if kind in ("teacher", "student") else "baselines", domain_fm=2)
    model = build_model(cfg, kind, 4).eval()
    inputs = _inputs(cfg)
    n_sites = len(sites(model))
    # the exceptions: DomainFM's two one-hot picks; one expert mix per objective with gates
    domain_fm = [m for m in model.modules() if isinstance(m, net_mod.DomainFM)]
    gates = getattr(model, "gates", None)
    expected = n_sites + 2 * len(domain_fm) + (len(gates) if gates is not None else 0)
    sparse_proj = sum(1 for n, m in model.named_modules() if isinstance(m, nn.Linear) and n.startswith("sparse."))
    with torch.no_grad(), _CountGemms() as count:
        model(*inputs)
    assert count.n == expected + sparse_proj


def test_site_counts_per_kind(demo) -> None:
    counts = {k: len(sites(build_model(demo, k, 4))) for k in MODEL_KINDS}
    # teacher: dense 2 + domain_fm 1 + 4 experts x 2 + 2 gates + 2 heads x 2
    # student: dense 2 + domain_fm 1 + 2 heads x 2; mmoe: 4 experts x 2 + 2 gates + 2 towers x 2
    # baselines' size has one Wukong layer: 6 sites (fm_proj, fm_pair, fm_mlp x 2, lcb, skip)
    # separate: 5 cells x (dense 2 + 6 + head 2); pooled: 2 x 10; shared_bottom: 1 x 2 + 2 x 2
    assert counts == {"teacher": 17, "student": 7, "separate": 50, "pooled": 20, "mmoe": 14, "shared_bottom": 6}


def test_each_site_with_no_recipe_is_the_plain_op() -> None:
    torch.manual_seed(0)
    ref = nn.Linear(5, 3)
    torch.manual_seed(0)
    lin = Linear(5, 3)
    x = torch.randn(4, 7, 5)
    assert torch.equal(lin.weight, ref.weight) and torch.equal(lin.bias, ref.bias)
    assert torch.equal(lin(x), F.linear(x, ref.weight, ref.bias))
    assert lin.weight_matrix().shape == (3, 5) and lin.gemm_shape() == (5, 3) and lin.flops_per_row() == 30
    torch.manual_seed(0)
    mix = TokenMix(6, 4, dim=3)
    torch.manual_seed(0)
    w = torch.randn(6, 4) / 6**0.5
    t = torch.randn(2, 6, 3)
    assert torch.equal(mix.weight, w) and torch.equal(mix(t), torch.einsum("bnd,nm->bmd", t, w))
    assert mix.weight_matrix().shape == (4, 6) and mix.gemm_shape() == (6, 4) and mix.rows_per_example == 3
    pair = PairMatmul(3, 5)
    z = torch.randn(2, 5, 3)
    assert torch.equal(pair(t, z), torch.bmm(t, z.transpose(1, 2))) and pair.weight_matrix() is None


def test_probes_see_the_2d_gemm_operands() -> None:
    seen = []

    class Probe:
        def observe(self, a, b=None):
            seen.append((tuple(a.shape), None if b is None else tuple(b.shape)))

    mix, pair, lin = TokenMix(6, 4, dim=3), PairMatmul(3, 5, rows_per_example=6), Linear(3, 2)
    for s in (mix, pair, lin):
        s.probe = Probe()
    t = torch.randn(2, 6, 3)
    mix(t), pair(t, torch.randn(2, 5, 3)), lin(t)
    assert seen == [((6, 6), None), ((12, 3), (10, 3)), ((12, 3), None)]  # A: (rows, K); B: (N rows, K)
    seen.clear()
    for s in (mix, pair, lin):
        s.eval()
    mix(t), pair(t, torch.randn(2, 5, 3)), lin(t)
    assert seen == []  # eval never updates statistics


# ------------------------------------------------------------------ the Mods


def _train(model, cfg, steps: int = 6) -> list[float]:
    opt = torch.optim.Adam([p for n, p in model.named_parameters() if p.requires_grad], lr=0.01)
    dense, kjt, domain = _inputs(cfg, n=24)
    y = (torch.arange(24) % 2).float()
    losses = []
    model.train()
    for _ in range(steps):
        out = model(dense, kjt, domain)
        loss = sum(F.binary_cross_entropy_with_logits(v, y) for v in out.values())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def _all_mods(cfg, kind: str, **update):
    key = kind if kind in ("teacher", "student") else "baselines"
    return _with_size(cfg, key, **{"domain_fm": 2, **update})


@pytest.mark.parametrize("kind", ["teacher", "mmoe"])
def test_bias_final_keeps_only_each_heads_prediction_bias(demo, kind) -> None:
    cfg = _all_mods(tiny(demo), kind, bias="final")
    model = build_model(cfg, kind, 4)
    heads = model.heads if kind == "teacher" else model.towers
    prefix = "heads" if kind == "teacher" else "towers"
    finals = {f"{prefix}.{o}.{len(h) - 1}.bias" for o, h in heads.items()}
    biases = {n for n, _ in model.named_parameters() if n.endswith("bias")}
    assert biases == finals
    default = build_model(_all_mods(tiny(demo), kind), kind, 4)
    assert len([n for n, _ in default.named_parameters() if n.endswith("bias")]) > len(finals)
    model.set_output_bias({"click": 0.1, "conversion": 0.01})  # still has its prediction biases
    losses = _train(model, cfg)
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]


def test_hardswish_replaces_every_relu(demo) -> None:
    for kind in ("teacher", "mmoe"):
        cfg = _all_mods(tiny(demo), kind, activation="hardswish")
        model = build_model(cfg, kind, 4)
        assert any(isinstance(m, nn.Hardswish) for m in model.modules())
        assert not any(isinstance(m, nn.ReLU) for m in model.modules())
        losses = _train(model, cfg)
        assert all(np.isfinite(losses)) and losses[-1] < losses[0]


def test_block_rms_norm_gives_unit_rms_per_block() -> None:
    x = torch.randn(5, 20) * torch.logspace(-1, 3, 20)  # blocks of very different scales (all >> eps)
    y = BlockRMSNorm(20, 8)(x)  # blocks [0, 8), [8, 16) and the shorter tail [16, 20)
    for lo, hi in [(0, 8), (8, 16), (16, 20)]:
        assert torch.allclose(y[:, lo:hi].pow(2).mean(-1).sqrt(), torch.ones(5), atol=1e-4)
    assert torch.allclose(BlockRMSNorm(6, 8)(x[:, :6]).pow(2).mean(-1), torch.ones(5), atol=1e-4)  # one block
    assert torch.equal(BlockRMSNorm(4, 2)(torch.zeros(2, 4)), torch.zeros(2, 4))  # zeros stay zeros
    assert not list(BlockRMSNorm(20, 8).parameters())


def test_block_norm_follows_every_hidden_layer(demo) -> None:
    cfg = _all_mods(tiny(demo), "teacher", block_norm=8, shared_dims=[24, 16], experts=2)
    model = build_model(cfg, "teacher", 4)
    norms = {n: m for n, m in model.named_modules() if isinstance(m, BlockRMSNorm)}
    acts = [n for n, m in model.named_modules() if isinstance(m, nn.ReLU)]
    assert len(norms) == len(acts) > 0  # one norm per hidden layer, right after its activation
    for a in acts:
        parent, i = a.rsplit(".", 1)
        assert f"{parent}.{int(i) + 1}" in norms
    outs = []
    hooks = [m.register_forward_hook(lambda m, i, o: outs.append((m.block, m.width, i[0], o))) for m in norms.values()]
    with torch.no_grad():
        model(*_inputs(cfg, n=24))
    for h in hooks:
        h.remove()
    assert len(outs) == len(norms)
    for block, width, x, o in outs:
        full = width // block * block
        ms_in = x[:, :full].unflatten(-1, (-1, block)).pow(2).mean(-1)  # (B, blocks)
        rms = o[:, :full].unflatten(-1, (-1, block)).pow(2).mean(-1).sqrt()  # (B, blocks)
        live = ms_in > 1e-3  # far above eps (1e-6); a block of all-zero ReLU outputs stays zero
        assert live.float().mean() > 0.5 and torch.allclose(rms[live], torch.ones_like(rms[live]), atol=1e-3)
        assert torch.all(rms <= 1 + 1e-5)
    losses = _train(model, cfg)
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]


def test_all_mods_together_train(demo) -> None:
    for kind in ("teacher", "student", "mmoe", "separate"):
        cfg = _all_mods(tiny(demo), kind, bias="final", block_norm=4, activation="hardswish")
        torch.manual_seed(0)
        model = build_model(cfg, kind, 4)
        losses = _train(model, cfg)
        assert all(np.isfinite(losses)) and losses[-1] < losses[0], kind


# ------------------------------------------------------------------ FP8 sites and their serving form


def _fp8_everywhere(model, recipes=FORWARD_RECIPES) -> None:
    for i, (_, s) in enumerate(sites(model)):
        s.recipe = recipes[i % len(recipes)]


@pytest.mark.parametrize("recipe", FORWARD_RECIPES)
def test_serving_form_of_each_site_equals_its_fp8_forward(recipe) -> None:
    torch.manual_seed(0)
    lin, mix, pair, flat = Linear(40, 6), TokenMix(7, 5, dim=3), PairMatmul(3, 4), PairMatmul(40, 6, batched=False)
    x, t, z = torch.randn(9, 40) * 3, torch.randn(2, 7, 3), torch.randn(2, 4, 3)
    w = torch.randn(6, 40)
    for s in (lin, mix, pair, flat):
        s.recipe = recipe
        s.eval()
    pairs = [(lin(x), serving_form(lin)(x)), (mix(t), serving_form(mix)(t)),
             (pair(t, z), serving_form(pair)(t, z)), (flat(x, w), serving_form(flat)(x, w))]
    for want, got in pairs:
        # the same quantised operands in the same fp32 GEMM: equal up to fp32 summation order
        assert want.shape == got.shape and (got - want).abs().max() <= 1e-5 * want.abs().max()
    form = serving_form(lin)
    assert form.weight8.dtype == torch.float8_e4m3fn and not form.weight8.requires_grad
    w8, scale = quantize(lin.weight, recipe)
    assert torch.equal(form.weight8.float(), w8.float()) and torch.equal(form.weight_scale, scale)
    # the run-time quantiser is the recipe's, op for op
    assert torch.equal(fake_quantize(x, recipe, 40), dequantize(*quantize(x, recipe), recipe))


def test_fp8_sites_train(demo) -> None:
    cfg = _with_size(tiny(demo), "teacher", domain_fm=2)
    torch.manual_seed(0)
    model = build_model(cfg, "teacher", 4)
    _fp8_everywhere(model)
    assert {type(s) for _, s in sites(model)} == {Linear, TokenMix, PairMatmul}
    losses = _train(model, cfg)
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]
    assert all(s.weight.grad is not None for _, s in sites(model) if hasattr(s, "weight"))


@pytest.mark.parametrize("kind", ["teacher", "student"])
def test_scripted_artifact_with_fp8_sites_matches_the_eager_fp8_model(demo, kind) -> None:
    cfg = _with_size(tiny(demo), kind, domain_fm=2)
    torch.manual_seed(0)
    model = build_model(cfg, kind, 4)
    inputs = _inputs(cfg, n=16)
    with torch.no_grad():
        fp32 = {o: torch.sigmoid(v) for o, v in model.eval()(*inputs).items()}
        plain = script(model)(*inputs)
    assert fp8_sites(model) == [] and all(torch.allclose(plain[o], fp32[o], atol=1e-6) for o in fp32)

    _fp8_everywhere(model)
    with torch.no_grad():
        eager = {o: torch.sigmoid(v) for o, v in model.eval()(*inputs).items()}
    names = [n for n, _ in sites(model)]
    assert fp8_sites(model) == names
    assert fp8_sites(serving_module(model)) == [f"net.{n}" for n in names]
    served = serving_module(model)
    assert not any(isinstance(m, GemmSite) for m in served.modules())  # every site was swapped
    assert sum(isinstance(m, SERVING_TYPES) for m in served.modules()) == len(names)
    artifact = script(model)
    with torch.no_grad():
        got = artifact(*inputs)
    # probabilities: the artifact computes the eager model's quantised GEMMs (fp32 rounding only)
    assert max(float((got[o] - eager[o]).abs().max()) for o in eager) <= 1e-6
    one = _inputs(cfg, n=1)  # one request, from one domain: the untied layer's other copies see it too
    with torch.no_grad():
        alone, eager_alone = artifact(*one), {o: torch.sigmoid(v) for o, v in model.eval()(*one).items()}
    assert max(float((alone[o] - eager_alone[o]).abs().max()) for o in eager) <= 1e-6
    assert any(float((eager[o] - fp32[o]).abs().max()) > 0 for o in eager)  # FP8 did change the numbers
    n_weight_sites = sum(1 for _, s in sites(model) if s.weight_matrix() is not None)
    assert sum(p.dtype == torch.float8_e4m3fn for p in artifact.parameters()) == n_weight_sites


def test_plan_from_probes_to_artifact(demo, tmp_path) -> None:
    """The real path: probe while training, plan, apply, train in FP8, export."""
    cfg = _with_size(tiny(demo), "teacher", domain_fm=2)
    torch.manual_seed(0)
    model = build_model(cfg, "teacher", 4)
    attach_probes(model)
    _train(model, cfg, steps=3)
    plan = make_plan(model, FP8(enabled=True, max_relative_error=0.5), n_samples=256)
    chosen = apply_plan(model, plan)
    assert set(chosen) == {n for n, _ in sites(model)}
    fp8 = [n for n, c in chosen.items() if c != "fp32"]
    assert fp8 and fp8_sites(model) == fp8
    losses = _train(model, cfg, steps=3)
    assert all(np.isfinite(losses))
    inputs = _inputs(cfg, n=16)
    with torch.no_grad():
        eager = {o: torch.sigmoid(v) for o, v in model.eval()(*inputs).items()}
    path = tmp_path / "model.pt"
    script(model).save(str(path))
    with torch.no_grad():
        got = torch.jit.load(str(path))(*inputs)
    assert max(float((got[o] - eager[o]).abs().max()) for o in eager) <= 1e-6
