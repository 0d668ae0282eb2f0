"""The shipped real-data configs go through the same Spark pipeline: Avazu (headerless dev/test
csv, site vs app domains from a column map with a default), Taobao (domain from a Spark SQL
expression, labels from expressions, timestamps outside the range quarantined), and Criteo,
Douban and MIND."""

from __future__ import annotations

import pytest

from lattice.data import schema as S

from test_pipeline_helpers import config_with, paths_for, read_table

pytestmark = pytest.mark.slow


def _run(root, name, tmp, shared_data, monkeypatch):
    from pipelines.consolidate import ingest_and_consolidate

    monkeypatch.setenv("LATTICE_SHARED_DATA", str(shared_data))
    config = config_with(root, name, {"workdir": str(tmp / "wd")}, tmp)
    paths = paths_for(config, tmp / "wd")
    return config, paths, ingest_and_consolidate(config, paths)


def test_avazu_two_domains_from_headered_and_headerless_csv(spark, root, tmp_path, shared_data, monkeypatch):
    config, paths, res = _run(root, "avazu", tmp_path, shared_data, monkeypatch)
    assert [res["sources"][s]["files"] for s in ("avazu_train", "avazu_dev", "avazu_test")] == [1, 1, 1]
    assert [res["sources"][s]["rows_in"] for s in ("avazu_train", "avazu_dev", "avazu_test")] == [8087, 480, 432]
    assert res["totals"]["balanced"] and res["totals"]["rows_in"] == 8999
    df = read_table(paths.consolidated)
    assert set(df.domain.unique()) == {"site", "app"}
    app = df[df.domain == "app"]
    from lattice.data.schema import stable_id

    assert (app.site_id == stable_id("85f751fd")).all()
    assert df.event_timestamp.min().strftime("%Y-%m-%d %H") == "2014-10-21 00"
    assert df.mask_click.eq(1).all() and 0.05 < df.label_click.mean() < 0.4
    assert res["totals"]["rows_out"] + res["totals"]["quarantined"] == 8999
    # the files are the split (kind source), and Avazu's own id travels with every row
    assert df.groupby("split").size().to_dict() == {"train": 8087, "validation": 480, "test": 432}
    assert df.id.notna().all() and df.id.is_unique


def test_taobao_expressions_and_out_of_range_timestamps(spark, root, tmp_path, shared_data, monkeypatch):
    config, paths, res = _run(root, "taobao", tmp_path, shared_data, monkeypatch)
    # 84,475 full lines plus a last line cut short (4 of 5 columns, no newline): malformed
    assert res["totals"]["rows_in"] == 84476 and res["totals"]["balanced"]
    assert res["quarantine_reasons"]["malformed_line"] == 1
    assert res["quarantine_reasons"]["timestamp_out_of_range"] == 1390
    assert set(res["quarantine_reasons"]) <= {"timestamp_out_of_range", "malformed_line"}
    df = read_table(paths.consolidated)
    assert set(df.domain.unique()) == {"group_a", "group_b", "group_c"}
    grp = (df.category_id % 3).map({0: "group_a", 1: "group_b", 2: "group_c"})
    assert (grp.astype(str) == df.domain.astype(str)).all()
    assert (df.label_buy <= df.label_engage).all()  # buy implies engage
    assert 0.05 < df.label_engage.mean() < 0.2 and df.label_buy.sum() > 0


@pytest.mark.parametrize("name,rows", [("criteo", 8000), ("douban", 3000), ("mind", 8000)])
def test_other_shipped_configs(spark, root, tmp_path, shared_data, monkeypatch, name, rows):
    config, paths, res = _run(root, name, tmp_path, shared_data, monkeypatch)
    assert res["totals"]["rows_in"] == rows and res["totals"]["balanced"]
    df = read_table(paths.consolidated)
    assert set(df.columns) == set(S.consolidated_columns(config))
    assert set(df.domain.astype(str).unique()) == set(config.domain_names)
    assert len(df) == res["totals"]["rows_out"]
