"""lattice.quiet drops the libraries' own deprecation notices and nothing else."""

from __future__ import annotations

import logging
import warnings

from lattice.quiet import DropLibraryNotices, library_notices


def _shown(category: type[Warning], module: str, message: str = "notice") -> bool:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")  # what Feast's "once" does for DeprecationWarning
        library_notices()
        warnings.warn_explicit(message, category, f"{module.replace('.', '/')}.py", 1, module=module)
    return bool(seen)


def test_library_deprecations_are_dropped_at_the_source():
    assert not _shown(DeprecationWarning, "fbgemm_gpu.split_embedding_codegen_lookup_invokers")
    assert not _shown(DeprecationWarning, "torch.jit._script")
    assert not _shown(FutureWarning, "torchrec.distributed.embeddingbag")
    assert not _shown(FutureWarning, "lattice.training.distributed",
                      "Please use DTensor instead and we are deprecating ShardedTensor.")


def test_other_warnings_still_show():
    assert _shown(DeprecationWarning, "lattice.config.loader")
    assert _shown(FutureWarning, "lattice.training.distributed")
    assert _shown(UserWarning, "torchrec.distributed.embeddingbag")  # not a deprecation
    assert _shown(DeprecationWarning, "torch.nn.modules.module")  # torch beyond its jit
    assert _shown(FutureWarning, "torchrecx.module")  # a name that only starts like one


def _passes(message: str) -> bool:
    record = logging.LogRecord("py.warnings", logging.WARNING, __file__, 1, message, None, None)
    return DropLibraryNotices().filter(record)


def test_captured_notices_are_dropped_from_the_log():
    site = "/venv/lib/python3.11/site-packages"
    assert not _passes(f"{site}/fbgemm_gpu/split_table_batched_embeddings_ops.py:63: DeprecationWarning: gone\n  warnings.warn(")
    assert not _passes(f"{site}/torchrec/distributed/model_parallel.py:183: FutureWarning: `broadcast_buffers` is deprecated")
    assert not _passes(f"{site}/torch/jit/_script.py:1488: DeprecationWarning: `torch.jit.script` is deprecated.")
    assert _passes(f"{site}/torchrec/distributed/model_parallel.py:183: UserWarning: something else")
    assert _passes("/work/lattice/config/loader.py:10: DeprecationWarning: `models.x` is renamed")
    assert _passes(f"{site}/feast/feature_view.py:50: DeprecationWarning: a Feast notice")


def test_installing_twice_adds_one_log_filter():
    library_notices()
    library_notices()
    assert sum(isinstance(f, DropLibraryNotices) for f in logging.getLogger("py.warnings").filters) == 1
