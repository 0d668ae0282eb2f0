"""Load an exported artifact folder and score example-table rows with it.

The folder is self-contained: `model.pt` (TorchScript: dense, KJT, domain -> probabilities),
`config.json` (the training config, which fixes feature order and domain ids) and
`metadata.json` (dense stats, provenance). Rows are encoded by the same code training used
(`lattice.data.loader.batch_from_frame`), so a served row scores exactly like an offline one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import torch

from lattice.config import PlatformConfig
from lattice.data.transforms import DenseStats


@dataclass
class Predictor:
    module: torch.jit.ScriptModule
    config: PlatformConfig
    stats: DenseStats
    metadata: dict[str, Any]
    info: Any = None
    """Registry VersionInfo when loaded from the registry (serving), else None."""
    path: Path | None = None
    objectives: list[str] = field(default_factory=list)
    _encoder: Any = None

    @classmethod
    def load(cls, folder: str | Path, version: Any = None) -> "Predictor":
        folder = Path(folder)
        art = folder / "export" if (folder / "export" / "model.pt").exists() else folder
        meta = json.loads((art / "metadata.json").read_text())
        if meta.get("int8_embeddings"):
            import fbgemm_gpu  # noqa: F401  (registers the INT8 embedding-bag ops the artifact calls)
        import torchrec  # noqa: F401  (KeyedJaggedTensor and its scripted methods)

        module = torch.jit.load(str(art / "model.pt"), map_location="cpu")
        module.eval()
        config = PlatformConfig.model_validate(json.loads((art / "config.json").read_text()))
        p = cls(module, config, DenseStats.from_json(meta["dense_stats"]), meta, version, art, list(config.objective_names))
        p.warm_up()
        return p

    def encode(self, frame: pd.DataFrame):
        from lattice.data.loader import batch_from_frame

        return batch_from_frame(self.config, self.stats, frame)

    def encode_table(self, table: pa.Table):
        """Arrow rows -> Batch with the training encoder (no pandas round trip: the serving path)."""
        from lattice.data.loader import RowEncoder, to_batch

        if self._encoder is None:
            self._encoder = RowEncoder(self.config, self.stats)
        return to_batch(self.config, self._encoder.encode(table, {}))

    def predict_table(self, table: pa.Table) -> dict[str, np.ndarray]:
        return self.predict_batch(self.encode_table(table))

    def predict_columns(self, cols) -> dict[str, np.ndarray]:
        """Serving rows as numpy columns (`lattice.serving.frame.RequestColumns`) -> probabilities,
        through the training encoder's assembly step."""
        from lattice.data.loader import RowEncoder, to_batch

        if self._encoder is None:
            self._encoder = RowEncoder(self.config, self.stats)
        arrs = self._encoder.assemble(cols.example_id, cols.domain, cols.sparse, cols.dense, {}, len(cols))
        return self.predict_batch(to_batch(self.config, arrs))

    @torch.inference_mode()
    def predict_batch(self, batch) -> dict[str, np.ndarray]:
        out = self.module(batch.dense, batch.sparse, batch.domain)
        return {o: out[o].numpy() for o in self.objectives}

    def predict_frame(self, frame: pd.DataFrame) -> dict[str, np.ndarray]:
        return self.predict_batch(self.encode(frame))

    def warm_up(self) -> None:
        """One tiny forward so the first real request does not pay for lazy initialisation."""
        names = [f.column for f in self.config.features.sparse]
        row = {"example_id": ["warmup"], "domain": [self.config.domain_names[0]]}
        row.update({c: pd.array([1], dtype="Int64") for c in names})
        self.predict_frame(pd.DataFrame(row))
