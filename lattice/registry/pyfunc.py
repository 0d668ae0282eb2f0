"""An MLflow pyfunc flavour for every registered Lattice model, so that

    mlflow.pyfunc.load_model("models:/<name>@champion").predict(raw_rows)

scores raw rows the way `lattice predict` does: the rows of one source, in that source's own
column names, parsed by the feature stage's Spark SQL (`pipelines.score_input`), joined with the
entity aggregates of the Feast online store, and scored by the artifact; the answer is a
DataFrame with the source's pass-through columns, example_id, event_timestamp, domain,
`p_<objective>`, unknown_entities and `quarantine_reason` (null for a scored row; a row that
cannot be parsed comes back with its reason and no score, so rows in = rows out).

The flavour is added to the registered `model/` folder beside the model's own files (MLmodel,
the code file, the environment files and `artifacts/lattice_pyfunc.json`); the model's files are
not copied, and the registry's manifest covers the added files too.

Where the online store is: the work directory recorded at registration (`workdir` in the
flavour's model_config); pass `model_config={"workdir": ...}` to `load_model` to point at
another. `params={"source": NAME}` picks the source when more than one fits the columns."""

from __future__ import annotations

import json
import tempfile
import warnings
from importlib import metadata
from pathlib import Path
import mlflow.pyfunc
import numpy as np
import pandas as pd

MARKER = "lattice_pyfunc.json"
"""The flavour's one artifact: a small description (model name, input) whose location tells the
loaded model where its registered folder is (two levels up: `<folder>/artifacts/<marker>`)."""
REQUIREMENTS = ("mlflow", "torch", "torchrec", "fbgemm-gpu-cpu", "pandas", "pyarrow", "pyspark", "feast", "lattice-mdmo")
ENTRY = Path(__file__).with_name("pyfunc_entry.py")


def _requirements() -> list[str]:
    # pinned to what is installed: the flavour runs in this environment (lattice is not on PyPI)
    out = []
    for dist in REQUIREMENTS:
        try:
            out.append(f"{dist}=={metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            continue
    return out


def _signature():
    """No input schema (each source has its own raw columns); the one inference parameter,
    `source`, declared: MLflow drops params a signature does not declare."""
    from mlflow.models import ModelSignature
    from mlflow.types.schema import ParamSchema, ParamSpec

    return ModelSignature(inputs=None, params=ParamSchema([ParamSpec("source", "string", "")]))


def save_flavour(dest: Path, model: str, workdir: Path) -> Path:
    """Write the pyfunc files for `model` into `dest` (an empty folder) and return it; the registry
    logs them into the version's `model/` folder beside the model's files."""
    with tempfile.TemporaryDirectory() as tmp:
        marker = Path(tmp) / MARKER
        marker.write_text(json.dumps({"model": model, "input": "raw rows of one source (its own column names)"}))
        mlflow.pyfunc.save_model(
            path=str(dest), python_model=str(ENTRY), artifacts={"lattice": str(marker)}, signature=_signature(),
            model_config={"workdir": str(workdir)}, pip_requirements=_requirements(),
        )
    return dest


def _as_text(frame: pd.DataFrame) -> pd.DataFrame:
    """Every column as strings with nulls kept: the feature stage reads every raw format as text
    (parquet columns are cast to their string form), so a row scores as it would from a file."""
    out = pd.DataFrame(index=frame.index)
    for c in frame.columns:
        col = frame[c]
        if pd.api.types.is_float_dtype(col) and col.dropna().apply(float.is_integer).all():
            col = col.astype("Int64")  # ids read by pandas into a float column (nulls present): 7.0 -> "7"
        text = col.astype("string")
        out[str(c)] = text.mask(text.str.strip() == "")  # an empty field is null, as in a CSV
    return out


# MLflow warns, when the class is defined, that `predict` has no type hints; the input is one
# source's raw columns, which differ per config, so there is no schema to hint
with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message=".*type hints.*")

    class LatticePyfunc(mlflow.pyfunc.PythonModel):
        """Loads the registered folder's artifact (export/ when exported, else the trained model.pt)."""

        def load_context(self, context) -> None:
            from lattice.paths import Paths

            folder = Path(context.artifacts["lattice"]).resolve().parent.parent
            if not (folder / "MLmodel").is_file():
                raise FileNotFoundError(f"{folder} is not the registered model folder (no MLmodel beside artifacts/{MARKER})")
            self.folder = folder
            self.score, self.config = _load_scorer(folder)
            config = dict(context.model_config or {})
            self.paths = Paths.for_config(self.config, config.get("workdir"))

        def predict(self, context, model_input, params=None):
            from lattice.config.schema import Source
            from lattice.scoring.batch import score_rows
            from pipelines.score_input import parse_input

            if not isinstance(model_input, pd.DataFrame):
                raise TypeError(f"predict takes a pandas DataFrame of raw rows, got {type(model_input).__name__}")
            source = (params or {}).get("source") or None  # "": the one source that fits the columns
            # the rows go to the feature stage as a parquet file of text columns: every source's mapping reads it
            config = self.config.model_copy(update={"sources": [
                Source.model_validate({**s.model_dump(), "format": "parquet"}) for s in self.config.sources]})
            with tempfile.TemporaryDirectory() as tmp:
                file = Path(tmp) / "rows.parquet"
                _as_text(model_input).to_parquet(file, index=False)
                good, bad, _ = parse_input(config, str(file), source)
            out = score_rows(self.config, self.paths, good, self.score)
            out["quarantine_reason"] = pd.Series([None] * len(out), dtype="string", index=out.index)
            if len(bad):
                rejected = bad.rename(columns={"reason": "quarantine_reason"})
                for o in self.config.objective_names:
                    rejected[f"p_{o}"] = np.nan
                out = pd.concat([out, rejected[[c for c in rejected.columns if c in out.columns]]], ignore_index=True)
            return out.reset_index(drop=True)


def _load_scorer(folder: Path):
    """(frame -> {objective: probabilities}, the model's training config) for a registered folder."""
    if (folder / "export" / "model.pt").is_file():
        from lattice.export.predictor import Predictor

        pred = Predictor.load(folder)
        return pred.predict_frame, pred.config
    import torch

    from lattice.data.loader import batch_from_frame
    from lattice.evaluation.stages import predict
    from lattice.models.saved import load_saved

    saved = load_saved(folder)  # a tree model has no torch artifact: FileNotFoundError saying so

    def run(frame: pd.DataFrame) -> dict[str, np.ndarray]:
        with torch.no_grad():
            return {o: p.numpy() for o, p in predict(saved.model, batch_from_frame(saved.config, saved.stats, frame, leaves=saved.model.leaf_forest)).items()}

    return run, saved.config
