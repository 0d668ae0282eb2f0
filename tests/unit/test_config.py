"""Every shipped config loads; broken configs fail with the key path and the fix."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lattice.config import ConfigError, load_config, parse_config
from lattice.config.datacheck import data_problems, parse_time, strptime_format
from lattice.data.synth import generate

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
    # issue 40: a mapping to a column no feature reads would vanish silently; the fix names passthrough
    ("columns_target_not_a_feature", lambda d: d["sources"][0]["columns"].update(row_id="row_id"),
     "sources[0].columns.row_id", "'passthrough: [row_id]'"),
    # issue 38: leaf ids feed the teacher and the student only (a run without a fit is refused at
    # training: tests/unit/test_tree_leaves.py)
    ("leaves_not_a_network", lambda d: d.setdefault("models", {}).update(leaves={"models": ["mmoe"]}),
     "models.leaves", "teacher"),
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
    demo = str(ROOT / "configs" / "demo.yaml")
    ok = subprocess.run(cli + ["config", "check", "--no-data", demo], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "domain × objective" in ok.stdout and "video" in ok.stdout and "MiB" in ok.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(_mutate(_set("training.batchsize", 1))))
    res = subprocess.run(cli + ["config", "check", str(bad)], capture_output=True, text=True)
    assert res.returncode == 1
    assert "training.batchsize" in res.stderr and "unknown key" in res.stderr


def test_cli_config_check_reads_the_data(tmp_path: Path) -> None:
    """Without its data the demo config fails the check, and the message says how to make the data."""
    cli = [sys.executable, "-m", "lattice.cli", "config", "check", str(ROOT / "configs" / "demo.yaml")]
    env = {**os.environ, "LATTICE_DEMO_DATA": str(tmp_path / "absent")}
    res = subprocess.run(cli, capture_output=True, text=True, env=env)
    assert res.returncode == 1, res.stdout
    assert "1 problem(s) in" in res.stderr and "data_root" in res.stderr and "lattice synth --config" in res.stderr, res.stderr
    generate(load_config(ROOT / "configs" / "demo.yaml"), 300, tmp_path / "raw", progress=False)
    env["LATTICE_DEMO_DATA"] = str(tmp_path / "raw")
    ok = subprocess.run(cli, capture_output=True, text=True, env=env)
    assert ok.returncode == 0 and ok.stdout.rstrip().endswith("OK"), ok.stderr


def test_every_problem_is_listed() -> None:
    """A misspelt key, a bad choice and a cross-field problem in one file: all three are reported."""
    data = _mutate(lambda d: (_set("training.epoch", 3)(d), _set("features.sparse.0.hashing", "murmur")(d),
                              _set("objectives.0.domains", ["feed", "shorts"])(d)))
    with pytest.raises(ConfigError) as info:
        parse_config(data, "broken.yaml")
    paths = [p.path for p in info.value.problems]
    assert paths == ["features.sparse[0].hashing", "training.epoch", "objectives[0].domains[1]"], str(info.value)
    assert "did you mean 'epochs'?" in str(info.value) and "must be one of" in str(info.value)


def test_cross_field_rules_do_not_guess_past_a_bad_name() -> None:
    """A bad domain name is what the rules read: they are not run on a patched copy, so no
    invented 'unknown domain' problems follow the one real problem."""
    with pytest.raises(ConfigError) as info:
        parse_config(_mutate(_set("domains.0.name", "Feed Ads")), "broken.yaml")
    assert [p.path for p in info.value.problems] == ["domains[0].name"], str(info.value)


@pytest.mark.parametrize("mutation, path, suggestion", [
    (_set("training.epoch", 1), "training.epoch", "did you mean 'epochs'?"),
    (_set("trainig", {}), "trainig", "did you mean 'training'?"),
    (_set("sources.1.event_time.fromat", "iso"), "sources[1].event_time.fromat", "did you mean 'format'?"),
    (_set("sources.0.domain", {"colum": "site", "map": {"a": "feed"}}), "sources[0].domain.colum", "did you mean 'column'?"),
    (_set("sources.0.labels.click.colum", "x"), "sources[0].labels.click.colum", "did you mean 'column'?"),
    (_set("models.student.embeding_dim", 4), "models.student.embeding_dim", "did you mean 'embedding_dim'?"),
    (_set("training.zzz", 1), "training.zzz", "remove it or fix its spelling"),
])
def test_unknown_key_suggests_the_nearest(mutation, path: str, suggestion: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(_mutate(mutation), "broken.yaml")
    problem = next(p for p in info.value.problems if p.path == path)
    assert suggestion in problem.message and "valid keys: " in problem.message, problem.message


def test_duplicate_keys_are_refused(tmp_path: Path) -> None:
    text = (ROOT / "configs" / "demo.yaml").read_text()
    text = text.replace("training: {batch_size: 1024,", "training: {epochs: 5, batch_size: 1024,")  # epochs twice
    text = text.replace("    format: csv\n", "    format: csv\n    format: tsv\n", 1)
    bad = tmp_path / "dup.yaml"
    bad.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(bad)
    lines = text.splitlines()
    by_path = {p.path: p for p in info.value.problems}
    assert sorted(by_path) == ["sources[0].format", "training.epochs"], str(info.value)
    at = next(i for i, line in enumerate(lines, 1) if line.startswith("training:"))
    assert f"line {at}: duplicate key 'epochs'" in by_path["training.epochs"].message
    assert "keep one" in by_path["sources[0].format"].message and by_path["sources[0].format"].value == "tsv"


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


# ---------------------------------------------------------------- data checks (`lattice config check`)


def _mini(tmp_path: Path, fmt: str, values: list[str], path: str = "log.csv", column: str = "when"):
    """A one-source config over a csv of `values` in column `when` (time range: January 2026)."""
    (tmp_path / "log.csv").write_text("when,uid,clicked\n" + "".join(f"{v},{i},0\n" for i, v in enumerate(values)))
    return parse_config({
        "name": "mini", "data_root": str(tmp_path), "time_range": {"start": "2026-01-01", "end": "2026-02-01"},
        "domains": [{"name": "feed"}], "objectives": [{"name": "click", "domains": ["feed"]}],
        "sources": [{"name": "log", "path": path, "format": "csv", "domain": "feed", "columns": {"uid": "user_id"},
                     "event_time": {"column": column, "format": fmt}, "labels": {"click": {"column": "clicked"}}}],
        "features": {"sparse": [{"name": "user_id", "column": "user_id"}]},
    })


@pytest.mark.parametrize("pattern, expected", [
    ("yyMMddHH", "%y%m%d%H"),
    ("yyyy-MM-dd'T'HH:mm:ss.SSS", "%Y-%m-%dT%H:%M:%S.%f"),
    ("dd/MM/yyyy HH:mm", "%d/%m/%Y %H:%M"),
    ("EEE, d MMM yyyy h:mm a", "%a, %d %b %Y %I:%M %p"),
    ("yyyy-MM-dd HH:mm:ssXXX", "%Y-%m-%d %H:%M:%S%z"),
    ("yyyy 'at' HH''", "%Y at %H'"),
    ("yyyy-MM-dd G", None),  # era: not translated
    ("yyyy[-MM]", None),  # optional section
    ("yyyy-MM-dd HH:mm:ss.SSSSSSSSS", None),  # nanoseconds: strptime takes 6 digits
])
def test_spark_pattern_translation(pattern: str, expected: str | None) -> None:
    assert strptime_format(pattern) == expected


@pytest.mark.parametrize("fmt, value, expected", [
    ("yyMMddHH", "14102103", "2014-10-21 03:00:00"),
    ("yyMMddHH", "70010100", "2070-01-01 00:00:00"),  # Spark's two-digit years are 2000-2099
    ("yyyy-MM-dd HH:mm:ssXXX", "2026-01-03 12:00:00+01:00", "2026-01-03 11:00:00"),
    ("iso", "2026-01-03T12:00:00Z", "2026-01-03 12:00:00"),
    ("iso", "2026-1-3 1:02:03.5", "2026-01-03 01:02:03.500000"),
    ("iso", "2026-01-03", "2026-01-03 00:00:00"),
    ("unix_seconds", "1767225600", "2026-01-01 00:00:00"),
    ("unix_millis", "1767225600000", "2026-01-01 00:00:00"),
])
def test_parse_time(fmt: str, value: str, expected: str) -> None:
    assert str(parse_time(fmt, value)) == expected


@pytest.mark.parametrize("fmt, value", [
    ("yyyyMMddHH", "14102100"),  # MM takes exactly two digits: '21' is no month (strptime alone reads 1410-02-10)
    ("yyyy-MM-dd", "2026-01-03 12:00:00"),
    ("iso", "03/01/2026"),
    ("unix_seconds", "2026-01-03"),
    ("MM/dd/yyyy", "13/01/2026"),
])
def test_parse_time_refuses(fmt: str, value: str) -> None:
    with pytest.raises(ValueError):
        parse_time(fmt, value)


def test_time_format_failing_on_the_first_rows_names_file_value_and_fix(tmp_path: Path) -> None:
    problems = data_problems(_mini(tmp_path, "yyMMddHH", ["2026010312", "2026010313"]))
    assert [p.path for p in problems] == ["sources[0].event_time.format"]
    message = problems[0].message
    assert str(tmp_path / "log.csv") in message and "`when`" in message and "'2026010312'" in message
    assert message.endswith("try 'yyyyMMddHH'"), message
    assert data_problems(_mini(tmp_path, "yyyyMMddHH", ["2026010312", "2026010313"])) == []


def test_time_format_failing_on_some_rows(tmp_path: Path) -> None:
    values = ["03/01/2026", "13/01/2026"]
    assert data_problems(_mini(tmp_path, "dd/MM/yyyy", values)) == []
    (problem,) = data_problems(_mini(tmp_path, "MM/dd/yyyy", values))
    assert "fails on 1 of the first 2 values" in problem.message and "'13/01/2026'" in problem.message


def test_times_that_parse_outside_the_time_range(tmp_path: Path) -> None:
    (problem,) = data_problems(_mini(tmp_path, "unix_millis", ["1767225600", "1767229200"]))  # seconds, read as millis
    assert "outside time_range" in problem.message and "try 'unix_seconds'" in problem.message, problem.message


def test_untranslatable_pattern_is_a_note_not_a_problem(tmp_path: Path) -> None:
    notes: list[str] = []
    assert data_problems(_mini(tmp_path, "yyyy-MM-dd G", ["2026-01-03 AD"]), notes) == []
    assert len(notes) == 1 and "skipped" in notes[0] and "sources[0].event_time.format" in notes[0]


def test_missing_files_and_columns(tmp_path: Path) -> None:
    (problem,) = data_problems(_mini(tmp_path, "iso", ["2026-01-03"], path="logs/*.csv"))
    assert problem.path == "sources[0].path" and str(tmp_path / "logs" / "*.csv") in problem.message
    (problem,) = data_problems(_mini(tmp_path, "iso", ["2026-01-03"], column="hour"))
    assert problem.path == "sources[0]" and "lacks column(s) ['hour']" in problem.message


def test_demo_data_checks(tmp_path: Path) -> None:
    demo = load_config(ROOT / "configs" / "demo.yaml")
    (problem,) = data_problems(demo.model_copy(update={"data_root": str(tmp_path / "raw")}))
    assert problem.path == "data_root" and "lattice synth --config" in problem.message and "lattice demo" in problem.message
    generate(demo, 300, tmp_path / "raw", progress=False)  # csv, parquet and jsonl sources
    notes: list[str] = []
    # its own work dir too: the notes read the hashing fit of a demo already run in the checkout
    isolated = demo.model_copy(update={"data_root": str(tmp_path / "raw"), "workdir": str(tmp_path / "work")})
    assert data_problems(isolated, notes) == [] and notes == []


@pytest.mark.parametrize("path", [p for p in CONFIGS if p.stem != "demo"], ids=[p.stem for p in CONFIGS if p.stem != "demo"])
def test_shared_data_configs_pass_the_data_checks(path: Path, shared_data: Path, monkeypatch) -> None:
    monkeypatch.setenv("LATTICE_SHARED_DATA", str(shared_data))  # the configs' default is relative to the current directory
    assert data_problems(load_config(path)) == []


def test_config_check_notes_ranks_above_the_cores() -> None:
    from lattice.config.notes import speed_notes

    cfg = parse_config(_mutate(_set("training.nproc", 2)), "demo.yaml")
    note = speed_notes(cfg, cores=2, gpu=False)
    assert len(note) == 1 and "1.5-1.8x slower" in note[0] and "nproc: 0" in note[0]
    assert speed_notes(cfg, cores=16, gpu=False) == []  # cores to spare: nothing measured against it
    assert speed_notes(cfg, cores=2, gpu=True) == []  # one rank per GPU is the point of ranks
    one = parse_config(_mutate(_set("training.nproc", 1)), "demo.yaml")
    assert speed_notes(one, cores=2, gpu=False) == []
