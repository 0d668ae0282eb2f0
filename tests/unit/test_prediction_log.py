"""The prediction log and /metrics through the real app (`create_app`) with a stand-in server (a
fixed-score model, a stub online store): what a clean stop leaves on disk, what an unwritable
folder or a full queue costs (counted drops, never a failed request), and /metrics in
Prometheus' text format."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pyarrow.dataset as ds
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from lattice.config import load_config
from lattice.monitoring.compact import log_dataset
from lattice.monitoring.records import LogSchema, log_dir
from lattice.paths import Paths
from lattice.serving.app import Server, create_app
from lattice.serving.prediction_log import PredictionLogWriter
from lattice.serving.requests import RequestSchema
from lattice.serving.slot import ModelSlot

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def config():
    return load_config(ROOT / "configs" / "demo.yaml")


class _Model:
    """p(click) = 0.1 + price / 100 (so the logged feature and the score can be checked together)."""

    def __init__(self, config):
        self.config = config
        self.info = SimpleNamespace(name="stub", model="student", tags={})
        self.metadata, self.checksum = {}, "abc"

    def predict_columns(self, cols):
        click = 0.1 + cols.dense["price"] / 100
        return {"click": click, "conversion": np.full(len(cols), 0.02)}


class _Online:
    """user 404 is unknown; with `down`, every read is a fallback (the store cannot be read)."""

    mode = "stub"

    def __init__(self, config, down: bool = False):
        self.entity_keys = ["ad_id", "user_id"]
        self.down, self.fallbacks, self.reads = down, 0, 0
        self.agg = [f"{a.name}_{s}_{w}" for a in config.features.aggregates for w in a.windows for s in a.statistics]

    def lookup_ids(self, ids):
        users = ids["user_id"]
        n = len(users)
        if self.down:
            self.fallbacks += 2 * n
            return {c: np.zeros(n) for c in self.agg}, [["ad_id", "user_id"] for _ in range(n)]
        self.reads += n
        return {c: np.full(n, 3.0) for c in self.agg}, [["user_id"] if u == 404 else [] for u in users.tolist()]


def _app(config, workdir: Path, down: bool = False, replay_clock: bool = False, **log):
    mon = config.monitoring.model_copy(update={"prediction_log": config.monitoring.prediction_log.model_copy(update=log)})
    cfg = config.model_copy(update={"monitoring": mon})
    server = Server.__new__(Server)
    server.config, server.paths, server.schema = cfg, None, RequestSchema(cfg)
    model = _Model(cfg)
    server.slot = ModelSlot(lambda: 7, lambda version: model, poll_seconds=3600)
    server.online = _Online(cfg, down)
    return create_app(cfg, Paths(workdir=workdir, data_root=ROOT), server=server, replay_clock=replay_clock)


def _req(i: int, domain: str = "feed", user: int = 1, price: float | None = 5.0) -> dict:
    feats = {"device": 3} if price is None else {"device": 3, "price": price}
    return {"request_id": f"r{i}", "domain": domain, "entities": {"user_id": user, "ad_id": 9}, "features": feats}


def _families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def _value(families: dict, name: str, sample: str, **labels) -> float:
    for s in families[name].samples:
        if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
            return s.value
    raise AssertionError(f"no sample {sample}{labels} in {name}")


def test_clean_stop_keeps_every_acknowledged_record(config, tmp_path):
    # a long flush interval: only the clean stop can have written these records
    with TestClient(_app(config, tmp_path, flush_seconds=3600, flush_records=10_000)) as client:
        assert client.post("/predict", json=_req(0)).status_code == 200
        batch = {"requests": [_req(1, price=20.0), _req(2, "search", user=404, price=None)]}
        assert client.post("/predict", json=batch).status_code == 200
        assert not list(log_dir(tmp_path).rglob("part-*"))  # nothing written yet
    files = list(log_dir(tmp_path).rglob("part-*.arrow"))  # serving's parts: Arrow, for the monitor to compact
    assert files and all(f.parent.name.startswith("hour=") for f in files)
    t = log_dataset(log_dir(tmp_path)).to_table().to_pandas()
    t = t.sort_values("request_id").reset_index(drop=True)
    assert t["request_id"].tolist() == ["r0", "r1", "r2"]
    assert t["domain"].tolist() == ["feed", "feed", "search"]
    assert t["model_version"].tolist() == [7, 7, 7]
    assert t["origin"].tolist() == ["serve"] * 3
    assert t["user_id"].tolist() == [1, 1, 404]
    assert t["unknown_entities"].tolist() == ["", "", "user_id"]
    # the feature the model used and the score it gave, row by row
    assert t["p_click"].tolist() == pytest.approx([0.15, 0.3, 0.1])
    assert t["f.price"].iloc[:2].tolist() == [5.0, 20.0] and np.isnan(t["f.price"].iloc[2])  # not sent: null
    assert t["f.user_click_count_1d"].tolist() == [3.0, 3.0, 3.0]
    assert t["f.device"].tolist() == [3, 3, 3]
    assert t["hour"].iloc[0] == t["logged_at"].iloc[0].strftime("%Y-%m-%dT%H")


def test_a_replay_logs_the_time_it_sends_and_a_live_server_refuses_it(config, tmp_path):
    """`--replay-clock`: a past day's traffic replayed through the server is logged at the time
    each request names (so the monitor's periods are that day's); a bad time is a 400 that names
    the forms. Without the flag the header is a 400: a live server's log time is its own."""
    with TestClient(_app(config, tmp_path / "live")) as client:
        r = client.post("/predict", json=_req(0), headers={"X-Lattice-Logged-At": "2026-01-12T12:00:00Z"})
        assert r.status_code == 400 and "--replay-clock" in r.json()["detail"]
    with TestClient(_app(config, tmp_path / "replay", replay_clock=True)) as client:
        assert client.post("/predict", json=_req(1), headers={"X-Lattice-Logged-At": "2026-01-12T12:00:00Z"}).status_code == 200
        batch = {"requests": [_req(2), _req(3)]}
        assert client.post("/predict", json=batch, headers={"X-Lattice-Logged-At": "2026-01-13T08:30"}).status_code == 200
        assert client.post("/predict", json=_req(4), headers={"X-Lattice-Logged-At": "1767225600"}).status_code == 200
        assert client.post("/predict", json=_req(5)).status_code == 200  # no header: now
        for bad in ("yesterday", "nan", "inf"):
            r = client.post("/predict", json=_req(6), headers={"X-Lattice-Logged-At": bad})
            assert r.status_code == 400 and "ISO 8601" in r.json()["detail"], bad
    t = log_dataset(log_dir(tmp_path / "replay")).to_table().to_pandas()
    at = dict(zip(t["request_id"], t["logged_at"]))
    assert sorted(at) == ["r1", "r2", "r3", "r4", "r5"]  # the refused request is not logged
    assert at["r1"] == pd.Timestamp("2026-01-12T12:00:00Z")
    assert at["r2"] == at["r3"] == pd.Timestamp("2026-01-13T08:30:00Z")  # a naive time is UTC
    assert at["r4"] == pd.Timestamp("2026-01-01T00:00:00Z")
    assert at["r5"] > pd.Timestamp("2026-06-01T00:00:00Z")
    assert sorted(set(t["hour"])) == sorted({"2026-01-12T12", "2026-01-13T08", "2026-01-01T00", at["r5"].strftime("%Y-%m-%dT%H")})
    assert not (tmp_path / "live" / "prediction_log").exists() or not list(log_dir(tmp_path / "live").rglob("part-*"))


def test_unwritable_folder_counts_drops_and_still_answers(config, tmp_path):
    (tmp_path / "prediction_log").write_text("a file where the log's folder should be")  # mkdir fails, even as root
    with TestClient(_app(config, tmp_path, flush_seconds=0.05)) as client:
        for i in range(3):
            assert client.post("/predict", json=_req(i)).status_code == 200
        client.app.state.ops.writer.flush()
        health = client.get("/healthz").json()
        assert health["prediction_log"]["dropped"] == {"write_error": 3}
        assert "3 record(s) dropped" in health["warnings"][0]
        fam = _families(client.get("/metrics").text)
        assert _value(fam, "lattice_prediction_log_dropped", "lattice_prediction_log_dropped_total", reason="write_error") == 3


def test_full_queue_drops_and_counts(config, tmp_path):
    schema = LogSchema(config)
    writer = PredictionLogWriter(schema, tmp_path, queue_records=2, flush_seconds=3600, flush_records=100)
    cols = dict(logged_at=0.0, origin="serve", domain=["feed"], model_version=1, entities={}, passthrough={},
                probabilities={o: np.zeros(1) for o in schema.objectives}, unknown=[[]], store_error=False, sparse={}, dense={})
    assert writer.submit(1, request_id=["a"], **cols) and writer.submit(1, request_id=["b"], **cols)
    assert not writer.submit(1, request_id=["c"], **cols)
    assert writer.dropped == {"queue_full": 1}


def test_metrics_parse_and_count_cells(config, tmp_path):
    with TestClient(_app(config, tmp_path)) as client:
        client.post("/predict", json=_req(0, price=10.0))
        client.post("/predict", json={"requests": [_req(1, price=30.0), _req(2, "search", user=404),
                                                   _req(3, "search", user=404)]})
        client.post("/predict", content=b"not json", headers={"content-type": "application/json"})
        client.get("/healthz")
        fam = _families(client.get("/metrics").text)
    count = lambda d, o: _value(fam, "lattice_predictions", "lattice_predictions_total", domain=d, objective=o)
    total = lambda d, o: _value(fam, "lattice_prediction_probability_sum", "lattice_prediction_probability_sum_total",
                                domain=d, objective=o)
    assert (count("feed", "click"), count("search", "click"), count("search", "conversion")) == (2, 2, 2)
    assert total("feed", "click") == pytest.approx(0.2 + 0.4)  # p = 0.1 + price / 100
    # two unknown users in one batch: counted per key, once for the batch
    assert _value(fam, "lattice_unknown_entities", "lattice_unknown_entities_total", entity="user_id") == 2
    assert _value(fam, "lattice_online_store_errors", "lattice_online_store_errors_total") == 0
    assert _value(fam, "lattice_responses", "lattice_responses_total", route="/predict", status="200") == 2
    assert _value(fam, "lattice_responses", "lattice_responses_total", route="/predict", status="422") == 1
    assert _value(fam, "lattice_request_duration_seconds", "lattice_request_duration_seconds_count", route="/predict") == 3
    assert _value(fam, "lattice_model_version", "lattice_model_version") == 7


def test_store_errors_are_not_unknown_entities(config, tmp_path):
    with TestClient(_app(config, tmp_path, down=True)) as client:
        assert client.post("/predict", json={"requests": [_req(1), _req(2)]}).status_code == 200
        fam = _families(client.get("/metrics").text)
        ops = client.app.state.ops
        ops.writer.flush()
    assert _value(fam, "lattice_online_store_errors", "lattice_online_store_errors_total") == 4  # 2 rows x 2 keys
    assert "lattice_unknown_entities_total" not in {s.name for s in fam["lattice_unknown_entities"].samples}
    t = log_dataset(log_dir(tmp_path)).to_table().to_pandas()
    assert t["store_error"].tolist() == [True, True]


def test_passthrough_keys_are_checked_and_logged(config, tmp_path):
    src = config.sources[0].model_copy(update={"passthrough": ["impression_id"]})
    cfg = config.model_copy(update={"sources": [src, *config.sources[1:]]})
    with TestClient(_app(cfg, tmp_path)) as client:
        ok = client.post("/predict", json=dict(_req(0), passthrough={"impression_id": "imp-1"}))
        bad = client.post("/predict", json=dict(_req(1), passthrough={"row": 3}))
    assert ok.status_code == 200, ok.text
    assert bad.status_code == 422 and "impression_id" in bad.json()["detail"]
    t = log_dataset(log_dir(tmp_path)).to_table().to_pandas()
    assert t["impression_id"].tolist() == ["imp-1"]


def test_batch_scoring_writes_serving_schema(config, tmp_path):
    import pandas as pd

    from lattice.monitoring.records import frame_batch, write_partitioned

    schema = LogSchema(config)
    frame = pd.DataFrame({"example_id": ["e1", "e2"], "domain": ["feed", "video"], "user_id": [1, 2],
                          "ad_id": [5.0, np.nan], "device": pd.array([3, None], dtype="Int64"),
                          "price": [2.0, 0.0], "price_present": [1, 0], "user_click_count_1d": [4.0, 0.0]})
    table = frame_batch(schema, frame, {"click": np.array([0.1, 0.2]), "conversion": np.array([0.01, 0.0])},
                        [[], ["ad_id"]], model_version=3, logged_at=1_767_618_000.0)  # 2026-01-05T13:00Z
    assert table.schema == schema.schema
    write_partitioned(table, tmp_path)
    t = ds.dataset(str(tmp_path), format="parquet", partitioning="hive").to_table().to_pandas()
    assert t["hour"].tolist() == ["2026-01-05T13"] * 2
    assert t["request_id"].tolist() == ["e1", "e2"] and t["origin"].tolist() == ["batch"] * 2
    assert t["ad_id"].iloc[0] == 5 and pd.isna(t["ad_id"].iloc[1])
    assert t["f.device"].iloc[0] == 3 and pd.isna(t["f.device"].iloc[1])
    assert t["f.price"].iloc[0] == 2.0 and pd.isna(t["f.price"].iloc[1])  # present = 0: null, not 0.0
    assert t["f.user_click_count_1d"].tolist() == [4.0, 0.0]
    assert t["unknown_entities"].tolist() == ["", "ad_id"]


def test_both_off(config, tmp_path):
    cfg = config.model_copy(update={"monitoring": config.monitoring.model_copy(update={"metrics": False})})
    with TestClient(_app(cfg, tmp_path, enabled=False)) as client:
        assert client.post("/predict", json=_req(0)).status_code == 200
        assert client.get("/metrics").status_code == 404
        assert client.get("/healthz").json()["prediction_log"] is None
    assert not log_dir(tmp_path).exists()


def _item(rid: str, n: int, version, price, origin="serve", logged_at=1_767_618_000.0):
    ids = lambda *v: (np.array(v, np.int64), np.array([x % 2 == 0 for x in v], bool))
    return dict(request_id=[f"{rid}{i}" for i in range(n)], logged_at=logged_at + n, origin=origin,
                domain=["feed"] * n, model_version=version, entities={"user_id": ids(*range(n)), "ad_id": ids(*range(n))},
                passthrough={}, probabilities={"click": np.full(n, 0.1 * n), "conversion": np.zeros(n)},
                unknown=[["ad_id"]] * n, store_error=n == 2, sparse={"device": ids(*[5] * n)},
                dense={} if price is None else {"price": np.full(n, price)},
                dense_present={} if price is None else {"price": np.array([i % 3 != 0 for i in range(n)])})


def test_a_chunk_filled_request_by_request_makes_each_requests_rows(config):
    """Requests copied one after another into one chunk (whatever each carried) give the rows
    of each request's own table; a chunk refilled after a reset keeps nothing of its last rows
    (a column the new request lacks is null, not the old value)."""
    import pyarrow as pa

    from lattice.monitoring.records import LogChunk, record_batch

    schema = LogSchema(config)
    items = [_item("a", 1, 4, 2.5), _item("b", 2, None, None, origin="batch"), _item("c", 3, 5, 1.0)]
    chunk = LogChunk(schema, 8)
    for c in items:
        chunk.put(0, len(c["request_id"]), **c)
    assert chunk.n == 6 and chunk.room == 2
    separate = pa.concat_tables([record_batch(schema, **c) for c in items])
    assert chunk.table().equals(separate)
    assert separate.column("model_version").to_pylist() == [4, None, None, 5, 5, 5]
    assert separate.column("f.price").to_pylist() == [None, None, None, None, 1.0, 1.0]  # flags applied; absent is null
    assert separate.column("ad_id").to_pylist() == [0, 0, None, 0, None, 2]
    chunk.reset()
    chunk.put(0, 2, **items[1])  # no price, no version: where the old rows had both
    assert chunk.table().equals(record_batch(schema, **items[1]))
    assert chunk.table().column("f.price").null_count == 2
    chunk.reset()  # a batch with no unknown entity (filled at once) over rows that had one
    known = {**items[2], "unknown": [[], [], []]}
    chunk.put(0, 3, **known)
    assert chunk.table().equals(record_batch(schema, **known))
    assert chunk.table().column("unknown_entities").to_pylist() == ["", "", ""]
    with pytest.raises(ValueError, match="do not fit"):
        chunk.put(0, 6, **_item("d", 6, 1, 1.0))
    assert chunk.n == 3


def test_the_writer_spans_chunks_and_reuses_them(config, tmp_path):
    """A request larger than a chunk's room goes on in the next; after each write the chunks are
    refilled, and every record is written once."""
    from lattice.serving.prediction_log import PredictionLogWriter

    schema = LogSchema(config)
    writer = PredictionLogWriter(schema, tmp_path, flush_records=4, flush_seconds=60)
    try:
        sent, chunks = [], []
        for round in range(2):
            for k, n in enumerate([3, 6, 1, 9, 2]):
                item = _item(f"r{round}-{k}-", n, k, float(k))
                sent += item["request_id"]
                assert writer.submit(n, **item)
                writer.flush()
            chunks.append({id(c) for c in writer._spare})
            assert not writer._filling and all(c.n == 0 for c in writer._spare)
        assert writer.written == len(sent) and writer.dropped_total == 0
        assert chunks[1] == chunks[0] and len(chunks[0]) == 3  # 9 rows took 3 chunks of 4; the second round allocated none
    finally:
        writer.close()
    got = log_dataset(tmp_path).to_table().column("request_id").to_pylist()
    assert sorted(got) == sorted(sent) and len(got) == len(sent)


def test_rows_that_cannot_be_copied_are_counted_and_the_rest_kept(config, tmp_path):
    from lattice.serving.prediction_log import PredictionLogWriter

    writer = PredictionLogWriter(LogSchema(config), tmp_path, flush_seconds=60)
    try:
        bad = _item("x", 2, 1, 1.0)
        bad["probabilities"] = {"click": np.zeros(2)}  # an objective missing: the copy fails
        assert not writer.submit(2, **bad)
        assert "conversion" in writer.last_error
        assert writer.submit(1, **_item("ok", 1, 1, 1.0))
        writer.flush()
        assert writer.dropped == {"record_error": 2} and writer.written == 1
    finally:
        writer.close()
    assert log_dataset(tmp_path).to_table().column("request_id").to_pylist() == ["ok0"]


def _cell(period: str, version: int = 7, count: int = 400, ne: float = 0.9, auc: float = 0.7, **kw) -> dict:
    return {"domain": "feed", "objective": "click", "model_version": version, "period": period, "logged": 500,
            "count": count, "pending": 500 - count, "positives": 40, "label_rate": 0.1, "prediction_mean": 0.12,
            "calibration": 1.2, "ne": ne, "auc": auc, **kw}


def test_monitor_figures_are_gauges_of_the_latest_labelled_period(config, tmp_path):
    import os

    summary = tmp_path / "monitoring" / "summary.json"
    summary.parent.mkdir(parents=True)
    cells = [_cell("2026-01-04", ne=0.95), _cell("2026-01-05", ne=0.9),
             _cell("2026-01-06", count=0, ne=float("nan")),  # labels not arrived: says nothing yet
             _cell("2026-01-05", version=6, ne=0.97, auc=float("nan"))]
    summary.write_text(json.dumps({"cells": cells, "tripped": [{"rule": "calibration"}]}))
    with TestClient(_app(config, tmp_path)) as client:
        fam = _families(client.get("/metrics").text)
        ne = lambda f, v: _value(f, "lattice_online_ne", "lattice_online_ne", domain="feed", objective="click", version=v)
        assert ne(fam, "7") == pytest.approx(0.9)
        assert ne(fam, "6") == pytest.approx(0.97)
        assert _value(fam, "lattice_online_calibration", "lattice_online_calibration", version="7") == pytest.approx(1.2)
        assert _value(fam, "lattice_online_labels", "lattice_online_labels", version="7") == 400
        start = _value(fam, "lattice_online_period_start_seconds", "lattice_online_period_start_seconds", version="7")
        assert start == pd.Timestamp("2026-01-05", tz="UTC").timestamp()
        assert [s.labels["version"] for s in fam["lattice_online_auc"].samples] == ["7"]  # v6's NaN AUC left out
        assert _value(fam, "lattice_monitor_rules_tripped", "lattice_monitor_rules_tripped") == 1
        assert _value(fam, "lattice_monitor_age_seconds", "lattice_monitor_age_seconds") >= 0

        # the monitor runs again: the next scrape shows its new figures
        summary.write_text(json.dumps({"cells": [_cell("2026-01-06", ne=1.1)], "tripped": []}))
        os.utime(summary, (1e9, 1e9))
        fam = _families(client.get("/metrics").text)
        assert ne(fam, "7") == pytest.approx(1.1)
        assert _value(fam, "lattice_monitor_rules_tripped", "lattice_monitor_rules_tripped") == 0
        assert _value(fam, "lattice_monitor_age_seconds", "lattice_monitor_age_seconds") > 1e8

        # a damaged file: the scrape still answers, without figures, and counts the failure
        summary.write_text("{not json")
        os.utime(summary, (2e9, 2e9))
        response = client.get("/metrics")
        assert response.status_code == 200
        fam = _families(response.text)
        assert "lattice_online_ne" not in fam
        assert _value(fam, "lattice_monitor_read_errors", "lattice_monitor_read_errors") == 1


def test_no_monitor_run_yet_means_no_online_figures(config, tmp_path):
    with TestClient(_app(config, tmp_path)) as client:
        fam = _families(client.get("/metrics").text)
    assert "lattice_online_ne" not in fam and "lattice_monitor_age_seconds" not in fam
    assert _value(fam, "lattice_monitor_read_errors", "lattice_monitor_read_errors") == 0


def test_parts_dictionary_encode_only_the_columns_with_few_values(config, tmp_path):
    """Domains, origins and sparse feature ids repeat: dictionary-encoded. Request ids, entity
    ids and scores are left plain, where a dictionary is only work; the rows read back unchanged."""
    import pyarrow.parquet as pq

    from lattice.monitoring.records import record_batch, write_partitioned

    schema = LogSchema(config)
    table = record_batch(schema, **_item("e", 40, 3, 2.0))
    (part,) = write_partitioned(table, tmp_path)
    meta = pq.ParquetFile(part).metadata.row_group(0)
    encodings = {meta.column(i).path_in_schema: meta.column(i).encodings for i in range(meta.num_columns)}
    assert "RLE_DICTIONARY" in encodings["domain"] and "RLE_DICTIONARY" in encodings["f.device"]
    assert "RLE_DICTIONARY" not in encodings["request_id"] and "RLE_DICTIONARY" not in encodings["p_click"]
    assert "RLE_DICTIONARY" not in encodings["user_id"]
    assert pq.read_table(part).equals(table)
    # the codec: lz4 by default (the cheapest to write beside scoring), the config's when given
    assert {meta.column(i).compression for i in range(meta.num_columns)} <= {"LZ4", "LZ4_RAW"}
    (zpart,) = write_partitioned(table, tmp_path / "z", "zstd")
    assert pq.ParquetFile(zpart).metadata.row_group(0).column(0).compression == "ZSTD"
    assert pq.read_table(zpart).equals(table)


def test_serving_writes_the_configured_codec(config, tmp_path):
    from lattice.serving.ops import ServingOps

    log = config.monitoring.prediction_log.model_copy(update={"compression": "zstd"})
    cfg = config.model_copy(update={"monitoring": config.monitoring.model_copy(update={"prediction_log": log})})
    ops = ServingOps(cfg, tmp_path)
    try:
        assert ops.writer.compression == "zstd" and ops.writer.part_format == "arrow"
    finally:
        ops.close()


def test_per_cell_counts_and_sums_of_a_batch_match_its_rows() -> None:
    """One scored batch's per-cell prediction count and probability sum, grouped by comparing with
    the config's domains; a domain outside them is still counted (the batch's own grouping), and a
    domain with no row in the batch gets no series."""
    from lattice.serving.metrics import ServingMetrics

    m = ServingMetrics(None)
    domains = np.array(["feed", "search", "feed", "feed", "other"], dtype=str)
    probs = {"click": np.array([0.1, 0.2, 0.3, 0.4, 0.5]), "conversion": np.array([0.01, 0.02, 0.03, 0.04, 0.05])}
    for known in (["feed", "search", "video"], None):
        m.observe_predictions(domains, probs, known)
    m.observe_predictions(domains[:1], {o: p[:1] for o, p in probs.items()}, ["feed", "search", "video"])  # one row
    samples = {(s.name, s.labels["domain"], s.labels["objective"]): s.value
               for f in text_string_to_metric_families(m.exposition()[0].decode())
               for s in f.samples if s.name in ("lattice_predictions_total", "lattice_prediction_probability_sum_total")}
    count, total = "lattice_predictions_total", "lattice_prediction_probability_sum_total"
    assert samples[(count, "feed", "click")] == 7 and samples[(count, "search", "conversion")] == 2
    assert samples[(count, "other", "click")] == 2
    assert samples[(total, "feed", "click")] == pytest.approx(2 * 0.8 + 0.1)
    assert samples[(total, "other", "conversion")] == pytest.approx(0.1)
    assert not any(d == "video" for _, d, _ in samples)
