"""Fixtures of the unit tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def one_thread():
    """For tests of tiny tensors: one thread is faster, and a second OpenMP thread stalls whenever
    the other core is busy."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
