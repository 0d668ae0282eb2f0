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
        "leaves": m.leaves.model_copy(update={"num_trees": 12, "num_leaves": 7})})})


@pytest.fixture(scope="module")
def fitted(tmp_path_factory):
    base = tmp_path_factory.mktemp("trees")
    cfg = _config(base / "raw")
    generate(cfg, 4_000, base / "raw", progress=False)
    paths = Paths.for_config(cfg, base / "work")
    write_local_table(cfg, paths, row_group_size=700)
    seen: list[tuple[int, int]] = []
    real = lgb.train

    def recording(params, train_set, *args, **kwargs):  # instrument: the rows each fit and its early stop read
        booster = real(params, train_set, *args, **kwargs)
        valid = kwargs.get("valid_sets") or []
        seen.append((train_set.num_data(), valid[0].num_data() if valid else 0))
        return booster

    lgb.train = recording
    try:
        manifest = fit_trees(cfg, paths)
    finally:
        lgb.train = real
    return cfg, paths, manifest, seen


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


def test_leaves_on_is_refused_naming_the_command() -> None:
    import yaml
    d = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    d.setdefault("models", {})["leaves"] = {"models": ["teacher"]}
    with pytest.raises(ConfigError, match="lattice trees fit"):
        parse_config(d, "x.yaml")
