"""Issue 37's faults against a small local registry and, with `--serve-config/--serve-workdir`
(a work dir with a trained champion and a Feast store, e.g. bench_serving.build_demo's), a real
`lattice serve`; printed as a table: fault | expected | seen. Registry faults start from champion
v1 and challenger v2 (tiny stand-in artifacts: the registry checks bytes, not models).

    PYTHONPATH=$PWD python bench/faults_registry.py [--workdir /tmp/faults] \
        [--serve-config /tmp/b/bench_config.yaml --serve-workdir /tmp/b/wd]

Findings 1, 2, 3, 5, 6, 8: the registry itself. 4, 5/6 (serving side): the server's watcher
(`lattice.serving.app.Server`'s registry reader and `ModelSlot`) on a registry whose database is
replaced, truncated, or whose champion is an artifact that fails verification. 7: slow bodies
and per-client limits against `lattice serve` (normal clients' p99 under an abusive client:
bench/bench_fairness.py). 8 (Airflow): where the log servers of an Airflow started for
127.0.0.1 listen. 9: a subset run through the task runner. 10: an empty part file, and request
values the feature stage quarantines sent to `lattice serve`.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import unquote, urlparse

from lattice.cli.serve_cmd import exposure_error
from lattice.config import load_config
from lattice.paths import Paths
from lattice.registry import CHALLENGER, CHAMPION, ModelRegistry
from lattice.registry.stages import register

ROOT = Path(__file__).resolve().parents[1]
PASSING = {"decision": "promote", "passed": True, "reasons": [{"check": "all", "passed": True, "message": "ok"}]}


def _model(paths: Paths, payload: bytes) -> None:
    d = paths.model_dir("student")
    (d / "export").mkdir(parents=True, exist_ok=True)
    (d / "export" / "model.pt").write_bytes(payload)
    (d / "metrics.json").write_text(json.dumps({"macro": {"ne": 0.8}}))


def _fresh(config, root: Path, name: str) -> tuple[ModelRegistry, Paths]:
    paths = Paths.for_config(config, root / name)
    reg = ModelRegistry(config, paths)
    for i in (1, 2):
        _model(paths, f"student-{i}".encode() * 64)
        register(config, paths, "student")
    reg.record_promotion(reg.version(1), {**PASSING, "champion_before": None})
    reg.set_challenger(reg.version(2))
    return reg, paths


def _stored_pt(reg: ModelRegistry, v: int) -> Path:
    uri = reg.client.get_run(reg.version(v).run_id).info.artifact_uri
    return Path(unquote(urlparse(uri).path)) / "model" / "export" / "model.pt"


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[3] ^= 0xFF
    path.write_bytes(bytes(data))


def _state(reg: ModelRegistry) -> str:
    champ, ch = reg.by_alias(CHAMPION), reg.by_alias(CHALLENGER)
    return f"champion {champ.version if champ else None}, history {reg.champion_history()}, challenger {ch.version if ch else None}"


def _outcome(call) -> str:
    try:
        call()
        return "accepted"
    except Exception as exc:
        problems = getattr(exc, "problems", None)  # an integrity error: the files it names
        return f"refused ({type(exc).__name__}: {problems[0][:40] + '…' if problems else str(exc)[:90] + '…'})"


def _reader_slot(config, paths: Paths):
    """What `lattice serve` runs to follow the champion: the registry reader of `Server` (it
    watches the database file, then reads the alias) and a `ModelSlot` whose load verifies the
    stored copy (the bytes every replica downloads) instead of building a Predictor."""
    from lattice.serving.slot import ModelSlot

    reader = ModelRegistry(config, paths)

    def current():
        reader.watch_database()
        v = reader.by_alias(CHAMPION)
        return v.version if v else None

    def load(version: int):
        reader.download(reader.version(version))  # raises ArtifactIntegrityError for a corrupt copy
        return version

    return reader, ModelSlot(current, load, poll_seconds=3600)


def _health(slot) -> str:
    st = slot.state()
    return f"served {st['served_version']}, registry {st['registry_version']}, status {st['status']}"


def _promote_elsewhere(paths: Paths, version: int) -> None:
    """A promotion by another process (as `lattice promote` is), writing the file now at the path."""
    code = ("import sys; from pathlib import Path; from lattice.config import load_config; from lattice.paths import Paths; "
            "from lattice.registry import ModelRegistry; c = load_config(sys.argv[1]); "
            "r = ModelRegistry(c, Paths.for_config(c, sys.argv[2])); "
            "r.record_promotion(r.version(int(sys.argv[3])), {'decision': 'promote', 'passed': True, 'reasons': [], "
            "'champion_before': r.by_alias('champion').version})")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    subprocess.run([sys.executable, "-c", code, str(ROOT / "configs" / "demo.yaml"), str(paths.workdir), str(version)],
                   check=True, env=env, capture_output=True)


def serving_registry_rows(config, root: Path) -> list[tuple[str, str, str]]:
    rows = []
    # 4: mlflow.db deleted and restored from a backup under the running server, then a promote
    reg, paths = _fresh(config, root, "f4")
    reader, slot = _reader_slot(config, paths)
    slot.refresh()
    db = paths.mlflow / "mlflow.db"
    backup = root / "f4-backup.db"
    shutil.copyfile(db, backup)
    db.unlink()
    slot.refresh()
    gone = _health(slot)
    shutil.copyfile(backup, db)  # restored: a new file at the path
    _promote_elsewhere(paths, 2)
    started = time.monotonic()
    slot.refresh()  # the next poll
    rows.append(("4 mlflow.db deleted, restored from backup, v2 promoted; the server's next poll",
                 "deleted: registry_unreadable; then served 2 = registry 2, ok",
                 f"deleted: {gone}; next poll ({time.monotonic() - started:.1f} s): {_health(slot)}"))

    # 5 (serving side): truncated under the running server
    reg, paths = _fresh(config, root, "f5s")
    reader, slot = _reader_slot(config, paths)
    slot.refresh()
    (paths.mlflow / "mlflow.db").write_bytes(b"")
    slot.refresh()
    rows.append(("5 mlflow.db truncated under a running server; /healthz", "registry_unreadable, still serving 1",
                 f"{_health(slot)} ({(slot.state()['reason'] or '')[:60]}…)"))

    # 6 (serving side): the alias names a version whose stored copy is corrupt (set by hand:
    # rollback itself refuses it, row 6 above)
    reg, paths = _fresh(config, root, "f6s")
    reg.record_promotion(reg.version(2), {**PASSING, "champion_before": 1})
    reader, slot = _reader_slot(config, paths)
    slot.refresh()
    _flip(_stored_pt(reg, 1))
    shutil.rmtree(paths.mlflow / "cache", ignore_errors=True)  # a replica without a cached copy
    reg._set_alias(CHAMPION, 1)
    slot.refresh()
    rows.append(("6 champion moved to v1 whose stored copy is corrupt; /healthz", "refused, still serving 2, not ok",
                 _health(slot)))
    return rows


def subset_rows(config, root: Path) -> list[tuple[str, str, str]]:
    """9: the train form's Domains = feed, search through the task runner; the stage itself is a
    stand-in that writes a model file (what is under test is where the runner points it)."""
    import pandas as pd

    from lattice import stages
    from lattice.data.local_consolidate import write_parquet
    from lattice.orchestration.spec import dag_specs, defaults
    from lattice.orchestration.task_runner import DeterministicError, run_task

    os.environ["LATTICE_WORKDIR"] = str(root / "f9")
    paths = Paths.for_config(config)
    write_parquet(pd.DataFrame({"domain": ["feed", "search", "video"] * 2, "x": range(6)}), paths.training_set / "part-0.parquet")
    full = paths.model_dir("teacher")
    full.mkdir(parents=True, exist_ok=True)
    (full / "model.pt").write_text("full teacher")

    def stand_in(config, paths, model="teacher", **kw):
        out = paths.model_dir(model)
        out.mkdir(parents=True, exist_ok=True)
        (out / "model.pt").write_text(f"{model} of {config.domain_names}")
        return {"model_dir": str(out)}

    real = stages.get_stage
    stages.get_stage = lambda name: stand_in if name in ("train", "distill") else real(name)
    try:
        specs = {s.family: s for s in dag_specs(config)}
        t = specs["train_teacher"]
        out = run_task(ROOT / "configs" / "demo.yaml", t.tasks[0], {**defaults(t), "domains": ["feed", "search"]}, t.params)
        d = specs["distill"]
        try:
            run_task(ROOT / "configs" / "demo.yaml", d.tasks[0], {**defaults(d), "domains": ["feed"]}, d.params)
            missing = "ran"
        except DeterministicError as exc:
            missing = f"stopped, not retried ({str(exc)[:70]}…)"
    finally:
        stages.get_stage = real
        del os.environ["LATTICE_WORKDIR"]
    return [("9 train_teacher with Domains = feed, search", "models/teacher__feed_search; full teacher untouched",
             f"wrote {Path(out['summary']['model_dir']).relative_to(paths.workdir)}; full teacher: {full.joinpath('model.pt').read_text()!r}"),
            ("9 distill with Domains = feed (no teacher of that subset)", "stops with what to run first, no retries", missing)]


def empty_part_row(root: Path) -> tuple[str, str, str]:
    import datetime as dt

    import pyarrow as pa
    import pyarrow.parquet as pq

    from lattice.config.schema import Source
    from pipelines.sources import select_files, source_columns

    folder = root / "f10" / "search" / "date=2026-01-01"
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"ts": ["1"], "uid": ["7"]}), folder / "part-0.parquet")
    (folder / "part-1.parquet").write_bytes(b"")
    src = Source(name="s", path="search", format="parquet", domain="search", columns={"uid": "user_id"},
                 event_time={"column": "ts", "format": "unix_seconds"})
    try:
        sel = select_files(Paths(root / "f10" / "wd", root / "f10"), src, dt.date(2026, 1, 1), dt.date(2026, 1, 2))
        source_columns(src, sel.files)
        seen = f"read {len(sel.files)} file(s); {len(sel.empty_files)} empty file(s) counted as 0 rows"
    except Exception as exc:
        seen = f"run stopped: {type(exc).__name__}: {str(exc)[:60]}"
    return ("10 one 0-byte part file in a source", "0 rows for it; the run goes on", seen)


def airflow_row(root: Path) -> tuple[str, str, str]:
    from lattice.orchestration.airflow_env import local_airflow_env
    from lattice.orchestration.loopback_logs import HOST_ENV, write_settings

    home = root / "f8-airflow"
    write_settings(home)  # what `lattice airflow` (standalone.start) writes before starting Airflow
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    probe = ("import multiprocessing, sys, time\nfrom airflow.utils.serve_logs import serve_logs\n"
             "multiprocessing.Process(target=serve_logs, kwargs={'port': int(sys.argv[1])}, daemon=True).start()\ntime.sleep(60)\n")
    env = {**os.environ, **local_airflow_env(home, log_ports=(port, port + 1)), HOST_ENV: "127.0.0.1",
           "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.Popen([sys.executable, "-c", probe, str(port)], env=env, cwd=home, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    bound: list[str] = []
    try:
        deadline = time.time() + 90
        while not bound and time.time() < deadline and proc.poll() is None:
            time.sleep(0.5)
            out = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True).stdout
            bound = [line.split()[3] for line in out.splitlines() if line.strip()]
    finally:
        os.killpg(proc.pid, 9)
        proc.wait()
    return ("8 Airflow task-log server of an Airflow started for 127.0.0.1", "listens on 127.0.0.1 only",
            f"listens on {', '.join(bound) or 'nothing (did not start)'}")


def _serve(cfg_file: Path, wd: str, port: int) -> subprocess.Popen:
    import httpx

    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    server = subprocess.Popen([sys.executable, "-m", "lattice.cli", "serve", str(cfg_file), "--workdir", wd,
                               "--port", str(port), "--log-level", "warning"], cwd=ROOT, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
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


def server_rows(serve_config: str, serve_workdir: str, root: Path) -> list[tuple[str, str, str]]:
    """7 and 10 against a real `lattice serve` (body timeout 2 s, 4 requests in flight per client)."""
    import httpx
    import yaml

    raw = yaml.safe_load(Path(serve_config).read_text())
    raw.setdefault("serving", {})["limits"] = {"body_timeout_seconds": 2.0, "max_requests_in_flight": 4}
    cfg = root / "serve_faults.yaml"
    cfg.write_text(yaml.safe_dump(raw, sort_keys=False))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = _serve(cfg, serve_workdir, port)
    url = f"http://127.0.0.1:{port}"
    good = {"domain": "feed", "entities": {"user_id": 1, "ad_id": 2}, "features": {"price": 1.5}}
    rows = []
    try:
        # 20 slow-body connections from one client (127.0.0.3): headers and 10 of 1,000 promised
        # bytes, then nothing; a normal client (127.0.0.1) meanwhile
        slow = []
        for _ in range(20):
            c = socket.create_connection(("127.0.0.1", port), source_address=("127.0.0.3", 0))
            c.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"domain\":")
            slow.append(c)
        t0 = time.monotonic()
        during = httpx.post(url + "/predict", json=good, timeout=10).status_code
        answers, closed = [], 0
        for c in slow:
            c.settimeout(10)
            try:
                data = c.recv(4096)
                answers.append(data.split(b" ", 2)[1].decode() if data.startswith(b"HTTP/1.1") else "closed")
                c.settimeout(5)
                closed += c.recv(4096) == b""  # then the server closes it: nothing is held
            except OSError:
                answers.append("open")
            c.close()
        took = time.monotonic() - t0
        counts = {a: answers.count(a) for a in sorted(set(answers))}
        rows.append(("7 twenty slow-body connections from one client (10 of 1,000 bytes sent)",
                     "408 at the 2 s body timeout (or 429 over its 4 in flight), closed; another client served",
                     f"{counts}, {closed} of 20 closed by the server, all within {took:.1f} s; another client meanwhile: {during}"))

        # per-client limit: 6 held requests from one address, with max 4 in flight
        held = []
        for _ in range(6):
            c = socket.create_connection(("127.0.0.1", port))
            c.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
            held.append(c)
        time.sleep(0.5)
        r = httpx.post(url + "/predict", json=good, timeout=10)
        other = httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.2")).post(url + "/predict", json=good, timeout=10)
        for c in held:
            c.close()
        rows.append(("7 one client holds more than max_requests_in_flight (4)", "429 + Retry-After for it; another client 200",
                     f"{r.status_code} Retry-After={r.headers.get('retry-after')}; client 127.0.0.2: {other.status_code}"))

        for name, body in (("price -5", {**good, "features": {"price": -5.0}}),
                           ("empty user_id", {**good, "entities": {"user_id": "", "ad_id": 2}})):
            r = httpx.post(url + "/predict", json=body, timeout=10)
            rows.append((f"10 /predict with {name}", "422 naming the field (as the feature stage quarantines it)",
                         f"{r.status_code} {r.json().get('detail', '')[:70]}…"))
    finally:
        server.terminate()
        server.wait(timeout=30)
    return rows


def fairness_row(serve_config: str, serve_workdir: str, root: Path, seconds: float = 5.0) -> tuple[str, str, str]:
    """7: bench_fairness's measurement, shorter: 4 normal clients alone, then with the abuser."""
    import yaml

    sys.path.insert(0, str(ROOT / "bench"))
    from bench_fairness import _normal, _phase, _serve as serve_for_bench
    from bench_serving import requests_from_window
    from lattice.config import load_config as load

    config = load(serve_config)
    reqs = requests_from_window(config, Paths.for_config(config, serve_workdir), 2048)
    singles = [json.dumps(r).encode() for r in reqs]
    batch = json.dumps({"requests": reqs[:1024]}).encode()
    raw = yaml.safe_load(Path(serve_config).read_text())
    raw.setdefault("serving", {})["access_log"] = False
    cfg = root / "serve_fairness.yaml"
    cfg.write_text(yaml.safe_dump(raw, sort_keys=False))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = serve_for_bench(cfg, serve_workdir, port)
    try:
        _normal(port, singles, 4, 2.0)
        # alternated pairs: a busy spell of a shared machine falls on both phases alike
        pairs = [(_phase(port, singles, batch, 4, seconds, abuse=False), _phase(port, singles, batch, 4, seconds, abuse=True))
                 for _ in range(3)]
    finally:
        server.terminate()
        server.wait(timeout=30)
    import numpy as np

    a99 = float(np.median([a["p99"] for a, _ in pairs]))
    b99 = float(np.median([b["p99"] for _, b in pairs]))
    failed = sum(n for a, b in pairs for phase in (a, b) for code, n in phase["codes"].items() if code != 200)
    ratios = [round(b["p99"] / a["p99"], 2) for a, b in pairs]
    return ("7 one client: 1,024-row batches over 2 connections; 4 normal clients' p99",
            "at most 2x their p99 alone (same run); 0 failed normal requests",
            f"median p99 {a99:.0f} ms alone, {b99:.0f} ms with it ({b99 / a99:.2f}x; per run {ratios}); "
            f"failed normal requests: {failed}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", default="/tmp/lattice-faults-registry")
    ap.add_argument("--serve-config", help="config of a work dir with a trained champion (findings 7 and 10 on a real server)")
    ap.add_argument("--serve-workdir")
    args = ap.parse_args()
    root = Path(args.workdir)
    shutil.rmtree(root, ignore_errors=True)
    config = load_config(ROOT / "configs" / "demo.yaml")
    rows: list[tuple[str, str, str]] = []

    reg, _ = _fresh(config, root, "f1")
    reg.download(reg.version(2))  # the cache holds an intact copy
    _flip(_stored_pt(reg, 2))
    seen = _outcome(lambda: reg.record_promotion(reg.version(2), {**PASSING, "champion_before": 1}))
    rows.append(("1 stored copy of v2 corrupt, cache intact; promote", "refused naming export/model.pt; champion 1",
                 f"{seen}; {_state(reg)}"))

    reg, _ = _fresh(config, root, "f2")

    class Killed(BaseException):
        pass

    def die_after_alias(what, steps):
        for _label, do, _undo in steps[:3]:  # intent, decision run, alias
            do()
        raise Killed()

    reg._all_or_nothing = die_after_alias
    try:
        reg.record_promotion(reg.version(2), {**PASSING, "champion_before": 1})
    except Killed:
        pass
    torn = _state(reg)
    del reg._all_or_nothing
    with reg.move_lock("fault script"):
        note = reg.reconcile()
    rows.append(("2 killed right after the alias moved; next promote", "settled: champion 2, history [1, 2], challenger None",
                 f"torn: {torn} -> {note}; {_state(reg)}"))

    reg, paths = _fresh(config, root, "f3")
    db = paths.mlflow / "mlflow.db"

    def hold(seconds: float, taken: threading.Event) -> None:
        con = sqlite3.connect(db, isolation_level=None, timeout=0.1)
        con.execute("BEGIN EXCLUSIVE")
        taken.set()
        time.sleep(seconds)
        con.execute("ROLLBACK")
        con.close()

    for seconds in (1.0, 8.0):
        taken = threading.Event()
        t = threading.Thread(target=hold, args=(seconds, taken))
        t.start()
        taken.wait()
        started = time.monotonic()
        seen = _outcome(lambda: reg.by_alias(CHAMPION))
        waited = time.monotonic() - started
        t.join()
        want = "waits, reads champion 1" if seconds < 5 else "error naming mlflow.db after ~5 s"
        rows.append((f"3 exclusive lock on mlflow.db for {seconds:.0f} s; by_alias", want,
                     f"{seen} after {waited:.1f} s; {_state(reg)}"))

    reg, paths = _fresh(config, root, "f5")
    (paths.mlflow / "mlflow.db").write_bytes(b"")
    seen = _outcome(lambda: ModelRegistry(config, paths))
    rows.append(("5 mlflow.db truncated to 0 bytes; open the registry", "refused, no new registry",
                 f"{seen}; size now {(paths.mlflow / 'mlflow.db').stat().st_size} B"))

    reg, _ = _fresh(config, root, "f6")
    reg.record_promotion(reg.version(2), {**PASSING, "champion_before": 1})
    reg.download(reg.version(1))
    _flip(_stored_pt(reg, 1))
    seen = _outcome(reg.rollback)
    rows.append(("6 rollback v2 -> v1 with v1's stored copy corrupt", "refused; champion 2", f"{seen}; {_state(reg)}"))

    err = exposure_error("0.0.0.0", config.serving.auth_token_env, False)
    rows.append(("8 lattice serve --host 0.0.0.0, no token", "refused unless --insecure",
                 f"refused ({err[:60]}…)" if err else "would start"))
    rows.append(airflow_row(root))
    rows += serving_registry_rows(config, root)
    rows += subset_rows(config, root)
    rows.append(empty_part_row(root))
    if args.serve_config and args.serve_workdir:
        rows += server_rows(args.serve_config, args.serve_workdir, root)
        rows.append(fairness_row(args.serve_config, args.serve_workdir, root))
    else:
        rows.append(("7, 10 (server)", "-", "not run: pass --serve-config and --serve-workdir"))

    print("| fault | expected | seen |\n|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
