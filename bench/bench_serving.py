"""Serving latency and throughput over loopback HTTP, including the Feast online lookup, and the
student's inference cost against its teacher's.

    .venv/bin/python bench/bench_serving.py                       # builds a tiny trained demo (about 3 min)
    .venv/bin/python bench/bench_serving.py --config C --workdir W  # a work dir with a champion and a Feast store

The server runs in its own process (`lattice serve`), as in production; the client sends a
bounded loop of single requests, then of 256-request batches (each batch the next 256 rows of
the test window), on one keep-alive connection.
Printed: p50/p99 per request and per batch, predictions/s, and the in-server split between the
online lookup and the model; then teacher vs student cost (params, FLOPs, measured forward time)
and NE per cell.

    .venv/bin/python bench/bench_serving.py --ops [--runs 3]

instead measures what the prediction log and `/metrics` cost: the same server with both on
(`monitoring.prediction_log.enabled`, `monitoring.metrics`) and with both off, alternated in one
run; medians over `--runs` runs of single-request p99 and batched predictions/s, their ratios,
and the log's rows against the predictions sent.

    .venv/bin/python bench/bench_serving.py --stores [--entities 1000000 --runs 3]

instead compares the online stores and worker counts: Feast's SQLite store vs Redis (a private
redis-server on loopback, the scale-out profile's reader), each padded to `--entities` users,
served by 1 and 2 uvicorn workers. With N workers, N client processes each hold a connection to
a different worker; figures are the medians over `--runs` runs of p50/p99 single-request latency
and of predictions/s in batches of 256 (all clients together).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def build_demo(base: Path):
    """The integration tests' tiny trained work dir, plus a Feast store and a champion."""
    sys.path.insert(0, str(ROOT / "tests" / "integration"))
    import yaml

    from test_distill import trained_workdir

    from lattice.paths import Paths
    from lattice.registry import ModelRegistry
    from lattice.registry.stages import register
    from pipelines.feast_jobs import feast_apply, materialize

    config, wd = trained_workdir(base)
    paths = Paths.for_config(config, wd)
    feast_apply(config, paths)
    materialize(config, paths)
    reg = ModelRegistry(config, paths)
    reg.promote(reg.version(register(config, paths, "student")["version"]))
    cfg_file = base / "bench_config.yaml"
    cfg_file.write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    return str(cfg_file), wd


def percentiles(ms: list[float]) -> str:
    return f"p50 {np.percentile(ms, 50):7.2f} ms   p99 {np.percentile(ms, 99):7.2f} ms"


def requests_from_window(config, paths, n: int) -> list[dict]:
    import pandas as pd

    from lattice.data import schema as S
    from lattice.export.window import load_window

    rows = load_window(config, paths, "test", max_rows=n)
    entity = {f.column for f in config.entity_features}
    out = []
    for r in rows.to_dict("records"):
        feats = {c: int(r[c]) for c in S.sparse_columns(config) if c not in entity and not pd.isna(r[c])}
        feats.update({c: float(r[c]) for c in S.dense_columns(config) if r[S.present_column(c)] == 1})
        out.append({"domain": r["domain"], "entities": {k: int(r[k]) for k in sorted(entity)}, "features": feats})
    while len(out) < n:
        out += out[: n - len(out)]
    return out


def http_bench(url: str, reqs: list[dict], singles: int, batches: int, batch_size: int = 256,
               pin_pid: int | None = None, sync=None, cpu=None) -> dict:
    """One keep-alive connection from the standard library's HTTP client (httpx adds about 2 ms
    per call on this machine, which would be measured as server latency). `pin_pid`: reconnect
    until the connection is served by that uvicorn worker (its /healthz says its pid). `sync`:
    called after the warm-up and after the single requests (several clients wait there for each
    other, so that single requests are timed against single-request load, not against another
    client's warm-up or batches). `cpu`: returns the server's CPU seconds so far; each phase then
    also reports the server's CPU time per request (less noisy than wall time on a shared
    machine: another process's load stretches latency, not the server's own CPU time)."""
    import http.client
    from urllib.parse import urlparse

    u = urlparse(url)
    headers = {"Content-Type": "application/json"}
    for _ in range(200):
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
        if pin_pid is None:
            break
        conn.request("GET", "/healthz")
        if json.loads(conn.getresponse().read())["pid"] == pin_pid:
            break
        conn.close()

    def post(body: bytes) -> None:
        conn.request("POST", "/predict", body, headers)
        resp = conn.getresponse()
        data = resp.read()
        if resp.status != 200:
            raise RuntimeError(f"/predict answered {resp.status}: {data[:300]!r}")

    bodies = [json.dumps(r).encode() for r in reqs]
    try:
        for b in bodies[:20]:  # warm-up
            post(b)
        if sync is not None:
            sync()
        cpu0 = settled(cpu) if cpu else 0.0
        single = []
        for i in range(singles):
            t = time.perf_counter()
            post(bodies[i % len(bodies)])
            single.append((time.perf_counter() - t) * 1e3)
        if sync is not None:
            sync()
        # distinct consecutive rows of the test window per batch, so the entity cache sees the
        # traffic's real repeat rate (Zipf ids), not one batch replayed
        chunks = [reqs[i:i + batch_size] for i in range(0, len(reqs) - batch_size + 1, batch_size)]
        batch_bodies = [json.dumps({"requests": c}).encode() for c in chunks]
        cpu1 = settled(cpu) if cpu else 0.0
        batch = []
        started = time.perf_counter()
        for k in range(batches):
            body = batch_bodies[k % len(batch_bodies)]
            t = time.perf_counter()
            post(body)
            batch.append((time.perf_counter() - t) * 1e3)
        took = time.perf_counter() - started
        cpu2 = settled(cpu) if cpu else 0.0
    finally:
        conn.close()
    out = {"single_ms": single, "batch_ms": batch, "predictions_per_s": batches * batch_size / took,
           "single_per_s": singles / (sum(single) / 1e3)}
    if cpu:  # server CPU microseconds per single request, and per prediction in batches
        out["cpu_us_single"] = (cpu1 - cpu0) * 1e6 / max(singles, 1)
        out["cpu_us_prediction"] = (cpu2 - cpu1) * 1e6 / max(batches * batch_size, 1)
    return out


def settled(cpu, wait: float = 1.5) -> float:
    """`cpu()` once the server's background work of the phase is done: the prediction log's
    writer flushes at least every second (`flush_seconds`), so a phase's writes are charged to
    it, not to the next phase or to nothing. An idle server spends no CPU while it waits."""
    time.sleep(wait)
    return cpu()


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) of a process and its live children, every thread included
    (the prediction log's writer thread is part of what the server pays)."""
    import psutil

    proc = psutil.Process(pid)
    total = 0.0
    for p in [proc] + proc.children(recursive=True):
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def in_process_split(config, paths, reqs: list[dict]) -> dict:
    """Where a request's time goes inside the server: online lookup vs artifact (encode + forward),
    with the online store read as the config says."""
    from lattice.export.predictor import Predictor
    from lattice.registry import CHAMPION, ModelRegistry
    from lattice.serving.frame import request_columns
    from lattice.serving.online import OnlineFeatures
    from lattice.serving.requests import PredictRequest

    import torch

    torch.set_num_threads(1)  # as `lattice serve` runs the model
    reg = ModelRegistry(config, paths)
    pred = Predictor.load(reg.download(reg.by_alias(CHAMPION)))
    online = OnlineFeatures(config, paths)
    online.open()
    out = {}
    for n, loops in ((1, 200), (256, 20)):
        parsed = [PredictRequest.model_validate(r) for r in reqs[:n]]
        online.lookup([r.entities for r in parsed])
        look, model = [], []
        for _ in range(loops):
            t = time.perf_counter()
            aggs, _ = online.lookup([r.entities for r in parsed])
            t2 = time.perf_counter()
            pred.predict_columns(request_columns(pred.config, parsed, aggs))
            t3 = time.perf_counter()
            look.append((t2 - t) * 1e3)
            model.append((t3 - t2) * 1e3)
        out[n] = {"lookup_p50_ms": float(np.median(look)), "model_p50_ms": float(np.median(model))}
    return out


def student_vs_teacher(config, paths) -> dict:
    import torch

    from lattice.data.loader import batch_from_frame
    from lattice.evaluation.stages import load_model
    from lattice.export.window import load_window

    rows = load_window(config, paths, "test", max_rows=256)
    out = {}
    for name in ("teacher", "student"):
        net = load_model(config, paths, name)
        batch = batch_from_frame(config, net.dense_stats, rows)
        with torch.no_grad():
            for _ in range(3):
                net(batch.dense, batch.sparse, batch.domain)
            t = time.perf_counter()
            for _ in range(20):
                net(batch.dense, batch.sparse, batch.domain)
        out[name] = {"forward_ms_per_256": (time.perf_counter() - t) / 20 * 1e3,
                     **json.loads((paths.model_dir(name) / "metrics.json").read_text())["cost"]}
    return out


def start_server(cfg_file: str, wd: Path, url: str, args, workers: int = 1) -> subprocess.Popen:
    """`lattice serve` in its own process, returned once /healthz answers 200."""
    import httpx

    server = subprocess.Popen([sys.executable, "-m", "lattice.cli", "serve", cfg_file, "--workdir", str(wd), "--port", str(args.port),
                               "--log-level", "warning", "--workers", str(workers)], cwd=ROOT)
    deadline = time.time() + 600
    while True:
        try:
            if httpx.get(url + "/healthz").status_code == 200:
                return server
        except httpx.TransportError:
            pass
        if time.time() > deadline or server.poll() is not None:
            server.terminate()
            raise RuntimeError("the server did not become healthy")
        time.sleep(0.5)


def wait_healthy(url: str, server: subprocess.Popen, seconds: float) -> None:
    """Until `url`/healthz answers 200; RuntimeError when `server` exits or `seconds` pass."""
    import httpx

    deadline = time.time() + seconds
    while True:
        try:
            if httpx.get(url + "/healthz").status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.time() > deadline or server.poll() is not None:
            raise RuntimeError(f"lattice serve at {url} did not become healthy")
        time.sleep(0.5)


def serve_and_measure(cfg_file: str, wd: Path, url: str, args, reqs: list[dict]) -> dict:
    """Start `lattice serve` in its own process, wait until healthy, run the loop, stop it."""
    server = subprocess.Popen([sys.executable, "-m", "lattice.cli", "serve", cfg_file, "--workdir", str(wd), "--port", str(args.port),
                               "--log-level", "warning"], cwd=ROOT)
    try:
        wait_healthy(url, server, 180)
        return http_bench(url, reqs, args.singles, args.batches, cpu=lambda: process_cpu(server.pid))
    finally:
        server.terminate()
        server.wait(timeout=30)


# ---------------------------------------------------------------- --stores: SQLite vs Redis, 1 vs 2 workers
def pad_sqlite(config, paths, n: int) -> None:
    """`n` extra users in Feast's SQLite table of every user-keyed view (ids no request uses)."""
    import sqlite3

    from features.store import get_store
    from feast.infra.online_stores.helpers import compute_table_id
    from feast.infra.online_stores.sqlite import SqliteOnlineStore
    from lattice.serving.feast_keys import encode_keys, key_template

    store = get_store(config, paths)
    conn = sqlite3.connect(SqliteOnlineStore._get_db_path(store.config))
    ts = "2024-01-01 00:00:00"
    for view, blobs in _padding_values(config, store):
        key = view.join_keys[0]
        table = compute_table_id(store.config.project, view, False).replace('"', '""')
        for lo in range(0, n, 100_000):
            keys = encode_keys(key, list(range(PAD_BASE + lo, PAD_BASE + min(n, lo + 100_000))), 3, key_template(key, 3))
            with conn:
                conn.executemany(f'INSERT OR REPLACE INTO "{table}" (entity_key, feature_name, value, event_ts, created_ts) '
                                 "VALUES (?, ?, ?, ?, ?)", ((k, f, b, ts, ts) for k in keys for f, b in blobs.items()))
    conn.close()


def pad_redis(config, paths, n: int, endpoint: dict) -> None:
    """The same padding in Feast's Redis layout, written as pipelined HSETs (redis-py)."""
    import redis

    from features.store import get_store
    from lattice.serving.feast_keys import encode_keys, field_key, key_template

    store = get_store(config, paths)
    project = store.config.project.encode()
    client = redis.Redis(host=endpoint["host"], port=endpoint["port"], password=endpoint["password"], socket_timeout=60)
    for view, blobs in _padding_values(config, store):
        key = view.join_keys[0]
        mapping = {field_key(view.name, f): b for f, b in blobs.items()}
        for lo in range(0, n, 20_000):
            keys = encode_keys(key, list(range(PAD_BASE + lo, PAD_BASE + min(n, lo + 20_000))), 3, key_template(key, 3))
            pipe = client.pipeline(transaction=False)
            for k in keys:
                pipe.hset(k + project, mapping=mapping)
            pipe.execute()
    client.close()


PAD_BASE = 7 * 10**15  # far from the hashed ids the requests carry


def _padding_values(config, store):
    from feast.protos.feast.types.Value_pb2 import Value

    for agg in config.features.aggregates:
        if agg.entity != "user_id":
            continue
        view = store.get_feature_view(agg.name)
        blobs = {f.name: (Value(double_val=0.25) if "rate" in f.name else Value(int64_val=3)).SerializeToString()
                 for f in view.features}
        yield view, blobs


def _client(url: str, reqs: list[dict], singles: int, batches: int, want_pid: int | None, phases, out) -> None:
    """One client process; its connection is pinned to worker `want_pid` (None: any). `phases`:
    the barrier of all clients, before the single requests and before the batches."""
    out.put(http_bench(url, reqs, singles, batches, pin_pid=want_pid, sync=lambda: phases.wait(timeout=600)))


def measure_workers(url: str, reqs: list[dict], args, workers: int) -> dict:
    import multiprocessing as mp

    import httpx

    pids = set()
    for _ in range(100):
        pids.add(httpx.get(url + "/healthz").json()["pid"])
        if len(pids) >= workers:
            break
    ctx = mp.get_context("fork")
    clients = sorted(pids)[:workers]
    phases, out = ctx.Barrier(len(clients)), ctx.Queue()
    procs = [ctx.Process(target=_client, args=(url, reqs, args.singles, args.batches, pid if workers > 1 else None, phases, out))
             for pid in clients]
    for p in procs:
        p.start()
    res = [out.get(timeout=1800) for _ in procs]
    for p in procs:
        p.join()
    single = [x for r in res for x in r["single_ms"]]
    return {"p50": float(np.percentile(single, 50)), "p99": float(np.percentile(single, 99)),
            "batch_p50": float(np.percentile([x for r in res for x in r["batch_ms"]], 50)),
            "predictions_per_s": sum(r["predictions_per_s"] for r in res)}


def stores_bench(args) -> None:
    import yaml

    from lattice.config import load_config
    from lattice.config.schema import Deployment
    from lattice.deploy import local_services as ls
    from lattice.deploy.profile import write_profile
    from lattice.paths import Paths
    from features.repo import write_repo
    from pipelines.feast_jobs import feast_apply, materialize

    base = Path(tempfile.mkdtemp(prefix="lattice-bench-stores-"))
    if args.workdir:
        cfg_file, wd = args.config, Path(args.workdir)
    else:
        t = time.perf_counter()
        cfg_file, wd = build_demo(base)
        print(f"built the tiny trained demo in {time.perf_counter() - t:.0f}s at {wd}")
    config = load_config(cfg_file)
    paths = Paths.for_config(config, wd)
    reqs = requests_from_window(config, paths, 256 * args.batches)
    layout = ls.Layout(home=base / "services", secrets=base / "secrets",
                       ports={**ls.DEFAULT_PORTS, "redis": args.port + 1})
    ls.start_redis(layout)
    try:
        write_profile(layout.profile_file, {"spark": {"master": "local[2]"},
                                            "redis": ls.profile_dict(layout)["redis"], "serving": {"workers": 1}})
        redis_cfg = config.model_copy(update={"deployment": Deployment(profile="scale-out", profile_file=str(layout.profile_file))})
        redis_file = base / "bench_redis.yaml"
        redis_file.write_text(yaml.safe_dump(redis_cfg.model_dump(mode="json"), sort_keys=False))
        t = time.perf_counter()
        pad_sqlite(config, paths, args.entities)
        print(f"SQLite store padded with {args.entities:,} users in {time.perf_counter() - t:.0f}s")
        t = time.perf_counter()
        feast_apply(redis_cfg, paths)  # the same repo, now pointed at Redis (file registry: no PostgreSQL here)
        materialize(redis_cfg, paths)
        pad_redis(redis_cfg, paths, args.entities, ls.profile_dict(layout)["redis"])
        print(f"Redis store materialized and padded with {args.entities:,} users in {time.perf_counter() - t:.0f}s "
              f"({ls._redis_client(layout).dbsize():,} keys)")
        url = f"http://127.0.0.1:{args.port}"
        print(f"\nserving over loopback, {args.runs} runs each (medians), single: {args.singles} sequential requests per "
              f"client, batch: {args.batches} x 256 per client; N workers = N client processes; "
              f"entity cache {config.serving.feature_cache_seconds:g} s")
        for label, cfg in (("sqlite", redis_file.with_name("bench_sqlite.yaml")), ("redis", redis_file)):
            if label == "sqlite":
                cfg.write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
            for workers in (1, 2):
                if label == "sqlite":  # the embedded yaml again (the Redis runs build their store from the profile)
                    write_repo(config, paths)
                server = start_server(str(cfg), wd, url, args, workers)
                try:
                    runs = [measure_workers(url, reqs, args, workers) for _ in range(args.runs)]
                finally:
                    server.terminate()
                    server.wait(timeout=60)
                med = {k: float(np.median([r[k] for r in runs])) for k in runs[0]}
                each = "; ".join("p99 %.2f ms, %s/s" % (r["p99"], format(round(r["predictions_per_s"]), ",")) for r in runs)
                print(f"  {label:<6} {workers} worker(s): single p50 {med['p50']:6.2f} ms  p99 {med['p99']:6.2f} ms   "
                      f"batch-256 p50 {med['batch_p50']:6.2f} ms   {med['predictions_per_s']:>9,.0f} predictions/s   "
                      f"(runs: {each})", flush=True)
    finally:
        ls.stop_redis(layout)


def _config_with(config, prefix: str, changes: dict) -> str:
    """The config as YAML with `changes` (dotted key -> value) applied; its path."""
    import yaml

    data = config.model_dump(mode="json")
    for dotted, value in changes.items():
        *parents, leaf = dotted.split(".")
        node = data
        for key in parents:
            node = node[key]
        node[leaf] = value
    out = Path(tempfile.mkdtemp(prefix=prefix)) / f"{config.name}.yaml"
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(out)


def _log_rows(wd: Path) -> int:
    from lattice.monitoring.compact import count_rows

    return count_rows(wd / "prediction_log")


def _scoring_server(config, paths):
    """`Server.score` without HTTP: the champion and the online store as served."""
    from lattice.export.predictor import Predictor
    from lattice.registry import CHAMPION, ModelRegistry
    from lattice.serving.app import Server
    from lattice.serving.online import OnlineFeatures
    from lattice.serving.requests import RequestSchema
    from lattice.serving.slot import ModelSlot

    import torch

    torch.set_num_threads(1)
    reg = ModelRegistry(config, paths)
    info = reg.by_alias(CHAMPION)
    pred = Predictor.load(reg.download(info), version=info)
    server = Server.__new__(Server)
    server.config, server.paths, server.schema = config, paths, RequestSchema(config)
    server.slot = ModelSlot(lambda: info.version, lambda v: pred, poll_seconds=3600)
    server.slot.refresh()
    server.online = OnlineFeatures(config, paths)
    server.online.open()
    return server, info


def ops_tail_in_process(config, paths, reqs: list[dict], seconds: float, pairs: int = 3) -> list[dict]:
    """Single-request tail in one process: `Server.score` back to back for `seconds` with the
    prediction log + metrics on, then as long with them off (no writer thread at all), `pairs`
    times. Unlike `ops_in_process` (modes alternated call by call under one live writer), the
    `off` window here has no writer to wait for, so the tail its flushes cause shows."""
    from lattice.serving.ops import ServingOps
    from lattice.serving.requests import PredictRequest

    server, _ = _scoring_server(config, paths)
    parsed = [PredictRequest.model_validate(r) for r in reqs]
    out = []
    for _ in range(pairs):
        row = {}
        for mode in ("on", "off"):
            ops = ServingOps(config, Path(tempfile.mkdtemp(prefix="lattice-bench-ops-tail-"))) if mode == "on" else None
            for r in parsed[:50]:
                server.score([r], ops)
            times, i, end = [], 0, time.perf_counter() + seconds
            while time.perf_counter() < end:
                t = time.perf_counter()
                server.score([parsed[i % len(parsed)]], ops)
                times.append((time.perf_counter() - t) * 1e6)
                i += 1
            if ops is not None:
                ops.close()
            row[mode] = {q: float(np.percentile(times, q)) for q in (50, 99, 99.9)}
        out.append(row)
    return out


def ops_in_process(config, paths, reqs: list[dict], loops: int = 300) -> dict:
    """What recording adds to the request path, without HTTP or the machine's other load in the
    figure: `Server.score` with the prediction log + metrics (`ServingOps`) and without, the
    champion and the online store as served, alternated call by call; medians in microseconds."""
    import torch

    from lattice.serving.ops import ServingOps
    from lattice.serving.requests import PredictRequest

    # one intra-op thread, as `lattice serve` runs the model: with two, the idle OpenMP worker's
    # spinning while the writer's thread holds the GIL was charged to "on" (docs/bench/serving.md)
    torch.set_num_threads(1)
    server, info = _scoring_server(config, paths)
    ops = ServingOps(config, Path(tempfile.mkdtemp(prefix="lattice-bench-ops-log-")))
    out = {}
    for n in (1, 256):
        parsed = [PredictRequest.model_validate(r) for r in reqs[:n]]
        times = {"off": [], "on": []}
        for i in range(loops if n == 1 else loops // 10):
            for mode, o in (("off", None), ("on", ops)) if i % 2 else (("on", ops), ("off", None)):
                t = time.perf_counter()
                server.score(parsed, o)
                times[mode].append((time.perf_counter() - t) * 1e6)
        out[n] = {m: float(np.median(v)) for m, v in times.items()}
        # the request path's own share: `ServingOps.record` alone (metrics + the hand-over to the
        # writer's queue), which the two medians above bury in the machine's noise
        from lattice.serving.frame import request_columns

        cols = request_columns(config, parsed, {})
        probs = {o: np.full(n, 0.1) for o in config.objective_names}
        unknown = [[] for _ in range(n)]
        rec = []
        for _ in range(loops if n == 1 else loops // 5):
            t = time.perf_counter()
            ops.record(parsed, cols, probs, unknown, 0, 0, info.version)
            rec.append((time.perf_counter() - t) * 1e6)
        out[n]["record"] = float(np.median(rec))
    out["cpu"] = _ops_cpu(server, ops, [PredictRequest.model_validate(r) for r in reqs])
    ops.close()
    out["log_rows"] = ops.writer.written
    return out


def _ops_cpu(server, ops, parsed: list, rounds: int = 11) -> dict:
    """The process's CPU time (every thread: the writer's table build and part writes
    included, since each "on" block ends with `flush`) per prediction, all the requests as
    256-row batches, "on" and "off" blocks alternated; medians of `rounds` blocks each, in
    microseconds. CPU, not wall time: the writer's work on the other core counts."""
    batches = [parsed[i:i + 256] for i in range(0, len(parsed), 256)]
    got: dict[str, list[float]] = {"off": [], "on": []}
    for k in range(rounds):
        for mode in ("off", "on") if k % 2 == 0 else ("on", "off"):
            o = ops if mode == "on" else None
            t = time.process_time()
            for b in batches:
                server.score(b, o)
            if o is not None:
                o.writer.flush()
            got[mode].append((time.process_time() - t) * 1e6 / len(parsed))
    return {m: float(np.median(v)) for m, v in got.items()}


def ops_interleaved(config, wd: Path, args, reqs: list[dict]) -> dict:
    """Prediction log + /metrics on vs off, both servers up at once and hit in turn, request by
    request (on, off, off, on, ...), so that whatever else the machine runs lands on both alike;
    `--ops` runs them one after the other, which on this shared machine moved a mode's own
    figures by up to 2x between runs. Per round: single-request latency, the time of each
    256-row batch and each server's CPU (every thread, its writer's flushes included) over the
    batches. The "on" server's writer flushes in the background while the "off" one answers, so
    the wall-clock ratios understate the log's cost a little; the CPU ratio does not."""
    import http.client

    cfgs = {m: _config_with(config, f"lattice-bench-ops-{m}-", {"monitoring.metrics": on, "monitoring.prediction_log.enabled": on})
            for m, on in (("on", True), ("off", False))}
    ports = {"on": args.port, "off": args.port + 1}
    procs = {m: subprocess.Popen([sys.executable, "-m", "lattice.cli", "serve", cfgs[m], "--workdir", str(wd), "--port",
                                  str(ports[m]), "--log-level", "warning"], cwd=ROOT) for m in ("on", "off")}
    rows_before = _log_rows(wd)
    try:
        for m, proc in procs.items():
            wait_healthy(f"http://127.0.0.1:{ports[m]}", proc, 180)
        conns = {m: http.client.HTTPConnection("127.0.0.1", ports[m], timeout=60) for m in procs}
        headers = {"Content-Type": "application/json"}

        def post(m: str, body: bytes) -> float:
            t = time.perf_counter()
            conns[m].request("POST", "/predict", body, headers)
            resp = conns[m].getresponse()
            data = resp.read()
            if resp.status != 200:
                raise RuntimeError(f"/predict ({m}) answered {resp.status}: {data[:300]!r}")
            return (time.perf_counter() - t) * 1e3

        singles = [json.dumps(r).encode() for r in reqs]
        batches = [json.dumps({"requests": reqs[i:i + 256]}).encode() for i in range(0, len(reqs) - 255, 256)]
        for m in procs:  # warm-up
            for b in singles[:20] + batches[:3]:
                post(m, b)
        rounds = []
        sent = 0
        for r in range(args.runs):
            single = {"on": [], "off": []}
            for i in range(args.singles):
                for m in ("on", "off") if i % 2 == 0 else ("off", "on"):
                    single[m].append(post(m, singles[i % len(singles)]))
            cpu0 = {m: settled(lambda m=m: process_cpu(procs[m].pid)) for m in procs}
            batch = {"on": [], "off": []}
            for k in range(args.batches):
                for m in ("on", "off") if k % 2 == 0 else ("off", "on"):
                    batch[m].append(post(m, batches[k % len(batches)]))
            cpu1 = {m: settled(lambda m=m: process_cpu(procs[m].pid)) for m in procs}
            sent += args.singles + 256 * args.batches
            row = {m: {"p50": float(np.percentile(single[m], 50)), "p99": float(np.percentile(single[m], 99)),
                       "pps": 256 * len(batch[m]) / (sum(batch[m]) / 1e3),
                       "cpu_pred": (cpu1[m] - cpu0[m]) * 1e6 / (256 * args.batches)} for m in procs}
            rounds.append(row)
            print(f"  round {r + 1}: single p99 {row['on']['p99']:.2f} / {row['off']['p99']:.2f} ms (x{row['on']['p99'] / row['off']['p99']:.3f})"
                  f"   batched {row['on']['pps']:,.0f} / {row['off']['pps']:,.0f} predictions/s (x{row['on']['pps'] / row['off']['pps']:.3f})"
                  f"   server CPU {row['on']['cpu_pred']:.1f} / {row['off']['cpu_pred']:.1f} us a batched prediction"
                  f" (x{row['on']['cpu_pred'] / row['off']['cpu_pred']:.3f})", flush=True)
        for c in conns.values():
            c.close()
    finally:
        for proc in procs.values():
            proc.terminate()
            proc.wait(timeout=30)
    logged = _log_rows(wd) - rows_before
    ratio = {k: float(np.median([r["on"][k] / r["off"][k] for r in rounds])) for k in ("p50", "p99", "pps", "cpu_pred")}
    print(f"\ninterleaved, on / off, medians of {args.runs} rounds' ratios ({args.singles} single requests and {args.batches} batches "
          f"of 256 to each server a round): single p50 x{ratio['p50']:.3f}, p99 x{ratio['p99']:.3f}; batched predictions/s "
          f"x{ratio['pps']:.3f}; server CPU per batched prediction x{ratio['cpu_pred']:.3f}")
    print(f"  prediction log: {logged:,} rows written for {sent + 20 + 3 * 256:,} predictions sent to the logging server")
    return {"rounds": rounds, "ratio": ratio, "logged": logged, "sent": sent + 20 + 3 * 256}


def ops_bench(config, cfg_file: str, wd: Path, args, reqs: list[dict]) -> None:
    """Prediction log + /metrics on vs off, alternated (on, off, off, on, ...) so that the
    machine's load drifts over both alike."""
    switches = {"on": (True, True), "off": (False, False), "metrics": (True, False), "log": (False, True)}
    names = ["on", "off"] + [m for m in args.ops_modes.split(",") if m not in ("on", "off")]
    unknown = [m for m in names if m not in switches]
    if unknown:
        raise SystemExit(f"--ops-modes {unknown}: use on, off, metrics (only /metrics), log (only the prediction log)")
    cfgs = {m: _config_with(config, f"lattice-bench-ops-{m}-", {"monitoring.metrics": switches[m][0],
                                                                "monitoring.prediction_log.enabled": switches[m][1]})
            for m in names}
    url = f"http://127.0.0.1:{args.port}"
    results: dict[str, list[dict]] = {m: [] for m in names}
    sent = logged = 0
    for run in range(args.runs):
        order = [(m, cfgs[m]) for m in names]
        for mode, cfg in (order if run % 2 == 0 else order[::-1]):  # none always goes first
            before = _log_rows(wd)
            res = serve_and_measure(cfg, wd, url, args, reqs)
            results[mode].append(res)
            if mode == "on":  # warm-up 20 + singles + batches of 256, all logged by the clean stop
                sent += 20 + args.singles + 256 * args.batches
                logged += _log_rows(wd) - before
            print(f"  run {run + 1} {mode:<7}: single p99 {np.percentile(res['single_ms'], 99):6.2f} ms   "
                  f"{res['predictions_per_s']:8,.0f} predictions/s   server CPU {res['cpu_us_single']:5.0f} us a single request, "
                  f"{res['cpu_us_prediction']:5.1f} us a batched prediction", flush=True)
    med = {m: {"p50": float(np.median([np.percentile(r["single_ms"], 50) for r in rs])),
               "p99": float(np.median([np.percentile(r["single_ms"], 99) for r in rs])),
               "pps": float(np.median([r["predictions_per_s"] for r in rs])),
               "cpu_single": float(np.median([r["cpu_us_single"] for r in rs])),
               "cpu_pred": float(np.median([r["cpu_us_prediction"] for r in rs]))} for m, rs in results.items()}
    print(f"\nprediction log + /metrics, on vs off ({args.runs} runs each, medians; single: {args.singles} sequential "
          f"requests, batches: {args.batches} x 256)")
    for m in ["off", "on"] + names[2:]:
        print(f"  {m:<7}  single p50 {med[m]['p50']:6.2f} ms  p99 {med[m]['p99']:6.2f} ms   batched {med[m]['pps']:9,.0f} predictions/s"
              f"   server CPU {med[m]['cpu_single']:6.0f} us a single request, {med[m]['cpu_pred']:5.1f} us a batched prediction")
    for m in ["on"] + names[2:]:
        print(f"  {m} / off: single p99 x{med[m]['p99'] / med['off']['p99']:.3f}   batched predictions/s "
              f"x{med[m]['pps'] / med['off']['pps']:.3f}   server CPU single x{med[m]['cpu_single'] / med['off']['cpu_single']:.3f}"
              f", batched x{med[m]['cpu_pred'] / med['off']['cpu_pred']:.3f}")
    print(f"  prediction log: {logged:,} rows written for {sent:,} predictions sent")
    from lattice.paths import Paths

    inproc = ops_in_process(config, Paths.for_config(config, wd), reqs)
    print("  in process, Server.score with vs without recording (medians, alternated call by call):")
    for n in (1, 256):
        r = inproc[n]
        print(f"    {n:>3} request(s): {r['off']:8.0f} us -> {r['on']:8.0f} us   (x{r['on'] / r['off']:.3f});  "
              f"recording alone {r['record']:.0f} us ({r['record'] / r['off']:.1%} of scoring)")
    c = inproc["cpu"]
    print(f"    process CPU per batched prediction, the writer's parts included: {c['off']:.2f} us -> {c['on']:.2f} us "
          f"(+{c['on'] - c['off']:.2f} us, x{c['on'] / c['off']:.3f}; blocks of {len(reqs):,} alternated, medians)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", help="platform config of an existing run (with --workdir)")
    ap.add_argument("--workdir", help="work dir with a champion in the registry and a materialized Feast store")
    ap.add_argument("--singles", type=int, default=500)
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--port", type=int, default=8765)
    ap.add_argument("--stores", action="store_true", help="compare SQLite vs Redis, 1 vs 2 workers (see above)")
    ap.add_argument("--entities", type=int, default=1_000_000, help="--stores: users each store is padded to")
    ap.add_argument("--runs", type=int, default=3, help="--stores, --ops: runs per case (medians are printed)")
    ap.add_argument("--ops", action="store_true", help="prediction log + /metrics on vs off (see above)")
    ap.add_argument("--ops-tail", type=float, default=0, metavar="SECONDS",
                    help="--ops: only the single-request tail in one process, on vs off, SECONDS a window, --runs pairs")
    ap.add_argument("--ops-interleaved", action="store_true",
                    help="--ops: both servers up at once, requests alternated between them (see ops_interleaved); --runs rounds")
    ap.add_argument("--ops-modes", default="on,off", help="--ops: also `metrics` (only /metrics) and `log` (only the "
                    "prediction log), to tell which of the two costs what")
    args = ap.parse_args()
    if args.stores:
        print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, load avg {os.getloadavg()[0]:.1f} (shared machine: noisy)")
        return stores_bench(args)

    from lattice.config import load_config
    from lattice.paths import Paths

    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, python {platform.python_version()}, load avg {os.getloadavg()[0]:.1f}")
    if args.workdir:
        cfg_file, wd = args.config, Path(args.workdir)
    else:
        t = time.perf_counter()
        cfg_file, wd = build_demo(Path(tempfile.mkdtemp(prefix="lattice-bench-serving-")))
        print(f"built the tiny trained demo in {time.perf_counter() - t:.0f}s at {wd}")
    config = load_config(cfg_file)
    paths = Paths.for_config(config, wd)
    reqs = requests_from_window(config, paths, 256 * args.batches)
    if args.ops and args.ops_tail:
        rows = ops_tail_in_process(config, paths, reqs, args.ops_tail, pairs=args.runs)
        print(f"single-request tail in process, {args.ops_tail:g} s a window (us; log + metrics on vs off):")
        for k, r in enumerate(rows, 1):
            print(f"  pair {k}: " + "   ".join(f"p{q:g} {r['on'][q]:6.0f} / {r['off'][q]:6.0f} (x{r['on'][q] / r['off'][q]:.3f})"
                                            for q in (50, 99, 99.9)))
        ratios = {q: float(np.median([r["on"][q] / r["off"][q] for r in rows])) for q in (50, 99, 99.9)}
        print("  median ratio: " + "   ".join(f"p{q:g} x{v:.3f}" for q, v in ratios.items()))
        return None
    if args.ops and args.ops_interleaved:
        ops_interleaved(config, wd, args, reqs)
        return None
    if args.ops:
        return ops_bench(config, cfg_file, wd, args, reqs)

    import yaml

    url = f"http://127.0.0.1:{args.port}"
    modes = [  # (label, serving overrides); the first is the config as given
        (f"online store in memory (serving.online_mirror_entities {config.serving.online_mirror_entities:,})", {}),
        (f"on-demand reads, entity cache {config.serving.feature_cache_seconds:g} s", {"online_mirror_entities": 0}),
        ("on-demand reads, no cache: every request reads the Feast store", {"online_mirror_entities": 0, "feature_cache_seconds": 0}),
    ]
    for label, overrides in modes:
        run_cfg = cfg_file
        if overrides:  # same config, another way to read the online store
            data = config.model_dump(mode="json")
            data["serving"].update(overrides)
            run_cfg = str(Path(tempfile.mkdtemp(prefix="lattice-bench-serving-mode-")) / f"{config.name}.yaml")
            Path(run_cfg).write_text(yaml.safe_dump(data, sort_keys=False))
        res = serve_and_measure(run_cfg, wd, url, args, reqs)
        print(f"\nHTTP /predict on loopback (`lattice serve`, one process, Feast SQLite lookup): {label}")
        print(f"  single request  {percentiles(res['single_ms'])}   ({res['single_per_s']:,.0f} requests/s sequential, n={args.singles})")
        print(f"  batch of 256    {percentiles(res['batch_ms'])}   ({res['predictions_per_s']:,.0f} predictions/s, n={args.batches})")
    split = in_process_split(config, paths, reqs)
    print("  inside the server (p50):  " + "   ".join(
        f"{n} row(s): lookup {s['lookup_p50_ms']:.2f} ms + model {s['model_p50_ms']:.2f} ms" for n, s in split.items()))

    cost = student_vs_teacher(config, paths)
    t, s = cost["teacher"], cost["student"]
    print("\nstudent vs teacher (eager, batch 256)")
    print(f"  params            {s['params']:>12,} vs {t['params']:>12,}   ratio {s['params'] / t['params']:.3f}")
    print(f"  FLOPs / example   {s['flops_per_example']:>12,.0f} vs {t['flops_per_example']:>12,.0f}   ratio "
          f"{s['flops_per_example'] / t['flops_per_example']:.3f}")
    print(f"  forward ms / 256  {s['forward_ms_per_256']:>12.2f} vs {t['forward_ms_per_256']:>12.2f}   ratio "
          f"{s['forward_ms_per_256'] / t['forward_ms_per_256']:.3f}")
    report = paths.reports / "distillation.json"
    if report.exists():
        rep = json.loads(report.read_text())
        print("  NE per cell        student  teacher  gap")
        for cell, row in rep["cells"].items():
            print(f"    {cell:<18} {row['student_ne']:.4f}   {row['teacher_ne']:.4f}  {row.get('relative_gap', float('nan')):+.2%}")
        m = rep["macro"]
        print(f"    {'macro':<18} {m['student_ne']:.4f}   {m['teacher_ne']:.4f}  {m['relative_gap']:+.2%}"
              + (f"   (same student without teacher: {m['no_teacher_ne']:.4f})" if "no_teacher_ne" in m else ""))


if __name__ == "__main__":
    main()
