"""Leaf features (issue 38): `lattice trees fit` fits on the train split alone (validation rows only
stop it early, test rows never reach it) and its saved boosters give LightGBM's own leaf ids."""

from __future__ import annotations

import json
from pathlib import Path

import lightgbm as lgb
import numpy as np
import pytest

from lattice.config import ConfigError, PlatformConfig, load_config, parse_config
from lattice.data.local_table import write_local_table
from lattice.data.synth import generate
from lattice.data.transforms import DenseStats
from lattice.models.gbdt import TreeFeatures
from lattice.paths import Paths
from lattice.training.gbdt_stage import read_rows
from lattice.training.tiny import tiny
from lattice.trees.fit import fit_trees, leaf_ids

ROOT = Path(__file__).resolve().parents[2]


def _config(data_root: Path) -> PlatformConfig:
    cfg = tiny(load_config(ROOT / "configs" / "demo.yaml"), data_root=str(data_root))
    m = cfg.models
    trees = m.baselines.trees.model_copy(update={"num_threads": 1, "max_categories": 30})
    return cfg.model_copy(update={"models": m.model_copy(update={
        "baselines": m.baselines.model_copy(update={"trees": trees}),
        "leaves": m.leaves.model_copy(update={"num_trees": 12, "num_leaves": 7, "fit_share": 1.0})})})


def _fit_recording(cfg: PlatformConfig, paths: Paths) -> tuple[dict, list[tuple[int, int]]]:
    """`fit_trees` with `lgb.train` instrumented: the manifest, and the rows each fit and its early
    stop read, (train rows, validation rows) per booster."""
    seen: list[tuple[int, int]] = []
    real = lgb.train

    def recording(params, train_set, *args, **kwargs):
        booster = real(params, train_set, *args, **kwargs)
        valid = kwargs.get("valid_sets") or []
        seen.append((train_set.num_data(), valid[0].num_data() if valid else 0))
        return booster

    lgb.train = recording
    try:
        return fit_trees(cfg, paths), seen
    finally:
        lgb.train = real


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    base = tmp_path_factory.mktemp("trees")
    cfg = _config(base / "raw")
    generate(cfg, 4_000, base / "raw", progress=False)
    paths = Paths.for_config(cfg, base / "work")
    write_local_table(cfg, paths, row_group_size=700)
    return (cfg, paths, *_fit_recording(cfg, paths))


def test_the_fit_reads_labelled_train_rows_and_validation_only_for_early_stopping(fitted) -> None:
    cfg, paths, manifest, seen = fitted
    stats = DenseStats.load(paths.trees / "dense_stats.json")
    from lattice.data.loader import find_table
    arrs, split = read_rows(cfg, find_table(paths), stats)
    expected = []
    for o in cfg.objective_names:
        lab = arrs[f"mask:{o}"] > 0
        expected.append((int(((split == "train") & lab).sum()), int(((split == "validation") & lab).sum())))
    assert seen == expected
    assert manifest["version"] == 1
    assert json.loads((paths.trees / "manifest.json").read_text())["fit_rows"] == int((split == "train").sum())


def test_leaf_ids_are_lightgbms_own_pred_leaf(fitted) -> None:
    cfg, paths, manifest, _ = fitted
    from lattice.data.loader import find_table
    stats = DenseStats.load(paths.trees / "dense_stats.json")
    arrs, split = read_rows(cfg, find_table(paths), stats)
    features = TreeFeatures.fit(cfg, [c.column for c in stats.columns], arrs, split == "train",
                                cfg.models.baselines.trees.max_categories, with_domain=True)
    x = features.matrix(arrs)
    ids = leaf_ids(paths, x)
    assert set(ids) == {o for o, b in manifest["boosters"].items() if b["best_round"] > 0}
    for o, got in ids.items():
        booster = lgb.Booster(model_file=str(paths.trees / "boosters" / f"{o}.txt"))
        assert got.shape == (len(x), booster.num_trees())
        assert got.max() < cfg.models.leaves.num_leaves
        np.testing.assert_array_equal(got, booster.predict(x, pred_leaf=True))


def _leaves_on(cfg: PlatformConfig, models: list[str], margin: bool = False) -> PlatformConfig:
    m = cfg.models
    leaves = m.leaves.model_copy(update={"models": models, "margin": models if margin else []})
    return cfg.model_copy(update={"models": m.model_copy(update={"leaves": leaves})})


def _reference_leaves(cfg: PlatformConfig, paths: Paths) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """LightGBM's own pred_leaf on every row, by example id, built the way the fit built its matrix."""
    from lattice.data.loader import find_table
    stats = DenseStats.load(paths.trees / "dense_stats.json")
    arrs, split = read_rows(cfg, find_table(paths), stats)
    features = TreeFeatures.fit(cfg, [c.column for c in stats.columns], arrs, split == "train",
                                cfg.models.baselines.trees.max_categories, with_domain=True)
    x = features.matrix(arrs)
    ref = {p.stem: lgb.Booster(model_file=str(p)).predict(x, pred_leaf=True)
           for p in sorted((paths.trees / "boosters").glob("*.txt"))}
    return ref, {e: i for i, e in enumerate(arrs["example_id"])}


def test_the_training_loader_feeds_lightgbms_own_pred_leaf(fitted) -> None:
    from lattice.data.loader import BatchLoader, find_table, fit_dense_stats
    from lattice.trees.leaves import LeafForest, leaf_key

    cfg, paths, manifest, _ = fitted
    ref, row = _reference_leaves(cfg, paths)
    forest = LeafForest.load(paths.trees)
    table = find_table(paths)
    num_leaves = cfg.models.leaves.num_leaves
    seen = 0
    for split in ("train", "test"):
        for batch in BatchLoader(cfg, table, fit_dense_stats(cfg, table), split, batch_size=300, num_workers=0, leaves=forest):
            kjt = batch.sparse.to_dict()
            assert list(batch.sparse.keys())[-len(ref):] == [leaf_key(o) for o in sorted(ref)]
            idx = np.array([row[e] for e in batch.example_ids])
            for o, want in ref.items():
                trees = want.shape[1]
                ids = kjt[leaf_key(o)].values().numpy().reshape(len(batch), trees)  # one id per tree, every row
                offset = np.arange(trees) * num_leaves
                np.testing.assert_array_equal(ids - offset, want[idx])
            seen += len(batch)
    assert seen > 1000


def test_leaves_on_without_a_fit_is_refused_naming_the_command(tmp_path) -> None:
    from lattice.training.stages import train
    from lattice.trees.leaves import NoTreeFit

    cfg = _leaves_on(_config(tmp_path / "raw"), ["teacher"])
    generate(cfg, 800, tmp_path / "raw", progress=False)
    paths = Paths.for_config(cfg, tmp_path / "work")
    write_local_table(cfg, paths)
    with pytest.raises(NoTreeFit, match="lattice trees fit"):
        train(cfg, paths, model="teacher", nproc=1, epochs=1, progress=False)
    assert not paths.model_dir("teacher").exists()


def test_a_teacher_with_leaves_trains_carries_its_fit_and_scores_with_it(fitted, tmp_path) -> None:
    from lattice.data.loader import batch_from_frame
    from lattice.models.leaves import LeafArch
    from lattice.models.saved import load_saved
    from lattice.training.stages import train
    from lattice.trees.leaves import LeafForest

    cfg, paths, manifest, _ = fitted
    cfg = _leaves_on(cfg, ["teacher"])
    train(cfg, paths, model="teacher", nproc=1, epochs=1, progress=False)
    saved = load_saved(paths.model_dir("teacher"))
    forest = LeafForest.load(paths.trees)
    assert saved.model.leaf_forest.fit["sha256"] == forest.fit["sha256"]
    assert json.loads((paths.model_dir("teacher") / "metrics.json").read_text())["leaves"]["sha256"] == forest.fit["sha256"]
    from lattice.training.lineage import tags
    assert saved.blob["lineage"]["trees"]["sha256"] == forest.fit["sha256"]
    assert forest.fit["sha256"] in tags(saved.blob["lineage"])["lattice.lineage.trees"]
    arch = [m for m in saved.model.modules() if isinstance(m, LeafArch)]
    assert len(arch) == 1 and arch[0].num_tokens == len(forest.boosters)
    # the table is sized from the fit: trees kept by early stopping times leaves per tree
    for cfg_t in arch[0].ebc.embedding_bag_configs():
        o = cfg_t.feature_names[0].removeprefix("leaves_")
        assert cfg_t.num_embeddings == forest.fit["trees"][o] * cfg.models.leaves.num_leaves
    from lattice.data.loader import find_table
    import pandas as pd
    frame = pd.read_parquet(find_table(paths)).head(64)
    with_leaves = batch_from_frame(saved.config, saved.stats, frame, leaves=saved.model.leaf_forest)
    out = saved.model(*with_leaves.inputs())
    assert set(out) == set(cfg.objective_names)
    with pytest.raises(ValueError, match="leaf ids"):  # a batch built without them is refused, never scored blind
        saved.model(*batch_from_frame(saved.config, saved.stats, frame).inputs())


@pytest.mark.parametrize("margin", [False, True, "only"])
def test_the_exported_artifact_scores_a_raw_request_as_training_code_does(fitted, margin) -> None:
    """LightGBM in the predictor, beside the TorchScript module: raw rows in, the same leaf ids and
    the same probabilities as the training-time model on the training-time batch. `only`: the
    student reads the leaf ids for its margin alone (models.leaves.tokens without it)."""
    import pandas as pd
    import pyarrow as pa
    import torch

    from lattice.data.loader import batch_from_frame, find_table
    from lattice.export.predictor import Predictor
    from lattice.export.stages import export_model
    from lattice.models.saved import load_saved
    from lattice.training.stages import train
    from lattice.trees.leaves import TREES_FILE

    cfg, paths, manifest, _ = fitted
    cfg = _leaves_on(cfg, ["student"], margin=bool(margin))
    if margin == "only":
        cfg = cfg.model_copy(update={"models": cfg.models.model_copy(update={
            "leaves": cfg.models.leaves.model_copy(update={"tokens": ["teacher"]})})})
    train(cfg, paths, model="student", nproc=1, epochs=1, progress=False)
    summary = export_model(cfg, paths, "student")
    art = Path(summary["artifact"])
    assert (art / TREES_FILE).exists()
    meta = json.loads((art / "metadata.json").read_text())
    saved = load_saved(paths.model_dir("student"))
    assert meta["leaves"]["sha256"] == saved.model.leaf_forest.fit["sha256"]
    # tokens: a leaf table and one more token per forest; margin only: neither, the margin still read
    net = getattr(saved.model, "net", saved.model)  # inside the calibration wrapper
    assert (net.leaves is None) == (margin == "only") and (net.margin is not None) == bool(margin)
    predictor = Predictor.load(art)
    raw = pd.read_parquet(find_table(paths))
    raw = raw[raw["split"] == "test"].head(200).reset_index(drop=True)
    with torch.no_grad():
        want = {o: torch.sigmoid(v).numpy() for o, v in saved.model(*batch_from_frame(
            saved.config, saved.stats, raw, leaves=saved.model.leaf_forest).inputs()).items()}
    # the serving path: one Arrow row per request, only the request's raw columns
    request_cols = [c for c in raw.columns if not c.startswith(("label_", "mask_", "truth_", "split"))]
    for i in range(0, 200, 37):
        got = predictor.predict_table(pa.Table.from_pandas(raw.loc[[i], request_cols], preserve_index=False))
        for o in want:
            np.testing.assert_allclose(got[o], want[o][[i]], rtol=0, atol=1e-6)
    got = predictor.predict_frame(raw[request_cols])  # a batch of 200
    for o in want:
        np.testing.assert_allclose(got[o], want[o], rtol=0, atol=1e-6)
    assert summary["max_abs_diff"] <= 1e-6


def test_the_margin_is_the_boosters_raw_score_and_the_heads_start_on_it(fitted) -> None:
    """models.leaves.margin: the frozen leaf-value table summed over a row's leaf ids is LightGBM's
    own raw score; before any training the unchained objective's logit is that score plus the
    head's small initial output; a chained objective (conversion given click) takes no margin."""
    import torch

    from lattice.data.loader import BatchLoader, find_table, fit_dense_stats
    from lattice.models.build import build_model
    from lattice.models.leaves import LeafMargin, split_leaves
    from lattice.trees.leaves import LeafForest

    cfg, paths, manifest, _ = fitted
    cfg = _leaves_on(cfg, ["teacher"], margin=True)
    ref, row = _reference_leaves(cfg, paths)
    forest = LeafForest.load(paths.trees)
    table = find_table(paths)
    stats = fit_dense_stats(cfg, table)
    batch = next(iter(BatchLoader(cfg, table, stats, "test", batch_size=256, num_workers=0, leaves=forest)))
    n_dense = batch.dense.shape[1]
    model = build_model(cfg, "teacher", n_dense, leaves=forest.spec()).eval()
    model.set_output_bias({o: 0.1 for o in cfg.objective_names})
    assert set(model.margin_index) == set(forest.boosters) == {"click", "conversion"}
    # a chained objective's head is conditional on its `given`: the unconditional booster is not added
    chained = cfg.model_copy(update={"objectives": [o.model_copy(update={"given": "click"}) if o.name == "conversion" else o
                                                    for o in cfg.objectives]})
    assert set(build_model(chained, "teacher", n_dense, leaves=forest.spec()).margin_index) == {"click"}
    margins = model.margin(split_leaves(batch.sparse, model.n_sparse, model.leaf_keys)[1])  # (B, O)
    # LightGBM's raw score on the same rows, from the matrix the fit built
    stats_t = DenseStats.load(paths.trees / "dense_stats.json")
    from lattice.data.loader import find_table as ft
    arrs, split = read_rows(cfg, ft(paths), stats_t)
    features = TreeFeatures.fit(cfg, [c.column for c in stats_t.columns], arrs, split == "train",
                                cfg.models.baselines.trees.max_categories, with_domain=True)
    x = features.matrix(arrs)[[row[e] for e in batch.example_ids]]
    for i, o in enumerate(model.margin.objectives):
        want = forest.booster(o).predict(x, raw_score=True)
        np.testing.assert_allclose(margins[:, i].numpy(), want, rtol=0, atol=1e-5)
    with torch.no_grad():
        out = model(*batch.inputs())
        heads = {o: h for o, h in model.heads.items()}
    for o, i in model.margin_index.items():
        assert float(heads[o][-1].bias) == 0.0  # the margin carries the base rate
        assert float((out[o] - margins[:, i]).abs().mean()) < 0.5  # the head's residual starts small


def test_leaves_feed_the_teacher_and_the_student_only() -> None:
    import yaml
    d = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    d.setdefault("models", {})["leaves"] = {"models": ["teacher", "student"]}
    assert parse_config(d, "x.yaml").models.leaves.models == ["teacher", "student"]
    d["models"]["leaves"] = {"models": ["mmoe"]}
    with pytest.raises(ConfigError, match="leaves"):
        parse_config(d, "x.yaml")


def _random_ids(forest, n: int, rng: np.random.Generator) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per sparse feature: ids the fit saw, ids it never saw, and absent ones (a feature left out too)."""
    ids = {}
    for e in forest.sparse[:-1]:  # the last feature absent from the request altogether
        seen = e.ids[rng.integers(0, len(e.ids), n)] if len(e.ids) else np.zeros(n, np.int64)
        unseen = rng.integers(-2**62, 2**62, n)
        ids[e.name] = (np.where(rng.random(n) < 0.7, seen, unseen).astype(np.int64), rng.random(n) < 0.8)
    return ids


def test_one_request_gets_the_leaf_ids_a_batch_gets(fitted) -> None:
    """The one-row path (LeafForest._row + LightGBM's single-row predictor) against the batch path
    (TreeFeatures.matrix + Booster.predict pred_leaf), row by row: seen, unseen and absent ids of
    categorical and count encodings, the domain (a categorical split), dense values out of range."""
    from lattice.trees.leaves import LeafForest

    cfg, paths, manifest, _ = fitted
    forest = LeafForest.load(paths.trees)
    assert {e.kind for e in forest.sparse} == {"categorical", "count"}
    rng = np.random.default_rng(38)
    n = 400
    dense = {c.column: rng.normal(0, 1e3, n) * (rng.random(n) < 0.9) for c in forest.stats.columns}
    ids = _random_ids(forest, n, rng)
    domain = rng.integers(0, len(cfg.domain_names), n)
    batch = forest.arrays(dense, ids, domain, n)
    assert all(v.shape[0] == n for v in batch.values())
    x = forest.matrix(dense, ids, domain, n)
    assert np.isnan(x).any(axis=0).sum() >= 2  # missing values reach the trees
    for i in range(n):
        one = {k: (a[i:i + 1], p[i:i + 1]) for k, (a, p) in ids.items()}
        row = forest.matrix({k: v[i:i + 1] for k, v in dense.items()}, one, domain[i:i + 1], 1)
        np.testing.assert_array_equal(row, x[i:i + 1])  # NaN where NaN, same numbers elsewhere
        got = forest.arrays({k: v[i:i + 1] for k, v in dense.items()}, one, domain[i:i + 1], 1)
        for k, v in batch.items():
            np.testing.assert_array_equal(got[k], v[i:i + 1])


def test_lightgbms_single_row_predictor_is_pred_leaf(fitted) -> None:
    """SingleRowLeaves (the C API's single-row fast path) against Booster.predict(pred_leaf=True)
    on the fit's own rows and on rows with missing values and unseen categories."""
    from lattice.data.loader import find_table
    from lattice.trees.leaves import LeafForest, SingleRowLeaves

    cfg, paths, manifest, _ = fitted
    forest = LeafForest.load(paths.trees)
    stats = DenseStats.load(paths.trees / "dense_stats.json")
    arrs, _ = read_rows(cfg, find_table(paths), stats)
    x = forest.features.matrix(arrs)[:1500].copy()
    rng = np.random.default_rng(7)
    x[rng.random(x.shape) < 0.15] = np.nan
    x[rng.random(x.shape) < 0.05] = 10_000.0  # beyond every category and threshold
    for o in forest.boosters:
        booster = forest.booster(o)
        want = booster.predict(x, pred_leaf=True, num_threads=1)
        one = SingleRowLeaves(booster)
        got = np.stack([one(r) for r in x])
        assert got.dtype == np.int64 and got.shape == want.shape == (len(x), booster.num_trees())
        np.testing.assert_array_equal(got, want)
        assert len(np.unique(got, axis=0)) > 10  # the rows reach many leaves, not one
        with pytest.raises(ValueError, match="features"):
            one(x[0, :-1])


def test_the_row_encoder_shares_the_dense_block_only_when_the_transform_is_the_same(fitted) -> None:
    """RowEncoder reuses its own dense block for the trees only when the fit's stats transform
    alike; with other stats the trees still get their own transform, and the same leaf ids."""
    import dataclasses

    import pandas as pd
    import pyarrow as pa

    from lattice.data.loader import RowEncoder, find_table
    from lattice.trees.leaves import LeafForest

    cfg, paths, manifest, _ = fitted
    forest = LeafForest.load(paths.trees)
    tbl = pa.Table.from_pandas(pd.read_parquet(find_table(paths)).head(50), preserve_index=False)
    same = RowEncoder(cfg, forest.stats, leaves=forest)
    other_stats = dataclasses.replace(forest.stats, mean=[m + 1.0 for m in forest.stats.mean])
    other = RowEncoder(cfg, other_stats, leaves=forest)
    assert same.shared_dense and not other.shared_dense
    a, b = same.encode(tbl, {}), other.encode(tbl, {})
    assert not np.array_equal(a["dense"], b["dense"])
    leaf_keys = [k for k in a if k.startswith("leaf:")]
    assert leaf_keys
    for k in leaf_keys:
        np.testing.assert_array_equal(a[k], b[k])
        for i in range(0, 50, 7):  # one row at a time, as serving encodes
            np.testing.assert_array_equal(same.encode(tbl.slice(i, 1), {})[k], a[k][i:i + 1])
            np.testing.assert_array_equal(other.encode(tbl.slice(i, 1), {})[k], a[k][i:i + 1])


def test_a_student_saved_before_the_margin_existed_rebuilds_without_it(tmp_path) -> None:
    """The default puts the trees' margin under the student; a model saved before that key
    existed was trained without it, and its saved config must say so."""
    from lattice.models.saved import blob_config

    cfg = _leaves_on(_config(tmp_path / "raw"), ["student"])
    old = cfg.model_dump(mode="json")
    del old["models"]["leaves"]["margin"]
    assert blob_config({"config": old}).models.leaves.margin == []
    assert PlatformConfig.model_validate(old).models.leaves.margin == ["student"]  # a new config: the default


def test_the_cost_counts_one_lookup_per_tree(tmp_path) -> None:
    """model_cost: a forest of T trees reads T leaf rows a row (T x d for the leaf tokens, T for
    the frozen margin), not one lookup per forest as a feature's table does."""
    from lattice.models.build import build_model
    from lattice.models.cost import model_cost

    cfg = _config(tmp_path)
    spec = {"trees": {"click": 10, "conversion": 5}, "num_leaves": 7,
            "values": {"click": [0.0] * 70, "conversion": [0.0] * 35}}
    plain = model_cost(build_model(cfg, "teacher", 6), cfg, 6)
    on = _leaves_on(cfg, ["teacher"])
    tokens = model_cost(build_model(on, "teacher", 6, leaves=spec), on, 6)
    dim = build_model(on, "teacher", 6, leaves=spec).leaves.ebc.embedding_bag_configs()[0].embedding_dim
    assert plain["leaf_lookup_flops_per_example"] == 0
    assert tokens["leaf_lookup_flops_per_example"] == 15 * dim
    # the features' lookups are what they were: the forests' table is not counted as one more feature
    assert (tokens["flops_per_example"] - tokens["dense_flops_per_example"] - 15 * dim
            == plain["flops_per_example"] - plain["dense_flops_per_example"])
    margin = _leaves_on(cfg, ["teacher"], margin=True)
    both = model_cost(build_model(margin, "teacher", 6, leaves=spec), margin, 6)
    assert both["leaf_lookup_flops_per_example"] == 15 * dim + 15


@pytest.mark.parametrize("pooling", ["mean", "sum"])
def test_a_forests_token_pools_its_trees_leaf_rows_as_configured(tmp_path, pooling) -> None:
    """models.leaves.pooling: the token is the mean (the default) or the sum of the rows of the
    row's leaves, one per tree."""
    import torch
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from lattice.models.build import build_model

    cfg = _leaves_on(_config(tmp_path), ["teacher"])
    assert cfg.models.leaves.pooling == {"teacher": "mean", "student": "mean"}  # the default
    raw = cfg.model_dump(mode="json")
    raw["models"]["leaves"]["pooling"] = pooling  # one word sets both
    cfg = PlatformConfig.model_validate(raw)
    assert cfg.models.leaves.pooling == {"teacher": pooling, "student": pooling}
    raw["models"]["leaves"]["pooling"] = {"student": "sum"}  # a network left out keeps the default
    assert PlatformConfig.model_validate(raw).models.leaves.pooling == {"teacher": "mean", "student": "sum"}
    arch = build_model(cfg, "teacher", 6, leaves={"trees": {"click": 4, "conversion": 3}, "num_leaves": 7}).leaves
    ids = {"leaves_click": [2, 9, 16, 27], "leaves_conversion": [0, 13, 20]}  # one leaf per tree: t * 7 + leaf
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=arch.keys, values=torch.tensor(ids[arch.keys[0]] + ids[arch.keys[1]]),
                                              lengths=torch.tensor([len(ids[arch.keys[0]]), len(ids[arch.keys[1]])]))
    tokens = arch(kjt)  # (1, 2, D)
    tables = arch.ebc.embedding_bags
    for j, k in enumerate(arch.keys):
        rows = tables[f"t_{k}"].weight[torch.tensor(ids[k])]
        want = rows.mean(0) if pooling == "mean" else rows.sum(0)
        torch.testing.assert_close(tokens[0, j], want)


def test_a_model_saved_before_pooling_existed_rebuilds_summing_and_a_warm_start_across_it_is_refused(tmp_path) -> None:
    """A model saved before models.leaves.pooling summed its leaf rows, and rebuilds so; a warm
    start from it under a config that pools by mean is refused, naming the key and the fix (the
    tables have the same shapes, so the weights alone would not tell)."""
    from lattice.models.build import build_model
    from lattice.models.saved import blob_config
    from lattice.training.warm_start import WarmStartError, check_compatible

    cfg = _leaves_on(_config(tmp_path), ["teacher"])
    old = cfg.model_dump(mode="json")
    del old["models"]["leaves"]["pooling"]
    assert blob_config({"config": old}).models.leaves.pooling == {"teacher": "sum", "student": "sum"}
    spec = {"trees": {"click": 4, "conversion": 3}, "num_leaves": 7}
    parent = build_model(blob_config({"config": old}), "teacher", 6, leaves=spec)
    blob = {"kind": "teacher", "config": old, "state_dict": parent.state_dict()}
    child = build_model(cfg, "teacher", 6, leaves=spec)
    with pytest.raises(WarmStartError, match=r"models.leaves.pooling.teacher: sum"):
        check_compatible(child, blob, cfg, "teacher")
    summing = cfg.model_copy(update={"models": cfg.models.model_copy(update={
        "leaves": cfg.models.leaves.model_copy(update={"pooling": {"teacher": "sum", "student": "sum"}})})})
    assert check_compatible(build_model(summing, "teacher", 6, leaves=spec), blob, summing, "teacher") == []


# ---------------------------------------------------------------- cross-fitting (models.leaves.fit_share)


def _shared(cfg: PlatformConfig, share: float) -> PlatformConfig:
    m = cfg.models
    return cfg.model_copy(update={"models": m.model_copy(update={"leaves": m.leaves.model_copy(update={"fit_share": share})})})


@pytest.fixture(scope="module")
def cross_fitted(tmp_path_factory):
    """The `fitted` table again, its trees fitted on half the train rows."""
    base = tmp_path_factory.mktemp("xfit")
    cfg = _shared(_config(base / "raw"), 0.5)
    generate(cfg, 4_000, base / "raw", progress=False)
    paths = Paths.for_config(cfg, base / "work")
    write_local_table(cfg, paths, row_group_size=700)
    return (cfg, paths, *_fit_recording(cfg, paths))


def _fit_mask(cfg: PlatformConfig, paths: Paths, share: float):
    from lattice.data.loader import find_table
    from lattice.trees.leaves import fit_fraction
    stats = DenseStats.load(paths.trees / "dense_stats.json")
    arrs, split = read_rows(cfg, find_table(paths), stats)
    return arrs, split, (split == "train") & (fit_fraction(arrs["example_id"].tolist()) < share)


def test_a_cross_fit_reads_only_its_share_of_the_train_rows(cross_fitted) -> None:
    cfg, paths, manifest, seen = cross_fitted
    arrs, split, fit = _fit_mask(cfg, paths, 0.5)
    train = split == "train"
    assert 0.4 < fit.sum() / train.sum() < 0.6  # the hash draws about half
    expected = []
    for o in cfg.objective_names:
        lab = arrs[f"mask:{o}"] > 0
        expected.append((int((fit & lab).sum()), int(((split == "validation") & lab).sum())))  # validation: all of it
    assert seen == expected
    on_disk = json.loads((paths.trees / "manifest.json").read_text())
    assert on_disk["fit_share"] == 0.5 and on_disk["fit_rows"] == int(fit.sum())
    assert on_disk["train_rows"] == int(train.sum()) and on_disk["held_out_train_rows"] == int((train & ~fit).sum())
    assert "trees-fit" in on_disk["fit_rule"]
    # the rule is the example id's alone: the same ids in another order draw the same rows
    from lattice.trees.leaves import LeafForest, fitted_rows
    ids = arrs["example_id"][train]
    perm = np.random.default_rng(0).permutation(len(ids))
    np.testing.assert_array_equal(fitted_rows(ids[perm], 0.5), fitted_rows(ids, 0.5)[perm])
    # and the fit's lineage carries the share and the rule
    forest = LeafForest.load(paths.trees)
    assert forest.fit_share == 0.5 and forest.fit["fit_rule"] == on_disk["fit_rule"]


def test_the_trees_fitted_rows_train_with_empty_leaf_bags_the_others_with_pred_leaf(cross_fitted) -> None:
    import torch

    from lattice.data.loader import BatchLoader, find_table, fit_dense_stats
    from lattice.models.build import build_model
    from lattice.models.leaves import split_leaves
    from lattice.trees.leaves import LeafForest, leaf_key

    cfg, paths, manifest, _ = cross_fitted
    arrs, split, fit = _fit_mask(cfg, paths, 0.5)
    stats = DenseStats.load(paths.trees / "dense_stats.json")
    features = TreeFeatures.fit(cfg, [c.column for c in stats.columns], arrs, fit,  # the fit's own encodings: its rows
                                cfg.models.baselines.trees.max_categories, with_domain=True)
    x = features.matrix(arrs)
    ref = {p.stem: lgb.Booster(model_file=str(p)).predict(x, pred_leaf=True) for p in sorted((paths.trees / "boosters").glob("*.txt"))}
    row = {e: i for i, e in enumerate(arrs["example_id"])}
    forest = LeafForest.load(paths.trees)
    table = find_table(paths)
    on = _leaves_on(cfg, ["teacher"])
    model = build_model(on, "teacher", len(stats.columns), leaves=forest.spec())
    n_features = len(cfg.features.sparse)
    num_leaves = cfg.models.leaves.num_leaves
    counts = {"train": [0, 0], "test": [0, 0]}  # rows with an empty bag, rows with one id per tree
    for name in ("train", "test"):
        for batch in BatchLoader(on, table, fit_dense_stats(on, table), name, batch_size=300, num_workers=0, leaves=forest):
            kjt = batch.sparse.to_dict()
            idx = np.array([row[e] for e in batch.example_ids])
            fitted = fit[idx]
            for o, want in ref.items():
                trees = want.shape[1]
                lengths = kjt[leaf_key(o)].lengths().numpy()
                if name == "train":
                    np.testing.assert_array_equal(lengths, np.where(fitted, 0, trees))
                else:  # test rows keep their ids, whatever their hash
                    np.testing.assert_array_equal(lengths, np.full(len(batch), trees))
                got = kjt[leaf_key(o)].values().numpy().reshape(-1, trees) - np.arange(trees) * num_leaves
                np.testing.assert_array_equal(got, want[idx[lengths > 0]])
            empty = kjt[leaf_key(sorted(ref)[0])].lengths().numpy() == 0
            counts[name][0] += int(empty.sum())
            counts[name][1] += int((~empty).sum())
            # under mean pooling an empty bag is a zero token; a full one is not
            tokens = model.leaves(split_leaves(batch.sparse, n_features, model.leaf_keys)[1])
            assert torch.all(tokens[torch.from_numpy(empty)] == 0)
            assert torch.all(tokens[torch.from_numpy(~empty)].abs().sum(-1) > 0)
    assert counts["train"][0] > 300 and counts["train"][1] > 300 and counts["test"] [0] == 0


def test_a_teacher_trains_on_a_cross_fit_and_carries_its_share(cross_fitted) -> None:
    from lattice.models.saved import load_saved
    from lattice.training.stages import train

    cfg, paths, _, _ = cross_fitted
    on = _leaves_on(cfg, ["teacher"])
    train(on, paths, model="teacher", nproc=1, epochs=1, progress=False)
    saved = load_saved(paths.model_dir("teacher"))
    assert saved.model.leaf_forest.fit_share == 0.5
    assert saved.blob["lineage"]["trees"]["fit_share"] == 0.5 and "trees-fit" in saved.blob["lineage"]["trees"]["fit_rule"]


def test_a_fit_share_out_of_range_is_a_config_error_and_a_stale_fit_is_refused(fitted) -> None:
    import yaml

    from lattice.trees.leaves import NoTreeFit, forest_for

    d = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    d.setdefault("models", {})["leaves"] = {"models": ["teacher"]}
    assert parse_config(d, "x.yaml").models.leaves.fit_share == "auto"  # the default: the fit chooses
    for bad in (0, -0.5, 1.5, float("nan")):
        d["models"]["leaves"] = {"models": ["teacher"], "fit_share": bad}
        with pytest.raises(ConfigError, match=r"fit_share .*\(0, 1\]"):
            parse_config(d, "x.yaml")
    d["models"]["leaves"] = {"models": ["teacher", "student"], "fit_share": 0.5}  # the student on the margin: it reads every row
    assert parse_config(d, "x.yaml").models.leaves.fit_share == 0.5
    cfg, paths, _, _ = fitted  # fitted on every train row: a config asking for half is refused, naming the refit
    with pytest.raises(NoTreeFit, match=r"fit_share is 0.5 .*lattice trees fit"):
        forest_for(_shared(_leaves_on(cfg, ["teacher"]), 0.5), paths, "teacher")


def test_a_fit_or_model_made_before_fit_share_reads_every_train_row(fitted, tmp_path) -> None:
    import shutil

    from lattice.trees.leaves import LeafForest

    cfg, paths, _, _ = fitted
    now = LeafForest.load(paths.trees)
    old_dir = tmp_path / "trees"
    shutil.copytree(paths.trees, old_dir)
    m = json.loads((old_dir / "manifest.json").read_text())
    for k in ("fit_share", "train_rows", "held_out_train_rows", "fit_rule"):
        m.pop(k, None)
    (old_dir / "manifest.json").write_text(json.dumps(m))
    old = LeafForest.load(old_dir)
    assert old.fit_share == 1.0 and old.fit["sha256"] == now.fit["sha256"]  # same identity as before the key
    blob = old.blob()
    blob["fit"] = {k: v for k, v in blob["fit"].items() if k != "fit_share"}  # a model.pt saved before the key
    forest = LeafForest.from_blob(blob)
    assert forest.fit_share == 1.0
    arrs = {"example_id": np.array([f"e{i}" for i in range(50)]), "leaf:click": np.arange(100).reshape(50, 2)}
    forest.empty_fitted(arrs)
    np.testing.assert_array_equal(arrs["leaf:click"], np.arange(100).reshape(50, 2))  # nothing emptied


# ---------------------------------------------------------------- fit_share: auto


@pytest.fixture(scope="module")
def auto_table(tmp_path_factory):
    base = tmp_path_factory.mktemp("auto")
    cfg = _shared(_config(base / "raw"), "auto")
    generate(cfg, 4_000, base / "raw", progress=False)
    paths = Paths.for_config(cfg, base / "work")
    write_local_table(cfg, paths, row_group_size=700)
    return cfg, paths


def test_auto_measures_the_forests_optimism_and_keeps_every_row_below_the_bound(auto_table, monkeypatch) -> None:
    from lattice.data.loader import find_table
    from lattice.evaluation.metrics import ne
    from lattice.trees import fit as F

    cfg, paths = auto_table
    monkeypatch.setattr(F, "AUTO_GAP", 10.0)
    manifest = fit_trees(_leaves_on(cfg, ["teacher"]), paths)
    auto = manifest["fit_share_auto"]
    assert manifest["fit_share"] == 1.0 and auto["chose"] == 1.0 and "<= 10.0" in auto["why"]
    assert manifest["fit_share_setting"] == "auto" and "fit_rule" not in manifest
    # the optimism is the booster's own: (NE on validation - NE on its fit rows) / NE on validation
    stats = DenseStats.load(paths.trees / "dense_stats.json")
    arrs, split = read_rows(cfg, find_table(paths), stats)
    features = TreeFeatures.fit(cfg, [c.column for c in stats.columns], arrs, split == "train",
                                cfg.models.baselines.trees.max_categories, with_domain=True)
    x = features.matrix(arrs)
    assert auto["optimism_at_share_1"]
    for o, got in auto["optimism_at_share_1"].items():
        p = lgb.Booster(model_file=str(paths.trees / "boosters" / f"{o}.txt")).predict(x)
        lab, y = arrs[f"mask:{o}"] > 0, arrs[f"label:{o}"].astype(float)
        t, v = (split == "train") & lab, (split == "validation") & lab
        assert got == pytest.approx((ne(y[v], p[v]) - ne(y[t], p[t])) / ne(y[v], p[v]), abs=1e-6)
        assert got > 0  # 12 trees on a few thousand rows see their own rows better


def test_auto_refits_an_over_fitting_forest_on_a_share_and_a_model_follows_it(auto_table, monkeypatch) -> None:
    from lattice.trees import fit as F
    from lattice.trees.leaves import LeafForest, NoTreeFit, forest_for

    cfg, paths = auto_table
    monkeypatch.setattr(F, "AUTO_GAP", 0.0)
    on = _leaves_on(cfg, ["teacher"])
    manifest, seen = _fit_recording(on, paths)
    n = len([o for o in cfg.objective_names])
    assert len(seen) == 2 * n and all(a[0] > b[0] for a, b in zip(seen[:n], seen[n:]))  # every row, then the share
    assert manifest["fit_share"] == F.AUTO_SHARE and manifest["fit_share_auto"]["chose"] == F.AUTO_SHARE
    assert "> 0.0" in manifest["fit_share_auto"]["why"] and "trees-fit" in manifest["fit_rule"]
    on_disk = json.loads((paths.trees / "manifest.json").read_text())
    assert on_disk["fit_share"] == F.AUTO_SHARE and on_disk["fit_rows"] < on_disk["train_rows"]
    forest = forest_for(on, paths, "teacher")  # auto accepts the share its fit chose
    assert forest.fit_share == F.AUTO_SHARE and forest.fit["fit_share_auto"]["chose"] == F.AUTO_SHARE
    assert forest_for(_shared(on, F.AUTO_SHARE), paths, "teacher").fit_share == F.AUTO_SHARE  # the same share, fixed
    with pytest.raises(NoTreeFit, match="fit_share is 1.0 .*share of 0.7"):
        forest_for(_shared(on, 1.0), paths, "teacher")
    # a fixed-share fit is not what auto asked for
    fit_trees(_shared(on, F.AUTO_SHARE), paths)
    assert LeafForest.load(paths.trees).fit_share == F.AUTO_SHARE
    with pytest.raises(NoTreeFit, match="fit_share is auto .*fixed share of 0.7.*lattice trees fit"):
        forest_for(on, paths, "teacher")


def test_a_network_on_the_margin_reads_every_train_rows_leaves_under_a_cross_fit(cross_fitted, monkeypatch) -> None:
    """A network that starts at the trees' margin needs every row's leaves (an empty bag would zero
    its margin): the loader empties the fitted rows' bags only for the others."""
    from lattice.data.loader import BatchLoader, find_table, fit_dense_stats
    from lattice.trees.leaves import LeafForest, leaf_key
    from lattice.training import loop
    from lattice.training.stages import train

    cfg, paths, _, _ = cross_fitted
    forest = LeafForest.load(paths.trees)
    table = find_table(paths)
    key = leaf_key(sorted(forest.fit["trees"])[0])
    lengths = {}
    for cross_fit in (True, False):
        lengths[cross_fit] = np.concatenate([
            b.sparse.to_dict()[key].lengths().numpy()
            for b in BatchLoader(cfg, table, fit_dense_stats(cfg, table), "train", batch_size=500, num_workers=0,
                                 leaves=forest, cross_fit=cross_fit)])
    assert (lengths[True] == 0).sum() > 300 and (lengths[False] > 0).all()
    seen: dict[str, set] = {}
    real = loop.BatchLoader

    def recording(*args, **kwargs):
        seen.setdefault(args[3], set()).add(kwargs["cross_fit"])
        return real(*args, **kwargs)

    monkeypatch.setattr(loop, "BatchLoader", recording)
    train(_leaves_on(cfg, ["teacher"], margin=True), paths, model="teacher@m", nproc=1, epochs=1, progress=False)
    assert seen["train"] == {False}
    seen.clear()
    train(_leaves_on(cfg, ["teacher"]), paths, model="teacher@nm", nproc=1, epochs=1, progress=False)
    assert seen["train"] == {True}


# ---------------------------------------------------------------- a windowed run's trees


def test_a_windowed_fit_reads_only_the_windows_days_and_training_refuses_a_forest_of_other_days(fitted, tmp_path,
                                                                                                   monkeypatch) -> None:
    """training.window: the boosters fit on the window's train days and stop on its validation
    day (the stored split would have handed them rows of the validation and test days), and a
    model refuses a forest fitted on the stored split or on another window, naming the refit."""
    import datetime as dt

    from lattice.data.loader import find_table
    from lattice.data.window import latest_date, resolve
    from lattice.trees.leaves import LeafForest, NoTreeFit, forest_for

    cfg, paths, _, _ = fitted
    wpaths = Paths.for_config(cfg, tmp_path / "work")  # the same table, another trees folder
    wpaths.workdir.mkdir(parents=True)
    table = find_table(paths)
    (wpaths.workdir / table.name).symlink_to(table)
    last = latest_date(table)
    end = last.isoformat()  # the table's newest day is the test day, as in the demo's rounds
    windowed = cfg.model_copy(update={"training": cfg.training.model_copy(update={"window": "4d"})})
    seen: list[tuple[int, int]] = []
    real = lgb.train

    def recording(params, train_set, *args, **kwargs):
        booster = real(params, train_set, *args, **kwargs)  # the datasets are built by then
        seen.append((train_set.num_data(), kwargs["valid_sets"][0].num_data()))
        return booster

    monkeypatch.setattr(lgb, "train", recording)
    manifest = fit_trees(windowed, wpaths, end=end)
    window = resolve(windowed, table, end)
    assert manifest["window"] == {**window.to_json(), "validation_share": 1.0}
    # the rows each booster read: labelled rows of the window's train days, its validation day
    stats = DenseStats.load(wpaths.trees / "dense_stats.json")
    arrs, split = read_rows(windowed, table, stats, window.splits())
    stored_arrs, stored = read_rows(cfg, table, stats)
    expected = [(int(((split == "train") & (arrs[f"mask:{o}"] > 0)).sum()),
                 int(((split == "validation") & (arrs[f"mask:{o}"] > 0)).sum())) for o in cfg.objective_names]
    assert seen == expected and expected[0][0] > 0 and expected[0][1] > 0
    # the stored split would have fitted on rows of the test day (the table's newest)
    assert manifest["train_rows"] == int((split == "train").sum()) < int((stored == "train").sum())
    assert int((split == "test").sum()) > 0 and not ((split == "train") & (split == "test")).any()
    forest = LeafForest.load(wpaths.trees)
    assert forest.fit["window"]["end"] == end
    on = _leaves_on(windowed, ["teacher"])
    assert forest_for(on, wpaths, "teacher", window=window) is not None  # its own window
    later = resolve(windowed, table, (last + dt.timedelta(days=1)).isoformat())
    with pytest.raises(NoTreeFit, match=rf"window .*{later.train[0]}\.\.{later.validation}.*--end {later.end}"):
        forest_for(on, wpaths, "teacher", window=later)
    with pytest.raises(NoTreeFit, match=r"stored split \(no window\).*--end"):
        forest_for(on, paths, "teacher", window=window)  # the fixture's fit: the stored split
    # a fit that trained on half the newest day serves a run that holds out that half, not the whole day
    fit_trees(windowed, wpaths, end=end, validation_share=0.5)
    assert forest_for(on, wpaths, "teacher", window=window, validation_share=0.5) is not None
    with pytest.raises(NoTreeFit, match=r"holding out 0.5 of its newest day \(this run: 1\)"):
        forest_for(on, wpaths, "teacher", window=window)


def test_under_a_window_only_the_forests_own_days_lose_their_leaf_ids(cross_fitted) -> None:
    """A forest fitted on a window saw only the window's train days: a warm start's newer days
    keep every row's leaf ids, the forest's own days empty the fitted rows' bags (the loader)."""
    from lattice.data.loader import BatchLoader, find_table, fit_dense_stats
    from lattice.data.window import DaySplits, row_dates
    from lattice.data.loader import read_unit, scan_units
    from lattice.trees.leaves import LeafForest, fit_fraction, leaf_key

    cfg, paths, _, _ = cross_fitted
    table = find_table(paths)
    days = sorted({d for u in scan_units(table) for d in row_dates(*read_unit(u, ["event_timestamp", "date"]))})
    assert len(days) >= 4
    forest = LeafForest.load(paths.trees)
    forest.fit["window"] = {"train": days[:-2], "validation": days[-2], "test": days[-1], "end": days[-1]}
    on = _leaves_on(cfg, ["teacher"])
    # every day trains here, so the loader sees both the forest's days and two it never saw
    split = DaySplits({d: "train" for d in days})
    seen = {"own, fitted": 0, "own, not fitted": 0, "newer": 0}
    key = leaf_key(sorted(forest.boosters)[0])
    trees = forest.fit["trees"][sorted(forest.boosters)[0]]
    date_of = {}
    for u in scan_units(table):
        tbl, part = read_unit(u, ["example_id", "event_timestamp", "date"])
        date_of.update(zip(tbl.column("example_id").to_pylist(), row_dates(tbl, part)))
    def check(own_days: list[str]) -> None:
        for batch in BatchLoader(on, table, fit_dense_stats(on, table), "train", batch_size=400, num_workers=0,
                                 leaves=forest, days=split):
            lengths = batch.sparse.to_dict()[key].lengths().numpy()
            fitted = fit_fraction(list(batch.example_ids)) < forest.fit_share
            own = np.array([date_of[e] in own_days for e in batch.example_ids])
            np.testing.assert_array_equal(lengths, np.where(own & fitted, 0, trees))
            seen["own, fitted"] += int((own & fitted).sum())
            seen["own, not fitted"] += int((own & ~fitted).sum())
            seen["newer"] += int((~own).sum())

    check(days[:-2])
    assert min(seen.values()) > 50, seen
    # a fit that held out only a share of its newest day trained on the rest of that day too
    forest.fit["window"]["validation_share"] = 0.5
    check(days[:-1])


def test_fit_trees_if_on_fits_only_for_a_network_that_reads_leaves(fitted, tmp_path) -> None:
    """Code that trains outside the pipeline (the benches) fits the trees as fit_trees would, and
    nothing when models.leaves names no network."""
    from lattice.data.loader import find_table
    from lattice.trees.fit import fit_trees_if_on

    cfg, paths, _, _ = fitted
    other = Paths.for_config(cfg, tmp_path / "work")
    other.workdir.mkdir(parents=True)
    table = find_table(paths)
    (other.workdir / table.name).symlink_to(table)
    assert fit_trees_if_on(_leaves_on(cfg, []), other) is None and not other.trees.exists()
    manifest = fit_trees_if_on(_leaves_on(cfg, ["student"]), other)
    assert manifest["fit_rows"] > 0 and (other.trees / "manifest.json").exists()


def test_a_network_reading_leaves_for_neither_tokens_nor_margin_is_a_config_error() -> None:
    import yaml

    d = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    d.setdefault("models", {})["leaves"] = {"models": ["teacher", "student"], "tokens": ["teacher"], "margin": ["student"]}
    assert parse_config(d, "x.yaml").models.leaves.tokens == ["teacher"]  # the student: its margin only
    d["models"]["leaves"]["margin"] = []
    with pytest.raises(ConfigError, match=r"lists \['student'\] but neither models.leaves.tokens nor models.leaves.margin"):
        parse_config(d, "x.yaml")
