"""Fairness between clients (issue 37 finding 7): normal clients' latency with and without one
abusive client, in the same run, against a real `lattice serve` (one process, the tiny trained
demo: bench_serving.build_demo).

    PYTHONPATH=$PWD .venv/bin/python bench/bench_fairness.py [--config C --workdir W] [--seconds 10]

Normal clients: `--clients` threads, each its own client (address 127.0.0.1, 127.0.0.3, ...:
the server tells clients apart by address) on a keep-alive connection sending single requests
back to back. The abusive client: another process, from 127.0.0.2 (its own client
address), sending valid 1,024-row batches back to back over 2 connections (retrying a 429 at
once, ignoring Retry-After). Each server variant runs "alone" then "with the abuser":

- `fair`: the defaults (`serving.limits`: batches scored in chunks of 64 rows, fair turns);
- `one_chunk`: `score_chunk_rows: 1024`, i.e. a batch scored in one piece as before the fix;
- `chunk_128`: `score_chunk_rows: 128` (longer turns, fewer model calls per batch).

Printed per variant and phase (medians over `--runs` alternated alone / with-abuser pairs on one
server, so that a busy spell of a shared machine falls on both): normal p50/p99 (ms), normal
requests/s, abuser rows/s, failed normal requests, and p99 with / p99 alone (the issue's goal:
at most 2x).
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post_loop(port: int, source: str, bodies: list[bytes], stop: threading.Event, out: list, codes: dict) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60, source_address=(source, 0))
    i = 0
    while not stop.is_set():
        body = bodies[i % len(bodies)]
        i += 1
        t = time.perf_counter()
        try:
            conn.request("POST", "/predict", body, {"Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read()
        except (OSError, http.client.HTTPException):
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60, source_address=(source, 0))
            codes["error"] = codes.get("error", 0) + 1
            continue
        out.append((time.perf_counter() - t) * 1e3)
        codes[resp.status] = codes.get(resp.status, 0) + 1
    conn.close()


def _abuser(port: int, body: bytes, seconds: float, result) -> None:
    stop = threading.Event()
    lat: list[float] = []
    codes: dict = {}
    threads = [threading.Thread(target=_post_loop, args=(port, "127.0.0.2", [body], stop, lat, codes)) for _ in range(2)]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    result.put({"codes": {str(k): v for k, v in codes.items()}, "seconds": seconds})


def _normal(port: int, bodies: list[bytes], clients: int, seconds: float) -> dict:
    stop = threading.Event()
    lats: list[list[float]] = [[] for _ in range(clients)]
    codes: dict = {}
    sources = ["127.0.0.1"] + [f"127.0.0.{i}" for i in range(3, clients + 2)]  # 127.0.0.2 is the abuser
    threads = [threading.Thread(target=_post_loop, args=(port, sources[i], bodies[i::clients], stop, lats[i], codes))
               for i in range(clients)]
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    ms = [x for lat in lats for x in lat]
    return {"p50": float(np.percentile(ms, 50)), "p99": float(np.percentile(ms, 99)), "per_s": len(ms) / seconds,
            "codes": codes}


def _phase(port: int, singles: list[bytes], batch: bytes, clients: int, seconds: float, abuse: bool) -> dict:
    result = mp.get_context("spawn").Queue()
    proc = None
    if abuse:
        proc = mp.get_context("spawn").Process(target=_abuser, args=(port, batch, seconds + 1.0, result))
        proc.start()
        time.sleep(1.0)  # the abuser is at full speed before the normal clients are timed
    out = _normal(port, singles, clients, seconds)
    if proc is not None:
        ab = result.get(timeout=120)
        proc.join()
        ok = int(ab["codes"].get("200", 0))
        out["abuser_rows_per_s"] = ok * 1024 / ab["seconds"]
        out["abuser_429"] = int(ab["codes"].get("429", 0))
    return out


def _serve(cfg_file: Path, wd: str, port: int) -> subprocess.Popen:
    import httpx

    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    server = subprocess.Popen([sys.executable, "-m", "lattice.cli", "serve", str(cfg_file), "--workdir", wd,
                               "--port", str(port), "--log-level", "warning"], cwd=ROOT, env=env)
    deadline = time.time() + 300
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz").status_code == 200:
                return server
        except httpx.TransportError:
            pass
        if time.time() > deadline or server.poll() is not None:
            server.terminate()
            raise RuntimeError("the server did not become healthy")
        time.sleep(0.5)


def main() -> None:
    import yaml

    from bench_serving import build_demo, requests_from_window
    from lattice.config import load_config
    from lattice.paths import Paths

    ap = argparse.ArgumentParser()
    ap.add_argument("--config")
    ap.add_argument("--workdir")
    ap.add_argument("--base", default="/tmp/lattice-bench-fairness")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--variants", default="fair,one_chunk")
    ap.add_argument("--runs", type=int, default=3, help="alone / with-abuser pairs per variant (medians are printed)")
    args = ap.parse_args()
    if args.config and args.workdir:
        cfg_file, wd = args.config, args.workdir
    else:
        cfg_file, wd = build_demo(Path(args.base))
    config = load_config(cfg_file)
    reqs = requests_from_window(config, Paths.for_config(config, wd), 2048)
    singles = [json.dumps(r).encode() for r in reqs]
    batch = json.dumps({"requests": reqs[:1024]}).encode()
    raw = yaml.safe_load(Path(cfg_file).read_text())
    variants = {"fair": {}, "one_chunk": {"score_chunk_rows": 1024}, "chunk_128": {"score_chunk_rows": 128}}
    rows = []
    for name in args.variants.split(","):
        raw.setdefault("serving", {})["limits"] = variants[name]
        raw["serving"]["access_log"] = False
        vfile = Path(args.base) / f"fairness_{name}.yaml"
        vfile.parent.mkdir(parents=True, exist_ok=True)
        vfile.write_text(yaml.safe_dump(raw, sort_keys=False))
        port = _free_port()
        server = _serve(vfile, wd, port)
        try:
            _normal(port, singles, args.clients, 2.0)  # warm-up
            # alternated, so that a slow spell of a shared machine falls on both phases alike
            pairs = [(_phase(port, singles, batch, args.clients, args.seconds, abuse=False),
                      _phase(port, singles, batch, args.clients, args.seconds, abuse=True)) for _ in range(args.runs)]
        finally:
            server.terminate()
            server.wait(timeout=30)
        alone = {k: float(np.median([a[k] for a, _ in pairs])) for k in ("p50", "p99", "per_s")}
        abused = {k: float(np.median([b[k] for _, b in pairs])) for k in ("p50", "p99", "per_s", "abuser_rows_per_s", "abuser_429")}
        abused["ratios"] = [round(b["p99"] / a["p99"], 2) for a, b in pairs]
        abused["failed"] = sum(n for a, b in pairs for ph in (a, b) for code, n in ph["codes"].items() if code != 200)
        rows.append((name, alone, abused))
    print(f"\nnormal clients: {args.clients} x single requests, one address each; abuser: 2 connections x 1,024-row "
          f"batches from 127.0.0.2; {args.seconds:.0f} s per phase, same server per variant (cpus: {os.cpu_count()})")
    print(f"medians over {args.runs} alternated runs; p99 ratio per run in brackets")
    print("| variant | phase | normal p50 ms | normal p99 ms | normal req/s | abuser rows/s | normal failed | p99 ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for name, alone, abused in rows:
        print(f"| {name} | alone | {alone['p50']:.1f} | {alone['p99']:.1f} | {alone['per_s']:.0f} | - | | |")
        print(f"| {name} | with abuser | {abused['p50']:.1f} | {abused['p99']:.1f} | {abused['per_s']:.0f} | "
              f"{abused['abuser_rows_per_s']:.0f} | {abused['failed']} | {abused['p99'] / alone['p99']:.2f}x {abused['ratios']} |")
    print(json.dumps({n: {"alone": a, "with_abuser": b} for n, a, b in rows}, default=str))


if __name__ == "__main__":
    main()
