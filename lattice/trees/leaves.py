"""Leaf ids of the fitted trees as sparse ids (issue 38): what `lattice trees fit` wrote, loaded
once and carried by every model that reads leaves (model.pt `leaves`), so a saved model turns a
raw row into the same leaf ids in training, scoring and the gate, whatever the work folder holds
later.

The row encoder (lattice.data.loader.RowEncoder) hands `LeafForest.arrays` the raw dense columns
and ids of a row; the forest rebuilds the boosters' own matrix from them (the dense transform
with the fit's stats, the fit's sparse encodings, the domain) and asks LightGBM for `pred_leaf`.
`to_batch` turns each objective's (rows, trees) leaf indices into one KJT key `leaves_<objective>`
whose bag holds, per tree t, the id `t * num_leaves + leaf`: one feature per forest, not one per
tree, so the network gets one token per objective (50 trees as 50 tokens would multiply the
interaction layers' input for no more information), and the SUM-pooled bag of its trees' leaf
embeddings is the additive form of the booster itself (one embedding column could hold the
leaf values exactly). Its table has `trees * num_leaves` rows, sized from the fit.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import threading
from dataclasses import dataclass
from pathlib import Path

import lightgbm as lgb
import numpy as np

from lattice.data.transforms import DenseStats
from lattice.models.gbdt import SparseEncoding, TreeFeatures
from lattice.models.leaves import KEY_PREFIX, leaf_key  # noqa: F401  (the KJT keys of the forests)

FIT_SALT = "|trees-fit"
FIT_RULE = "sha256(example_id + '|trees-fit'), first 13 hex digits / 16**13 < fit_share, of the train split's rows"
EMPTY = -1
"""A leaf id the training loader writes over a fitted row's ids (cross-fitting): `leaf_values`
leaves it out of the bag, so the row's bag is empty."""

TREES_FILE = "trees.json"
"""The tree fit inside an exported artifact (LeafForest.to_json), next to the TorchScript module."""


class NoTreeFit(FileNotFoundError):
    pass


def fit_fraction(example_ids) -> np.ndarray:
    """u in [0, 1) per example id for the cross-fitting share (`models.leaves.fit_share`; a train
    row is fitted on when u < the share): the split's hash of the id, salted, so the share does
    not follow the split's own draw. A function of the id alone: no row order or partitioning."""
    from lattice.data.split import hash_fraction

    return hash_fraction(f"{e}{FIT_SALT}" for e in example_ids)


def fitted_rows(example_ids, share: float) -> np.ndarray:
    """Of these train rows, those a fit of `share` was fitted on (every row at 1)."""
    ids = np.asarray(example_ids)
    if share >= 1.0:
        return np.ones(len(ids), bool)
    return fit_fraction(ids.tolist()) < share


@dataclass
class LeafForest:
    """The fitted boosters with what their matrix was built from. `blob()` / `from_blob` carry it
    inside model.pt."""

    boosters: dict[str, str]  # objective -> LightGBM model text (objectives with a booster only)
    stats: DenseStats
    sparse: list[SparseEncoding]
    with_domain: bool
    num_leaves: int
    fit: dict  # identity: version, fitted_at seconds, sha256 of the boosters and encodings

    def __post_init__(self) -> None:
        self._lgb: dict[str, lgb.Booster] = {}
        self._single: dict[str, SingleRowLeaves] = {}
        self.features = TreeFeatures([c.column for c in self.stats.columns], self.sparse, self.with_domain)
        self._offsets: dict[str, np.ndarray] = {}  # objective -> t * num_leaves per tree
        self._values: dict[str, list[float]] = {}  # objective -> leaf_values

    # ------------------------------------------------------------ loading
    @classmethod
    def load(cls, trees_dir: Path, config_hint: str = "CONFIG") -> "LeafForest":
        trees_dir = Path(trees_dir)
        manifest_file = trees_dir / "manifest.json"
        if not manifest_file.exists():
            raise NoTreeFit(f"models.leaves is on but no tree fit is at {trees_dir}; fit it first with "
                            f"`lattice trees fit {config_hint}` (after `lattice features`)")
        manifest = json.loads(manifest_file.read_text())
        boosters = {p.stem: p.read_text() for p in sorted((trees_dir / "boosters").glob("*.txt"))}
        if not boosters:
            raise NoTreeFit(f"the tree fit at {trees_dir} has no booster (every objective was constant on train); "
                            "turn models.leaves off or refit with more rows")
        enc = np.load(trees_dir / "encodings.npz")
        sparse = [SparseEncoding(name, d["encoding"], enc[f"ids__{name}"].astype(np.int64), enc[f"counts__{name}"].astype(np.int64))
                  for name, d in manifest["features"]["sparse"].items()]
        stats = DenseStats.load(trees_dir / "dense_stats.json")
        digest = hashlib.sha256()
        for o, text in boosters.items():
            digest.update(o.encode() + b"\0" + text.encode())
        digest.update((trees_dir / "encodings.npz").read_bytes())
        digest.update((trees_dir / "dense_stats.json").read_bytes())
        fit = {"version": manifest["version"], "sha256": digest.hexdigest(), "path": str(trees_dir),
               "trees": {o: _num_trees(t) for o, t in boosters.items()}, "num_leaves": int(manifest["num_leaves"]),
               "fit_rows": manifest.get("fit_rows")}
        share = float(manifest.get("fit_share", 1.0))  # a fit made before cross-fitting: every train row
        fit["fit_share"] = share
        fit["window"] = manifest.get("window")  # a windowed run's days (training.window), else None
        if manifest.get("fit_share_setting") == "auto":  # the share the fit chose, and why
            fit.update(fit_share_setting="auto", fit_share_auto=manifest["fit_share_auto"])
        if share < 1.0:  # the rule, into the lineage of every model that reads this fit
            digest.update(f"fit_share={share!r};{manifest['fit_rule']}".encode())
            fit["sha256"] = digest.hexdigest()
            fit.update(fit_rule=manifest["fit_rule"], train_rows=manifest.get("train_rows"))
        return cls(boosters, stats, sparse, "domain" in manifest["features"]["names"], int(manifest["num_leaves"]), fit)

    def blob(self) -> dict:
        """What model.pt keeps (a few hundred KB for 50 trees of 31 leaves per objective)."""
        return {"boosters": self.boosters, "dense_stats": self.stats.to_json(), "with_domain": self.with_domain,
                "num_leaves": self.num_leaves, "fit": self.fit,
                "sparse": [{"name": e.name, "kind": e.kind, "ids": e.ids, "counts": e.counts} for e in self.sparse]}

    @classmethod
    def from_blob(cls, d: dict) -> "LeafForest":
        sparse = [SparseEncoding(e["name"], e["kind"], np.asarray(e["ids"], np.int64), np.asarray(e["counts"], np.int64))
                  for e in d["sparse"]]
        return cls(dict(d["boosters"]), DenseStats.from_json(d["dense_stats"]), sparse, bool(d["with_domain"]),
                   int(d["num_leaves"]), dict(d["fit"]))

    def to_json(self) -> str:
        """The fit as text (the artifact's trees.json: no pickle in what serving loads)."""
        d = self.blob()
        d["sparse"] = [{**e, "ids": e["ids"].tolist(), "counts": e["counts"].tolist()} for e in d["sparse"]]
        return json.dumps(d)

    @classmethod
    def from_json(cls, text: str | bytes) -> "LeafForest":
        return cls.from_blob(json.loads(text))

    def spec(self) -> dict:
        """What the model builder needs: objective -> trees, leaves per tree, and per objective the
        leaf values in the forest's table order (`t * num_leaves + leaf`; rows of leaves a tree
        did not grow are 0) for `models.leaves.margin`."""
        return {"trees": dict(self.fit["trees"]), "num_leaves": self.num_leaves,
                "values": {o: self.leaf_values(o) for o in self.fit["trees"]}}

    def leaf_values(self, objective: str) -> list[float]:
        """The booster's leaf outputs as one table of `trees * num_leaves` rows."""
        if objective not in self._values:
            booster = self.booster(objective)
            out = np.zeros(int(self.fit["trees"][objective]) * self.num_leaves, dtype=np.float64)
            for t, tree in enumerate(booster.dump_model()["tree_info"][: int(self.fit["trees"][objective])]):
                for leaf in range(int(tree["num_leaves"])):
                    out[t * self.num_leaves + leaf] = booster.get_leaf_output(t, leaf)
            self._values[objective] = out.tolist()
        return self._values[objective]

    @property
    def fit_share(self) -> float:
        """The share of the train split the boosters were fitted on (`models.leaves.fit_share`);
        1 for a fit, or a model.pt, made before the key existed."""
        return float(self.fit.get("fit_share", 1.0))

    def empty_fitted(self, arrs: dict[str, np.ndarray], dates=None) -> dict[str, np.ndarray]:
        """Cross-fitting, for the rows a network trains on (all of the train split): the rows the
        boosters were fitted on get an empty bag of leaf ids (`EMPTY` over their ids), in place.
        Nothing changes at a share of 1. `dates`: each row's day (a windowed run); a fit of a
        window then covers only its own train days, so a warm start's new days, which the
        parent's forest never saw, keep every row's leaf ids."""
        share = self.fit_share
        keys = [k for k in arrs if k.startswith("leaf:")]
        if share >= 1.0 or not keys:
            return arrs
        rows = fitted_rows(arrs["example_id"], share)
        window = self.fit.get("window")
        if window is not None and dates is not None:
            # the fit's days: its train days, and its newest day when it held out only a share of it
            days = list(window["train"]) + ([window["validation"]] if window.get("validation_share", 1.0) < 1 else [])
            rows &= np.isin(np.asarray(dates, dtype=object), np.asarray(days, dtype=object))
        for k in keys:
            arrs[k][rows] = EMPTY
        return arrs

    # ------------------------------------------------------------ scoring
    def booster(self, objective: str) -> lgb.Booster:
        if objective not in self._lgb:
            self._lgb[objective] = lgb.Booster(model_str=self.boosters[objective])
        return self._lgb[objective]

    def single_row(self, objective: str) -> "SingleRowLeaves":
        if objective not in self._single:
            self._single[objective] = SingleRowLeaves(self.booster(objective))
        return self._single[objective]

    def __getstate__(self) -> dict:  # worker processes load their own boosters
        state = dict(self.__dict__)
        state["_lgb"], state["_single"], state["_values"] = {}, {}, {}
        return state

    def matrix(self, dense_raw: dict[str, np.ndarray], ids: dict[str, tuple[np.ndarray, np.ndarray]],
               domain: np.ndarray, n: int, dense: np.ndarray | None = None) -> np.ndarray:
        """The boosters' (n, features) matrix from raw columns: `dense_raw` column -> raw values
        (nulls 0, as RowEncoder reads them), `ids` feature name -> (int64 ids, present). `dense`:
        the fit's dense transform of `dense_raw`, when the caller has it (RowEncoder does when its
        stats are the fit's: `same_dense_transform`)."""
        z = self.stats.apply(dense_raw, n) if dense is None else dense
        if n == 1:  # one request: a list, one searchsorted per feature, no per-feature arrays
            return self._row(z, ids, domain)
        arrs: dict[str, np.ndarray] = {"dense": z, "domain": domain}
        for e in self.sparse:
            arrs[f"id:{e.name}"], arrs[f"has:{e.name}"] = ids.get(e.name, (np.zeros(n, np.int64), np.zeros(n, bool)))
        return self.features.matrix(arrs)

    def _row(self, z: np.ndarray, ids: dict[str, tuple[np.ndarray, np.ndarray]], domain: np.ndarray) -> np.ndarray:
        """`features.matrix` of one row, (1, features) float64, the same numbers."""
        row = z[0].tolist()  # float32 -> Python float, exact (as x[:, :k] = dense upcasts)
        for e in self.sparse:  # SparseEncoding.apply on one id
            got = ids.get(e.name)
            if got is None or not got[1][0] or not len(e.ids):
                row.append(np.nan)  # absent (or a feature the fit saw no id of)
                continue
            v = got[0][0]
            i = int(e.ids.searchsorted(v))
            if i < len(e.ids) and e.ids[i] == v:
                row.append(float(i) if e.kind == "categorical" else float(e.counts[i]))
            else:  # present, never seen by the fit
                row.append(np.nan if e.kind == "categorical" else 0.0)
        if self.with_domain:
            row.append(domain[0])
        return np.array([row], dtype=np.float64)

    def leaves(self, x: np.ndarray) -> dict[str, np.ndarray]:
        """objective -> (n, trees) int64 leaf index (LightGBM pred_leaf). One row goes through
        LightGBM's single-row predictor (`SingleRowLeaves`), more through `Booster.predict`."""
        if len(x) == 1:
            return {o: self.single_row(o)(x[0])[None, :] for o in self.boosters}
        # one thread: a request is a few rows, and OpenMP threads spinning beside torch's on shared
        # cores put the single-row p99 at 100+ ms (bench/bench_tree_leaves.py --latency-only)
        return {o: np.asarray(self.booster(o).predict(x, pred_leaf=True, num_threads=1), dtype=np.int64).reshape(len(x), -1)
                for o in self.boosters}

    def arrays(self, dense_raw: dict[str, np.ndarray], ids: dict[str, tuple[np.ndarray, np.ndarray]],
               domain: np.ndarray, n: int, dense: np.ndarray | None = None) -> dict[str, np.ndarray]:
        """RowEncoder arrays `leaf:<objective>`, (n, trees) int64: the id of tree t's leaf in the
        forest's table, `t * num_leaves + leaf`. `dense`: as `matrix` takes it."""
        out = {}
        for o, v in self.leaves(self.matrix(dense_raw, ids, domain, n, dense)).items():
            offsets = self._offsets.get(o)
            if offsets is None or offsets.shape[1] != v.shape[1]:
                offsets = self._offsets[o] = np.arange(v.shape[1], dtype=np.int64)[None, :] * self.num_leaves
            out[f"leaf:{o}"] = offsets + v
        return out

    def same_dense_transform(self, stats: DenseStats) -> bool:
        """True when `stats.apply` gives the numbers the fit's own stats give (same columns,
        transforms and bounds): the row encoder's dense block can then be reused as is."""
        return _transform_of(stats) == _transform_of(self.stats)


class SingleRowLeaves:
    """pred_leaf of one row through LightGBM's own single-row predictor
    (`LGBM_BoosterPredictForMatSingleRowFastInit` / `...SingleRowFast` of its C API, which the
    Python package does not wrap): the prediction setup is made once, not per request as
    `Booster.predict` makes it (about 20 us against 6 us a call on the dev machine, 7 trees).
    Same trees, same iterations as `Booster.predict(x, pred_leaf=True)`
    (tests/unit/test_tree_leaves.py checks equality row by row). One thread; a lock, since the
    handle holds one row's buffers."""

    def __init__(self, booster: lgb.Booster):
        from lightgbm.basic import _C_API_DTYPE_FLOAT64, _C_API_PREDICT_LEAF_INDEX, _LIB, _safe_call

        self._lib, self._check = _LIB, _safe_call
        self.booster = booster  # keeps the booster's handle alive as long as the fast config
        self.ncol = booster.num_feature()
        # Booster.predict's default iterations: best_iteration (-1: all, as a booster loaded from text)
        self.handle = ctypes.c_void_p()
        _safe_call(_LIB.LGBM_BoosterPredictForMatSingleRowFastInit(
            booster._handle, ctypes.c_int(_C_API_PREDICT_LEAF_INDEX), ctypes.c_int(0), ctypes.c_int(booster.best_iteration),
            ctypes.c_int(_C_API_DTYPE_FLOAT64), ctypes.c_int32(self.ncol), ctypes.c_char_p(b"num_threads=1"),
            ctypes.byref(self.handle)))
        self._out = np.empty(booster.num_trees(), dtype=np.float64)
        self._out_ptr = self._out.ctypes.data_as(ctypes.POINTER(ctypes.c_double))
        self._len = ctypes.c_int64(0)
        self._lock = threading.Lock()

    def __call__(self, row: np.ndarray) -> np.ndarray:
        """(features,) float64 -> (trees,) int64 leaf index."""
        row = np.ascontiguousarray(row, dtype=np.float64)
        if row.shape != (self.ncol,):
            raise ValueError(f"one row of {self.ncol} features expected, got shape {row.shape}")
        with self._lock:
            self._check(self._lib.LGBM_BoosterPredictForMatSingleRowFast(
                self.handle, ctypes.c_void_p(row.ctypes.data), ctypes.byref(self._len), self._out_ptr))
            return self._out[: self._len.value].astype(np.int64)

    def __del__(self) -> None:
        handle = getattr(self, "handle", None)
        if handle is not None and handle.value:
            self._lib.LGBM_FastConfigFree(handle)
            handle.value = None


def _transform_of(stats: DenseStats) -> tuple:
    """What `DenseStats.apply` reads."""
    return (tuple(stats.columns), tuple(stats.mean), tuple(stats.std),
            None if stats.low is None else tuple(stats.low), None if stats.high is None else tuple(stats.high))


def _num_trees(model_text: str) -> int:
    return sum(1 for line in model_text.splitlines() if line.startswith("Tree="))


def forest_for(config, paths, kind: str, parent_blob: dict | None = None, window=None,
               validation_share: float | None = None) -> LeafForest | None:
    """The tree fit model `kind` reads (None when models.leaves leaves it out): a warm start keeps
    its parent's (the leaf ids its tables learned), else the work folder's `lattice trees fit`.
    No fit: NoTreeFit naming the command. `window`: the run's TrainWindow (training.window); the
    work folder's fit must have been fitted on the same days (NoTreeFit otherwise); `validation_share`:
    the run's share of the newest day held out (default training.window_validation)."""
    from lattice.models.build import reads_leaves

    if not reads_leaves(config, kind):
        return None
    if parent_blob is not None and parent_blob.get("leaves"):
        return LeafForest.from_blob(parent_blob["leaves"])
    hint = f"<config of {config.name!r}> --workdir {paths.workdir}"
    forest = LeafForest.load(paths.trees, config_hint=hint)
    setting = config.models.leaves.fit_share
    # the fit decides which train rows lose their leaf ids: it must be this config's (at `auto`, a
    # fit that chose its share itself)
    if setting == "auto" and forest.fit.get("fit_share_setting") != "auto":
        raise NoTreeFit(f"models.leaves.fit_share is auto but the tree fit at {paths.trees} was fitted on a fixed share "
                        f"of {forest.fit_share} of the train rows; refit it with `lattice trees fit {hint}`")
    if setting != "auto" and forest.fit_share != float(setting):
        raise NoTreeFit(f"models.leaves.fit_share is {setting} but the tree fit at {paths.trees} was fitted on a share "
                        f"of {forest.fit_share} of the train rows; refit it with `lattice trees fit {hint}`")
    if window is not None:
        from lattice.data.window import held_out_share

        _same_window(forest, window, paths, hint, held_out_share(config, validation_share))
    return forest


def _same_window(forest: LeafForest, window, paths, hint: str, validation_share: float) -> None:
    """A windowed run reads only a forest fitted on its own days: one fitted on the stored split or
    on another window may have learned the labels of this run's validation or test rows (a fit that
    held out less of the newest day than the run holds out, too)."""
    from lattice.data.window import fitted_elsewhere

    on = fitted_elsewhere(forest.fit.get("window"), window, validation_share)
    if on is None:
        return
    wanted = window.to_json()
    raise NoTreeFit(f"the tree fit at {paths.trees} was fitted on {on}; this run trains on the window "
                    f"{wanted['train'][0]}..{wanted['validation']} (training.window, interval end {wanted['end']}), so its "
                    f"trees may have seen this run's validation or test labels. Refit them for this window: "
                    f"`lattice trees fit {hint} --end {wanted['end']}` (the pipeline's fit_trees step does it)")
