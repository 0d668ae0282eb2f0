"""Library deprecation notices a user cannot act on, kept out of the platform's output.

fbgemm_gpu warns at import about optional SSD kernels it could not load, torchrec and torch about
their own internal calls (DDP's `broadcast_buffers`, `torch.jit.script`, ShardedTensor), and torch
logs `is_fx_tracing` through glog: about fifty lines per `lattice demo`, on every rank, between
the stage headers. None of them is about the user's config, data or code. Our own warnings,
and every library's other warnings (a RuntimeWarning, a UserWarning), still show.

Two layers, because Feast calls `warnings.simplefilter("once", DeprecationWarning)` when it is
imported, which puts its rule before ours: the `warnings` filters drop the notices where no later
rule overrides them, and a filter on the `py.warnings` logger (where Great Expectations'
`logging.captureWarnings(True)` sends every warning) drops those that get through.

Library log records a user cannot act on are dropped at their logger too: Great Expectations'
"Skipping registering function ... because it is a closure" (about 200 INFO lines per import in
a task whose root logger passes INFO), and fbgemm_gpu's INFO records, which it logs on the root
logger itself: one "Successfully loaded" per kernel library at import, and each embedding
table's constructor arguments ("[TBE=...]"). fbgemm's warnings and errors still pass.
"""

from __future__ import annotations

import logging
import re
import warnings

# (category, module the warning is attributed to, or a message) of each notice we drop
_BY_MODULE = [(DeprecationWarning, r"(fbgemm_gpu|torchrec)(\.|$)"), (DeprecationWarning, r"torch\.jit(\.|$)"),
              (FutureWarning, r"torchrec(\.|$)")]
_BY_MESSAGE = [(FutureWarning, r"Please use DTensor instead and we are deprecating ShardedTensor")]
# a captured warning's logged text: "<file>:<line>: <Category>: <message>"
_LOGGED = re.compile(r"/(fbgemm_gpu|torchrec|torch/jit)/[^:]*:\d+: (DeprecationWarning|FutureWarning):"
                     r"|FutureWarning: Please use DTensor instead and we are deprecating ShardedTensor")


class DropLibraryNotices(logging.Filter):
    """Drops a captured warning (logger `py.warnings`) that is one of the notices above."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not _LOGGED.search(record.getMessage())


# loggers whose records below WARNING are bookkeeping of the library, not news about the run
# (GE's closure notes and its "Multiple declarations of metric", py4j's connection closing)
_CHATTY = ("great_expectations._docs_decorators", "great_expectations.expectations.registry", "py4j.clientserver")
_FBGEMM_FILE = re.compile(r"[/\\]fbgemm_gpu[/\\]")


class DropLibraryChatter(logging.Filter):
    """On the root logger: drops the INFO (and DEBUG) records fbgemm_gpu logs there directly
    (`logging.info(...)`), known by the file that logged them; nothing else."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or not _FBGEMM_FILE.search(record.pathname or "")


def library_notices() -> None:
    """Install both layers; safe to call more than once."""
    for category, module in _BY_MODULE:
        warnings.filterwarnings("ignore", category=category, module=module)
    for category, message in _BY_MESSAGE:
        warnings.filterwarnings("ignore", message=message, category=category)
    logger = logging.getLogger("py.warnings")
    if not any(isinstance(f, DropLibraryNotices) for f in logger.filters):
        logger.addFilter(DropLibraryNotices())
    # torch's glog-style warning, once per process, when torchrec asks `is_fx_tracing`
    logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)
    for name in _CHATTY:
        logging.getLogger(name).setLevel(logging.WARNING)
    root = logging.getLogger()
    if not any(isinstance(f, DropLibraryChatter) for f in root.filters):
        root.addFilter(DropLibraryChatter())
