"""Issue 37's registry faults (findings 1, 2, 3, 5, 6, 8) against a small local registry, printed as
a table: fault | expected | seen. Each fault starts from champion v1 and challenger v2 (tiny
stand-in artifacts: the registry checks bytes, not models).

    PYTHONPATH=$PWD python bench/faults_registry.py [--workdir /tmp/faults]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workdir", default="/tmp/lattice-faults-registry")
    root = Path(ap.parse_args().workdir)
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

    print("| fault | expected | seen |\n|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
