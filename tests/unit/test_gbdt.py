"""The LightGBM baselines `gbdt` (pooled per objective) and `gbdt_cell` (per cell): their predictions
are those of a direct LightGBM fit on the same rows, masked and test rows never reach a fit, and
their outputs have the layout every model has."""

from __future__ import annotations

import json
from pathlib import Path

import lightgbm as lgb
import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from lattice.config import PlatformConfig, load_config
from lattice.data.local_table import write_local_table
from lattice.data.synth import generate
from lattice.data.transforms import DenseStats
from lattice.paths import Paths
from lattice.training.stages import train
from lattice.training.tiny import tiny

ROOT = Path(__file__).resolve().parents[2]
MAX_ROUNDS = 80  # enough for early stopping to act on the tiny table, short enough for 2 cores


def _config(data_root: Path) -> PlatformConfig:
    cfg = tiny(load_config(ROOT / "configs" / "demo.yaml"), data_root=str(data_root))
    b = cfg.models.baselines
    # one thread: a direct refit must see the same thread count, and the shared CI cores stay free
    trees = b.trees.model_copy(update={"max_rounds": MAX_ROUNDS, "num_threads": 1, "max_categories": 30})
    return cfg.model_copy(update={"models": cfg.models.model_copy(update={"baselines": b.model_copy(update={"trees": trees})})})


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[PlatformConfig, Paths]:
    base = tmp_path_factory.mktemp("gbdt")
    cfg = _config(base / "raw")
    generate(cfg, 6_000, base / "raw", progress=False)
    paths = Paths.for_config(cfg, base / "work")
    write_local_table(cfg, paths, row_group_size=700)
    for model in ("gbdt", "gbdt_cell"):
        train(cfg, paths, model=model, progress=False)
    return cfg, paths


def _table(paths: Paths) -> pd.DataFrame:
    """The consolidated table read straight from its files (hive partitions as columns)."""
    return pd.read_parquet(paths.consolidated).assign(domain=lambda d: d["domain"].astype(str))


def _direct_features(cfg: PlatformConfig, paths: Paths, df: pd.DataFrame, model: str,
                     with_domain: bool) -> tuple[np.ndarray, list[int]]:
    """The boosters' matrix rebuilt by hand: the saved dense stats applied to the raw columns, each
    sparse id as its rank among the train ids (at most max_categories of them) or its train count."""
    stats = DenseStats.load(paths.model_dir(model) / "dense_stats.json")
    raw = {c.column: df[c.column].fillna(0).to_numpy(np.float64) for c in stats.columns if c.column in df}
    cols = [stats.apply(raw, len(df)).astype(np.float64)]
    cats = []
    train = df["split"] == "train"
    k = len(stats.columns)
    for j, f in enumerate(cfg.features.sparse):
        ids = df[f.column]
        counts = ids[train].dropna().astype(np.int64).value_counts().sort_index()
        if len(counts) <= cfg.models.baselines.trees.max_categories:
            code = pd.Series(np.arange(len(counts), dtype=np.float64), index=counts.index)
            cols.append(ids.map(code).to_numpy(np.float64)[:, None])
            cats.append(k + j)
        else:
            col = ids.map(counts.astype(np.float64)).to_numpy(np.float64)
            col[ids.notna().to_numpy() & np.isnan(col)] = 0.0  # present but unseen in train
            cols.append(col[:, None])
    if with_domain:
        cols.append(df["domain"].map({d: i for i, d in enumerate(cfg.domain_names)}).to_numpy(np.float64)[:, None])
        cats.append(k + len(cfg.features.sparse))
    return np.hstack(cols), cats


def _direct_fit(cfg: PlatformConfig, x: np.ndarray, cats: list[int], y: np.ndarray, fit: np.ndarray,
                valid: np.ndarray) -> lgb.Booster:
    t = cfg.models.baselines.trees
    params = {"objective": "binary", "metric": "binary_logloss", "num_leaves": t.num_leaves, "learning_rate": t.learning_rate,
              "min_data_in_leaf": t.min_data_in_leaf, "lambda_l2": t.lambda_l2, "seed": cfg.training.seed,
              "deterministic": True, "force_row_wise": True, "num_threads": 1, "verbosity": -1}
    train_set = lgb.Dataset(x[fit], y[fit], categorical_feature=cats)
    valid_set = lgb.Dataset(x[valid], y[valid], reference=train_set)
    return lgb.train(params, train_set, num_boost_round=t.max_rounds, valid_sets=[valid_set],
                     callbacks=[lgb.early_stopping(t.early_stopping_rounds, verbose=False)])


@pytest.mark.parametrize(("model", "cell"), [("gbdt", ("feed", "click")), ("gbdt", ("search", "conversion")),
                                             ("gbdt_cell", ("search", "conversion")), ("gbdt_cell", ("video", "click"))])
def test_predictions_equal_a_direct_lightgbm_fit_on_the_same_rows(trained, model, cell) -> None:
    cfg, paths = trained
    domain, objective = cell
    df = _table(paths)
    x, cats = _direct_features(cfg, paths, df, model, with_domain=model == "gbdt")
    labelled = df[f"mask_{objective}"].to_numpy() > 0
    if model == "gbdt_cell":
        labelled &= (df["domain"] == domain).to_numpy()
    split = df["split"].to_numpy()
    y = df[f"label_{objective}"].to_numpy(np.float64)
    booster = _direct_fit(cfg, x, cats, y, (split == "train") & labelled, (split == "validation") & labelled)
    test = (split == "test") & (df["domain"] == domain).to_numpy()
    direct = pd.Series(booster.predict(x[test], num_iteration=booster.best_iteration), index=df["example_id"][test])

    preds = pd.read_parquet(paths.model_dir(model) / "predictions.parquet").set_index("example_id")
    ours = preds.loc[direct.index, f"p_{objective}"]
    assert len(direct) > 20
    assert np.abs(ours.to_numpy() - direct.to_numpy()).max() <= 1e-12
    key = objective if model == "gbdt" else f"{domain}__{objective}"
    summary = json.loads((paths.model_dir(model) / "summary.json").read_text())
    assert summary["boosters"][key]["best_round"] == booster.best_iteration


def _perturbed_copy(cfg: PlatformConfig, paths: Paths, out: Path) -> Paths:
    """The same table where nothing a fit may read changes, and everything it must not read does:
    labels of masked rows set to 1, and the test rows' labels flipped and their features scrambled."""
    other = Paths.for_config(cfg, out)
    rng = np.random.default_rng(1)
    for f in sorted(paths.consolidated.rglob("*.parquet")):
        df = pq.read_table(f).to_pandas()
        for o in cfg.objective_names:
            df.loc[df[f"mask_{o}"] == 0, f"label_{o}"] = 1
        test = df["split"] == "test"
        for o in cfg.objective_names:
            df.loc[test & (df[f"mask_{o}"] > 0), f"label_{o}"] = 1 - df.loc[test & (df[f"mask_{o}"] > 0), f"label_{o}"]
        for c in {s.column for s in cfg.features.sparse} & set(df.columns):
            df.loc[test & df[c].notna(), c] = rng.integers(0, 50, int((test & df[c].notna()).sum()))
        for c in {d.column for d in cfg.features.dense} & set(df.columns):
            df.loc[test, c] = df.loc[test, c] * 100 + 7
        target = other.consolidated / f.relative_to(paths.consolidated)
        target.parent.mkdir(parents=True, exist_ok=True)
        df.to_parquet(target, index=False, row_group_size=700)
    return other


def test_masked_and_test_rows_never_reach_a_fit(trained, tmp_path, monkeypatch) -> None:
    cfg, paths = trained
    other = _perturbed_copy(cfg, paths, tmp_path / "perturbed")
    seen: list[tuple[int, int]] = []
    real_train = lgb.train

    def recording(params, train_set, *args, **kwargs):  # instrument: how many rows each fit and its early stop read
        booster = real_train(params, train_set, *args, **kwargs)
        valid = kwargs.get("valid_sets") or []
        seen.append((train_set.num_data(), valid[0].num_data() if valid else 0))
        return booster

    monkeypatch.setattr(lgb, "train", recording)
    for model in ("gbdt", "gbdt_cell"):
        train(cfg, other, model=model, progress=False)
        for f in sorted((paths.model_dir(model) / "boosters").glob("*.txt")):
            assert (other.model_dir(model) / "boosters" / f.name).read_text() == f.read_text(), f"{model}/{f.name}"
    df = _table(paths)
    expected = []
    for o in cfg.objective_names:  # gbdt: one fit per objective, on its labelled train rows
        labelled = df[f"mask_{o}"] > 0
        expected.append((int(((df["split"] == "train") & labelled).sum()), int(((df["split"] == "validation") & labelled).sum())))
    for d, o in cfg.cells():  # gbdt_cell: one per cell
        labelled = (df[f"mask_{o}"] > 0) & (df["domain"] == d)
        expected.append((int(((df["split"] == "train") & labelled).sum()), int(((df["split"] == "validation") & labelled).sum())))
    assert seen == expected


def test_outputs_have_the_layout_of_every_model(trained) -> None:
    cfg, paths = trained
    df = _table(paths)
    test_ids = set(df.loc[df["split"] == "test", "example_id"])
    contract = ["example_id", "domain"] + [f"{k}_{o}" for o in cfg.objective_names for k in ("p", "label", "mask", "truth")]
    for model, boosters in (("gbdt", set(cfg.objective_names)), ("gbdt_cell", {f"{d}__{o}" for d, o in cfg.cells()})):
        d = paths.model_dir(model)
        preds = pd.read_parquet(d / "predictions.parquet")
        assert list(preds.columns[:len(contract)]) == contract
        assert set(preds["example_id"]) == test_ids and preds["example_id"].is_monotonic_increasing
        assert preds[[f"p_{o}" for o in cfg.objective_names]].apply(lambda p: p.between(0, 1).all()).all()
        metrics = json.loads((d / "metrics.json").read_text())
        assert set(metrics["cells"]) == {f"{dd}/{o}" for dd, o in cfg.cells()} and metrics["kind"] == model
        assert all(c["ne"] == c["ne"] for c in metrics["cells"].values())  # every cell scored
        assert {p.stem for p in (d / "boosters").glob("*.txt")} == boosters
        summary = json.loads((d / "summary.json").read_text())
        assert any(b["best_round"] < MAX_ROUNDS for b in summary["boosters"].values())  # early stopping acts
        assert summary["params"]["deterministic"] and summary["params"]["seed"] == cfg.training.seed
        assert summary["fit_rows"] == int((df["split"] == "train").sum())
        # a saved booster scores as in training
        assert lgb.Booster(model_file=str(next((d / "boosters").glob("*.txt")))).num_trees() > 0
    enc = json.loads((paths.model_dir("gbdt") / "summary.json").read_text())["features"]
    assert "domain" in enc["categorical"]
    assert {v["encoding"] for v in enc["sparse"].values()} == {"categorical", "count"}  # tiny: both kinds occur


def test_evaluate_and_the_dags_show_the_teacher_beside_the_trees(trained) -> None:
    from lattice.evaluation.stages import evaluate
    from lattice.evaluation.versus import versus_lines, versus_trees
    from lattice.orchestration.spec import dag_specs

    cfg, paths = trained
    out = evaluate(cfg, paths, ["gbdt", "gbdt_cell"])
    assert set(out["models"]) == {"gbdt", "gbdt_cell"} and out["vs_trees"] is None  # no deep model to compare
    trees = {m: json.loads((paths.model_dir(m) / "metrics.json").read_text()) for m in ("gbdt", "gbdt_cell")}
    deep = {"cells": {c: {**v, "ne": v["ne"] - 0.5, "ne_se": 0.001} for c, v in trees["gbdt"]["cells"].items()}}
    versus = versus_trees({"teacher": deep, **trees})
    assert versus["summary"]["teacher"]["better"] == len(cfg.cells())
    assert versus_lines(versus)[0].startswith(f"teacher vs trees (gbdt, gbdt_cell): better in {len(cfg.cells())}")

    tasks = [t.task_id for s in dag_specs(cfg) if s.family == "train_teacher" for t in s.tasks]
    assert tasks[-3:] == ["train_gbdt", "train_gbdt_cell", "evaluate_vs_trees"]
    off = cfg.models.baselines.model_copy(update={"gbdt": False, "gbdt_cell": False})
    no_trees = cfg.model_copy(update={"models": cfg.models.model_copy(update={"baselines": off})})
    left = [t.task_id for s in dag_specs(no_trees) if s.family == "train_teacher" for t in s.tasks]
    assert not [t for t in left if "gbdt" in t or t == "evaluate_vs_trees"]
    assert left[:3] == ["train_teacher", "evaluate_teacher", "register_teacher"]  # the neural baselines follow, if any


def test_a_row_cap_samples_the_train_split_only_and_the_trees_refuse_torch_options(trained) -> None:
    from lattice.training.gbdt_stage import _fit_rows

    cfg, paths = trained
    split = np.array(["train"] * 50 + ["validation"] * 5 + ["test"] * 5, dtype=object)
    rows = _fit_rows(split, 20, seed=0)
    assert rows.sum() == 20 and not rows[50:].any()
    assert np.array_equal(rows, _fit_rows(split, 20, seed=0)) and _fit_rows(split, None, 0).sum() == 50
    with pytest.raises(ValueError, match="no teacher scores and no --resume"):
        train(cfg, paths, model="gbdt", resume=True)


def test_serving_paths_refuse_a_tree_model_saying_why(trained) -> None:
    from lattice.evaluation.stages import load_model

    cfg, paths = trained
    with pytest.raises(FileNotFoundError, match="gradient-boosted-trees baseline"):
        load_model(cfg, paths, "gbdt")
    with pytest.raises(FileNotFoundError, match="train it first"):
        load_model(cfg, paths, "student")  # never trained here


def test_a_windowed_run_fits_stops_and_tests_on_the_teachers_days(trained) -> None:
    """With training.window the boosters take the deep models' days (the demo's rounds and a DAG's
    windowed baselines compare them with a teacher tested on one day): fit on the train days'
    labelled rows, stop on the validation day, score the test day only."""
    cfg, paths = trained
    cfg = cfg.model_copy(update={"training": cfg.training.model_copy(update={"window": "3d"})})
    df = _table(paths)
    day = pd.to_datetime(df["event_timestamp"]).dt.strftime("%Y-%m-%d") if "date" not in df else df["date"].astype(str)
    days = sorted(day.unique())
    end = days[5]  # window: days[2], days[3] train, days[4] validation; test days[5]
    summary = train(cfg, paths, model="gbdt@win", progress=False, end=end)
    assert summary["test_rows"] == int((day == end).sum()) > 0
    assert summary["validation_rows"] == int((day == days[4]).sum())
    assert summary["fit_rows"] == int(day.isin(days[2:4]).sum())
    preds = pd.read_parquet(paths.model_dir("gbdt@win") / "predictions.parquet")
    assert set(preds["example_id"]) == set(df.loc[day == end, "example_id"])
