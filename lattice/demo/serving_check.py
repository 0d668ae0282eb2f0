"""The demo's serving check: start `lattice serve` as its own process (as a user would), send test
rows as HTTP requests, compare every answer with the champion artifact scored offline on the
same rows and the same online features, then stop the server."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

import numpy as np
import pandas as pd

from lattice.config import PlatformConfig
from lattice.data import schema as S
from lattice.paths import Paths
from lattice.serving.client import requests_from_rows


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def offline_scores(config: PlatformConfig, paths: Paths, predictor, rows: pd.DataFrame) -> dict[str, np.ndarray]:
    """The champion artifact on the same rows, with the entity features the online store holds."""
    from features.store import online_features

    frame = rows.copy()
    entity = [f.column for f in config.entity_features]
    if entity and S.aggregate_columns(config):
        online = online_features(config, paths, [{k: int(v) for k, v in zip(entity, vals)} for vals in frame[entity].to_numpy()])
        for c in S.aggregate_columns(config):
            frame[c] = [0.0 if v is None else float(v) for v in online[c]]
    return predictor.predict_frame(frame)


def _wait_ready(url: str, proc: subprocess.Popen, timeout: float = 180) -> None:
    import httpx

    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"`lattice serve` exited with code {proc.returncode} before it was ready")
        try:
            if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"`lattice serve` was not ready at {url} after {timeout:.0f}s")


def serving_check(config: PlatformConfig, paths: Paths, n_requests: int = 300) -> dict[str, Any]:
    import httpx

    from lattice.export.predictor import Predictor
    from lattice.export.window import load_window
    from lattice.registry import CHAMPION, ModelRegistry

    reg = ModelRegistry(config, paths)
    champion = reg.by_alias(CHAMPION)
    if champion is None:
        raise LookupError("no champion to serve: the promotion gate has never promoted a model")
    predictor = Predictor.load(reg.download(champion), version=champion)
    rows = load_window(config, paths, "test", max_rows=n_requests, seed=7)
    reqs = requests_from_rows(config, rows)
    want = offline_scores(config, paths, predictor, rows)

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "lattice.cli", "serve", config.source_file or "configs/demo.yaml",
           "--workdir", str(paths.workdir), "--port", str(port), "--log-level", "warning"]
    log = open(paths.workdir / "serve.log", "w")
    env = {**os.environ, "LATTICE_DEMO_DATA": str(paths.data_root)}
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        _wait_ready(url, proc)
        # a config that turns serving auth on gets its token sent, as any client would
        token = os.environ.get(config.serving.auth_token_env or "", "")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        meta = httpx.get(url + "/metadata", timeout=10, headers=headers).json()
        latencies, got = [], {o: [] for o in config.objective_names}
        failures = 0
        with httpx.Client(timeout=30, headers=headers) as client:
            for req in reqs[:3]:  # warm-up: the first calls pay for lazy initialisation, not serving
                client.post(url + "/predict", json=req)
            for req in reqs:  # one request at a time, as a ranking service would call it
                t = time.perf_counter()
                resp = client.post(url + "/predict", json=req)
                latencies.append((time.perf_counter() - t) * 1000)
                if resp.status_code != 200:
                    failures += 1
                    continue
                pred = resp.json()["predictions"][0]
                for o in config.objective_names:
                    got[o].append(pred["probabilities"][o])
            t = time.perf_counter()
            batch = client.post(url + "/predict", json={"requests": reqs[:config.serving.max_batch]})
            batch_ms = (time.perf_counter() - t) * 1000
        diff = max(float(np.max(np.abs(np.array(got[o]) - want[o]))) for o in config.objective_names) if not failures else float("nan")
        # the served artifact (TorchScript, fused pooling) and the offline scores (eager model) sum in
        # another float32 order: the gate's own artifact tolerance, not bit identity (issue 41)
        tol = config.promotion.export_tolerance
        return {
            "requests": len(reqs), "failed": failures, "model_version": meta.get("model_version"),
            "max_abs_diff_vs_offline": diff, "tolerance": tol, "matches_offline": bool(failures == 0 and diff <= tol),
            "latency_p50_ms": float(np.percentile(latencies, 50)), "latency_p99_ms": float(np.percentile(latencies, 99)),
            "batch_status": batch.status_code, "batch_ms": batch_ms,
        }
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
