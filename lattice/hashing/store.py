"""Where fitted id maps live and how training finds them.

A fitted map (one per sparse feature and row budget R, the table rows a model uses for it) is a
dict with exactly these keys, the contract the model side reads:

    feature, scheme          the sparse feature and its hashing (vocab | mixed | learned)
    version                  sha256 of the content, 16 hex digits
    table_rows               rows the table needs (<= budget; vocab/mixed: kept ids + 1)
    budget                   R
    ids                      np.int64 (n,), ascending: the ids with a fitted row
    rows_of                  np.int64 (n,), the row of each id in `ids` (mixed: its frequency rank)
    counts                   np.int64 (n,), training rows of each id in `ids`
    oov_start, oov_rows      an id not in `ids` maps to oov_start + (id mod oov_rows), with the
                             non-negative remainder of Python, numpy and torch.remainder
    frequent                 rows [0, frequent) each hold exactly one id (the most frequent)
    window                   {"split": "train", "rows", "start", "end"}: what it was fitted on
    stats                    {"distinct", "kept", "coverage", "seconds"}

On disk, under `paths.hashing`, one `<feature>.npz` (the arrays of every R) and one
`<feature>.json` (everything else, plus the fingerprint of what it was fitted on). `load_fitted`
refuses a fit that is missing, or stale: fitted on a training split of another size, for other
hashing keys, or for row budgets the config no longer uses; `check_window` refuses one fitted on
other days than a windowed run's. A stale fit would not fail loudly in
training; it would silently map ids to rows fitted for other data.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from lattice.config import PlatformConfig
from lattice.hashing.budgets import fit_keys, needs_fit, row_budgets
from lattice.paths import Paths

ARRAYS = ("ids", "rows_of", "counts")
SCALARS = ("table_rows", "budget", "oov_start", "oov_rows", "frequent")
FORMAT = 1
SUBSET_MARKER = "_lattice_subset.json"  # lattice.orchestration.run_paths.MARKER: a domain subset of a table


class FitMissingError(FileNotFoundError):
    """A feature's hashing needs a fitted id map that was never fitted."""


class FitStaleError(FitMissingError):
    """A fitted id map exists but was fitted for other data or other hashing keys."""


def fit_command(config: PlatformConfig) -> str:
    return f"lattice hashing fit {config.source_file or 'CONFIG'}"


def content_version(fitted: dict[str, Any]) -> str:
    """sha256 of what decides the lookup (and the counts), 16 hex digits."""
    h = hashlib.sha256()
    h.update(json.dumps([fitted["feature"], fitted["scheme"], *(int(fitted[k]) for k in SCALARS)]).encode())
    for k in ARRAYS:
        h.update(np.ascontiguousarray(fitted[k], dtype="<i8").tobytes())
    return h.hexdigest()[:16]


def lookup(fitted: dict[str, Any], ids: np.ndarray) -> np.ndarray:
    """Reference id -> row map (numpy; the model's torch remap must agree with it)."""
    ids = np.asarray(ids, dtype=np.int64)
    known = fitted["ids"]
    # the remainder of an int64 by a positive int is in [0, oov_rows) for negative ids too
    out = fitted["oov_start"] + np.remainder(ids, np.int64(fitted["oov_rows"]))
    if len(known):
        at = np.minimum(np.searchsorted(known, ids), len(known) - 1)
        hit = known[at] == ids
        out[hit] = fitted["rows_of"][at[hit]]
    return out.astype(np.int64)


# ---------------------------------------------------------------- fingerprint of the fitted data


def _table_files(table: Path) -> list[list]:
    files = [table] if table.is_file() else sorted(p for p in table.rglob("*.parquet") if not p.name.startswith((".", "_")))
    return [[str(f.relative_to(table)) if table.is_dir() else f.name, f.stat().st_size, f.stat().st_mtime_ns] for f in files]


def source_table(table: Path) -> Path:
    """The table a domain subset (run_paths.subset_table) was cut from: a fit of the whole
    training split covers every subset of it."""
    marker = table / SUBSET_MARKER
    if table.is_dir() and marker.exists():
        try:
            return Path(json.loads(marker.read_text())["source"])
        except (ValueError, KeyError, OSError):
            return table
    return table


def train_rows(table: Path) -> int | None:
    """Rows with `split == 'train'` (pyarrow, reads the split column only); None without one."""
    import pyarrow.dataset as ds

    data = ds.dataset(str(table), format="parquet", partitioning="hive", ignore_prefixes=[".", "_"])
    if "split" not in data.schema.names:
        return None
    return int(data.count_rows(filter=ds.field("split") == "train"))


def table_fingerprint(table: Path, rows: int) -> dict[str, Any]:
    """What a fit read: the table, its files and its training rows (`rows`, as the fit counted)."""
    table = source_table(Path(table))
    return {"table": str(table), "train_rows": int(rows), "files": _table_files(table)}


def _table_change(recorded: dict[str, Any], table: Path | None) -> str | None:
    """Why the table no longer matches the fit, or None."""
    table = source_table(table) if table is not None else Path(recorded["table"])
    if not table.exists():
        return None  # nothing to compare with here (training fails on the missing table itself)
    if _table_files(table) == recorded["files"]:
        return None
    if recorded.get("window"):  # a window's rows: counting the stored split says nothing of them
        return f"the table {table} was rewritten after the fit on the window ending {recorded['window']['end']}"
    now = train_rows(table)
    if now is None:  # no split column: the fit applied the hash rule; the file list changed, so refit
        return f"the table {table} was rewritten after the fit"
    if now != recorded["train_rows"]:
        return f"the training split now has {now:,} rows, the fit saw {recorded['train_rows']:,} (table {table})"
    return None


# ---------------------------------------------------------------- files


def fit_files(paths: Paths, feature: str) -> tuple[Path, Path]:
    return paths.hashing / f"{feature}.json", paths.hashing / f"{feature}.npz"


def _replace(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def save_fitted(paths: Paths, feature: str, fits: dict[int, dict[str, Any]], fingerprint: dict[str, Any]) -> Path:
    """Write one feature's maps (every budget); the json goes last and names each map's version,
    so a reader never pairs a new json with old arrays unnoticed."""
    meta_path, arrays_path = fit_files(paths, feature)
    meta_path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {f"{k}_{r}": np.asarray(m[k], np.int64) for r, m in fits.items() for k in ARRAYS}

    def write_arrays(tmp: Path) -> None:
        with open(tmp, "wb") as fh:
            np.savez(fh, **arrays)

    _replace(arrays_path, write_arrays)
    meta = {"format": FORMAT, "feature": feature, "fingerprint": fingerprint,
            "fits": {str(r): {k: v for k, v in m.items() if k not in ARRAYS} for r, m in sorted(fits.items())}}
    _replace(meta_path, lambda tmp: tmp.write_text(json.dumps(meta, indent=1, default=str)))
    return meta_path


def read_fitted(paths: Paths, feature: str) -> tuple[dict[int, dict[str, Any]], dict[str, Any]]:
    """(budget -> fitted map, file metadata) of one feature, as saved; FitMissingError if absent."""
    meta_path, arrays_path = fit_files(paths, feature)
    if not meta_path.exists() or not arrays_path.exists():
        raise FitMissingError(f"no fitted id map for {feature!r} at {meta_path}")
    meta = json.loads(meta_path.read_text())
    fits: dict[int, dict[str, Any]] = {}
    with np.load(arrays_path) as npz:
        for r, m in meta["fits"].items():
            if any(f"{k}_{r}" not in npz for k in ARRAYS):
                raise FitStaleError(f"{arrays_path} lacks the arrays of budget {r} that {meta_path} names")
            fits[int(r)] = {**m, **{k: npz[f"{k}_{r}"].astype(np.int64) for k in ARRAYS}}
    return fits, meta


def _stale_reason(config: PlatformConfig, feature, meta: dict[str, Any], fits: dict[int, dict], table: Path | None) -> str | None:
    keys = fit_keys(feature)
    fp = meta.get("fingerprint", {})
    if fp.get("keys") != json.loads(json.dumps(keys)):
        changed = sorted(k for k in keys if (fp.get("keys") or {}).get(k) != keys[k])
        return f"fitted for other hashing keys ({', '.join(changed) or 'format'} changed)"
    missing = [r for r in row_budgets(config, feature) if r not in fits]
    if missing:
        return f"the model sizes now need row budgets {missing}, the fit has {sorted(fits)}"
    for r, m in fits.items():
        if content_version(m) != m.get("version"):
            return f"the arrays of budget {r} do not match their recorded version (a torn or edited file)"
    return _table_change(fp, table)


def check_window(config: PlatformConfig, paths: Paths, window, validation_share: float | None = None) -> None:
    """Refuse the fitted maps of another window than this run's (`window`: its TrainWindow, None
    when training.window is unset): maps fitted on the stored split or on other days may have
    counted the ids and (learned) the labels of this run's validation or test rows, and so may a
    fit that held out less of the newest day than the run does. Raises FitStaleError naming the
    command; a missing fit is left to `load_fitted`."""
    from lattice.data.window import fitted_elsewhere, held_out_share

    held_out = held_out_share(config, validation_share)
    wrong: list[str] = []
    for f in needs_fit(config):
        try:
            _, meta = read_fitted(paths, f.name)
        except FitMissingError:
            continue
        on = fitted_elsewhere(meta.get("fingerprint", {}).get("window"), window, held_out)
        if on is not None:
            wrong.append(f"{f.name!r} was fitted on {on}")
    if not wrong:
        return
    if window is None:
        raise FitStaleError(f"the fitted id map of sparse feature(s) {'; '.join(wrong)}, and this run reads the stored "
                            f"split (training.window is unset); run `{fit_command(config)}` again")
    wanted = window.to_json()
    raise FitStaleError(
        f"the fitted id map of sparse feature(s) {'; '.join(wrong)}; this run trains on the window "
        f"{wanted['train'][0]}..{wanted['validation']} (training.window, interval end {wanted['end']}), so the maps may "
        f"have counted the ids and labels of its validation or test rows. Refit them for this window: "
        f"`{fit_command(config)} --end {wanted['end']}` (the pipeline's fit_hashing step does it)")


def load_fitted(config: PlatformConfig, paths: Paths, table: Path | None = None) -> dict[str, dict[int, dict]]:
    """feature -> {row budget: fitted id map} for every sparse feature whose scheme needs one.

    `table`: the training table the caller reads (default: the one `find_table(paths)` finds, or,
    where there is none, the one the fit read). Raises FitMissingError (FitStaleError when a fit
    exists but no longer matches) naming every such feature and the command that fits them."""
    need = needs_fit(config)
    if not need:
        return {}
    if table is None:
        from lattice.data.loader import NoTrainingData, find_table

        try:
            table = find_table(paths)
        except NoTrainingData:
            table = None
    out: dict[str, dict[int, dict]] = {}
    missing: list[str] = []
    stale: list[str] = []
    for f in need:
        try:
            fits, meta = read_fitted(paths, f.name)
        except FitStaleError as exc:
            stale.append(f"{f.name!r}: {exc}")
            continue
        except FitMissingError:
            missing.append(f.name)
            continue
        reason = _stale_reason(config, f, meta, fits, table)
        if reason:
            stale.append(f"{f.name!r}: {reason}")
        else:
            out[f.name] = fits
    if missing:
        raise FitMissingError(
            f"sparse feature(s) {missing} use hashing {sorted({f.hashing for f in need if f.name in missing})} and need "
            f"a fitted id map, which {paths.hashing} does not hold; run `{fit_command(config)}` after the features "
            "stage" + (f" (also stale: {'; '.join(stale)})" if stale else ""))
    if stale:
        raise FitStaleError(
            f"the fitted id map of sparse feature(s) {'; '.join(stale)}: it is stale; run `{fit_command(config)}` "
            "again to refit on the current training split")
    return out
