"""Load an exported artifact folder and score example-table rows with it.

The folder is self-contained: `model.pt` (TorchScript: dense, KJT, domain -> probabilities),
`config.json` (the training config, which fixes feature order and domain ids) and
`metadata.json` (dense stats, provenance). Rows are encoded by the same code training used
(`lattice.data.loader.batch_from_frame`), so a served row scores exactly like an offline one.

Loaded for a registry version, the files are read once, hashed, checked against the checksum
recorded at registration, and only then deserialised from those same bytes: a changed file is
refused (ArtifactIntegrityError), and `checksum` is that of exactly what was loaded.
"""

from __future__ import annotations

import hashlib
import io
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
from lattice.registry.checksum import (MANIFEST_FILE, MANIFEST_TAG, ArtifactIntegrityError, compare, read_manifest,
                                       sha256_files)


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
    checksum: str = ""
    """sha256 of the artifact folder as loaded (`sha256_path` of the bytes read): what /metadata reports."""
    leaves: Any = None
    """The tree fit (lattice.trees.leaves.LeafForest, from trees.json) of a model that reads leaf ids:
    every request's leaf ids are computed here, by LightGBM, from its raw columns."""

    @classmethod
    def load(cls, folder: str | Path, version: Any = None) -> "Predictor":
        """Load `folder` (a registered model folder with `export/`, or an export folder). With a
        registry `version`, refuse (ArtifactIntegrityError) unless the files are the registered bytes."""
        folder = Path(folder)
        art = folder / "export" if (folder / "export" / "model.pt").exists() else folder
        files = {f.relative_to(art).as_posix(): f.read_bytes() for f in sorted(art.rglob("*")) if f.is_file()}
        checksum = sha256_files(files)
        if version is not None:
            _verify_loaded(folder, art, files, checksum, version)

        def read(name: str) -> bytes:
            if name not in files:
                raise FileNotFoundError(f"{art / name} not found: {art} is not an exported artifact")
            return files[name]

        meta = json.loads(read("metadata.json"))
        if meta.get("int8_embeddings"):
            import fbgemm_gpu  # noqa: F401  (registers the INT8 embedding-bag ops the artifact calls)
        import torchrec  # noqa: F401  (KeyedJaggedTensor and its scripted methods)

        module = torch.jit.load(io.BytesIO(read("model.pt")), map_location="cpu")  # the bytes that were checked
        module.eval()
        config = PlatformConfig.model_validate(json.loads(read("config.json")))
        from lattice.trees.leaves import TREES_FILE, LeafForest

        leaves = LeafForest.from_json(read(TREES_FILE)) if TREES_FILE in files else None
        if meta.get("leaves") and leaves is None:
            raise FileNotFoundError(f"{art} serves a model that reads tree leaf ids but holds no {TREES_FILE}; export it again")
        del files
        p = cls(module, config, DenseStats.from_json(meta["dense_stats"]), meta, version, art, list(config.objective_names),
                checksum=checksum, leaves=leaves)
        p.warm_up()
        return p

    def encode(self, frame: pd.DataFrame):
        from lattice.data.loader import batch_from_frame

        return batch_from_frame(self.config, self.stats, frame, leaves=self.leaves)

    def encode_table(self, table: pa.Table):
        """Arrow rows -> Batch with the training encoder (no pandas round trip: the serving path)."""
        from lattice.data.loader import RowEncoder, to_batch

        if self._encoder is None:
            self._encoder = RowEncoder(self.config, self.stats, leaves=self.leaves)
        return to_batch(self.config, self._encoder.encode(table, {}))

    def predict_table(self, table: pa.Table) -> dict[str, np.ndarray]:
        return self.predict_batch(self.encode_table(table))

    def predict_columns(self, cols) -> dict[str, np.ndarray]:
        """Serving rows as numpy columns (`lattice.serving.frame.RequestColumns`) -> probabilities,
        through the training encoder's assembly step."""
        from lattice.data.loader import RowEncoder, to_batch

        if self._encoder is None:
            self._encoder = RowEncoder(self.config, self.stats, leaves=self.leaves)
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


def _verify_loaded(folder: Path, art: Path, files: dict[str, bytes], checksum: str, version: Any) -> None:
    """The loaded bytes against the version's registered checksum (`lattice.checksum`, taken over
    this same folder). On a mismatch the files are named from the manifest beside `folder` (a
    download-cache entry keeps it there), checked against the digest the registry recorded."""
    tags = dict(getattr(version, "tags", None) or {})
    what = f"{getattr(version, 'name', 'model')} v{getattr(version, 'version', '?')} at {art}"
    expected = tags.get("lattice.checksum")
    if not expected:
        raise ArtifactIntegrityError(what, ["no checksum was recorded at registration; register the model again"])
    if checksum == expected:
        return
    problems = [f"checksum {checksum[:16]}… of the files read differs from the registered {expected[:16]}…"]
    digest = tags.get(MANIFEST_TAG)
    if digest and (folder.parent / MANIFEST_FILE).is_file():
        try:
            registered = read_manifest(folder.parent / MANIFEST_FILE, digest)
        except ArtifactIntegrityError as exc:
            problems += exc.problems
        else:
            prefix = "" if art == folder else art.relative_to(folder).as_posix() + "/"
            sub = {k[len(prefix):]: h for k, h in registered.items() if k.startswith(prefix)}
            named = compare(sub, {n: hashlib.sha256(b).hexdigest() for n, b in files.items()})
            problems = [prefix + p for p in named] or problems
    raise ArtifactIntegrityError(what, problems)
