"""Compressed embeddings (lattice.hashing): every scheme maps every id into its tables, QR keeps
the id space collision-free, mixed dims stay within the parameter budget, zch trains (on 1 rank
and 2 DMP ranks, with one map), each scheme trains inside LatticeNet, and the TorchScript
artifact gives the eager model's rows and scores. Fitted maps are built by hand to the fit
stage's contract (lattice.hashing.fit)."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from lattice.config import load_config
from lattice.config.schema import PlatformConfig, SparseFeature
from lattice.config.summary import embedding_bytes
from lattice.hashing.layout import budget_rows, mixed_layout, qr_split
from lattice.hashing.registry import make_compression
from lattice.hashing.store import FitMissingError
from lattice.hashing.zch import ZCHRemap
from lattice.models import build_model
from lattice.models.cost import model_cost
from lattice.models.saved import rebuild
from lattice.training.tiny import tiny

ROOT = Path(__file__).resolve().parents[2]
SCHEMES = ("none", "modulo", "vocab", "learned", "qr", "mixed", "zch")
FITTED = ("vocab", "learned", "mixed")
HUGE = [0, 1, -1, -(2**40), 2**62, 2**63 - 1, -(2**63)]
COMPRESSED = ("user_id", "ad_id")  # the demo features the tests switch to a scheme


# ---------------------------------------------------------------- fitted maps by hand


def fit_by_hand(name: str, scheme: str, budget: int, raw: np.ndarray, min_count: int = 1, frequent_share: float = 0.5,
                unseen_share: float = 0.05) -> dict:
    """A fitted map with the fit stage's contract: ids sorted with their rows and counts, an
    out-of-vocabulary range, table_rows (vocab: rank rows + 1 oov row, capped to the budget;
    learned: frequent rows, clustered rows, unseen range; mixed: rank rows then an unseen range,
    possibly more rows than the budget)."""
    u, c = np.unique(np.asarray(raw, np.int64), return_counts=True)
    u, c = u[c >= min_count], c[c >= min_count]
    order = np.lexsort((u, -c))
    u, c = u[order], c[order]  # by frequency rank
    if scheme == "vocab":
        u, c = u[: budget - 1], c[: budget - 1]
        rows, oov_start, oov_rows, table_rows, frequent = np.arange(len(u)), len(u), 1, len(u) + 1, len(u)
    elif scheme == "learned":
        oov_rows = max(1, int(budget * unseen_share))
        frequent = min(len(u), int(budget * frequent_share))
        clusters = budget - oov_rows - frequent
        rows = np.concatenate([np.arange(frequent), frequent + u[frequent:] % clusters])
        oov_start, table_rows = budget - oov_rows, budget
    elif scheme == "mixed":
        oov_rows = max(1, budget // 20)
        rows, oov_start, table_rows, frequent = np.arange(len(u)), len(u), len(u) + oov_rows, 0
    else:
        raise ValueError(scheme)
    s = np.argsort(u)
    return {"feature": name, "scheme": scheme, "version": 1, "table_rows": int(table_rows), "budget": int(budget),
            "ids": u[s], "rows_of": rows[s].astype(np.int64), "counts": c[s].astype(np.int64), "oov_start": int(oov_start),
            "oov_rows": int(oov_rows), "frequent": int(frequent), "window": {}, "stats": {"ids": int(len(u))}}


def traffic(rng: np.random.Generator, n: int, pool: int = 400) -> np.ndarray:
    """Zipf-like ids from a pool of `pool` large raw ids (a few frequent, a long tail)."""
    base = np.arange(1, pool + 1, dtype=np.int64) * 7919 + 10**9
    p = 1.0 / np.arange(1, pool + 1) ** 1.1
    return base[rng.choice(pool, size=n, p=p / p.sum())]


@pytest.fixture(scope="module")
def demo() -> PlatformConfig:
    return tiny(load_config(ROOT / "configs" / "demo.yaml"))


def with_scheme(cfg: PlatformConfig, scheme: str, **keys) -> PlatformConfig:
    """The config with `user_id` and `ad_id` switched to `scheme` (like `--set
    features.sparse.user_id.hashing=...`)."""
    sparse = [f.model_copy(update={"hashing": scheme, **keys}) if f.name in COMPRESSED else f for f in cfg.features.sparse]
    return cfg.model_copy(update={"features": cfg.features.model_copy(update={"sparse": sparse})})


def fitted_for(cfg: PlatformConfig, seed: int = 0, n: int = 4000) -> dict:
    """feature -> {budget: map} for every fitted feature of every model size of the config."""
    rng = np.random.default_rng(seed)
    sizes = (cfg.models.teacher, cfg.models.student, cfg.models.baselines.size)
    out: dict = {}
    for f in cfg.features.sparse:
        if f.hashing in FITTED:
            raw = traffic(rng, n)
            out[f.name] = {budget_rows(f, s): fit_by_hand(f.name, f.hashing, budget_rows(f, s), raw, f.fit_min_count())
                           for s in sizes}
    return out


def kjt_for(cfg: PlatformConfig, rng: np.random.Generator, batch: int, max_len: int = 3,
            extra: list[int] | None = None) -> KeyedJaggedTensor:
    """Bags of 0..max_len ids per (feature, example): traffic ids, unseen ids and the extremes
    (`extra`) for compressed features, in-range ids for `none` ones."""
    values, lengths = [], []
    for f in cfg.features.sparse:
        lens = rng.integers(0, max_len + 1, batch)
        v = traffic(rng, int(lens.sum()))
        v[::5] = rng.integers(-(2**62), 2**62, len(v[::5]))  # unseen, negative and huge ids
        if extra and f.name in COMPRESSED:
            k = min(len(extra), len(v))
            v[:k] = extra[:k]
        if f.hashing == "none":
            v = np.remainder(v, f.num_embeddings)
        values.append(v)
        lengths.append(lens)
    return KeyedJaggedTensor(keys=[f.name for f in cfg.features.sparse], values=torch.from_numpy(np.concatenate(values)),
                             lengths=torch.from_numpy(np.concatenate(lengths).astype(np.int32)))


# ---------------------------------------------------------------- the id -> row maps


@pytest.mark.parametrize("scheme", [s for s in SCHEMES if s != "none"])
def test_every_id_lands_in_its_tables(demo, scheme) -> None:
    cfg = with_scheme(demo, scheme, zch_eviction_interval=2)
    fitted = fitted_for(cfg)
    f = next(f for f in cfg.features.sparse if f.name == "user_id")
    comp = make_compression(cfg, f, cfg.models.teacher, fitted)
    rng = np.random.default_rng(1)
    m = fitted.get("user_id", {}).get(budget_rows(f, cfg.models.teacher))
    frequent = m["ids"][np.argsort(-m["counts"])[:5]].tolist() if m else []
    rare = m["ids"][np.argsort(m["counts"])[:5]].tolist() if m else []
    ids = torch.tensor(frequent + rare + HUGE + rng.integers(-(2**63), 2**63 - 1, 200, dtype=np.int64).tolist())
    lengths = torch.from_numpy(rng.multinomial(len(ids), np.ones(40) / 40).astype(np.int32))  # 40 bags, some empty
    comp.train()
    for _ in range(3):  # zch: profiles and evicts on the way; the others ignore the mode
        comp(ids, lengths)
    for mode in (True, False):
        comp.train(mode)
        vs, ls = comp(ids, lengths)
        assert len(vs) == len(comp.tables) == len(ls)
        for v, l, t in zip(vs, ls, comp.tables):
            assert v.dtype == torch.int64 and int(l.sum()) == v.numel() and l.shape == lengths.shape
            assert v.numel() == 0 or (int(v.min()) >= 0 and int(v.max()) < t.rows), (t, v.min(), v.max())
        if scheme == "mixed":  # every id is in exactly one block, and each bag keeps its length
            assert torch.equal(torch.stack(ls).sum(0).to(lengths.dtype), lengths)
        else:
            assert all(torch.equal(l, lengths) for l in ls)


def test_none_refuses_ids_outside_its_table_and_huge_ids_are_no_exception(demo) -> None:
    f = next(f for f in demo.features.sparse if f.hashing == "none")
    comp = make_compression(demo, f, demo.models.teacher)
    with pytest.raises(ValueError, match=f"{f.name}.*hashing 'none'"):
        comp(torch.tensor([2**62]), torch.tensor([1], dtype=torch.int32))


@pytest.mark.parametrize("scheme", ["vocab", "learned"])
def test_fitted_lookup_follows_the_map_and_sends_others_to_the_oov_range(demo, scheme) -> None:
    cfg = with_scheme(demo, scheme, min_count=2)
    fitted = fitted_for(cfg)
    f = next(f for f in cfg.features.sparse if f.name == "ad_id")
    rows = budget_rows(f, cfg.models.teacher)
    m = fitted["ad_id"][rows]
    comp = make_compression(cfg, f, cfg.models.teacher, fitted)
    assert comp.tables[0].rows == m["table_rows"] <= rows
    ids = torch.from_numpy(m["ids"])
    got, = comp(ids, torch.ones(len(ids), dtype=torch.int32))[0]
    assert torch.equal(got, torch.from_numpy(m["rows_of"]))
    others = torch.tensor(HUGE + [int(m["ids"].max()) + 1, int(m["ids"].min()) - 1])
    others = others[~torch.isin(others, ids)]
    got, = comp(others, torch.ones(len(others), dtype=torch.int32))[0]
    assert torch.equal(got, m["oov_start"] + torch.remainder(others, m["oov_rows"]))


@pytest.mark.parametrize("budget, buckets", [(16, None), (1000, None), (1000, 10), (1000, 998), (37, 5)])
def test_qr_ids_below_the_id_space_never_share_both_rows(budget, buckets) -> None:
    f = SparseFeature(name="x", column="x", num_embeddings=budget, hashing="qr", qr_buckets=buckets)
    comp = make_compression(None, f, tiny_size(), None)  # type: ignore[arg-type]
    q, r = qr_split(f, budget)
    assert q + r == budget and comp.id_space == q * r
    assert [t.rows for t in comp.tables] == [q, r]
    ids = torch.arange(q * r)
    (qi, ri), _ = comp(ids, torch.ones(len(ids), dtype=torch.int32))
    assert int(qi.max()) < q and int(ri.max()) < r
    pairs = qi * r + ri  # (quotient, remainder) as one number
    assert torch.unique(pairs).numel() == q * r  # no two ids share both rows


def tiny_size():
    from lattice.config.schema import ModelSize

    return ModelSize(embedding_dim=8)


def test_qr_with_a_vocab_fit_keeps_every_fitted_id_apart(demo) -> None:
    cfg = with_scheme(demo, "qr")
    f = next(f for f in cfg.features.sparse if f.name == "user_id")
    rows = budget_rows(f, cfg.models.teacher)
    m = fit_by_hand("user_id", "vocab", rows, traffic(np.random.default_rng(0), 3000))
    comp = make_compression(cfg, f, cfg.models.teacher, {"user_id": {rows: m}})
    (qi, ri), _ = comp(torch.from_numpy(m["ids"]), torch.ones(len(m["ids"]), dtype=torch.int32))
    assert torch.unique(qi * comp.r_rows + ri).numel() == len(m["ids"])


@pytest.mark.parametrize("combine", ["mul", "add", "concat"])
def test_qr_combines_the_two_pooled_rows(demo, combine) -> None:
    f = SparseFeature(name="x", column="x", num_embeddings=100, hashing="qr", qr_combine=combine, embedding_dim=8)
    comp = make_compression(None, f, tiny_size(), None)  # type: ignore[arg-type]
    pq, pr = torch.randn(3, comp.tables[0].dim), torch.randn(3, comp.tables[1].dim)
    want = {"mul": pq * pr, "add": pq + pr, "concat": torch.cat([pq, pr], 1)}[combine]
    assert torch.equal(comp.combine([pq, pr]), want) and want.shape == (3, comp.out_dim) and comp.out_dim == 8
    if combine == "concat":
        assert [t.dim for t in comp.tables] == [4, 4]


def _zipf(n: int, s: float) -> np.ndarray:
    return np.floor(1e6 / np.arange(1, n + 1) ** s) + 1


@pytest.mark.parametrize("popularity", [_zipf(50_000, 1.1), _zipf(3000, 0.6), np.ones(500), _zipf(90, 1.0), np.array([5.0, 1.0])],
                         ids=["zipf-50k", "zipf-3k", "uniform", "small", "two-rows"])
@pytest.mark.parametrize("budget, dim", [(2, 16), (3, 8), (64, 16), (2000, 16), (10_000, 4), (2000, 1)])
@pytest.mark.parametrize("alpha", [0.0, 0.3, 1.0])
def test_mixed_dims_stay_within_the_parameter_budget(popularity, budget, dim, alpha) -> None:
    lay = mixed_layout(popularity, budget, dim, alpha)
    assert lay.params <= budget * dim
    assert len(lay.widths) >= 2 and lay.widths[0] == dim and all(1 <= w <= dim for w in lay.widths)
    if dim >= 4:  # fbgemm's fused kernel (big tables) takes only widths divisible by 4
        assert all(w % 4 == 0 for w in lay.widths), lay.widths
    assert lay.bounds[0] == 0 and all(b > a for a, b in zip(lay.bounds, lay.bounds[1:])) and lay.bounds[-1] <= len(popularity)
    if alpha == 0:
        assert set(lay.widths) == {dim}  # 0: every block full width
    if alpha > 0 and lay.bounds[-1] == len(popularity) and len(set(popularity)) > 1:
        assert list(lay.widths) == sorted(lay.widths, reverse=True)  # rarer blocks are never wider


def test_mixed_module_parameters_match_the_layout_and_the_tail_is_narrower(demo) -> None:
    cfg = with_scheme(demo, "mixed", mixed_alpha=0.5, num_embeddings=1000)
    f = next(f for f in cfg.features.sparse if f.name == "user_id")
    rows = budget_rows(f, cfg.models.teacher)
    m = fit_by_hand("user_id", "mixed", rows, traffic(np.random.default_rng(0), 20_000, pool=5000))
    assert m["table_rows"] > rows  # more ids than the budget's rows: the tail has to be narrow
    comp = make_compression(cfg, f, cfg.models.teacher, {"user_id": {rows: m}})
    params = sum(t.rows * t.dim for t in comp.tables) + sum(p.numel() for p in comp.parameters())
    assert params == comp.layout.params <= rows * comp.out_dim
    assert comp.tables[0].dim == comp.out_dim and min(t.dim for t in comp.tables[1:]) < comp.out_dim
    assert sum(t.rows for t in comp.tables) > rows  # it holds more ids apart than a full-width table could


def test_a_fitted_scheme_without_its_fit_names_the_fit_command(demo) -> None:
    for scheme in FITTED:
        with pytest.raises(FitMissingError, match=r"'user_id'.*lattice hashing fit CONFIG"):
            build_model(with_scheme(demo, scheme), "teacher", 4)
    cfg = with_scheme(demo, "vocab")
    fitted = fitted_for(cfg)
    del fitted["ad_id"][budget_rows(cfg.features.sparse[1], cfg.models.student)]  # the student's budget only
    build_model(cfg, "teacher", 4, fitted=fitted)
    with pytest.raises(FitMissingError, match=r"'ad_id'.*-row table.*lattice hashing fit CONFIG"):
        build_model(cfg, "student", 4, fitted=fitted)


def test_config_check_refuses_what_no_model_could_build(demo) -> None:
    from lattice.config.loader import every_problem

    def problems(**keys) -> list[tuple[str, object, str]]:
        sparse = [demo.features.sparse[0].model_copy(update=keys), *demo.features.sparse[1:]]
        cfg = demo.model_copy(update={"features": demo.features.model_copy(update={"sparse": sparse})})
        return [(p.path, p.value, p.message) for p in every_problem(cfg)]

    (p,) = problems(hashing="qr", qr_buckets=demo.features.sparse[0].num_embeddings)
    assert p[0] == "features.sparse[0].qr_buckets" and "qr_buckets <=" in p[2]
    (p,) = problems(hashing="qr", num_embeddings=3)
    assert p[0] == "features.sparse[0].num_embeddings"
    (p,) = problems(hashing="qr", qr_combine="concat", embedding_dim=1)
    assert p[0] == "features.sparse[0].qr_combine"
    (p,) = problems(hashing="learned", learned_frequent_share=0.7, learned_unseen_share=0.3)
    assert p[0] == "features.sparse[0].learned_unseen_share"
    for scheme in SCHEMES:
        assert problems(hashing=scheme) == []


# ---------------------------------------------------------------- zch


def test_zch_trains_and_maps_the_seen_ids_to_distinct_rows() -> None:
    rows = 64
    z = ZCHRemap("x", rows, eviction_interval=2).train()
    rng = np.random.default_rng(0)
    hot = torch.arange(40) * 1_000_003 - 2**40  # 40 ids seen every step (negative ones too)
    for _ in range(6):
        z(torch.cat([hot, torch.from_numpy(rng.integers(0, 2**62, 10))]))
    z.eval()
    got = z(hot)
    assert torch.unique(got).numel() == len(hot) and int(got.max()) < rows - 1  # a row each, not the miss row
    unseen = torch.tensor([7, 2**62 + 1, -5])
    assert z(unseen).tolist() == [rows - 1] * 3
    frozen = z.frozen()
    probe = torch.cat([hot, unseen, torch.tensor(HUGE)])
    assert torch.equal(frozen(probe), z(probe))  # the artifact's lookup is the eval-mode lookup


ZCH_WORKER = r'''
import json, os, sys
import numpy as np, torch
sys.path.insert(0, sys.argv[2])
from test_hashing_modules import fitted_for, kjt_for, with_scheme
from lattice.config import load_config
from lattice.models import build_model
from lattice.training import distributed as D
from lattice.training.tiny import tiny
from torchrec import EmbeddingBagCollection
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.optimizers import in_backward_optimizer_filter

rank, world, _ = D.init_process_group()
cfg = tiny(load_config(os.path.join(sys.argv[2], "..", "..", "configs", "demo.yaml")))
cfg = with_scheme(cfg, "zch", zch_eviction_interval=2)
sparse = list(cfg.features.sparse)
sparse[4] = sparse[4].model_copy(update={"hashing": "qr"})
sparse[6] = sparse[6].model_copy(update={"hashing": "mixed"})
cfg = cfg.model_copy(update={"features": cfg.features.model_copy(update={"sparse": sparse})})
torch.manual_seed(0)
model = build_model(cfg, "teacher", 4, fitted=fitted_for(cfg))
tables = [p for m in model.modules() if isinstance(m, EmbeddingBagCollection) for p in m.parameters()]
apply_optimizer_in_backward(torch.optim.Adagrad, tables, {"lr": 0.05})
dmp = D.wrap(model, D.make_plan(model, world, D.sharding_types(["table_wise", "column_wise", "data_parallel"])))
opt = torch.optim.Adam([p for _, p in in_backward_optimizer_filter(dmp.named_parameters())], lr=0.01)
rng = np.random.default_rng(rank + 1)  # each rank its own ids: the maps must agree all the same
losses = []
for step in range(6):
    kjt = kjt_for(cfg, rng, 32, max_len=1)
    out = dmp(torch.randn(32, 4), kjt, torch.arange(32) % 3)
    loss = sum(torch.nn.functional.binary_cross_entropy_with_logits(v, torch.zeros_like(v)) for v in out.values())
    opt.zero_grad(); loss.backward(); opt.step(); losses.append(loss.item())
state = {n: b.tolist() for n, b in dmp.named_buffers() if "_mch_sorted_raw_ids" in n or "_mch_remapped_ids_mapping" in n}
json.dump({"losses": losses, "state": state}, open(os.path.join(sys.argv[1], f"rank{rank}.json"), "w"))
'''


@pytest.mark.slow
def test_zch_map_stays_one_map_under_two_dmp_ranks(tmp_path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(ZCH_WORKER)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script),
           str(tmp_path), str(Path(__file__).resolve().parent)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["state"] and r0["state"] == r1["state"]  # both ranks profiled the global batch
    ids = [v for k, v in r0["state"].items() if k.endswith("_mch_sorted_raw_ids")][0]
    assert sum(1 for i in ids if i != 2**63 - 1) > 0  # the map took ids in
    assert all(np.isfinite(r0["losses"]))


# ---------------------------------------------------------------- inside LatticeNet, and the artifact


def _train(model: torch.nn.Module, cfg: PlatformConfig, steps: int, seed: int = 0) -> list[float]:
    """A learnable task: click iff the user's raw id is even; Adam on everything."""
    rng = np.random.default_rng(seed)
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    losses = []
    model.train()
    for _ in range(steps):
        kjt = kjt_for(cfg, rng, 128, max_len=1)
        uid = kjt.to_dict()["user_id"]
        y = torch.zeros(128)
        y[torch.repeat_interleave(torch.arange(128), uid.lengths().long())] = (uid.values() % 2 == 0).float()
        out = model(torch.zeros(128, 4), kjt, torch.arange(128) % 3)
        loss = sum(torch.nn.functional.binary_cross_entropy_with_logits(v, y) for v in out.values())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("scheme", SCHEMES)
def test_each_scheme_trains_in_lattice_net_and_the_artifact_equals_eager(demo, scheme, tmp_path) -> None:
    import torchrec.fx

    from lattice.export.serving_module import _swap, script

    cfg = with_scheme(demo, scheme, zch_eviction_interval=3)
    fitted = fitted_for(cfg)
    torch.manual_seed(0)
    model = build_model(cfg, "teacher", 4, fitted=fitted)
    losses = _train(model, cfg, 20)
    assert all(np.isfinite(losses)) and np.mean(losses[-5:]) < np.mean(losses[:5]), losses
    model.eval()
    rng = np.random.default_rng(7)
    kjt = kjt_for(cfg, rng, 24, extra=HUGE)  # multi-id bags, empty bags and the extreme ids
    dense, domain = torch.randn(24, 4), torch.arange(24) % 3
    with torch.no_grad():
        eager = {k: torch.sigmoid(v) for k, v in model(dense, kjt, domain).items()}
    path = tmp_path / "model.pt"
    script(model).save(str(path))
    artifact = torch.jit.load(str(path))  # a fresh load: the lookup buffers travel in the file
    got = artifact(dense, kjt, domain)
    for o in eager:
        torch.testing.assert_close(got[o], eager[o], rtol=0, atol=1e-7)
    # the rows the artifact looks up are the eager rows
    frozen = copy.deepcopy(model.sparse.compress).eval()
    holder = torch.nn.Module()
    holder.compress = frozen
    _swap(holder)
    traced = torch.jit.script(torchrec.fx.symbolic_trace(holder.compress))
    want, have = model.sparse.compress(kjt), traced(kjt)
    assert have.keys() == want.keys()
    assert torch.equal(have.values(), want.values()) and torch.equal(have.lengths(), want.lengths())


@pytest.mark.parametrize("scheme", ["vocab", "mixed", "zch", "qr"])
def test_a_saved_model_rebuilds_from_its_blob_alone(demo, scheme) -> None:
    cfg = with_scheme(demo, scheme, zch_eviction_interval=2)
    fitted = fitted_for(cfg)
    torch.manual_seed(0)
    model = build_model(cfg, "teacher", 4, fitted=fitted)
    _train(model, cfg, 4)
    model.eval()
    # the blob as the trainer writes it, the maps' budgets and arrays through a JSON-like round trip
    plain = {f: {str(b): {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in m.items()} for b, m in per.items()}
             for f, per in fitted.items()}
    blob = {"config": cfg.model_dump(mode="json"), "kind": "teacher", "n_dense": 4, "hashing": plain, "fp8": None,
            "state_dict": model.state_dict()}
    again = rebuild(blob)
    kjt = kjt_for(cfg, np.random.default_rng(3), 16, extra=HUGE)
    with torch.no_grad():
        a, b = model(torch.zeros(16, 4), kjt, torch.arange(16) % 3), again(torch.zeros(16, 4), kjt, torch.arange(16) % 3)
    assert all(torch.equal(a[o], b[o]) for o in a)  # rebuilt from its blob: the same modules, weights and ops


def test_cost_reports_real_parameters_and_the_lookup_buffers(demo) -> None:
    base = model_cost(build_model(demo, "teacher", 4), demo, 4)
    assert base["lookup_bytes"] == 0
    concat = with_scheme(demo, "qr", qr_combine="concat")
    c = model_cost(build_model(concat, "teacher", 4), concat, 4)
    half = sum(budget_rows(f, concat.models.teacher) * min(f.embedding_dim, 8) // 2
               for f in concat.features.sparse if f.name in COMPRESSED)
    assert base["embedding_params"] - c["embedding_params"] == half  # two half-width tables over the same rows
    assert embedding_bytes(demo) - embedding_bytes(concat) == 4 * sum(f.num_embeddings * (f.embedding_dim // 2)
                                                                      for f in demo.features.sparse if f.name in COMPRESSED)
    vocab = with_scheme(demo, "vocab")
    fitted = fitted_for(vocab)
    v = model_cost(build_model(vocab, "teacher", 4, fitted=fitted), vocab, 4)
    n_ids = sum(len(fitted[f][budget_rows(next(s for s in vocab.features.sparse if s.name == f), vocab.models.teacher)]["ids"])
                for f in COMPRESSED)
    assert v["lookup_bytes"] == 12 * n_ids  # sorted int64 ids + their int32 rows
    assert v["embedding_params"] < base["embedding_params"]  # vocab tables hold the fitted ids only
    mixed = with_scheme(demo, "mixed")
    m = model_cost(build_model(mixed, "teacher", 4, fitted=fitted_for(mixed)), mixed, 4)
    assert m["embedding_params"] <= base["embedding_params"]  # blocks and their projections within the budget
    z = model_cost(build_model(with_scheme(demo, "zch"), "teacher", 4), with_scheme(demo, "zch"), 4)
    zch_rows = sum(budget_rows(f, demo.models.teacher) for f in demo.features.sparse if f.name in COMPRESSED)
    assert z["lookup_bytes"] >= 16 * zch_rows  # the managed-collision ids and their rows, at least


def test_an_int8_artifact_takes_every_compressed_table(demo) -> None:
    """INT8 row-wise export packs rows into 2-byte words: mixed blocks and QR halves stay even."""
    from lattice.export.serving_module import script

    schemes = {"user_id": "mixed", "ad_id": "qr", "device": "zch", "query_category": "vocab", "position": "learned"}
    sparse = [f.model_copy(update={"hashing": schemes[f.name], "qr_combine": "concat", "mixed_alpha": 0.8, "embedding_dim": 6})
              if f.name in schemes else f for f in demo.features.sparse]
    cfg = demo.model_copy(update={"features": demo.features.model_copy(update={"sparse": sparse})})
    torch.manual_seed(0)
    model = build_model(cfg, "teacher", 4, fitted=fitted_for(cfg)).eval()
    widths = {c.name: c.embedding_dim for c in model.sparse.ebc.embedding_bag_configs()}
    assert widths["t_ad_id__q"] == 4 and widths["t_ad_id__r"] == 2
    assert all(w % 2 == 0 for w in widths.values()) and any(w < 6 for n, w in widths.items() if n.startswith("t_user_id__b"))
    kjt = kjt_for(cfg, np.random.default_rng(5), 16, extra=HUGE)
    dense, domain = torch.randn(16, 4), torch.arange(16) % 3
    with torch.no_grad():
        eager = {k: torch.sigmoid(v) for k, v in model(dense, kjt, domain).items()}
    got = script(model, int8=True)(dense, kjt, domain)
    for o in eager:
        torch.testing.assert_close(got[o], eager[o], rtol=0, atol=5e-3)


@pytest.mark.parametrize("scheme,keys", [("mixed", {}), ("qr", {"qr_combine": "concat"})])
def test_compressed_tables_take_fbgemms_fused_kernel(demo, scheme, keys) -> None:
    """The planner gives big tables fbgemm's fused kernel, which takes only widths divisible by 4
    (a 6-wide mixed tail failed at 1M rows; tiny tables here would get the data-parallel kernel, so
    the plan is forced). The width rule itself is checked over many layouts above."""
    import torch.distributed as dist
    from torchrec import EmbeddingBagCollection
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology

    from lattice.training import distributed as D

    cfg = with_scheme(demo, scheme, **keys)
    cfg = cfg.model_copy(update={"models": cfg.models.model_copy(update={
        "teacher": cfg.models.teacher.model_copy(update={"embedding_dim": 16})})})  # 16-wide tables, narrower tails
    torch.manual_seed(0)
    model = build_model(cfg, "teacher", 4, fitted=fitted_for(cfg))
    configs = [c for m in model.modules() if isinstance(m, EmbeddingBagCollection) for c in m.embedding_bag_configs()]
    compressed = [c for c in configs if c.name.split("__")[0] in {f"t_{n}" for n in COMPRESSED}]
    if scheme == "mixed":
        assert len({c.embedding_dim for c in compressed}) > 1  # the layout did narrow the tails
    assert all(c.embedding_dim % 4 == 0 for c in compressed), [(c.name, c.embedding_dim) for c in compressed]
    D.init_process_group()
    fused = {c.name: ParameterConstraints(sharding_types=["table_wise"], compute_kernels=["fused"]) for c in configs}
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=1, compute_device="cpu"), constraints=fused)
    dmp = D.wrap(model, planner.collective_plan(model, [EmbeddingBagCollectionSharder()], dist.GroupMember.WORLD))
    out = dmp(torch.randn(8, 4), kjt_for(cfg, np.random.default_rng(0), 8), torch.arange(8) % 3)
    assert all(torch.isfinite(v).all() for v in out.values())


@pytest.mark.parametrize("scheme", ["modulo", "none", "qr"])
def test_the_artifact_fuses_modulo_tables_into_one_lookup(demo, scheme) -> None:
    """`modulo` / `none` models serve their tables as one stacked lookup with the narrow tables'
    projections folded in (FusedSparse): the same probabilities as eager, at batch 1 and with
    empty bags and extreme ids; any other scheme keeps the general path."""
    from lattice.export.serving_module import FusedSparse, script, serving_module

    cfg = with_scheme(demo, scheme)
    torch.manual_seed(0)
    model = build_model(cfg, "teacher", 4)
    _train(model, cfg, 5)
    model.eval()
    fused = [m for m in serving_module(model).modules() if isinstance(m, FusedSparse)]
    assert len(fused) == (1 if scheme != "qr" else 0)
    assert model.sparse.proj  # the tiny teacher has narrow tables whose projections get folded
    artifact = script(model)
    for batch in (1, 24):
        kjt = kjt_for(cfg, np.random.default_rng(batch), batch, extra=HUGE)
        dense, domain = torch.randn(batch, 4), torch.arange(batch) % 3
        with torch.no_grad():
            eager = {k: torch.sigmoid(v) for k, v in model(dense, kjt, domain).items()}
        got = artifact(dense, kjt, domain)
        for o in eager:
            torch.testing.assert_close(got[o], eager[o], rtol=0, atol=1e-6)


def test_int8_artifact_stores_smaller_tables(demo, tmp_path) -> None:
    """INT8 row-wise tables (promotion.int8_embeddings) keep the per-table path and store a
    smaller artifact than the FP32 one with its fused lookup, once tables are wide enough for
    a row's scale and bias to pay (here 32 wide)."""
    import zipfile

    from lattice.config.schema import ModelSize
    from lattice.export.serving_module import script

    cfg = demo.model_copy(update={"models": demo.models.model_copy(update={"teacher": ModelSize(embedding_dim=32, num_layers=1)})})
    sparse = [f.model_copy(update={"embedding_dim": 32}) for f in cfg.features.sparse]
    cfg = cfg.model_copy(update={"features": cfg.features.model_copy(update={"sparse": sparse})})
    model = build_model(cfg, "teacher", 4).eval()

    def data_bytes(int8: bool) -> int:
        path = tmp_path / f"int8_{int8}.pt"
        script(model, int8=int8).save(str(path))
        return sum(i.file_size for i in zipfile.ZipFile(path).infolist() if "/data/" in i.filename)

    tables = sum(budget_rows(f, cfg.models.teacher) * 32 * 4 for f in cfg.features.sparse)
    fp32, int8 = data_bytes(False), data_bytes(True)
    assert fp32 - int8 > 0.5 * tables, (fp32, int8, tables)  # FP32 rows of 128 bytes against 32 + scale/bias
