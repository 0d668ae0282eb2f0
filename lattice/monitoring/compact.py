"""Serving's Arrow parts -> parquet, one file per hour folder and run; the log as one dataset.

Serving writes its parts as Arrow IPC files, lz4 on each buffer
(`monitoring.prediction_log.part_format`): 0.45 us a row of the serving cores for the demo's 31
columns, against 0.75 us for a parquet part (docs/bench/serving.md). The monitor, which runs off
those cores, rewrites them: in each hour folder, the Arrow parts present when it starts go into one
parquet file (`compact-<unique>.parquet`) whose footer names them, and are then deleted.

A reader (`log_dataset`) skips every part a compacted file in its folder names, so no row is
read twice: not between the compacted file's rename and the deletes, nor after a crash between
them (the next compaction deletes such leftovers first). Parts written meanwhile are not named,
so they stay and are read as they are until the next run.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as fs
import pyarrow.parquet as pq

from lattice.monitoring.records import PARTITION, _dictionary_columns

COMPACTED_FROM = b"lattice.compacted_from"  # footer key: the Arrow parts a compacted file holds (JSON list)
ROW_GROUP_ROWS = 131_072  # parts are ~5,000 rows (a flush); row groups this size keep the time filter's pruning useful


def _visible(folder: Path, pattern: str) -> list[Path]:
    return sorted(p for p in folder.glob(pattern) if not p.name.startswith("."))


def compacted_names(folder: Path) -> set[str]:
    """The Arrow parts the folder's compacted files already hold."""
    names: set[str] = set()
    for f in _visible(folder, "compact-*.parquet"):
        meta = pq.read_schema(f).metadata or {}
        names.update(json.loads(meta.get(COMPACTED_FROM, b"[]")))
    return names


def log_files(root: Path) -> tuple[list[Path], list[Path]]:
    """(parquet files, Arrow parts no compacted file holds) under the log's `root`."""
    parquet, arrow = [], []
    for folder in sorted(Path(root).glob(f"{PARTITION}=*")):
        parquet += _visible(folder, "*.parquet")
        done = compacted_names(folder)
        arrow += [p for p in _visible(folder, "*.arrow") if p.name not in done]
    return parquet, arrow


def log_dataset(root: Path) -> ds.Dataset | None:
    """Every logged row under `root` (parquet files and uncompacted Arrow parts), hive-partitioned
    by hour; None when nothing is logged."""
    root = Path(root)
    if not root.exists():
        return None
    parquet, arrow = log_files(root)
    parts = [_files(files, fmt, root) for files, fmt in ((parquet, "parquet"), (arrow, "ipc")) if files]
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0]
    # a config change between parts (features on / off) changes the columns: nulls where absent
    return ds.dataset(parts, schema=pa.unify_schemas([p.schema for p in parts], promote_options="permissive"))


def _files(files: list[Path], fmt: str, root: Path) -> ds.Dataset:
    # every file's schema, unified: a config change between parts (features on / off) changes the
    # columns, and a dataset takes its first file's schema otherwise (the others' extra columns lost)
    options = ds.FileSystemFactoryOptions(partition_base_dir=str(root), partitioning=ds.HivePartitioning.discover())
    fmt_ = ds.ParquetFileFormat() if fmt == "parquet" else ds.IpcFileFormat()
    factory = ds.FileSystemDatasetFactory(fs.LocalFileSystem(), [str(p) for p in files], fmt_, options)
    return factory.finish(factory.inspect(promote_options="permissive"))


def count_rows(root: Path) -> int:
    data = log_dataset(root)
    return 0 if data is None else data.count_rows()


def _read_part(path: Path) -> pa.Table:
    with pa.memory_map(str(path)) as source:
        return pa.ipc.open_file(source).read_all()


def compact(root: Path, compression: str = "lz4") -> dict:
    """Rewrite every hour folder's Arrow parts as one parquet file; returns what it did
    ({"folders", "parts", "rows"}). Parts of different columns (a config changed between them)
    go into one file each."""
    done = {"folders": 0, "parts": 0, "rows": 0}
    for folder in sorted(Path(root).glob(f"{PARTITION}=*")) if Path(root).exists() else []:
        held = compacted_names(folder)
        for leftover in _visible(folder, "*.arrow"):
            if leftover.name in held:  # a run that stopped between its rename and its deletes
                leftover.unlink(missing_ok=True)
        parts = _visible(folder, "*.arrow")
        if not parts:
            continue
        by_schema: dict[pa.Schema, list[Path]] = {}
        for p in parts:
            with pa.memory_map(str(p)) as source:
                by_schema.setdefault(pa.ipc.open_file(source).schema, []).append(p)
        for schema, group in by_schema.items():
            done["rows"] += _compact_group(folder, schema, group, compression)
            done["parts"] += len(group)
        done["folders"] += 1
    return done


def _compact_group(folder: Path, schema: pa.Schema, parts: list[Path], compression: str) -> int:
    name = f"compact-{os.getpid()}-{uuid.uuid4().hex[:12]}.parquet"
    tmp = folder / f".{name}.tmp"
    footer = schema.with_metadata({**(schema.metadata or {}), COMPACTED_FROM: json.dumps([p.name for p in parts]).encode()})
    rows, pending = 0, []
    try:
        with pq.ParquetWriter(tmp, footer, compression=compression,
                              use_dictionary=_dictionary_columns(schema.empty_table())) as writer:
            for p in parts:  # one part in memory at a time, plus one row group's worth
                pending.append(_read_part(p))
                if sum(t.num_rows for t in pending) >= ROW_GROUP_ROWS:
                    rows += _write(writer, pending, footer)
                    pending = []
            rows += _write(writer, pending, footer)
        os.replace(tmp, folder / name)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    for p in parts:  # a reader skips them from the rename on; deleting is only housekeeping
        p.unlink(missing_ok=True)
    return rows


def _write(writer: pq.ParquetWriter, tables: list[pa.Table], schema: pa.Schema) -> int:
    if not tables:
        return 0
    table = pa.concat_tables(tables).replace_schema_metadata(schema.metadata)
    writer.write_table(table, row_group_size=ROW_GROUP_ROWS)
    return table.num_rows
