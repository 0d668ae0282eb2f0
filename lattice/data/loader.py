"""Streaming parquet -> `Batch` loader.

The table is the consolidated example table (`lattice.data.schema`), read from
`paths.training_set` when the feature pipeline has written it, else `paths.consolidated`.
Work is cut into *units* (one parquet row group each); per epoch the unit order is shuffled with
(seed, epoch), worker processes take every n-th unit, rows go through a bounded shuffle buffer
(so batches mix domains even though files are partitioned by domain), and each rank keeps every
world_size-th row. Memory is bounded by the buffer, not by the table, and the order is a pure
function of (seed, epoch, rank, world_size, num_workers).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from lattice.config import PlatformConfig
from lattice.data import label_time
from lattice.data import schema as S
from lattice.data.batch import Batch, kjt_from_ids
from lattice.data.split import Split, split_mask
from lattice.data.transforms import DenseStats, StatsAccumulator, dense_spec
from lattice.data.window import DaySplits, row_dates
from lattice.data.zipper import newly_known_heads, zipper_heads_arrow
from lattice.models.leaves import leaf_values
from lattice.paths import Paths



class NoTrainingData(FileNotFoundError):
    pass


def find_table(paths: Paths) -> Path:
    """The training set if the feature pipeline wrote it, else the consolidated examples."""
    for p in (paths.training_set, paths.consolidated):
        if p.exists() and any(p.rglob("*.parquet")):
            return p
    raise NoTrainingData(
        f"no training data: neither {paths.training_set} nor {paths.consolidated} holds parquet files. "
        "Produce it with `lattice features CONFIG` (the Spark feature pipeline); for a quick local table, "
        "lattice.data.local_consolidate.consolidate + write_parquet into the consolidated folder."
    )


@dataclass(frozen=True)
class Unit:
    file: str
    row_group: int
    partition: tuple[tuple[str, str], ...]  # hive key=value pairs from the path


def hive_partitions(root: Path, files: list[Path]) -> dict[str, tuple[tuple[str, str], ...]]:
    """file -> its hive `key=value` folders under `root` (sorted by key), parsed by pyarrow.dataset
    (values URI-decoded, as Spark escapes them). Every value is kept a string: type inference
    would read `007` as 7."""
    import pyarrow.dataset as ds

    names = [str(f) for f in files]
    found = ds.dataset(names, format="parquet", partitioning="hive", partition_base_dir=str(root))
    # the keys' names only: the types discovery inferred are dropped below
    keys = sorted({k for frag in found.get_fragments() for k in ds.get_partition_keys(frag.partition_expression)})
    if not keys:
        return {n: () for n in names}
    text = ds.partitioning(pa.schema([(k, pa.string()) for k in keys]), flavor="hive")
    out = {}
    for frag in ds.dataset(names, format="parquet", partitioning=text, partition_base_dir=str(root)).get_fragments():
        values = ds.get_partition_keys(frag.partition_expression)
        out[frag.path] = tuple((k, values[k]) for k in keys if values.get(k) is not None)
    return out


def scan_units(root: Path) -> list[Unit]:
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*.parquet") if not p.name.startswith((".", "_")))
    parts = hive_partitions(root, files) if root.is_dir() and files else {}
    units = []
    for f in files:
        part = parts.get(str(f), ())
        for rg in range(pq.ParquetFile(f).metadata.num_row_groups):
            units.append(Unit(str(f), rg, part))
    if not units:
        raise NoTrainingData(f"no parquet row groups under {root}")
    return units


def table_rows(root: Path) -> int:
    """Rows of the table, from the parquet footers (no data read)."""
    return sum(pq.ParquetFile(f).metadata.num_rows for f in sorted({u.file for u in scan_units(root)}))


def split_rows(root: Path, split: str) -> int | None:
    """Rows of `split` in the table's stored `split` column (one column read, no rows decoded
    beyond it); None for a table without the column (written before it existed)."""
    import pyarrow.dataset as ds

    if "split" not in table_columns(root):
        return None
    data = ds.dataset(str(root), format="parquet", partitioning="hive", ignore_prefixes=[".", "_"])
    return int(data.count_rows(filter=ds.field("split") == split))


def window_rows(root: Path, days: DaySplits) -> int:
    """Rows of the table's units whose `date` partition the run wants (all units when the table
    is not partitioned by date), from the parquet footers."""
    units = [u for u in scan_units(root) if _unit_wanted(u, days)]
    return sum(pq.ParquetFile(u.file).metadata.row_group(u.row_group).num_rows for u in units)


def _unit_wanted(unit: Unit, days: DaySplits | None) -> bool:
    """False only for a unit whose `date` partition lies outside the run's days (never read)."""
    date = dict(unit.partition).get("date")
    return days is None or date is None or days.wanted(date)


def _unit_ids(tbl: pa.Table, part: dict[str, str]) -> list:
    ids = _column(tbl, "example_id", part)
    return ids.to_pylist() if ids is not None else []


def _row_split(config: PlatformConfig, tbl: pa.Table, part: dict[str, str], split: Split,
               days: DaySplits | None, dates_ids: tuple[np.ndarray, list] | None = None) -> np.ndarray:
    """The rows of `split` in one unit: by the run's days (a windowed run) or the stored column.
    `dates_ids`: the unit's row dates and example ids when the caller already read them."""
    if days is not None:
        dates, ids = dates_ids if dates_ids is not None else (row_dates(tbl, part), _unit_ids(tbl, part))
        return days.split_of(dates, ids, split)
    ids = _unit_ids(tbl, part)
    stored = _column(tbl, "split", part)
    return split_mask(config, ids, split, stored.to_pylist() if stored is not None else None)


def table_columns(root: Path) -> set[str]:
    """Columns of the table: file schema plus hive partition keys (first file decides)."""
    u = scan_units(root)[0]
    return set(pq.ParquetFile(u.file).schema_arrow.names) | {k for k, _ in u.partition}


def _column(tbl: pa.Table, name: str, partition: dict[str, str]) -> pa.ChunkedArray | None:
    if name in tbl.column_names:
        return tbl.column(name)
    if name in partition:
        return pa.chunked_array([pa.array([partition[name]] * tbl.num_rows)])
    return None


def read_unit(unit: Unit, wanted: list[str]) -> tuple[pa.Table, dict[str, str]]:
    pf = pq.ParquetFile(unit.file)
    cols = [c for c in wanted if c in pf.schema_arrow.names]
    return pf.read_row_group(unit.row_group, columns=cols), dict(unit.partition)


class RowEncoder:
    """Rows -> dict of numpy arrays in model order (dense transformed, ids, masks...).

    Two entry points share one assembly step, so training, scoring and serving encode a row the
    same way: `encode` takes an Arrow table (the training set), `assemble` takes numpy columns
    (serving builds those straight from requests, without an Arrow table per request)."""

    def __init__(self, config: PlatformConfig, stats: DenseStats, with_truth: bool = False, leaves=None):
        self.config = config
        self.stats = stats
        self.with_truth = with_truth
        # leaves: a lattice.trees.leaves.LeafForest for a model that reads leaf ids (issue 38);
        # its trees read the raw columns through their own fit's transform
        self.leaves = leaves
        tree_dense = [c.column for c in leaves.stats.columns] if leaves is not None else []
        # raw dense columns read once each, the model's and the trees' (usually the same columns)
        self.dense_columns = list(dict.fromkeys([c.column for c in stats.columns] + tree_dense))
        # the trees' dense block is the model's when both stats transform alike (the usual case:
        # both fitted on the same train split): computed once per row, not twice
        self.shared_dense = leaves is not None and leaves.same_dense_transform(stats)
        self.domain_index = {d: i for i, d in enumerate(config.domain_names)}
        self.sparse = [(f.name, f.column) for f in config.features.sparse]
        objs = config.objective_names
        self.targets = [S.label_column(o) for o in objs] + [S.mask_column(o) for o in objs] + (
            [S.truth_column(o) for o in objs] if with_truth else [])
        self.columns = list(dict.fromkeys(
            ["example_id", "domain"] + [c for _, c in self.sparse] + [c.column for c in stats.columns] + tree_dense + self.targets
        ))

    def encode(self, tbl: pa.Table, partition: dict[str, str], keep: np.ndarray | None = None) -> dict[str, np.ndarray]:
        if keep is not None:
            tbl = tbl.take(pa.array(np.flatnonzero(keep)))
        n = tbl.num_rows
        names = set(tbl.column_names)

        def col(name: str) -> pa.ChunkedArray | None:
            if name in names:
                return tbl.column(name)
            if name in partition:
                return pa.chunked_array([pa.array([partition[name]] * n)])
            return None

        ids, dom = col("example_id"), col("domain")
        if ids is None or dom is None:
            raise ValueError("the example table needs 'example_id' and 'domain' columns (see lattice.data.schema)")
        sparse = {}
        for _, c in self.sparse:
            a = col(c)
            if a is not None:
                # fill_null before to_numpy: a nullable int64 would otherwise become float64 and lose ids > 2**53
                sparse[c] = (pc.fill_null(a.cast(pa.int64()), 0).to_numpy().astype(np.int64),
                             pc.is_valid(a).to_numpy(zero_copy_only=False).astype(bool))
        dense = {}
        for c in self.dense_columns:
            a = col(c)
            if a is not None:
                dense[c] = pc.fill_null(a.cast(pa.float64()), 0.0).to_numpy()
        targets = {}
        for c in self.targets:
            a = col(c)
            if a is not None:
                fill = np.nan if c.startswith("truth_") else 0.0
                targets[c] = pc.fill_null(a.cast(pa.float32()), fill).to_numpy()
        return self.assemble(np.asarray(ids.to_numpy(zero_copy_only=False)).astype(str),
                             np.asarray(dom.to_numpy(zero_copy_only=False)).astype(str), sparse, dense, targets, n)

    def assemble(self, example_id: np.ndarray, domain: np.ndarray, sparse: dict[str, tuple[np.ndarray, np.ndarray]],
                 dense: dict[str, np.ndarray], targets: dict[str, np.ndarray], n: int) -> dict[str, np.ndarray]:
        """Numpy columns -> model arrays. `sparse`: column -> (int64 ids, bool present); `dense`:
        column -> raw float64 (nulls already 0); `targets`: label/mask/truth columns. Any column
        left out is absent (empty bag, dense at the train mean, label masked)."""
        try:
            dom_idx = np.fromiter((self.domain_index[d] for d in domain.tolist()), np.int64, n)
        except KeyError:
            unknown = sorted(set(domain.tolist()) - set(self.domain_index))
            raise ValueError(f"domain(s) {unknown} in the table are not declared in the config's 'domains' "
                             f"{self.config.domain_names}; add them to the config or rebuild the table") from None
        out: dict[str, np.ndarray] = {"example_id": example_id, "domain": dom_idx}
        for name, col in self.sparse:
            if col in sparse:
                out[f"id:{name}"], out[f"has:{name}"] = sparse[col]
            else:
                out[f"id:{name}"], out[f"has:{name}"] = np.zeros(n, np.int64), np.zeros(n, bool)
        out["dense"] = self.stats.apply(dense, n)
        if self.leaves is not None:  # (n, trees) per objective: lattice.trees.leaves
            out.update(self.leaves.arrays(dense, {name: (out[f"id:{name}"], out[f"has:{name}"]) for name, _ in self.sparse},
                                          dom_idx, n, out["dense"] if self.shared_dense else None))
        for o in self.config.objective_names:
            for kind, col in (("label", S.label_column(o)), ("mask", S.mask_column(o))):
                out[f"{kind}:{o}"] = targets[col] if col in targets else np.zeros(n, np.float32)
            if self.with_truth:
                col = S.truth_column(o)
                out[f"truth:{o}"] = targets[col] if col in targets else np.full(n, np.nan, np.float32)
        return out


def _concat(parts: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    if len(parts) == 1:
        # Arrow hands out read-only views; torch warns (once per process, in every rank's log) on
        # making tensors of them, so the rare read-only column is copied here
        return {k: v if v.flags.writeable else v.copy() for k, v in parts[0].items()}
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def _take(arrs: dict[str, np.ndarray], idx: np.ndarray | slice) -> dict[str, np.ndarray]:
    return {k: v[idx] for k, v in arrs.items()}


class ExampleStream(IterableDataset):
    """Yields encoded batches (dicts of numpy arrays) of one split for one rank."""

    def __init__(self, config: PlatformConfig, root: Path, stats: DenseStats, split: Split, batch_size: int,
                 rank: int = 0, world_size: int = 1, seed: int = 0, shuffle: bool = True,
                 teacher_scores: str | Path | None = None, with_truth: bool = False, buffer_rows: int | None = None,
                 cache_bytes: int = 0, label_cutoff: dt.datetime | None = None, days: DaySplits | None = None,
                 leaves=None, cross_fit: bool = True):
        self.config, self.root, self.stats, self.split = config, Path(root), stats, split
        self.leaves = leaves  # a LeafForest: every row also gets its leaf ids (lattice.trees.leaves)
        # train rows the trees were fitted on get empty leaf bags (False: a network starting at the
        # trees' margin, which needs every row's leaves)
        self.cross_fit = cross_fit
        # labels as known at this instant (lattice.data.label_time); None: the final labels
        self.label_cutoff = label_cutoff
        self.days = days  # a windowed run: date -> split (lattice.data.window)
        self.batch_size, self.rank, self.world_size, self.seed, self.shuffle = batch_size, rank, world_size, seed, shuffle
        self.teacher_scores = Path(teacher_scores) if teacher_scores else None
        self.with_truth = with_truth
        self.buffer_rows = buffer_rows or max(64 * batch_size, 65_536)
        self.epoch = 0
        self.units = [u for u in scan_units(self.root) if _unit_wanted(u, days)]
        # unit index -> its encoded kept rows (None: it keeps none), filled while reading, up to
        # `cache_bytes`: a later pass takes a unit from here instead of parquet and the encoder
        self.cache_bytes, self._cache, self._cached_bytes = cache_bytes, {}, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _unit_order(self) -> list[tuple[int, Unit]]:
        order = list(enumerate(self.units))
        if self.shuffle:
            perm = np.random.default_rng([self.seed, self.epoch]).permutation(len(order))
            order = [order[i] for i in perm]
        info = get_worker_info()
        if info is not None:
            order = order[info.id::info.num_workers]
        return order

    def _teacher(self) -> pd.DataFrame | None:
        if self.teacher_scores is None:
            return None
        cols = ["example_id"] + [f"p_{o}" for o in self.config.objective_names]
        have = set(pq.read_schema(self.teacher_scores if self.teacher_scores.is_file() else next(self.teacher_scores.rglob("*.parquet"))).names)
        missing = [c for c in cols if c not in have]
        if missing:
            raise ValueError(f"teacher scores {self.teacher_scores} lack columns {missing}; "
                             "make them with lattice.training.stages.score(config, paths, 'teacher')")
        return pd.read_parquet(self.teacher_scores, columns=cols).drop_duplicates("example_id").set_index("example_id")

    def _attach_teacher(self, arrs: dict[str, np.ndarray], teacher: pd.DataFrame) -> None:
        t = teacher.reindex(arrs["example_id"])
        ok = np.ones(len(t), bool)
        for o in self.config.objective_names:
            v = t[f"p_{o}"].to_numpy(np.float32)
            ok &= ~np.isnan(v)
            arrs[f"teacher:{o}"] = np.nan_to_num(v, nan=0.5)
        arrs["teacher_mask"] = ok.astype(np.float32)

    def _read(self, index: int, unit: Unit, enc: "RowEncoder", teacher: pd.DataFrame | None) -> dict[str, np.ndarray] | None:
        """One unit's rows of this split and rank, encoded (None when it keeps none)."""
        extra = ["split"] if self.days is None else ["date", "event_timestamp"]
        zipper = self.config.training.label_delay == "zipper" and bool(label_time.delayed_objectives(self.config))
        if self.label_cutoff is not None or zipper:
            extra += [c for c in label_time.columns_needed(self.config) if c not in extra]
        tbl, part = read_unit(unit, enc.columns + extra)
        # Zipper heads' labels from the final ones, before the cutoff masks the open windows
        heads = zipper_heads_arrow(tbl, self.label_cutoff, self.config) if zipper else {}
        if self.label_cutoff is not None:
            tbl = label_time.apply_cutoff_arrow(tbl, self.label_cutoff, self.config)
        dates_ids, stale = None, None
        if self.split == "train" and self.days is not None and self.days.matured and self.days.parent_cutoff:
            dates_ids = (row_dates(tbl, part), _unit_ids(tbl, part))  # read once, for both rules below
            rows = self.days.newly_known_rows(*dates_ids)
            parent_cutoff = dt.datetime.fromisoformat(self.days.parent_cutoff)
            event_us = label_time._to_us(tbl.column("event_timestamp").to_pandas()) if rows.any() else None
            tbl = label_time.train_newly_known(tbl, rows, parent_cutoff, self.config, event_us)
            heads = newly_known_heads(heads, tbl, rows, parent_cutoff, self.config, event_us)
            # a matured row with no newly known label (a domain without the delayed objective, a
            # Zipper head that closed before the parent) would only dilute its batch: not read
            stale = rows & ~label_time.teaches(tbl, self.config, heads)
        keep = _row_split(self.config, tbl, part, self.split, self.days, dates_ids)
        if stale is not None:
            keep &= ~stale
        if self.world_size > 1:
            j = np.cumsum(keep) - 1  # position among this unit's kept rows
            keep &= (j + index) % self.world_size == self.rank
        if not keep.any():
            return None
        arrs = enc.encode(tbl, part, keep)
        if self.split == "train" and self.leaves is not None and self.cross_fit:  # no leaf ids on the trees' own rows
            dates = None
            if self.days is not None and self.leaves.fit_share < 1.0:  # a window's forest saw only its own days
                dates = np.asarray(dates_ids[0] if dates_ids is not None else row_dates(tbl, part), dtype=object)[keep]
            self.leaves.empty_fitted(arrs, dates)
        for o, (lab, msk) in heads.items():  # one 1-D column per head, so `pack` ships them as it does labels
            for k in range(lab.shape[1]):
                arrs[f"zlabel:{o}:{k}"] = lab[keep, k].astype(np.float32)
                arrs[f"zmask:{o}:{k}"] = msk[keep, k].astype(np.float32)
        if teacher is not None:
            self._attach_teacher(arrs, teacher)
        return arrs

    def _keep(self, index: int, arrs: dict[str, np.ndarray] | None) -> None:
        size = sum(v.nbytes for v in arrs.values()) if arrs is not None else 0
        if self._cached_bytes + size > self.cache_bytes:
            return
        for v in (arrs or {}).values():
            v.flags.writeable = False  # shared by every later pass: `_concat` and `to_batch` copy, never write
        self._cache[index] = arrs
        self._cached_bytes += size

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        enc = RowEncoder(self.config, self.stats, self.with_truth, leaves=self.leaves)
        teacher: list[pd.DataFrame | None] = []  # read on the first unit that is not cached
        rng = np.random.default_rng([self.seed, self.epoch, 7919, (get_worker_info().id if get_worker_info() else 0)])
        pending: list[dict[str, np.ndarray]] = []
        n_pending = 0

        def drain(final: bool) -> Iterator[dict[str, np.ndarray]]:
            nonlocal pending, n_pending
            if not pending:
                return
            arrs = _concat(pending)
            if self.shuffle:
                arrs = _take(arrs, rng.permutation(n_pending))
            full = (n_pending // self.batch_size) * self.batch_size
            stop = n_pending if final else full
            for s in range(0, stop, self.batch_size):
                yield _take(arrs, slice(s, min(s + self.batch_size, stop)))
            rest = _take(arrs, slice(stop, n_pending))
            pending, n_pending = ([rest], len(rest["domain"])) if len(rest["domain"]) else ([], 0)

        for index, unit in self._unit_order():
            if index in self._cache:
                arrs = self._cache[index]
            else:
                if not teacher:
                    teacher.append(self._teacher())
                arrs = self._read(index, unit, enc, teacher[0])
                if self.cache_bytes:
                    self._keep(index, arrs)
            if arrs is None:
                continue
            pending.append(arrs)
            n_pending += len(arrs["domain"])
            if n_pending >= (self.buffer_rows if self.shuffle else self.batch_size):
                yield from drain(final=False)
        yield from drain(final=True)


def to_batch(config: PlatformConfig, arrs: dict[str, np.ndarray]) -> Batch:
    names = [f.name for f in config.features.sparse]
    objs = config.objective_names
    # arrays Arrow hands over without a copy are read-only, which torch warns about (and a write
    # through the tensor would be undefined): those few are copied, the rest shared
    def t(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(a if a.flags.writeable else a.copy())

    teacher = {o: t(arrs[f"teacher:{o}"]) for o in objs} if "teacher_mask" in arrs else None
    truth = {o: t(arrs[f"truth:{o}"]) for o in objs} if f"truth:{objs[0]}" in arrs else None
    # Zipper heads (training.label_delay: zipper): objective -> (B, K), one column per window
    zk = {o: sum(1 for k in arrs if k.startswith(f"zmask:{o}:")) for o in objs}
    zl = {o: torch.from_numpy(np.stack([arrs[f"zlabel:{o}:{k}"] for k in range(n)], 1)) for o, n in zk.items() if n}
    zm = {o: torch.from_numpy(np.stack([arrs[f"zmask:{o}:{k}"] for k in range(n)], 1)) for o, n in zk.items() if n}
    # leaf ids (lattice.trees.leaves), when the rows carry them: one key per forest after the features'
    sparse = kjt_from_ids(names, [arrs[f"id:{n}"] for n in names], [arrs[f"has:{n}"] for n in names], leaf_values(arrs))
    return Batch(
        dense=t(arrs["dense"]),
        sparse=sparse,
        domain=t(arrs["domain"]),
        labels={o: t(arrs[f"label:{o}"]) for o in objs},
        masks={o: t(arrs[f"mask:{o}"]) for o in objs},
        example_ids=arrs["example_id"],
        teacher=teacher,
        teacher_mask=t(arrs["teacher_mask"]) if teacher is not None else None,
        truth=truth,
        zipper_labels=zl or None,
        zipper_masks=zm or None,
    )


class BatchLoader:
    """Iterable of `Batch` over one split for one rank, with worker processes."""

    def __init__(self, config: PlatformConfig, root: Path, stats: DenseStats, split: Split, batch_size: int | None = None,
                 rank: int = 0, world_size: int = 1, seed: int | None = None, shuffle: bool | None = None,
                 num_workers: int | None = None, teacher_scores: str | Path | None = None, with_truth: bool = False,
                 cache: bool = False, label_cutoff: dt.datetime | None = None, days: DaySplits | None = None,
                 leaves=None, cross_fit: bool = True):
        self.config = config
        self.stream = ExampleStream(
            config, root, stats, split, batch_size or config.training.batch_size, rank, world_size,
            config.training.seed if seed is None else seed, split == "train" if shuffle is None else shuffle,
            teacher_scores, with_truth, label_cutoff=label_cutoff, days=days, leaves=leaves, cross_fit=cross_fit,
        )
        nw = config.training.num_workers if num_workers is None else num_workers
        self.num_workers = min(nw, len(self.stream.units))
        # `cache`: keep encoded rows between passes (for a loader read every epoch; a one-pass reader
        # would only hold memory). Not with workers: they end with each pass, and their caches too
        self.stream.cache_bytes = config.training.loader_cache_mb * 2**20 if cache and not self.num_workers else 0

    def set_epoch(self, epoch: int) -> None:
        self.stream.set_epoch(epoch)

    def __iter__(self) -> Iterator[Batch]:
        if not self.num_workers:
            for arrs in self.stream:
                yield to_batch(self.config, arrs)
            return
        dl = DataLoader(_Packed(self.stream), batch_size=None, num_workers=self.num_workers, prefetch_factor=4)
        for packed in dl:
            yield to_batch(self.config, unpack(packed))


PACK_KEY = "__packed__"


def pack(arrs: dict[str, np.ndarray]) -> dict:
    """A batch's 1-D numeric columns stacked into one 2-D array per dtype (ids, presence flags,
    labels and masks of every feature and objective). A worker process hands each array to the
    trainer as its own shared-memory segment, with a socket round trip per array; with one id and
    one flag array per sparse feature that was ~50 transfers a batch, and a third of a small
    table's training time (Avazu: 1.9 of 5.1 s, cProfile). Packed, it is a handful."""
    groups: dict[str, list[str]] = {}
    out: dict = {}
    for k, v in arrs.items():
        if v.ndim == 1 and v.dtype != object:
            groups.setdefault(v.dtype.str, []).append(k)
        else:
            out[k] = v
    out[PACK_KEY] = [(dtype, keys) for dtype, keys in groups.items()]
    for i, (dtype, keys) in enumerate(out[PACK_KEY]):
        out[f"{PACK_KEY}{i}"] = np.stack([arrs[k] for k in keys])
    return out


def unpack(packed: dict) -> dict[str, np.ndarray]:
    """`pack`'s inverse (tensors from the DataLoader or arrays): the same keys and values, each
    1-D column a row view of its stacked array."""
    out = {k: (v.numpy() if isinstance(v, torch.Tensor) else v) for k, v in packed.items()
           if not k.startswith(PACK_KEY)}
    for i, (_, keys) in enumerate(packed[PACK_KEY]):
        stacked = packed[f"{PACK_KEY}{i}"]
        stacked = stacked.numpy() if isinstance(stacked, torch.Tensor) else stacked
        out.update(zip(keys, stacked))
    return out


class _Packed(IterableDataset):
    """The stream's batches `pack`ed inside the worker process."""

    def __init__(self, stream: "ExampleStream"):
        self.stream = stream

    def __iter__(self) -> Iterator[dict]:
        return (pack(arrs) for arrs in self.stream)


def fit_dense_stats(config: PlatformConfig, root: Path, days: DaySplits | None = None) -> DenseStats:
    """One streaming pass over the train split (of the run's `days`, when windowed): dense stats,
    per-objective label rates and the distinct ids of every sparse feature (to check that its
    table can hold them)."""
    present = table_columns(root)
    cols = dense_spec(config, present)
    acc = StatsAccumulator(cols)
    objs = config.objective_names
    sparse = {f.name: f.column for f in config.features.sparse if f.column in present}
    wanted = list(dict.fromkeys(["example_id", "split", "date", "event_timestamp"] + [c.column for c in cols] + list(sparse.values())
                                + [S.label_column(o) for o in objs] + [S.mask_column(o) for o in objs]))
    pos = {o: 0.0 for o in objs}
    cnt = {o: 0.0 for o in objs}
    seen: dict[str, list[np.ndarray]] = {name: [] for name in sparse}  # per unit, merged once at the end
    for unit in scan_units(root):
        if not _unit_wanted(unit, days):
            continue
        tbl, part = read_unit(unit, wanted)
        keep = _row_split(config, tbl, part, "train", days)
        tbl = tbl.take(pa.array(np.flatnonzero(keep)))
        raw = {c.column: pc.fill_null(tbl.column(c.column).cast(pa.float64()), 0.0).to_numpy()
               for c in cols if c.column in tbl.column_names}
        acc.add(raw, tbl.num_rows)
        for name, c in sparse.items():
            if c in tbl.column_names:
                ids = pc.drop_null(tbl.column(c)).cast(pa.int64()).to_numpy()
                seen[name].append(np.unique(ids))
        for o in objs:
            if S.mask_column(o) in tbl.column_names:
                m = pc.fill_null(tbl.column(S.mask_column(o)).cast(pa.float64()), 0.0).to_numpy()
                y = pc.fill_null(tbl.column(S.label_column(o)).cast(pa.float64()), 0.0).to_numpy()
                pos[o] += float((y * m).sum())
                cnt[o] += float(m.sum())
    stats = acc.finish()
    stats.label_rates = {o: (pos[o] / cnt[o] if cnt[o] else 0.5) for o in objs}
    unique = {name: np.unique(np.concatenate(v)) if v else np.zeros(0, np.int64) for name, v in seen.items()}
    stats.distinct_ids = {name: int(len(u)) for name, u in unique.items()}
    rows = {f.name: f.num_embeddings for f in config.features.sparse}
    stats.merged_ids = {name: int(len(u) - len(np.unique(np.remainder(u, rows[name])))) for name, u in unique.items()}
    return stats


def batch_from_frame(config: PlatformConfig, stats: DenseStats, df: pd.DataFrame, leaves=None) -> Batch:
    """A pandas frame of example-table rows (e.g. serving requests joined with features) -> Batch.
    Missing feature columns are treated as absent (empty bags, dense at the train mean).
    `leaves`: the LeafForest of a model that reads leaf ids (its `leaf_forest`)."""
    df = df.copy()
    if "example_id" not in df:
        df["example_id"] = [str(i) for i in range(len(df))]
    tbl = pa.Table.from_pandas(df, preserve_index=False)
    return to_batch(config, RowEncoder(config, stats, leaves=leaves).encode(tbl, {}))
