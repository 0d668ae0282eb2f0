"""What one training run needs, as a JSON file the torchrun workers read (the config travels
inside it, so configs built in code or tests train the same way as YAML ones)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from lattice.config import PlatformConfig
from lattice.paths import Paths


@dataclass
class RunSpec:
    config: dict
    workdir: str
    data_root: str
    model: str
    epochs: int
    seed: int
    table: str
    teacher_scores: str | None = None
    checkpoint_every: int = 0  # steps; 0 = end of every epoch only
    stop_after: int | None = None  # steps; simulates an interruption (checkpoint, then stop)
    resume: bool = False
    progress: bool = True
    validation_only: bool = False  # `lattice tune`: judge on the validation split; never read the test split
    days: dict | None = None  # a windowed run: lattice.data.window.DaySplits.to_json()
    parent: str | None = None  # a warm start: the parent's folder (model.pt, checkpoint/)
    fitted: str | None = None  # a warm start: the parent's id maps refitted for this run (torch.save file)
    lineage: dict | None = None  # written into model.pt and lineage.json (lattice.training.lineage)

    def platform(self) -> PlatformConfig:
        return PlatformConfig.model_validate(self.config)

    def paths(self) -> Paths:
        return Paths(workdir=Path(self.workdir), data_root=Path(self.data_root))

    def save(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=1, default=str))
        return path

    @classmethod
    def load(cls, path: Path) -> "RunSpec":
        return cls(**json.loads(Path(path).read_text()))
