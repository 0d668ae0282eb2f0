"""How many ids a `modulo` table merges, for `lattice config check` and training's notes.

n distinct ids hashed into R rows collide in n(n-1)/(2R) pairs on average (each of the n(n-1)/2
pairs shares a row with probability 1/R), long before n reaches R: 20,000 ids in 200,000 rows
already merge about 1,000 pairs. Two merged ids train one embedding, so the note says how many
and what avoids it: for a field whose ids fit the budget, `hashing: vocab` gives each its own row.
"""

from __future__ import annotations

import json
from pathlib import Path

from lattice.config import PlatformConfig
from lattice.config.schema import SparseFeature
from lattice.paths import Paths

# below this share of ids in a colliding pair, collisions are not worth a note
NOTE_SHARE = 0.01
SAMPLE_ROWS = 1_000_000  # rows of the table `config check` reads when no model recorded its counts


def expected_colliding_pairs(n: int, rows: int) -> float:
    """Expected id pairs sharing a row when n distinct ids hash uniformly into `rows` rows."""
    return n * (n - 1) / (2 * rows) if rows > 0 and n > 1 else 0.0


def collision_note(feature: SparseFeature, n: int, rows: int, where: str = "in the train split") -> str | None:
    """A line for a `modulo` feature whose n ids are expected to collide noticeably in `rows` rows."""
    pairs = expected_colliding_pairs(n, rows)
    if feature.hashing != "modulo" or pairs < max(1.0, NOTE_SHARE * n):
        return None
    line = (f"sparse feature {feature.name!r}: {n:,} distinct ids {where} hashed (modulo) into {rows:,} rows collide "
            f"in about {pairs:,.0f} pairs (n(n-1)/2R), so those ids train one shared embedding")
    if n <= rows:
        return line + (f"; the ids fit the budget: `hashing: vocab` (features.sparse.{feature.name}.hashing, then "
                       "`lattice hashing fit CONFIG`) gives each its own row")
    return line + "; `hashing: learned` lets similar ids share rows instead of arbitrary ones (or raise num_embeddings)"


def collision_notes(config: PlatformConfig, distinct: dict[str, int], where: str = "in the train split") -> list[str]:
    notes = []
    for f in config.features.sparse:
        note = collision_note(f, int(distinct.get(f.name, 0)), f.num_embeddings, where)
        if note:
            notes.append(note)
    return notes


def recorded_distinct_ids(paths: Paths) -> dict[str, int]:
    """Distinct train-split ids per feature as a trained model recorded them (its dense_stats.json;
    the teacher first), or {} before any model was trained."""
    folders = sorted(paths.models.glob("*")) if paths.models.is_dir() else []
    folders.sort(key=lambda p: p.name != "teacher")
    for folder in folders:
        f = folder / "dense_stats.json"
        try:
            found = json.loads(f.read_text()).get("distinct_ids") if f.exists() else None
        except (OSError, ValueError):
            continue
        if found:
            return {k: int(v) for k, v in found.items()}
    return {}


def sampled_distinct_ids(config: PlatformConfig, table: Path, rows: int = SAMPLE_ROWS) -> dict[str, int]:
    """Distinct ids per modulo feature in the first `rows` rows of the table (a lower bound)."""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    data = ds.dataset(str(table), format="parquet", partitioning="hive", ignore_prefixes=[".", "_"])
    cols = sorted({f.column for f in config.features.sparse if f.hashing == "modulo"} & set(data.schema.names))
    if not cols:
        return {}
    head = data.head(rows, columns=cols)
    count = {c: int(pc.count_distinct(head.column(c)).as_py()) for c in cols}
    return {f.name: count[f.column] for f in config.features.sparse if f.column in count}


def config_check_notes(config: PlatformConfig, paths: Paths) -> list[str]:
    """Collision notes from what is already on disk: a trained model's counts, else a bounded
    read of the training table; nothing when neither exists (no data read from raw logs)."""
    distinct = recorded_distinct_ids(paths)
    if distinct:
        return collision_notes(config, distinct)
    # the folders `lattice.data.loader.find_table` tries, looked up here without importing the
    # loader (it pulls torch, seconds that `config check` should not spend)
    table = next((p for p in (paths.training_set, paths.consolidated) if p.is_dir() and any(p.rglob("*.parquet"))), None)
    if table is None:
        return []
    return collision_notes(config, sampled_distinct_ids(config, table), f"in the first {SAMPLE_ROWS:,} rows of {table}")
