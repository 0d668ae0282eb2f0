"""`lattice predict`: score a user's file or folder with a trained or registered model.

    input (csv / tsv / parquet / jsonl, one source's raw schema)
      --pipelines.score_input: the source's mapping, the feature stage's parsing--> rows | quarantine
      --entity aggregates from the Feast online store (what serving reads)-->
      --the model (champion artifact from the registry, or a trained teacher / student)--> p_<objective>

Entity aggregates are the online store's current values, as serving uses, so a batch score of a
row equals the score of the same row sent to `lattice serve`. Output rows keep the source's
pass-through columns; rows in = rows scored + rows quarantined."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np
import pandas as pd

from lattice.config import PlatformConfig
from lattice.data import schema as S
from lattice.paths import Paths

log = logging.getLogger(__name__)


def _online_aggregates(config: PlatformConfig, paths: Paths, rows: pd.DataFrame) -> tuple[dict[str, np.ndarray], list[list[str]]]:
    from lattice.serving.online import OnlineFeatures

    if not config.features.aggregates or rows.empty:
        return {}, [[] for _ in range(len(rows))]
    online = OnlineFeatures(config, paths)
    online.open()
    ids = {k: rows[k].astype("int64").to_numpy() for k in online.entity_keys}
    return online.lookup_ids(ids, len(rows))


def _scorer(config: PlatformConfig, paths: Paths, model: str):
    """model name -> (callable frame -> {objective: probabilities}, a description, the registry
    version or None for a model scored from its training folder)."""
    if model == "champion":
        from lattice.export.predictor import Predictor
        from lattice.registry import CHAMPION, ModelRegistry

        reg = ModelRegistry(config, paths)
        info = reg.by_alias(CHAMPION)
        if info is None:
            raise LookupError(f"registered model {reg.base_name!r} has no champion; run `lattice promote CONFIG` first")
        pred = Predictor.load(reg.download(info), version=info)
        return pred.predict_frame, f"champion v{info.version}", info.version
    import torch

    from lattice.data.loader import batch_from_frame
    from lattice.evaluation.stages import load_model, predict

    net = load_model(config, paths, model)

    def run(frame: pd.DataFrame) -> dict[str, np.ndarray]:
        with torch.no_grad():
            return {o: p.numpy() for o, p in predict(net, batch_from_frame(config, net.dense_stats, frame, leaves=getattr(net, "leaf_forest", None))).items()}

    return run, f"trained {model}", None


def _write(frame: pd.DataFrame, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".csv":
        frame.to_csv(path, index=False)
    else:
        frame.to_parquet(path, index=False)


def _log_predictions(config: PlatformConfig, paths: Paths, frame: pd.DataFrame, probs: dict[str, np.ndarray],
                     unknown: list[list[str]], version: int | None, logged_at: float | None = None) -> int:
    """The scored rows into the prediction log, in serving's schema (origin `batch`)."""
    from lattice.monitoring.records import LogSchema, frame_batch, log_dir, write_partitioned

    table = frame_batch(LogSchema(config, features=config.monitoring.prediction_log.features), frame, probs, unknown, version,
                        logged_at=logged_at)
    write_partitioned(table, log_dir(paths.workdir), config.monitoring.prediction_log.compression)
    return table.num_rows


def _score(config: PlatformConfig, paths: Paths, good: pd.DataFrame, score,
           batch_rows: int) -> tuple[pd.DataFrame, pd.DataFrame, list[list[str]]]:
    """(scores, the frame scored with its online aggregates, unknown entities per row)."""
    aggregates, unknown = _online_aggregates(config, paths, good)
    frame = good.copy()
    for c, v in aggregates.items():
        frame[c] = v
    probs: dict[str, list[np.ndarray]] = {o: [] for o in config.objective_names}
    for s in range(0, len(frame), batch_rows):
        part = score(frame.iloc[s:s + batch_rows].reset_index(drop=True))
        for o in probs:
            probs[o].append(np.asarray(part[o], np.float64))
    out = good[S.passthrough_columns(config) + ["example_id", "event_timestamp", "domain"]].copy()
    for o, parts in probs.items():
        out[f"p_{o}"] = np.concatenate(parts) if parts else np.zeros(0)
    out["unknown_entities"] = [",".join(u) for u in unknown]
    return out, frame, unknown


def score_rows(config: PlatformConfig, paths: Paths, good: pd.DataFrame, score, batch_rows: int = 65_536) -> pd.DataFrame:
    """Parsed rows (`parse_input`'s good rows) -> pass-through, example_id, event_timestamp, domain,
    p_<objective> and unknown_entities: the online aggregates joined in, then `score` batch by batch.
    `lattice predict` and the registry's pyfunc flavour both call it, so they score alike."""
    return _score(config, paths, good, score, batch_rows)[0]


def predict_file(config: PlatformConfig, paths: Paths, input: str, output: str, model: str = "champion",
                 source: str | None = None, batch_rows: int = 65_536, log_predictions: bool | None = None,
                 logged_at: str | None = None) -> dict:
    """`log_predictions`: append the scores to the prediction log (default: the config's
    `monitoring.prediction_log.enabled`). `logged_at`: the time the log records them as scored
    (UTC; a naive time is read as UTC; default now): a replay of a past day's traffic, whose
    monitor periods must be that day's and not the replay's."""
    from pipelines.score_input import parse_input

    t0 = time.perf_counter()
    good, bad, src = parse_input(config, input, source)
    score, what, version = _scorer(config, paths, model)
    out, frame, unknown = _score(config, paths, good, score, batch_rows)
    logged = 0
    if (config.monitoring.prediction_log.enabled if log_predictions is None else log_predictions) and len(frame):
        probs = {o: out[f"p_{o}"].to_numpy() for o in config.objective_names}
        when = None
        if logged_at is not None:
            ts = pd.Timestamp(logged_at)
            when = (ts.tz_localize("UTC") if ts.tz is None else ts).timestamp()
        logged = _log_predictions(config, paths, frame, probs, unknown, version, logged_at=when)
    out_path = Path(output)
    _write(out, out_path)
    q_path = out_path.with_name(out_path.stem + "_quarantine.parquet")
    if len(bad):
        _write(bad, q_path)
    summary = {
        "stage": "predict", "model": what, "source": src.name, "input": input, "output": str(out_path),
        "rows_in": int(len(good) + len(bad)), "rows_scored": int(len(good)), "quarantined": int(len(bad)),
        "quarantine_reasons": {str(k): int(v) for k, v in bad["reason"].value_counts().items()} if len(bad) else {},
        "quarantine": str(q_path) if len(bad) else None, "logged": logged, "seconds": round(time.perf_counter() - t0, 2),
    }
    log.info("predict: %d of %d rows scored by %s; %d quarantined", summary["rows_scored"], summary["rows_in"], what, summary["quarantined"])
    return summary
