"""The hashing schemes by name, and the factory that builds a feature's compression module.

Two tables, both plain dicts so a new scheme is one module plus one line here:
  - `REMAPS`: single-table schemes, name -> builder(config, feature, rows, fitted map or None)
    returning an id -> row module (into [0, rows), or [0, the map's table_rows) when fitted);
  - `MULTI_TABLE`: schemes that split a feature over several tables (qr, mixed), name ->
    builder(feature, rows, dim, fitted map or None) returning a `Compression`.
The scheme modules import only `lattice.hashing.base`; this module imports them, never the
reverse, so reading a scheme never leads back to the factory.
"""

# no `from __future__ import annotations`: the builders' modules are FX-traced

from typing import Callable, Dict, Optional, cast

from torch import nn

from lattice.config import PlatformConfig
from lattice.config.rules_hashing import budget_rows, feature_width
from lattice.config.schema import HASHING_NEEDS_FIT, ModelSize, SparseFeature
from lattice.hashing import mixed, qr
from lattice.hashing.base import (
    FIT_COMMAND,
    Compression,
    FittedLookup,
    RemapCompression,
    fitted_map,
    lookup_from_map,
    require_fitted,
)
from lattice.hashing.single import IdentityRemap, ModuloRemap

RemapBuilder = Callable[[PlatformConfig, SparseFeature, int, Optional[dict]], nn.Module]
MultiTableBuilder = Callable[[SparseFeature, int, int, Optional[dict]], Compression]


def _none(config: PlatformConfig, f: SparseFeature, rows: int, m: Optional[dict]) -> nn.Module:
    # a scaled-down table cannot hold every raw id: re-hash into it
    return IdentityRemap(f.name, rows) if rows >= f.num_embeddings else ModuloRemap(rows)


def _fitted(config: PlatformConfig, f: SparseFeature, rows: int, m: Optional[dict]) -> nn.Module:
    if m is None:
        raise ValueError(f"sparse feature {f.name!r}: hashing {f.hashing!r} needs its fitted map; run `{FIT_COMMAND}`")
    return lookup_from_map(f, m, rows)


def _zch(config: PlatformConfig, f: SparseFeature, rows: int, m: Optional[dict]) -> nn.Module:
    # imported on use: TorchRec's managed-collision modules load only for configs that use them
    from lattice.hashing.zch import ZCHRemap

    return ZCHRemap(f.name, rows, f.zch_eviction_interval)


REMAPS: Dict[str, RemapBuilder] = {
    "none": _none,
    "modulo": lambda config, f, rows, m: ModuloRemap(rows),
    "vocab": _fitted,
    "learned": _fitted,
    "zch": _zch,
}

MULTI_TABLE: Dict[str, MultiTableBuilder] = {
    "qr": lambda f, rows, dim, m: qr.QRCompression(f, rows, dim, m),
    "mixed": lambda f, rows, dim, m: mixed.MixedCompression(f, rows, dim, cast(dict, m)),
}


def register_remap(kind: str, builder: RemapBuilder) -> None:
    REMAPS[kind] = builder


def make_remap(config: PlatformConfig, feature: SparseFeature, rows: int, fitted_map_: Optional[dict] = None) -> nn.Module:
    """The id -> row module of a single-table scheme; `fitted_map_`: the feature's fitted map for
    this row budget (vocab, learned)."""
    if feature.hashing not in REMAPS:
        raise ValueError(
            f"sparse feature {feature.name!r} uses hashing {feature.hashing!r}, which is not registered as a "
            f"single-table remap (available: {', '.join(sorted(REMAPS))}); multi-table schemes "
            f"({', '.join(sorted(MULTI_TABLE))}) are built by lattice.hashing.registry.make_compression")
    return REMAPS[feature.hashing](config, feature, rows, fitted_map_)


def single_table_remap(f: SparseFeature, rows: int, fitted_map_: Optional[dict]) -> nn.Module:
    """The id -> row module of vocab, learned (their fitted map) and zch."""
    if f.hashing == "zch":
        return _zch(cast(PlatformConfig, None), f, rows, fitted_map_)
    return _fitted(cast(PlatformConfig, None), f, rows, fitted_map_)


def make_compression(config: PlatformConfig, feature: SparseFeature, size: ModelSize,
                     fitted: Optional[dict] = None) -> Compression:
    """The compression module of `feature` in a model of `size`. `fitted`: feature -> {budget:
    fitted map}; a scheme that needs a fit and finds none for its budget raises FitMissingError
    naming `lattice hashing fit CONFIG`."""
    rows, dim = budget_rows(feature, size), feature_width(feature, size)
    m = require_fitted(feature, rows, fitted) if feature.hashing in HASHING_NEEDS_FIT else fitted_map(feature, rows, fitted)
    if feature.hashing in MULTI_TABLE:
        return MULTI_TABLE[feature.hashing](feature, rows, dim, m)
    remap = make_remap(config, feature, rows, m)
    table_rows = remap.rows if isinstance(remap, FittedLookup) else rows
    return RemapCompression(feature.name, table_rows, dim, remap)
