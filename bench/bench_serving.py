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


def http_bench(url: str, reqs: list[dict], singles: int, batches: int, batch_size: int = 256) -> dict:
    """One keep-alive connection from the standard library's HTTP client (httpx adds about 2 ms
    per call on this machine, which would be measured as server latency)."""
    import http.client
    from urllib.parse import urlparse

    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    headers = {"Content-Type": "application/json"}

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
        single = []
        for i in range(singles):
            t = time.perf_counter()
            post(bodies[i % len(bodies)])
            single.append((time.perf_counter() - t) * 1e3)
        # distinct consecutive rows of the test window per batch, so the entity cache sees the
        # traffic's real repeat rate (Zipf ids), not one batch replayed
        chunks = [reqs[i:i + batch_size] for i in range(0, len(reqs) - batch_size + 1, batch_size)]
        batch_bodies = [json.dumps({"requests": c}).encode() for c in chunks]
        batch = []
        started = time.perf_counter()
        for k in range(batches):
            body = batch_bodies[k % len(batch_bodies)]
            t = time.perf_counter()
            post(body)
            batch.append((time.perf_counter() - t) * 1e3)
        took = time.perf_counter() - started
    finally:
        conn.close()
    return {"single_ms": single, "batch_ms": batch, "predictions_per_s": batches * batch_size / took,
            "single_per_s": singles / (sum(single) / 1e3)}


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


def serve_and_measure(cfg_file: str, wd: Path, url: str, args, reqs: list[dict]) -> dict:
    """Start `lattice serve` in its own process, wait until healthy, run the loop, stop it."""
    import httpx

    server = subprocess.Popen([sys.executable, "-m", "lattice.cli", "serve", cfg_file, "--workdir", str(wd), "--port", str(args.port),
                               "--log-level", "warning"], cwd=ROOT)
    try:
        deadline = time.time() + 180
        while True:
            try:
                if httpx.get(url + "/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.time() > deadline or server.poll() is not None:
                raise RuntimeError("the server did not become healthy")
            time.sleep(0.5)
        return http_bench(url, reqs, args.singles, args.batches)
    finally:
        server.terminate()
        server.wait(timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", help="platform config of an existing run (with --workdir)")
    ap.add_argument("--workdir", help="work dir with a champion in the registry and a materialized Feast store")
    ap.add_argument("--singles", type=int, default=500)
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--port", type=int, default=8765)
    args = ap.parse_args()

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
