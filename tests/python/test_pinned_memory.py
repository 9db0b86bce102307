"""Exact-size pinned tables: speedtorch.pinned_empty and the memory PinnedEmbedding owns."""

from __future__ import annotations

import gc
from pathlib import Path

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


@pytest.mark.parametrize("size, dtype", [((2**62,), torch.float32), ((2**31, 2**31, 4), torch.float32),
                                         ((2**61, 2), torch.float16), ((2, 2**62), torch.int8)])
def test_pinned_empty_refuses_sizes_that_overflow(size, dtype):
    """Bytes past 64 bits used to wrap (or reach torch's from_blob, which aborts the process): a clear error."""
    with pytest.raises(RuntimeError, match="overflow"):
        speedtorch.pinned_empty(*size, dtype=dtype)


def test_embedding_sizes_that_overflow_are_refused():
    """Rows x dim x itemsize and the optimizer state's width and bytes are all checked (they used to wrap: a negative
    state width, or a view outside its buffer)."""
    with pytest.raises(RuntimeError, match="overflow"):
        speedtorch.PinnedEmbedding(2**40, 2**30, torch.float32)
    with pytest.raises(RuntimeError, match="overflow"):
        speedtorch.PinnedEmbedding.state_width("adam", {}, 2**62)
    with pytest.raises(RuntimeError, match="overflow"):
        speedtorch.PinnedEmbedding(0, 2**61, torch.float32)  # no rows, but a row of 2^63 bytes
    wide = speedtorch.PinnedEmbedding(0, 2**60, torch.float16)  # rows of 2^61 bytes; Adam's state: 2^63 bytes a row
    for beside in (True, False):
        with pytest.raises(RuntimeError, match="overflow"):
            wide.set_optimizer("adam", {}, beside)
    assert wide.optimizer() == "" and wide.table().shape == (0, 2**60)  # refused before anything changed


def test_pinned_when_cuda_present():
    t = speedtorch.pinned_empty(10, 4)
    assert t.is_pinned() == (torch.cuda.is_available() and "cuda=none" not in speedtorch.build_info())


def _mapping_covers(begin: int, end: int) -> bool:
    """Whether one mapping of this process holds the whole address range [begin, end)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        if lo <= begin and end <= hi:
            return True
    return False


def _resident_bytes_of_mapping_at(address: int) -> int:
    """Rss of the mapping holding `address`, from /proc/self/smaps: this buffer's own pages, not the process's,
    whose total moves with whatever else the allocator (or ASan's quarantine) frees meanwhile."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0] if line else ""
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= address < hi
        elif inside and line.startswith("Rss:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no mapping holds address {address:#x}")


def _mapping_overlaps(begin: int, end: int) -> bool:
    for line in Path("/proc/self/maps").read_text().splitlines():
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        if lo < end and begin < hi:
            return True
    return False


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux /proc")
def test_memory_freed_with_last_reference():
    nbytes = 64 << 20
    t = speedtorch.pinned_empty(nbytes // 16, 4)  # 64 MiB, its own mapping
    begin = t.data_ptr()
    t.fill_(1.0)  # every page resident (page-locked ones are from the start)
    view = t[5:10]
    del t
    assert float(view.sum()) == 5 * 4  # the view still owns the buffer
    assert _mapping_covers(begin, begin + nbytes)
    assert _resident_bytes_of_mapping_at(begin) >= nbytes
    del view
    gc.collect()
    # Unmapped means its pages went back to the kernel; no part of the range may stay mapped.
    assert not _mapping_overlaps(begin, begin + nbytes), "the buffer is still mapped after its last reference went"
