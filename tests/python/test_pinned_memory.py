"""Exact-size pinned tables: speedtorch.pinned_empty and the memory PinnedEmbedding owns."""

from __future__ import annotations

import pytest
import torch

import speedtorch


def test_pinned_empty_is_zeroed_and_exact():
    t = speedtorch.pinned_empty(1000, 33, dtype=torch.float16)
    assert t.shape == (1000, 33) and t.dtype == torch.float16
    assert t.untyped_storage().nbytes() == 1000 * 33 * 2
    assert torch.count_nonzero(t) == 0


def test_pinned_empty_accepts_a_size_tuple():
    assert speedtorch.pinned_empty((3, 4)).shape == (3, 4)


def test_pinned_empty_zero_rows():
    t = speedtorch.pinned_empty(0, 8)
    assert t.shape == (0, 8)


def test_pinned_empty_rejects_negative_sizes():
    with pytest.raises(RuntimeError, match="negative dimension"):
        speedtorch.pinned_empty(-1, 8)


def test_pinned_when_cuda_present():
    t = speedtorch.pinned_empty(10, 4)
    assert t.is_pinned() == (torch.cuda.is_available() and "cuda=none" not in speedtorch.build_info())


def test_memory_freed_with_last_reference():
    t = speedtorch.pinned_empty(1 << 20, 4)  # 16 MiB
    view = t[5:10]
    del t
    view.fill_(1.0)  # the view still owns the buffer
    assert float(view.sum()) == 5 * 4
