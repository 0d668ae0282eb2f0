"""redis-py (hiredis parser) vs the hand-written raw-socket client it replaced, reading Feast's
Redis online store layout, in one run.

A redis-server on 127.0.0.1 (a free port, no persistence) gets the demo config's feature views
written by Feast's own `RedisOnlineStore.online_write_batch` (`--entities` per view). Both readers
are checked to return the same values as Feast's `online_read`, then each times `--lookups`
reads of the two shapes serving sends: one request (its user and its ad: one id per view) and a
256-request batch (256 ids per view), alternating the two clients call by call so that drift
on a shared machine hits both. Prints medians, p90 and the ratio.

    .venv/bin/python bench/bench_redis_client.py --entities 20000 --lookups 2000

The rule (issue 36): keep a hand-written path only if it saves more than 20% of request time.
A request's time includes its feature lookup, so a saving under 20% of the lookup alone is
under 20% of the request too.
"""

from __future__ import annotations

import argparse
import datetime as dt
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis(port: int, folder: Path) -> subprocess.Popen:
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(folder)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 20
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return proc
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"redis-server did not start on port {port}")


def repo_config(port: int, folder: Path):
    from feast.repo_config import RepoConfig

    return RepoConfig(project="demo", provider="local", registry=str(folder / "registry.db"), repo_path=str(folder),
                      online_store={"type": "redis", "connection_string": f"127.0.0.1:{port}"},
                      offline_store={"type": "file"}, entity_key_serialization_version=3)


def write_rows(cfg, views, n: int, rng) -> None:
    """Feast's own writer: the keys and fields are exactly what materialization writes."""
    from feast.infra.online_stores.redis import RedisOnlineStore
    from feast.protos.feast.types.EntityKey_pb2 import EntityKey
    from feast.protos.feast.types.Value_pb2 import Value

    store = RedisOnlineStore()
    now = dt.datetime.now(dt.timezone.utc)
    for view in views:
        key = view.join_keys[0]
        rows = []
        for i in range(n):
            values = {f.name: (Value(double_val=float(rng.random())) if "rate" in f.name else Value(int64_val=int(rng.integers(0, 500))))
                      for f in view.features}
            rows.append((EntityKey(join_keys=[key], entity_values=[Value(int64_val=i)]), values, now, None))
        for lo in range(0, n, 5000):
            store.online_write_batch(cfg, view, rows[lo:lo + 5000], None)


def feast_values(cfg, view, ids: list[int]) -> dict[int, list[float]]:
    from feast.infra.online_stores.redis import RedisOnlineStore
    from feast.protos.feast.types.EntityKey_pb2 import EntityKey
    from feast.protos.feast.types.Value_pb2 import Value

    key = view.join_keys[0]
    got = RedisOnlineStore().online_read(cfg, view, [EntityKey(join_keys=[key], entity_values=[Value(int64_val=i)]) for i in ids])
    out = {}
    for i, (_, vals) in zip(ids, got):
        if vals is None:
            out[i] = [float("nan")] * len(view.features)
        else:
            out[i] = [float(getattr(vals[f.name], vals[f.name].WhichOneof("val"))) if f.name in vals and vals[f.name].WhichOneof("val")
                      else float("nan") for f in view.features]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--entities", type=int, default=20_000, help="entities written per feature view")
    ap.add_argument("--lookups", type=int, default=2_000, help="timed reads per client and shape")
    args = ap.parse_args()

    import hiredis
    import redis

    from feast import FeatureStore

    from features.repo import definitions
    from lattice.config import load_config
    from lattice.paths import Paths
    from lattice.serving.redis_online import RedisOnlineReader
    from raw_redis_reader import RedisOnlineReader as RawReader

    config = load_config(ROOT / "configs" / "demo.yaml")
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        paths = Paths.for_config(config, tmp / "wd")
        port = free_port()
        proc = start_redis(port, tmp)
        try:
            cfg = repo_config(port, tmp)
            store = FeatureStore(config=cfg)
            store.apply(definitions(config, paths))  # views read back from a registry carry their join keys
            views = [store.get_feature_view(a.name) for a in config.features.aggregates]
            t = time.perf_counter()
            write_rows(cfg, views, args.entities, rng)
            print(f"wrote {args.entities:,} entities x {len(views)} views with Feast's writer in {time.perf_counter() - t:.1f}s")
            clients = {"redis-py": RedisOnlineReader(cfg, views, read_timeout=5), "raw socket": RawReader(cfg, views, read_timeout=5)}

            def wanted(ids_per_view: int):
                # ids drawn past the written range too: about 1 in 10 is an entity the store lacks
                return [(v.name, v.join_keys[0], [f.name for f in v.features],
                         rng.integers(0, int(args.entities * 1.1), ids_per_view).tolist()) for v in views]

            # same answers as Feast's online_read, for both clients
            check = wanted(300)
            for name, client in clients.items():
                got = client.read_many(check)
                for (vname, _, _, ids), per in zip(check, got):
                    view = next(v for v in views if v.name == vname)
                    want = feast_values(cfg, view, ids)
                    for i in ids:
                        np.testing.assert_allclose(per[i], want[i], rtol=0, atol=0, equal_nan=True, err_msg=f"{name} {vname} id {i}")
            print(f"both clients return Feast online_read's values on {sum(len(w[3]) for w in check)} ids")

            print(f"\nmachine: {platform.machine()} {platform.processor() or ''}, python {platform.python_version()}, "
                  f"redis-py {redis.__version__} (hiredis {hiredis.__version__}), redis-server on loopback")
            print(f"{'shape':<28}{'client':<12}{'median ms':>10}{'p90 ms':>9}")
            for label, per_view in (("1 request (1 id/view)", 1), ("256-request batch", 256)):
                times: dict[str, list[float]] = {k: [] for k in clients}
                for c in clients.values():  # connect and warm up outside the timing
                    for _ in range(20):
                        c.read_many(wanted(per_view))
                for _ in range(args.lookups):
                    w = wanted(per_view)
                    for name, c in clients.items():
                        t = time.perf_counter()
                        c.read_many(w)
                        times[name].append((time.perf_counter() - t) * 1e3)
                med = {k: statistics.median(v) for k, v in times.items()}
                for name, v in times.items():
                    print(f"{label:<28}{name:<12}{med[name]:>10.3f}{np.percentile(v, 90):>9.3f}")
                saving = (med["redis-py"] - med["raw socket"]) / med["redis-py"]
                print(f"{label:<28}ratio redis-py / raw socket = {med['redis-py'] / med['raw socket']:.2f}; "
                      f"the raw socket saves {saving:.0%} of the redis-py lookup time")
            for c in clients.values():
                c.close()
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
