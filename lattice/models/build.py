"""`build_model(config, kind, n_dense)`: every model the platform trains, by name."""

from __future__ import annotations

from torch import nn

from lattice.config import PlatformConfig
from lattice.models.baselines import MultiTaskModel, PooledModels, SeparateModels
from lattice.models.lattice_net import LatticeNet

MODEL_KINDS = ("teacher", "student", "separate", "pooled", "mmoe", "shared_bottom")
"""The torch models `build_model` builds."""
GBDT_KINDS = ("gbdt", "gbdt_cell")
"""LightGBM baselines (lattice.models.gbdt): trained by their own stage, never by the torch trainer."""


def kind_of(name: str) -> str:
    """A model *name* (its folder under models/) is its kind, optionally with a suffix after
    ':' or '@' (e.g. 'student@nodistill' trains the student architecture under another name)."""
    kind = name.split("@")[0].split(":")[0]
    if kind not in MODEL_KINDS + GBDT_KINDS:
        raise ValueError(f"unknown model {name!r}; use one of {MODEL_KINDS + GBDT_KINDS} (optionally 'kind@tag')")
    return kind


def baseline_names(config: PlatformConfig) -> list[str]:
    b = config.models.baselines
    return ((["separate"] if b.separate else []) + (["pooled"] if b.pooled else []) + ([b.multitask] if b.multitask != "none" else [])
            + (["gbdt"] if b.gbdt else []) + (["gbdt_cell"] if b.gbdt_cell else []))


def reads_leaves(config: PlatformConfig, kind: str) -> bool:
    """Whether model `kind` reads the trees' leaf ids (models.leaves.models; teacher and student only)."""
    return kind_of(kind) in config.models.leaves.models


def build_model(config: PlatformConfig, kind: str, n_dense: int, *, fitted: dict | None = None,
                fp8_plan: dict | None = None, leaves: dict | None = None) -> nn.Module:
    """Forward: (dense (B, n_dense), sparse KJT, domain (B,)) -> {objective: logits (B,)}.
    `n_dense` is the width of the dense input (lattice.data.transforms.dense_spec). `fitted`:
    feature -> fitted id map for the hashing schemes that need one (lattice.hashing); `fp8_plan`:
    the FP8 dispatcher's plan, applied to the GEMM sites it names (lattice.fp8); `leaves`: the
    tree fit's LeafForest.spec() for a teacher or student that reads leaf ids. A saved model is
    rebuilt with the ones saved with it (lattice.models.saved.rebuild), never rebuilt by hand."""
    kind = kind_of(kind)
    if kind in GBDT_KINDS:
        raise ValueError(f"{kind!r} is a LightGBM baseline, not a torch module; train it with "
                         "lattice.training.gbdt_stage.train_gbdt (`lattice train CONFIG --model gbdt`)")
    m = config.models
    if leaves and kind not in ("teacher", "student"):
        raise ValueError(f"leaf ids feed the teacher and the student only (models.leaves.models), not {kind!r}")
    if kind in ("teacher", "student"):
        margin = kind in m.leaves.margin  # the trees' raw score under this network's logits
        model = LatticeNet(config, m.teacher if kind == "teacher" else m.student, n_dense, fitted=fitted, leaves=leaves,
                           margin=margin, leaf_pooling=m.leaves.pooling[kind], leaf_tokens=kind in m.leaves.tokens)
    elif kind == "separate":
        model = SeparateModels(config, m.baselines.size, n_dense, fitted=fitted)
    elif kind == "pooled":
        model = PooledModels(config, m.baselines.size, n_dense, fitted=fitted)
    else:
        model = MultiTaskModel(config, m.baselines.size, n_dense, n_experts=4 if kind == "mmoe" else 1, fitted=fitted)
    if fp8_plan:
        from lattice.fp8.dispatch import apply_plan

        apply_plan(model, fp8_plan)
    return model
