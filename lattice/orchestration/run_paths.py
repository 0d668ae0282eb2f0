"""Where one task of a model DAG reads and writes: the config's `Paths`, with two changes.

* A run on a subset of domains reads a copy of the training table that holds only those domains'
  rows. The narrowed config (see `narrow`) declares only the chosen domains, and the loader refuses
  rows of a domain the config does not declare (a table built for another config must not train
  silently), so the rows are filtered here rather than relaxing that check. Training on the full
  config and judging only the subset was the other choice; it would ignore what the user asked
  for (a model of these domains) and still spend the time of every domain.
* A task that rewrites a model folder (`TaskSpec.replaces_model`) writes it under a scratch
  workdir, and the folder replaces the old one only when the stage succeeded: a failed run leaves
  the previous model whole, never new metadata beside the old weights.

* A run on a subset of domains or objectives is its own model variant (`variant`): its model
  folders are `models/<model>__<variant>` (e.g. `teacher__feed_search`), its teacher scores
  `teacher_scores__<variant>`, and it registers under `<registered name>__<variant>`, so it never
  replaces the full model in the work directory nor becomes the registry's latest teacher or the
  servable model's challenger (issue 37 finding 9).

Training ranks under torchrun rebuild plain `Paths(workdir)` from the run spec, so a staged
model lives where plain `Paths` of the scratch workdir put it (`<scratch>/models/<name>`); every
other folder resolves to the config's real workdir.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lattice.paths import Paths

SUBSETS = "subsets"
STAGING = ".staging"
MARKER = "_lattice_subset.json"  # leading "_": the loader and pyarrow skip it as a data file


@dataclass(frozen=True)
class RunPaths(Paths):
    home: Paths
    """The config's real paths."""
    table: Path | None = None
    """The training table this run reads instead of the config's (a domain subset)."""
    staged: tuple[str, ...] = ()
    """Models written under `workdir` (a scratch folder), swapped into `home` by `commit`."""
    variant: str | None = None
    """A subset run's model variant (`subset_variant`); None for the full config."""

    @classmethod
    def make(cls, home: Paths, *, table: Path | None = None, staged: str | None = None,
             variant: str | None = None) -> "RunPaths":
        workdir = home.workdir / STAGING / f"{staged}-{uuid.uuid4().hex[:8]}" if staged else home.workdir
        return cls(workdir=workdir, data_root=home.data_root, home=home, table=table,
                   staged=(staged,) if staged else (), variant=variant)

    def home_model_dir(self, model: str) -> Path:
        """Where `model` lives in the real work directory: its variant's folder in a subset run."""
        return self.home.model_dir(variant_name(model, self.variant))

    # the table the loader finds (`find_table` tries training_set, then consolidated)
    @property
    def training_set(self) -> Path:
        return self.table if self.table is not None else self.home.training_set

    @property
    def consolidated(self) -> Path:
        return self.table if self.table is not None else self.home.consolidated

    @property
    def quarantine(self) -> Path:
        return self.home.quarantine

    @property
    def aggregates(self) -> Path:
        return self.home.aggregates

    @property
    def feast_repo(self) -> Path:
        return self.home.feast_repo

    @property
    def validation(self) -> Path:
        return self.home.validation

    @property
    def hashing(self) -> Path:
        return self.home.hashing

    @property
    def trees(self) -> Path:
        return self.home.trees

    @property
    def models(self) -> Path:
        return self.home.models

    def model_dir(self, model: str) -> Path:
        if model in self.staged:
            return Paths(self.workdir, self.data_root).model_dir(model)  # what the ranks compute
        return self.home_model_dir(model)

    @property
    def teacher_scores(self) -> Path:
        t = self.home.teacher_scores
        return t if self.variant is None else t.with_name(f"{t.name}__{self.variant}")

    @property
    def mlflow(self) -> Path:
        return self.home.mlflow

    @property
    def reports(self) -> Path:
        r = self.home.reports
        return r if self.variant is None else r / self.variant  # a subset's reports beside, not over, the full ones

    def ensure(self) -> "RunPaths":
        self.home.ensure()
        self.workdir.mkdir(parents=True, exist_ok=True)
        return self

    def commit(self) -> dict[str, str]:
        """Move every staged model folder over the real one; returns {scratch path: real path}."""
        moved: dict[str, str] = {}
        for model in self.staged:
            new, target = self.model_dir(model), self.home_model_dir(model)
            # a torch model is whole once model.pt exists; a LightGBM baseline (lattice.training.gbdt_stage)
            # has boosters instead and writes its summary.json last
            trees_done = (new / "boosters").is_dir() and (new / "summary.json").exists()
            if not ((new / "model.pt").exists() or trees_done):
                raise FileNotFoundError(f"the stage wrote no {new / 'model.pt'}; the previous model at {target} is kept")
            spec = new / "run_spec.json"
            if spec.exists():  # the record of the run names the folders it ends up in
                data = json.loads(spec.read_text())
                data["workdir"] = str(self.home.workdir)
                spec.write_text(json.dumps(data, indent=1))
            swap_in(new, target)
            moved[str(new)] = str(target)
        self.discard()
        return moved

    def discard(self) -> None:
        if self.staged:
            shutil.rmtree(self.workdir, ignore_errors=True)
            try:
                self.workdir.parent.rmdir()  # .staging, when no other task stages a model now
            except OSError:
                pass


def subset_variant(full_domains: list[str], full_objectives: list[str], domains: list[str],
                   objectives: list[str]) -> str | None:
    """The variant name of a run on `domains` x `objectives` of a config declaring the full lists:
    None for the full config; else the chosen domains joined by '_' (when a subset), then '__'
    and the chosen objectives (when a subset), e.g. `feed_search`, `click`, `feed__click`.
    Letters, digits, '_' and '-' only: it becomes part of folder, MLflow and Feast names."""
    parts = []
    if sorted(domains) != sorted(full_domains):
        parts.append("_".join(d for d in full_domains if d in domains))
    if sorted(objectives) != sorted(full_objectives):
        parts.append("_".join(o for o in full_objectives if o in objectives))
    return "__".join(parts) or None


def variant_name(model: str, variant: str | None) -> str:
    """`teacher` -> `teacher__feed_search` in a subset run (the model folder's and the registry's name)."""
    return model if variant is None else f"{model}__{variant}"


def swap_in(new: Path, target: Path) -> None:
    """Replace folder `target` by `new` (same file system): two renames, the old one removed after."""
    target.parent.mkdir(parents=True, exist_ok=True)
    old = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}")
    if target.exists():
        os.replace(target, old)
    os.replace(new, target)
    shutil.rmtree(old, ignore_errors=True)


def relocate(value: Any, moved: dict[str, str]) -> Any:
    """`value` (a stage summary) with scratch paths rewritten to where the folders were moved."""
    if isinstance(value, str):
        for old, new in moved.items():
            if value == old or value.startswith(old + os.sep):
                return new + value[len(old):]
        return value
    if isinstance(value, dict):
        return {k: relocate(v, moved) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [relocate(v, moved) for v in value]
    return value


def _fingerprint(table: Path) -> list[tuple[str, int, int]]:
    files = [table] if table.is_file() else sorted(p for p in table.rglob("*.parquet"))
    return [(str(f.relative_to(table)) if table.is_dir() else f.name, f.stat().st_size, f.stat().st_mtime_ns)
            for f in files]


def _hive_keys(table: Path) -> list[str]:
    """The `key=value` folder names above the table's first data file (none for a flat table)."""
    if table.is_file():
        return []
    first = next(iter(sorted(p for p in table.rglob("*.parquet") if not p.name.startswith((".", "_")))), None)
    parts = first.relative_to(table).parts[:-1] if first is not None else ()
    return [part.split("=", 1)[0] for part in parts if "=" in part]


def subset_table(home: Paths, domains: list[str]) -> Path:
    """The config's training table (`find_table`) restricted to the rows of `domains`, under
    `<workdir>/subsets/`. Named by the domains and the source files (paths, sizes, mtimes): reused
    while the table is unchanged, rebuilt (and the stale copy removed) after it is rewritten."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    from lattice.data.loader import find_table
    from lattice.orchestration.narrow import SubsetError

    source = find_table(home)
    chosen = sorted(domains)
    key = hashlib.sha256(json.dumps([chosen, str(source), _fingerprint(source)]).encode()).hexdigest()[:12]
    root = home.workdir / SUBSETS
    prefix = "+".join(chosen) + "-"
    folder = root / f"{prefix}{key}"
    if (folder / MARKER).exists():
        return folder
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{folder.name}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        data = ds.dataset(str(source), format="parquet", partitioning="hive", ignore_prefixes=[".", "_"])
        rows = data.count_rows(filter=ds.field("domain").isin(chosen))
        if rows == 0:
            raise SubsetError(f"the training table {source} holds no rows of the domains {chosen}; run the "
                              "features DAG with these domains first, or choose domains that have data")
        # keep the source's hive folders (e.g. domain=feed/) so the loader reads the same columns
        keys = _hive_keys(source)
        layout = ds.partitioning(pa.schema([data.schema.field(k) for k in keys]), flavor="hive") if keys else None
        ds.write_dataset(data.scanner(filter=ds.field("domain").isin(chosen)), str(tmp), format="parquet",
                         partitioning=layout, basename_template="part-{i}.parquet",
                         max_rows_per_group=65_536, max_rows_per_file=2_000_000)
        (tmp / MARKER).write_text(json.dumps({"source": str(source), "domains": chosen, "rows": rows}))
        try:
            os.replace(tmp, folder)
        except OSError:  # another task built the same subset first: use its copy
            if not (folder / MARKER).exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for stale in root.glob(f"{prefix}*"):
        if stale != folder and stale.name[len(prefix):].isalnum():
            shutil.rmtree(stale, ignore_errors=True)
    return folder
