"""Serving on the scale-out services: Feast with its SQL registry on PostgreSQL and its online
store in Redis, `lattice serve --workers 2`, Redis stopped and restarted under it, and a champion
swap under load.

PostgreSQL and Redis are this module's own (free loopback ports, throwaway folders): the fault
test stops Redis, which must not disturb other tests using the session's `scaleout_services`.
The profile has no MLflow server and a `local[2]` Spark master, so the model registry stays the
work dir's and Feast's Spark offline store runs in-process: this file tests Feast and serving.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest
import yaml

from lattice.registry import ModelRegistry
from lattice.registry.stages import register
from lattice.serving.client import requests_from_rows
from test_distill import copy_workdir, trained_workdir
from test_serving import _offline

pytestmark = [pytest.mark.slow, pytest.mark.scaleout]

ROOT = Path(__file__).resolve().parents[2]
TOKEN_ENV = "LATTICE_TEST_SCALEOUT_TOKEN"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def services():
    from lattice.deploy import local_services as ls
    from lattice.deploy.profile import write_profile

    layout = ls.throwaway_layout("lattice-serve-so-")
    home = layout.home
    try:
        ls.start_postgres(layout)
        ls.start_redis(layout)
        profile = ls.profile_dict(layout)
        profile.pop("mlflow")
        profile["spark"] = {"master": "local[2]"}
        write_profile(layout.profile_file, profile)
        yield layout
    finally:
        ls.stop_redis(layout)
        ls.stop_postgres(layout)
        shutil.rmtree(home, ignore_errors=True)  # data and logs
        shutil.rmtree(layout.secrets, ignore_errors=True)  # passwords and the profile


@pytest.fixture(scope="module")
def stack(services, tmp_path_factory):
    """The same trained work dir twice: materialized into SQLite (embedded) and into Redis with the
    SQL registry (scale-out); a champion and a second version in the scale-out copy's registry."""
    from lattice.config.schema import Deployment
    from lattice.export.stages import export_model
    from pipelines.feast_jobs import feast_apply, materialize

    base, _ = trained_workdir()
    lite = copy_workdir(tmp_path_factory.mktemp("lite") / "wd")
    feast_apply(base, lite)
    materialize(base, lite)
    config = base.model_copy(update={
        "deployment": Deployment(profile="scale-out", profile_file=str(services.profile_file)),
        # no cache: a value read is the store's value now (the fault test sees Redis come and go)
        "serving": base.serving.model_copy(update={"feature_cache_seconds": 0.0, "auth_token_env": TOKEN_ENV}),
    })
    paths = copy_workdir(tmp_path_factory.mktemp("so") / "wd")
    feast_apply(config, paths)
    materialize(config, paths)
    reg = ModelRegistry(config, paths)
    champion = reg.version(register(config, paths, "student")["version"])
    reg.promote(champion)
    export_model(config, paths, "student@noteacher")
    other = reg.version(register(config, paths, "student@noteacher")["version"])
    cfg_file = tmp_path_factory.mktemp("cfg") / "scaleout.yaml"
    cfg_file.write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    return {"base": base, "lite": lite, "config": config, "paths": paths, "reg": reg, "cfg_file": cfg_file,
            "versions": {"student": champion.version, "student@noteacher": other.version}}


@pytest.fixture(scope="module")
def server(stack):
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k != "LATTICE_PROFILE_FILE"}
    env[TOKEN_ENV] = "test-token-" + os.urandom(8).hex()
    proc = subprocess.Popen([sys.executable, "-m", "lattice.cli", "serve", str(stack["cfg_file"]), "--workdir",
                             str(stack["paths"].workdir), "--port", str(port), "--workers", "2", "--poll-seconds", "0.3",
                             "--log-level", "warning"], cwd=ROOT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 420  # two workers import torch at once on a busy 2-core machine
        while True:
            try:
                if httpx.get(url + "/healthz", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.time() < deadline and proc.poll() is None, "lattice serve --workers 2 did not become healthy"
            time.sleep(0.5)
        yield {"url": url, "headers": {"Authorization": f"Bearer {env[TOKEN_ENV]}"}}
    finally:
        proc.terminate()
        proc.wait(timeout=60)


@pytest.fixture(scope="module")
def window(stack):
    from lattice.export.window import load_window

    return load_window(stack["base"], stack["lite"], "test", max_rows=256, seed=1)


def _healthz_by_worker(url: str, tries: int = 40) -> dict[int, dict]:
    """/healthz of each worker: fresh connections land on either process."""
    seen: dict[int, dict] = {}
    for _ in range(tries):
        h = httpx.get(url + "/healthz", timeout=10).json()
        seen[h["pid"]] = h
        if len(seen) >= 2 and _ > 8:
            break
    return seen


def test_feast_uses_the_profile_redis_and_sql_registry(stack, services):
    from feast import FeatureStore

    paths = stack["paths"]
    conf_file = paths.feast_repo / "feature_store.yaml"
    assert stat.S_IMODE(conf_file.stat().st_mode) == 0o600  # it holds the Redis and PostgreSQL passwords
    conf = yaml.safe_load(conf_file.read_text())
    assert conf["online_store"]["type"] == "redis" and conf["registry"]["registry_type"] == "sql"
    assert conf["offline_store"]["spark_conf"]["spark.master"] == "local[2]"
    store = FeatureStore(repo_path=str(paths.feast_repo))
    assert sorted(v.name for v in store.list_feature_views()) == sorted(a.name for a in stack["config"].features.aggregates)
    # the registry lives in PostgreSQL, not in a file of the repo
    assert not (paths.feast_repo / "data" / "registry.db").exists()
    from lattice.deploy.local_services import _connect

    with _connect(services, "lattice_feast") as conn, conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM feature_views WHERE project_id = %s", (stack["config"].name,))
        assert cur.fetchone()[0] == len(stack["config"].features.aggregates)
    # Redis holds one hash per materialized entity
    from lattice.deploy.local_services import _redis_client

    assert _redis_client(services).dbsize() > 100


def test_redis_reads_equal_feast_and_the_sqlite_store(stack, window):
    """Redis read by our batch reader == Feast's own online_read on Redis == the SQLite store."""
    from lattice.serving.online import OnlineFeatures

    ids = {k: window[k].to_numpy(np.int64) for k in ("user_id", "ad_id")}
    redis_side = OnlineFeatures(stack["config"], stack["paths"])
    redis_side.open()
    assert redis_side._redis is not None, "the batch Redis reader did not open"
    lite = OnlineFeatures(stack["base"], stack["lite"])
    lite.open()
    got, unknown = redis_side.lookup_ids(dict(ids))
    want, want_unknown = lite.lookup_ids(dict(ids))
    assert set(got) == set(want) and unknown == want_unknown
    for c in want:  # the same stored values decoded by two readers, no arithmetic: exactly equal
        np.testing.assert_array_equal(got[c], want[c], err_msg=c)
    assert any(np.any(v > 0) for v in got.values())
    # and what Feast's RedisOnlineStore.online_read decodes from the same hashes
    redis_side._redis = None
    via_feast, _ = redis_side.lookup_ids(dict(ids))
    for c in want:
        np.testing.assert_array_equal(via_feast[c], want[c], err_msg=c)


def test_two_workers_score_as_the_sqlite_path_and_need_the_token(stack, server, window):
    config, url = stack["config"], server["url"]
    reqs = requests_from_rows(config, window)
    assert httpx.post(url + "/predict", json={"requests": reqs[:2]}, timeout=30).status_code == 401
    assert httpx.post(url + "/predict", json={"requests": reqs[:2]}, headers={"X-API-Key": "wrong"}, timeout=30).status_code == 401
    want = _offline(stack["base"], stack["lite"], "student", window)  # the trained model on SQLite features
    pids = set()
    for _ in range(6):  # fresh connections: both workers answer, each from Redis
        r = httpx.post(url + "/predict", json={"requests": reqs}, headers=server["headers"], timeout=60)
        assert r.status_code == 200, r.text
        body = r.json()
        for o in config.objective_names:
            np.testing.assert_allclose([p["probabilities"][o] for p in body["predictions"]], want[o], atol=1e-5, rtol=0)
        assert all(p["unknown_entities"] == [] for p in body["predictions"])
    workers = _healthz_by_worker(url)
    pids |= set(workers)
    assert len(pids) == 2, f"expected 2 workers answering, saw pids {sorted(pids)}"
    assert all(h["status"] == "ok" and h["online_store"]["store"] == "redis" for h in workers.values())


def test_redis_down_answers_with_defaults_and_recovers(stack, server, services, window):
    from lattice.deploy import local_services as ls
    from pipelines.feast_jobs import materialize

    config, url, headers = stack["config"], server["url"], server["headers"]
    reqs = {"requests": requests_from_rows(config, window.head(8))}
    before = httpx.post(url + "/predict", json=reqs, headers=headers, timeout=30).json()
    ls.stop_redis(services)
    try:
        assert not ls.redis_ready(services)
        took = []
        with httpx.Client(timeout=30, headers=headers) as client:
            for _ in range(30):
                t = time.perf_counter()
                r = client.post(url + "/predict", json=reqs)
                took.append(time.perf_counter() - t)
                assert r.status_code == 200, r.text
                # the documented fallback: no-history defaults, every entity listed as unknown
                assert all(sorted(p["unknown_entities"]) == ["ad_id", "user_id"] for p in r.json()["predictions"])
        # bounded: the breaker spares most requests the connection attempt
        assert np.median(took) < 0.25 and max(took) < 2.0, took
        for pid, h in _healthz_by_worker(url).items():
            assert h["status"] == "degraded", h
            assert h["online_store"]["store"] == "redis" and h["online_store"]["status"] == "unavailable", h
            assert "online store redis" in h["degraded"][0]
    finally:
        ls.start_redis(services)
    # Redis came back empty (no persistence on loopback): materialize again, then fresh values
    materialize(config, stack["paths"])
    deadline = time.time() + 30
    while True:
        r = httpx.post(url + "/predict", json=reqs, headers=headers, timeout=30).json()
        workers = _healthz_by_worker(url)
        if (all(p["unknown_entities"] == [] for p in r["predictions"]) and len(workers) == 2
                and all(h["status"] == "ok" for h in workers.values())):
            break
        assert time.time() < deadline, (r["predictions"][0], workers)
        time.sleep(0.5)
    for a, b in zip(before["predictions"], r["predictions"]):
        for o in config.objective_names:
            assert a["probabilities"][o] == pytest.approx(b["probabilities"][o], abs=1e-6)


def test_champion_swap_under_load_every_worker_no_5xx(stack, server, window):
    config, reg, url, headers = stack["config"], stack["reg"], server["url"], server["headers"]
    old, new = stack["versions"]["student"], stack["versions"]["student@noteacher"]
    assert {h["model_version"] for h in _healthz_by_worker(url).values()} == {old}
    body = json.dumps({"requests": requests_from_rows(config, window.head(16))})
    statuses: list[int] = []
    versions: list[int] = []
    errors: list[str] = []
    stop = threading.Event()

    def load(fresh: bool) -> None:  # a bounded loop: keep-alive, or a new connection per request
        client = httpx.Client(timeout=30, headers={**headers, "Content-Type": "application/json"})
        try:
            while not stop.is_set():
                try:
                    if fresh:
                        client.close()
                        client = httpx.Client(timeout=30, headers={**headers, "Content-Type": "application/json"})
                    r = client.post(url + "/predict", content=body)
                    statuses.append(r.status_code)
                    if r.status_code == 200:
                        versions.append(r.json()["model_version"])
                except httpx.TransportError as exc:
                    errors.append(repr(exc))
                time.sleep(0.005)
        finally:
            client.close()

    threads = [threading.Thread(target=load, args=(f,)) for f in (False, True)]
    for t in threads:
        t.start()
    try:
        time.sleep(1.0)
        reg.promote(reg.version(new))  # the alias moves while both workers are under load
        deadline = time.time() + 60
        while True:
            workers = _healthz_by_worker(url)
            if len(workers) == 2 and all(h["model_version"] == new for h in workers.values()):
                break
            assert time.time() < deadline, f"not every worker swapped: {workers}"
            time.sleep(0.3)
        time.sleep(1.0)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    assert statuses and not errors, errors[:3]
    assert all(s == 200 for s in statuses), sorted(set(statuses))
    assert versions[0] == old and versions[-1] == new and set(versions) == {old, new}


# ------------------------------------------------------------------ Prometheus of the profile
@pytest.fixture(scope="module")
def prometheus(services):
    """The profile's Prometheus (Debian's binary) on this module's throwaway layout; it scrapes
    whatever `lattice serve` announced in the profile's targets folder."""
    from lattice.deploy import prometheus_server as prom

    try:
        prom.start_prometheus(services)
        yield prom.url(services)
    finally:
        prom.stop_prometheus(services)


def _promql(base: str, query: str) -> list[dict]:
    r = httpx.get(base + "/api/v1/query", params={"query": query}, timeout=10).json()
    assert r["status"] == "success", r
    return r["data"]["result"]


def _served_counts(url: str) -> dict[tuple[str, str], float]:
    from prometheus_client.parser import text_string_to_metric_families

    fams = {f.name: f for f in text_string_to_metric_families(httpx.get(url + "/metrics", timeout=10).text)}
    return {(s.labels["domain"], s.labels["objective"]): s.value for s in fams["lattice_predictions"].samples
            if s.name == "lattice_predictions_total"}


def test_prometheus_on_loopback_scrapes_both_workers_per_cell(stack, server, prometheus, services, window):
    from lattice.deploy import prometheus_server as prom
    from lattice.deploy.processes import wait_until

    url = server["url"]
    port = int(url.rsplit(":", 1)[1])
    # `lattice serve` announced itself in the folder the generated prometheus.yml reads
    target = json.loads((prom.targets_dir(services) / f"lattice-serve-{port}.json").read_text())
    assert target[0]["targets"] == [f"127.0.0.1:{port}"]
    listening = {c.laddr for c in psutil.net_connections("tcp")
                 if c.status == "LISTEN" and c.laddr.port == services.ports["prometheus"]}
    assert {a.ip for a in listening} == {"127.0.0.1"}  # loopback only
    reqs = requests_from_rows(stack["config"], window.head(40))
    # a /predict series scraped before the requests below: rate() over the hour needs two samples
    assert httpx.post(url + "/predict", json={"requests": reqs[:1]}, headers=server["headers"], timeout=60).status_code == 200
    assert wait_until(lambda: bool(_promql(prometheus, 'lattice_predictions_total{job="lattice-serving"}')), 60), \
        "Prometheus never scraped the server"
    before = _served_counts(url)
    for i in range(0, 40, 8):
        assert httpx.post(url + "/predict", json={"requests": reqs[i:i + 8]}, headers=server["headers"],
                          timeout=60).status_code == 200
    served = _served_counts(url)  # both workers summed (multiprocess); nothing else sends now
    # the server scores every objective for every request (the cells are only what is evaluated)
    assert sum(served.values()) - sum(before.values()) == 40 * len(stack["config"].objective_names)
    query = 'sum by (domain, objective) (lattice_predictions_total{job="lattice-serving"})'
    deadline, seen = time.time() + 60, {}
    while time.time() < deadline:
        seen = {(r["metric"]["domain"], r["metric"]["objective"]): float(r["value"][1]) for r in _promql(prometheus, query)}
        if seen == served:
            break
        time.sleep(1)
    assert seen == served, f"Prometheus {seen} vs the server's /metrics {served}"
    (up,) = _promql(prometheus, 'up{job="lattice-serving"}')
    assert up["metric"]["instance"] == f"127.0.0.1:{port}" and up["value"][1] == "1"
    # the documented p99 query answers for /predict (docs/monitoring.md)
    p99 = _promql(prometheus, 'histogram_quantile(0.99, sum by (le) (rate(lattice_request_duration_seconds_bucket'
                              '{job="lattice-serving", route="/predict"}[1h])))')
    assert len(p99) == 1
