"""A tiny variant of a platform config for tests and smoke runs on 2 cores: small tables, narrow
networks, small batches. The structure (domains, objectives, features) is the config's own."""

from __future__ import annotations

from lattice.config import PlatformConfig
from lattice.config.schema import ModelSize


def tiny(config: PlatformConfig, data_root: str | None = None, rows_cap: int = 3000, batch_size: int = 256) -> PlatformConfig:
    small = ModelSize(embedding_dim=8, num_layers=1, num_tokens=8, fm_rank=8, head_dims=[16], domain_untied=True)
    sparse = [f.model_copy(update={"num_embeddings": min(f.num_embeddings, rows_cap)}) for f in config.features.sparse]
    update = {
        "features": config.features.model_copy(update={"sparse": sparse}),
        "models": config.models.model_copy(update={
            "teacher": small,
            "student": small.model_copy(update={"embedding_dim": 4, "table_scale": 0.5, "domain_untied": False}),
            "baselines": config.models.baselines.model_copy(update={"size": small.model_copy(update={"domain_untied": False})}),
            # no leaf features: a test that trains outside the pipeline (whose teacher DAG fits the
            # trees) would need its own `lattice trees fit`; tests of the leaves turn them on
            "leaves": config.models.leaves.model_copy(update={"models": []}),
        }),
        "training": config.training.model_copy(update={"batch_size": batch_size, "num_workers": 0, "lr_dense": 0.003, "lr_sparse": 0.01}),
    }
    if config.synthetic is not None:
        update["synthetic"] = config.synthetic.model_copy(update={"users": 2000, "ads": 500, "chunk_rows": 5000})
    if data_root is not None:
        update["data_root"] = data_root
    return config.model_copy(update=update)
