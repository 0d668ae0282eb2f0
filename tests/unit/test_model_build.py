"""Every model kind builds from config and answers per objective; the student's cost budget;
the KJT remap in front of the tables."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from lattice.config import load_config
from lattice.data.batch import kjt_from_ids
from lattice.models import MODEL_KINDS, build_model
from lattice.models.cost import model_cost
from lattice.models.remap import make_remap, table_capacity_notes
from lattice.models.sparse import table_shape
from lattice.training.tiny import tiny

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def demo():
    return load_config(ROOT / "configs" / "demo.yaml")


@pytest.mark.parametrize("kind", MODEL_KINDS)
def test_every_kind_returns_logits_per_objective(demo, kind) -> None:
    cfg = tiny(demo)
    torch.manual_seed(0)
    model = build_model(cfg, kind, 4)
    names = [f.name for f in cfg.features.sparse]
    kjt = kjt_from_ids(names, [np.arange(6) * 7 for _ in names], [np.array([1, 1, 0, 1, 0, 1], bool) for _ in names])
    out = model(torch.randn(6, 4), kjt, torch.tensor([0, 1, 2, 0, 1, 2]))
    assert set(out) == set(cfg.objective_names)
    assert all(v.shape == (6,) and torch.isfinite(v).all() for v in out.values())


def test_student_costs_at_most_a_fifth_of_the_teacher(demo) -> None:
    t = model_cost(build_model(demo, "teacher", 6), demo, 6)
    s = model_cost(build_model(demo, "student", 6), demo, 6)
    assert s["params"] * 5 <= t["params"]
    assert s["flops_per_example"] * 5 <= t["flops_per_example"]


def test_table_shapes_follow_model_size(demo) -> None:
    shapes = {n: (r, d) for n, r, d in table_shape(demo, demo.models.student)}
    assert shapes["user_id"] == (160_000, 4)  # 200000 rows x table_scale 0.8, width min(16, 4)
    assert shapes["device"] == (13, 4)  # 16 x 0.8, rounded


def test_remap_keeps_ids_in_table_and_rejects_bad_unhashed_ids(demo) -> None:
    seg = next(f for f in demo.features.sparse if f.name == "user_segment")  # hashing: none
    ids = torch.tensor([0, 5, 63])
    assert torch.equal(make_remap(demo, seg, 64)(ids), ids)
    with pytest.raises(ValueError, match="user_segment.*hashing 'none'"):
        make_remap(demo, seg, 64)(torch.tensor([64]))
    uid = next(f for f in demo.features.sparse if f.name == "user_id")
    out = make_remap(demo, uid, 1000)(torch.tensor([5, 1005, 2**60 + 3]))
    assert out.tolist() == [5, 5, (2**60 + 3) % 1000]
    with pytest.raises(ValueError, match="hashing 'qr'.*not registered"):
        make_remap(demo, uid.model_copy(update={"hashing": "qr"}), 1000)


def test_capacity_notes_name_modulo_tables_smaller_than_their_id_count(demo) -> None:
    rows = {f.name: f.num_embeddings for f in demo.features.sparse}
    fits = {k: v // 100 for k, v in rows.items()}  # a hundredth of the rows: few expected collisions
    assert table_capacity_notes(demo, fits) == [] and table_capacity_notes(demo, None) == []
    over = {**fits, "user_id": 3 * rows["user_id"], "user_segment": 10 * rows["user_segment"]}
    (note,) = table_capacity_notes(demo, over)  # user_segment has hashing 'none': it fails on use instead
    assert "'user_id'" in note and f"{3 * rows['user_id']:,} distinct ids" in note and "3.0 per row" in note
    assert f"--set features.sparse.user_id.num_embeddings={3 * rows['user_id']}" in note


def test_capacity_notes_use_exact_merges_when_the_ids_are_known(demo) -> None:
    rows = {f.name: f.num_embeddings for f in demo.features.sparse}
    n = rows["ad_id"] // 2  # n(n-1)/2R estimates thousands of colliding pairs at half the rows
    assert any("'ad_id'" in x for x in table_capacity_notes(demo, {"ad_id": n}))
    # ids 0..n-1 below the row count: id mod rows merges none of them, and the exact count says so
    assert table_capacity_notes(demo, {"ad_id": n}, {"ad_id": 0}) == []
    (note,) = table_capacity_notes(demo, {"ad_id": n}, {"ad_id": n // 10})
    assert f"{n // 10:,} of its {n:,} distinct" in note and "hashing: vocab" in note


def test_chained_logit_is_the_product_of_probabilities_and_stays_finite() -> None:
    from lattice.models.chain import chained_logit

    a = torch.tensor([-30.0, -5.0, 0.0, 2.0, 8.0, 40.0], dtype=torch.float64, requires_grad=True)
    b = torch.tensor([-25.0, 1.0, -3.0, 0.5, 9.0, 40.0], dtype=torch.float64, requires_grad=True)
    got = chained_logit(a, b)
    want = torch.logit(torch.sigmoid(a) * torch.sigmoid(b))
    torch.testing.assert_close(got[:-1], want[:-1], rtol=1e-6, atol=1e-9)
    assert torch.isfinite(got).all()  # p = 1 in float64 at the end: clamped, not inf
    got.sum().backward()
    assert torch.isfinite(a.grad).all() and torch.isfinite(b.grad).all()


@pytest.mark.parametrize("kind", ["teacher", "student", "mmoe"])
def test_a_chained_objective_never_exceeds_the_objective_it_follows(demo, kind) -> None:
    cfg = tiny(demo)
    objectives = [o.model_copy(update={"given": "click"}) if o.name == "conversion" else o for o in cfg.objectives]
    cfg = cfg.model_copy(update={"objectives": objectives})
    torch.manual_seed(0)
    model = build_model(cfg, kind, 4)
    names = [f.name for f in cfg.features.sparse]
    kjt = kjt_from_ids(names, [np.arange(64) % 16 for _ in names], [np.ones(64, bool) for _ in names])
    out = model(torch.randn(64, 4) * 3, kjt, torch.arange(64) % 3)
    assert torch.all(torch.sigmoid(out["conversion"]) <= torch.sigmoid(out["click"]) * (1 + 1e-6))


@pytest.mark.parametrize("shared_dims, experts", [([], 1), ([16], 1), ([16, 8], 3)])
def test_heads_read_tokens_a_shared_stack_or_gated_experts(demo, shared_dims, experts) -> None:
    cfg = tiny(demo)
    size = cfg.models.teacher.model_copy(update={"shared_dims": shared_dims, "experts": experts})
    cfg = cfg.model_copy(update={"models": cfg.models.model_copy(update={"teacher": size})})
    torch.manual_seed(0)
    model = build_model(cfg, "teacher", 4)
    assert len(model.experts) == (experts if shared_dims else 1) and (model.gates is None) == (experts == 1 or not shared_dims)
    names = [f.name for f in cfg.features.sparse]
    kjt = kjt_from_ids(names, [np.arange(8) for _ in names], [np.ones(8, bool) for _ in names])
    out = model(torch.randn(8, 4), kjt, torch.arange(8) % 3)
    assert set(out) == set(cfg.objective_names) and all(v.shape == (8,) and torch.isfinite(v).all() for v in out.values())
    sum(v.sum() for v in out.values()).backward()
    assert all(p.grad is not None for p in model.experts.parameters())


@pytest.mark.parametrize("n_domains", [2, 6])  # all domains at once, and per-example weights
def test_domain_fm_weights_each_token_pair_by_its_domain(n_domains) -> None:
    from lattice.models.interaction import DomainFM

    torch.manual_seed(0)
    fm = DomainFM(n_tokens=3, dim=4, n_domains=n_domains, channels=2)
    assert fm.per_example == (n_domains > 4)
    x, domain = torch.randn(5, 3, 4), torch.tensor([0, 1, 1, 0, n_domains - 1])
    got = fm(x, domain).view(5, 3, 2)  # (B, pairs (0,1), (0,2), (1,2), C)
    for b in range(5):
        for c in range(2):
            s = fm.scale[domain[b], c]
            want = [float((x[b, i] * s * x[b, j]).sum()) for i, j in [(0, 1), (0, 2), (1, 2)]]
            assert torch.allclose(got[b, :, c], torch.tensor(want), atol=1e-5)
    # the same tokens in another domain interact differently
    assert not torch.allclose(fm(x, torch.zeros(5, dtype=torch.long)), fm(x, torch.ones(5, dtype=torch.long)))


def test_a_model_saved_before_dense_tokens_existed_rebuilds_with_two(demo) -> None:
    from lattice.models.saved import rebuild

    cfg = tiny(demo)
    two = cfg.model_copy(update={"models": cfg.models.model_copy(update={
        "teacher": cfg.models.teacher.model_copy(update={"dense_tokens": 2})})})
    assert cfg.models.teacher.dense_tokens == 4  # today's default
    torch.manual_seed(0)
    model = build_model(two, "teacher", 4).eval()
    dump = two.model_dump(mode="json")
    for size in (dump["models"]["teacher"], dump["models"]["student"], dump["models"]["baselines"]["size"]):
        del size["dense_tokens"]  # what a blob written before the key existed holds
    again = rebuild({"config": dump, "kind": "teacher", "n_dense": 4, "state_dict": model.state_dict()}, calibrated=False)
    assert again.dense.tokens == 2
    names = [f.name for f in cfg.features.sparse]
    kjt = kjt_from_ids(names, [np.arange(8) % 5 for _ in names], [np.ones(8, bool) for _ in names])
    inputs = (torch.randn(8, 4), kjt, torch.arange(8) % len(cfg.domain_names))
    with torch.no_grad():
        # rebuilt from its blob: the same modules and weights on the same inputs run the same ops
        assert all(torch.equal(a, b) for a, b in zip(model(*inputs).values(), again(*inputs).values()))


def test_domain_untied_runs_each_copy_on_its_own_rows_only() -> None:
    from lattice.models.interaction import DomainUntied, WukongLayer

    torch.manual_seed(0)
    untied = DomainUntied(lambda: WukongLayer(5, 4, 8, 3), n_domains=3)
    seen = {d: [] for d in range(3)}
    for d, layer in enumerate(untied.layers):
        layer.register_forward_pre_hook(lambda _m, args, d=d: seen[d].append(args[0].shape[0]))
    x, domain = torch.randn(7, 5, 8, requires_grad=True), torch.tensor([1, 0, 1, 1, 0, 1, 0])  # domain 2 absent
    got = untied(x, domain)
    # what every copy would give on the whole batch, each row keeping its own domain's
    want = torch.stack([layer(x) for layer in untied.layers])[domain, torch.arange(7)]
    assert torch.allclose(got, want, atol=1e-6)
    assert seen == {0: [3, 7], 1: [4, 7], 2: [7]}  # the first call saw 3 and 4 rows; copy 2 was skipped
    untied.zero_grad()
    got.sum().backward()
    assert all(p.grad is None for p in untied.layers[2].parameters())  # an absent domain's copy is untouched
    assert all(p.grad is not None for p in untied.layers[0].parameters())


def test_teacher_with_domain_fm_trains_every_domain_weight(demo) -> None:
    cfg = tiny(demo)
    size = cfg.models.teacher.model_copy(update={"domain_fm": 2})
    cfg = cfg.model_copy(update={"models": cfg.models.model_copy(update={"teacher": size})})
    torch.manual_seed(0)
    model = build_model(cfg, "teacher", 4)
    names = [f.name for f in cfg.features.sparse]
    kjt = kjt_from_ids(names, [np.arange(12) for _ in names], [np.ones(12, bool) for _ in names])
    out = model(torch.randn(12, 4), kjt, torch.arange(12) % 3)
    sum(v.sum() for v in out.values()).backward()
    assert model.domain_fm.scale.grad is not None and (model.domain_fm.scale.grad.abs().sum(dim=(1, 2)) > 0).all()
