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


def _root_passes(pathname: str, level: int, message: str, name: str = "root") -> bool:
    record = logging.LogRecord(name, level, pathname, 1, message, None, None)
    return logging.getLogger().filter(record) and logging.getLogger(name).isEnabledFor(level)


def test_library_chatter_is_dropped_at_its_logger():
    root, before = logging.getLogger(), logging.getLogger().level
    root.setLevel(logging.INFO)  # as in an Airflow task
    try:
        _check_chatter()
    finally:
        root.setLevel(before)


def _check_chatter():
    library_notices()
    site = "/venv/lib/python3.11/site-packages"
    # fbgemm_gpu logs on the root logger itself: its INFO is dropped by the file it comes from
    assert not _root_passes(f"{site}/fbgemm_gpu/__init__.py", logging.INFO,
                            "Successfully loaded: 'fbgemm_gpu_py.so'")
    assert not _root_passes(f"{site}/fbgemm_gpu/split_table_batched_embeddings_ops_training.py", logging.INFO,
                            "[TBE=abc] Contents: {'feature_table_map': [0, 1]}")
    assert _root_passes(f"{site}/fbgemm_gpu/__init__.py", logging.ERROR, "Could not load the library 'x.so'!")
    assert _root_passes("/work/lattice/cli/run_cmd.py", logging.INFO, "stage consolidate finished")
    assert _root_passes(f"{site}/fbgemm_gpux/__init__.py", logging.INFO, "a name that only starts like it")
    # Great Expectations' closure bookkeeping; its warnings stay
    ge = "great_expectations._docs_decorators"
    assert not logging.getLogger(ge).isEnabledFor(logging.INFO)
    assert logging.getLogger(ge).isEnabledFor(logging.WARNING)
    # only that logger is raised: its siblings keep inheriting (the GX root's level is the
    # validate stage's business, set there for the whole library once a suite has run)
    assert logging.getLogger("great_expectations.core").level == logging.NOTSET


def test_installing_twice_adds_one_root_filter():
    from lattice.quiet import DropLibraryChatter

    library_notices()
    library_notices()
    assert sum(isinstance(f, DropLibraryChatter) for f in logging.getLogger().filters) == 1
