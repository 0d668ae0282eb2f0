"""The search space of `lattice tune` (`tune.space`), without training: keys are checked against
the config like any other config error, and a chosen value round-trips through `--set`."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from lattice.config import ConfigError, load_config
from lattice.tuning.space import as_overlay, as_sets, resolve
from lattice.tuning.stages import check_space

ROOT = Path(__file__).resolve().parents[2]


def _with_space(tmp_path: Path, space: dict) -> Path:
    data = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    data["tune"] = {"space": space}
    f = tmp_path / "demo.yaml"
    f.write_text(yaml.safe_dump(data, sort_keys=False))
    return f


def test_the_default_space_fits_every_shipped_config() -> None:
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        config = load_config(path)  # would raise on a default key that names nothing
        assert config.tune.space and config.tune.trials >= 1
        check_space(config)  # and every bound and choice makes a valid config


def test_a_bad_key_names_the_file_the_key_and_the_fix(tmp_path: Path) -> None:
    f = _with_space(tmp_path, {"training.lr_dence": {"low": 0.001, "high": 0.01},
                               "models.teacher.num_layers": {"low": 1.5, "high": 3},
                               "models.teacher": {"low": 1, "high": 2},
                               "features.sparse.no_such_feature.embedding_dim": {"choices": [8, 16]}})
    with pytest.raises(ConfigError) as exc:
        load_config(f)
    text = str(exc.value)
    assert f"{f}: tune.space.training.lr_dence" in text and "did you mean 'training.lr_dense'" in text
    assert "tune.space.models.teacher.num_layers" in text and "integer" in text
    assert "tune.space.models.teacher:" in text and "whole section" in text
    assert "tune.space.features.sparse.no_such_feature.embedding_dim" in text and "user_id" in text


def test_ranges_are_checked(tmp_path: Path) -> None:
    for bad, why in (({"low": 1, "high": 0}, "at most"), ({"low": 0, "high": 1, "log": True}, "log"),
                     ({"choices": [1], "low": 0, "high": 1}, "not both"), ({}, "neither")):
        with pytest.raises(ConfigError, match=why):
            load_config(_with_space(tmp_path, {"training.lr_dense": bad}))


def test_chosen_values_round_trip_through_set_and_the_overlay(tmp_path: Path) -> None:
    values = {"training.lr_dense": 1e-05, "models.teacher.dropout": 0.25, "models.teacher.embedding_dim": 64,
              "features.sparse.user_id.embedding_dim": 8, "models.teacher.domain_token": False}
    config = load_config(ROOT / "configs" / "demo.yaml", as_sets(values))
    data = config.model_dump(mode="json")
    assert {k: resolve(data, k)[0] for k in values} == values
    overlay = as_overlay(values)
    assert overlay["training"]["lr_dense"] == 1e-05 and overlay["features"]["sparse"]["user_id"]["embedding_dim"] == 8
