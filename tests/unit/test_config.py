"""Every shipped config loads; broken configs fail with the key path and the fix."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lattice.config import ConfigError, load_config, parse_config

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_every_shipped_config_loads(path: Path) -> None:
    cfg = load_config(path)
    assert cfg.cells(), "a config must have at least one labelled (domain, objective) cell"
    assert cfg.source_file == str(path.resolve())


def test_demo_config_shape() -> None:
    cfg = load_config(ROOT / "configs" / "demo.yaml")
    assert cfg.domain_names == ["feed", "search", "video"]
    assert cfg.objective_names == ["click", "conversion"]
    assert ("video", "conversion") not in cfg.cells()
    assert len(cfg.cells()) == 5


def _demo() -> dict:
    return yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())


def _mutate(fn):
    data = copy.deepcopy(_demo())
    fn(data)
    return data


def _set(path: str, value):
    def fn(d):
        keys = path.split(".")
        cur = d
        for k in keys[:-1]:
            cur = cur[int(k)] if k.isdigit() else cur[k]
        last = keys[-1]
        if last.isdigit():
            cur[int(last)] = value
        else:
            cur[last] = value
    return fn


def _del(path: str):
    def fn(d):
        keys = path.split(".")
        cur = d
        for k in keys[:-1]:
            cur = cur[int(k)] if k.isdigit() else cur[k]
        del cur[keys[-1]]
    return fn


# (id, mutation, key path expected in the message, words of the fix expected in the message)
BROKEN = [
    ("unknown_top_key", _set("trainnig", {}), "trainnig", "unknown key"),
    ("unknown_nested_key", _set("training.batchsize", 10), "training.batchsize", "unknown key"),
    ("missing_time_range", _del("time_range"), "time_range", "required key is missing"),
    ("objective_unknown_domain", _set("objectives.0.domains", ["feed", "shorts"]), "objectives[0].domains[1]", "declare it under 'domains'"),
    ("source_unknown_domain", _set("sources.0.domain", "homepage"), "sources[0].domain", "declare it under 'domains'"),
    ("feature_column_not_provided", _set("features.dense.0.column", "bid_amount"), "features.dense[0].column", "no source maps a raw column"),
    ("duplicate_domain", lambda d: d["domains"].append({"name": "feed"}), "domains", "duplicate name 'feed'"),
    ("duplicate_feature", lambda d: d["features"]["dense"].append({"name": "price", "column": "price"}), "features", "duplicate name 'price'"),
    ("student_larger_than_teacher", _set("models.student.embedding_dim", 64), "models.student.embedding_dim", "larger than its teacher"),
    ("bad_format", _set("sources.1.format", "xlsx"), "sources[1].format", "must be one of"),
    ("bad_hashing", _set("features.sparse.0.hashing", "murmur"), "features.sparse[0].hashing", "must be one of"),
    ("bad_transform", _set("features.dense.0.transform", "sqrt"), "features.dense[0].transform", "must be one of"),
    ("negative_loss_weight", _set("objectives.0.loss_weight", -1), "objectives[0].loss_weight", "greater than 0"),
    ("bad_window", _set("features.aggregates.0.windows", ["1w"]), "features.aggregates[0].windows", "'12h' or '7d'"),
    ("aggregate_non_entity", _set("features.aggregates.0.entity", "device"), "features.aggregates[0].entity", "entity: true"),
    ("label_unknown_objective", _set("sources.2.labels", {"click": {"column": "is_click"}, "view": {"column": "v"}}), "sources[2].labels.view", "unknown objective"),
    ("label_both_column_and_expr", _set("sources.0.labels.click", {"column": "clicked", "expr": "clicked > 0"}), "sources[0].labels.click", "exactly one of"),
    ("headerless_csv_without_schema", _set("sources.0.header", False), "sources[0]", "schema_columns"),
    ("time_range_reversed", _set("time_range", {"start": "2026-02-01", "end": "2026-01-01"}), "time_range", "must be after start"),
    ("bad_name", _set("domains.0.name", "Feed Ads"), "domains[0].name", "lower-case"),
    ("domain_without_source", lambda d: d["domains"].append({"name": "shorts"}), "domains[3]", "no source feeds this domain"),
    ("objective_domain_without_label", _set("objectives.1.domains", ["feed", "search", "video"]), "objectives[1].domains", "no source of domain 'video'"),
    ("given_unknown_objective", _set("objectives.1.given", "purchase"), "objectives[1].given", "must name another objective"),
    ("given_itself", _set("objectives.1.given", "conversion"), "objectives[1].given", "must name another objective"),
    ("given_fewer_domains", lambda d: (d["objectives"][0].update(domains=["feed"]), d["objectives"][1].update(given="click")),
     "objectives[1].given", "not labelled in every domain"),
    ("schedule_both", _set("schedules.distill", {"cron": "@daily", "asset": "teacher"}), "schedules.distill", "not both"),
]


@pytest.mark.parametrize("case_id,mutation,key,fix", BROKEN, ids=[b[0] for b in BROKEN])
def test_broken_config_names_key_and_fix(case_id, mutation, key, fix) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(_mutate(mutation), "broken.yaml")
    text = str(info.value)
    assert "broken.yaml: " in text
    assert any(p.path == key or p.path.startswith(key) for p in info.value.problems), text
    assert fix in text, text


def test_yaml_syntax_error_names_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ndomains: [a, b\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: line \d+"):
        load_config(bad)


def test_missing_file() -> None:
    with pytest.raises(ConfigError, match="config file not found"):
        load_config("configs/nope.yaml")


def test_env_expansion(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("LATTICE_DEMO_DATA", str(tmp_path))
    assert load_config(ROOT / "configs" / "demo.yaml").data_root == str(tmp_path)


def test_cli_config_check(tmp_path: Path) -> None:
    cli = [sys.executable, "-m", "lattice.cli"]
    ok = subprocess.run(cli + ["config", "check", str(ROOT / "configs" / "demo.yaml")], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "domain × objective" in ok.stdout and "video" in ok.stdout and "MiB" in ok.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(_mutate(_set("training.batchsize", 1))))
    res = subprocess.run(cli + ["config", "check", str(bad)], capture_output=True, text=True)
    assert res.returncode == 1
    assert "training.batchsize" in res.stderr and "unknown key" in res.stderr


def test_set_overrides_change_values_and_named_entries() -> None:
    demo = ROOT / "configs" / "demo.yaml"
    cfg = load_config(demo, ["training.epochs=1", "models.teacher.shared_dims=[256, 128]", "objectives.conversion.given=click",
                             "features.sparse.user_id.num_embeddings=1000"])
    assert cfg.training.epochs == 1
    assert cfg.models.teacher.shared_dims == [256, 128]
    assert next(o for o in cfg.objectives if o.name == "conversion").given == "click"
    assert next(f for f in cfg.features.sparse if f.name == "user_id").num_embeddings == 1000
    assert load_config(demo).training.epochs != 1  # the file is untouched


@pytest.mark.parametrize("override, expected", [
    ("training.epochs", "KEY.PATH=VALUE"),  # no '='
    ("objectives.purchase.loss_weight=2", "no such section or named entry"),
    ("training.batchsize=8", "unknown key"),  # caught by validation, with the path
    ("training.epochs=-1", "training.epochs"),
])
def test_bad_set_override_names_the_key(override: str, expected: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(ROOT / "configs" / "demo.yaml", [override])
    assert expected in str(info.value) and "demo.yaml" in str(info.value)
