"""A user's own log through the feature stage: event identity (key or none), every split kind,
pass-through columns, any Spark time pattern, expression mappings, and errors that name the
domain, the source, the reason and the count."""

from __future__ import annotations

import pytest

from test_pipeline_helpers import paths_for, read_table, write_config

pytestmark = pytest.mark.slow

HEADER = "row_id,person,offer,segment,when,seen,visited,fold"


def rows(n: int, hour0: int = 0) -> list[str]:
    # hour h of 2026-01-0d in the user's yyyyMMddHH convention; offers carry a 'of-' prefix
    out = []
    for i in range(n):
        day, hour = 2 + (hour0 + i) // 24, (hour0 + i) % 24
        fold = "test" if i % 5 == 0 else ("dev" if i % 5 == 1 else "train")
        out.append(f"r{i},{i % 6},of-{i % 4},{'ab'[i % 2]},202601{day:02d}{hour:02d},{i % 3},{i % 2},{fold}")
    return out


def config_dict(data_root, **training) -> dict:
    return {
        "name": "userlog", "data_root": str(data_root),
        "time_range": {"start": "2026-01-01", "end": "2026-01-10"},
        "domains": [{"name": "shop", "min_rows": 1}],
        "objectives": [{"name": "visit", "domains": ["shop"]}],
        "sources": [{
            "name": "shop_log", "path": "log.csv", "format": "csv", "domain": "shop",
            "columns": {"person": "user_id", "segment": "segment", "seen": "seen"},
            "expressions": {"offer_id": "CAST(regexp_replace(offer, '^of-', '') AS INT) + 100"},
            "passthrough": ["row_id"],
            "event_time": {"column": "when", "format": "yyyyMMddHH"},
            "labels": {"visit": {"column": "visited"}},
        }],
        "features": {"sparse": [{"name": "user_id", "column": "user_id", "entity": True},
                                {"name": "offer_id", "column": "offer_id"},
                                {"name": "segment", "column": "segment"}],
                     "dense": [{"name": "seen", "column": "seen"}]},
        "training": training,
    }


def run(tmp, lines: list[str], name: str = "cfg.yaml", source: dict | None = None, **training):
    from pipelines.consolidate import ingest_and_consolidate

    (tmp / "data").mkdir(exist_ok=True)
    (tmp / "data" / "log.csv").write_text("\n".join([HEADER, *lines]) + "\n")
    data = config_dict(tmp / "data", **training)
    data["sources"][0].update(source or {})
    config = write_config(tmp, data, name)
    paths = paths_for(config, tmp / ("wd_" + name))
    return config, paths, ingest_and_consolidate(config, paths)


def test_identical_rows_are_distinct_events_without_a_key(spark, tmp_path):
    lines = rows(30)
    same = "x,1,of-1,a,2026010305,1,1,train"
    config, paths, res = run(tmp_path, [*lines, same, same, same])
    df = read_table(paths.consolidated)
    assert res["totals"]["rows_out"] == 33 and len(df) == 33 and df.example_id.is_unique
    assert res["sources"]["shop_log"]["identical_rows"] == 2
    assert res["quarantine_reasons"] == {}


def test_a_declared_key_deduplicates(spark, tmp_path):
    lines = rows(30)
    again = lines[3].replace(",0,train", ",0,train")  # the same row_id logged twice
    config, paths, res = run(tmp_path, [*lines, again], source={"key": ["row_id"]})
    assert res["quarantine_reasons"] == {"duplicate_key": 1}
    assert res["totals"]["rows_out"] == 30 and res["totals"]["balanced"]


def test_time_pattern_expressions_and_passthrough(spark, tmp_path):
    config, paths, res = run(tmp_path, rows(30))
    df = read_table(paths.consolidated).sort_values("row_id")
    assert res["quarantine_reasons"] == {} and len(df) == 30
    r = df.set_index("row_id").loc["r25"]
    assert str(r.event_timestamp)[:13] == "2026-01-03 01"  # 25 hours after 2026-01-02 00:00
    assert set(df.offer_id) == {100, 101, 102, 103}  # 'of-3' -> 3 + 100 through the expression
    assert sorted(df.row_id) == sorted(f"r{i}" for i in range(30))


def test_split_by_column(spark, tmp_path):
    lines = rows(30)
    config, paths, res = run(tmp_path, [*lines, "bad,1,of-1,a,2026010305,1,1,holdout"],
                             split={"kind": "column", "column": "fold"})
    df = read_table(paths.consolidated).set_index("row_id")
    for i in range(30):
        want = "test" if i % 5 == 0 else ("validation" if i % 5 == 1 else "train")
        assert df.loc[f"r{i}", "split"] == want
    assert res["quarantine_reasons"] == {"bad_split": 1}


def test_split_by_time(spark, tmp_path):
    config, paths, res = run(tmp_path, rows(72), split={"kind": "time", "validation_start": "2026-01-03T12:00:00",
                                                        "test_start": "2026-01-04T00:00:00"})
    df = read_table(paths.consolidated)
    ts = df.event_timestamp.dt.tz_localize(None) if df.event_timestamp.dt.tz is not None else df.event_timestamp
    assert (df.split == "test").sum() == 24 and (ts[df.split == "test"] >= "2026-01-04").all()
    assert (df.split == "validation").sum() == 12 and (df.split == "train").sum() == 36
    assert res["split"]["kind"] == "time"


def test_split_by_hash_matches_the_python_rule(spark, tmp_path):
    from lattice.data.split import hash_split

    config, paths, res = run(tmp_path, rows(200))
    df = read_table(paths.consolidated)
    assert list(df.split) == list(hash_split(config, df.example_id))
    assert 0.03 < (df.split == "test").mean() < 0.2


def test_a_source_whose_rows_all_fail_is_explained(spark, tmp_path):
    from pipelines.validate import ValidationFailed

    with pytest.raises(ValidationFailed) as err:
        run(tmp_path, rows(30), source={"event_time": {"column": "when", "format": "yyMMddHH"}})
    msg = str(err.value)
    assert "domain shop: 0 of 30 rows kept" in msg and "30 quarantined as bad_timestamp" in msg
    assert "source shop_log" in msg and "when=20260102" in msg and "quarantine" in msg


def test_bad_values_are_quarantined_with_their_reason(spark, tmp_path):
    """NaN / Infinity, a value outside a declared range, null-like and non-scalar keys, an id
    outside an exact-id table: each quarantined with its reason; a huge finite value is kept
    (the robust dense stats absorb it, tests/unit/test_loader.py)."""
    bad = {
        "b1,1,of-1,a,2026010305,NaN,1,train": "bad_value",
        "b2,1,of-1,a,2026010305,Infinity,1,train": "bad_value",
        "b3,1,of-1,a,2026010305,-1,1,train": "value_out_of_range",
        "b4,NULL,of-1,a,2026010305,1,1,train": "null_key",
        "b5,[1],of-1,a,2026010305,1,1,train": "null_key",
        "b6,1,of-7,a,2026010305,1,1,train": "bad_id",
    }
    lines = [*rows(30), *bad, "b7,1,of-1,a,2026010305,1e308,1,train"]
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "log.csv").write_text("\n".join([HEADER, *lines]) + "\n")
    data = config_dict(tmp_path / "data")
    data["features"]["dense"][0]["valid_range"] = [0, None]
    data["features"]["sparse"][1].update(hashing="none", num_embeddings=104)  # offers 100..103
    config = write_config(tmp_path, data)
    from pipelines.consolidate import ingest_and_consolidate

    paths = paths_for(config, tmp_path / "wd")
    res = ingest_and_consolidate(config, paths)
    q = read_table(paths.quarantine)
    got = dict(zip(q.raw.str.split(",").str[0], q.reason))
    assert got == {line.split(",")[0]: reason for line, reason in bad.items()}
    df = read_table(paths.consolidated)
    assert res["totals"]["rows_out"] == 31 and 1e308 in set(df.seen)


def test_a_chained_objective_cannot_fire_without_its_given(spark, tmp_path):
    data = config_dict(tmp_path / "data")
    data["objectives"].append({"name": "buy", "domains": ["shop"], "given": "visit"})
    data["sources"][0]["labels"]["buy"] = {"expr": "seen = 2"}
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "log.csv").write_text("\n".join([HEADER, *rows(30)]) + "\n")
    config = write_config(tmp_path, data)
    from pipelines.consolidate import ingest_and_consolidate

    res = ingest_and_consolidate(config, paths_for(config, tmp_path / "wd"))
    # seen = 2 where i % 3 == 2, visited = 0 where i is even: i = 2, 8, 14, 20, 26
    assert res["quarantine_reasons"] == {"bad_label": 5}


def test_the_embedded_spark_driver_listens_on_loopback(spark):
    conf = spark.sparkContext.getConf()
    assert conf.get("spark.driver.host") == "127.0.0.1" and conf.get("spark.driver.bindAddress") == "127.0.0.1"
