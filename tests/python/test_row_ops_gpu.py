"""GPU routes of gather / scatter_: pinned host table <-> GPU through the UVA kernel, the staged path and both at
once; GPU-resident tables; index errors found before launch and by the kernels themselves; ordering between UVA
kernels and CPU access."""

from __future__ import annotations

import ctypes
import os
import shutil
import threading
from pathlib import Path

import pytest
import torch
from helpers import last_wins_reference, random_table, rows_at

import speedtorch

pytestmark = pytest.mark.gpu

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# -1: automatic split (forced to split even small tables below); 0: staged only; 1: UVA only.
FRACTIONS = [-1.0, 0.0, 0.3, 1.0]


def force_split(transfer_settings, fraction: float, chunk_bytes: int = 4096) -> None:
    """Makes even small transfers take the requested split, through several small staging chunks (for the rest of
    the test: transfer_settings is conftest's fixture)."""
    transfer_settings(
        uva_fraction=fraction, uva_reach_bytes=0, small_transfer_bytes=0, staging_chunk_bytes=chunk_bytes
    )


@pytest.mark.parametrize("fraction", FRACTIONS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("indices_on", ["cpu", "cuda"])
def test_gather_pinned_to_gpu(fraction, dtype, index_dtype, indices_on, transfer_settings):
    force_split(transfer_settings, fraction)
    table = random_table(3000, 40, dtype, pinned=True)
    assert table.is_pinned()
    indices = torch.randint(0, 3000, (31, 17), dtype=index_dtype)  # duplicates included
    out = speedtorch.gather(table, indices.to(indices_on), device="cuda")
    assert out.device.type == "cuda" and out.shape == (31, 17, 40)
    torch.testing.assert_close(out.cpu(), table[indices.long()], rtol=0, atol=0)


@pytest.mark.parametrize("dim", [1, 3, 8, 33, 128, 1024])
def test_gather_every_row_width(dim, transfer_settings):
    force_split(transfer_settings, 0.5, chunk_bytes=1 << 16)
    table = random_table(500, dim, pinned=True)
    indices = torch.randint(0, 500, (700,), device="cuda")
    torch.testing.assert_close(speedtorch.gather(table, indices).cpu(), table[indices.cpu()], rtol=0, atol=0)


@pytest.mark.parametrize("fraction", FRACTIONS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("src_indices_on", ["cpu", "cuda"])
def test_scatter_gpu_to_pinned_last_wins(fraction, dtype, src_indices_on, transfer_settings):
    force_split(transfer_settings, fraction)
    table = random_table(400, 24, dtype, pinned=True)
    indices = torch.randint(0, 400, (1500,))  # every row hit several times
    src = random_table(1500, 24, dtype)
    expected = last_wins_reference(table, indices, src)
    speedtorch.scatter_(table, indices.to(src_indices_on), src.cuda())
    torch.cuda.synchronize()
    torch.testing.assert_close(table, expected, rtol=0, atol=0)


@pytest.mark.parametrize("write_fraction", [1.0, 0.0, 0.5])
@pytest.mark.parametrize("read_fraction", [0.0, 1.0, 0.5])
def test_staged_access_is_ordered_after_uva_kernels(write_fraction, read_fraction, transfer_settings):
    """A scatter's UVA kernel may still be running when the next gather's CPU threads read the rows: they must wait
    for it (no explicit synchronize here)."""
    table = random_table(20_000, 64, pinned=True)
    indices = torch.randperm(20_000, device="cuda")[:8000]
    for step in range(3):
        src = torch.randn(8000, 64, device="cuda") + step
        force_split(transfer_settings, write_fraction, chunk_bytes=1 << 16)
        speedtorch.scatter_(table, indices, src)
        force_split(transfer_settings, read_fraction, chunk_bytes=1 << 16)
        torch.testing.assert_close(speedtorch.gather(table, indices), src, rtol=0, atol=0)


@pytest.mark.parametrize("fraction", [0.0, 0.5, 1.0])
def test_gather_on_a_side_stream(fraction, transfer_settings):
    force_split(transfer_settings, fraction)
    table = random_table(1000, 32, pinned=True)
    indices = torch.randint(0, 1000, (4000,), device="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        out = speedtorch.gather(table, indices) * 3
    stream.synchronize()
    torch.testing.assert_close(out.cpu(), table[indices.cpu()] * 3, rtol=0, atol=0)


def test_gpu_resident_table():
    table = random_table(800, 20).cuda()
    indices = torch.randint(0, 800, (9, 11), device="cuda")
    torch.testing.assert_close(speedtorch.gather(table, indices), table[indices], rtol=0, atol=0)
    # The rows land on the indices' device unless a device is named.
    on_host = speedtorch.gather(table, indices.cpu())
    assert on_host.device.type == "cpu"
    torch.testing.assert_close(on_host, table[indices].cpu(), rtol=0, atol=0)
    torch.testing.assert_close(speedtorch.gather(table, indices.cpu(), "cuda"), table[indices], rtol=0, atol=0)
    dup = torch.randint(0, 800, (3000,), device="cuda")
    src = torch.randn(3000, 20, device="cuda")
    expected = last_wins_reference(table.cpu(), dup.cpu(), src.cpu())
    speedtorch.scatter_(table, dup, src)
    torch.testing.assert_close(table.cpu(), expected, rtol=0, atol=0)
    speedtorch.scatter_(table, dup.cpu(), src.cpu())  # host src moves to the table's GPU
    torch.testing.assert_close(table.cpu(), expected, rtol=0, atol=0)


def test_cuda_indices_gathered_to_cpu():
    table = random_table(100, 8, pinned=True)
    indices = torch.randint(0, 100, (50,), device="cuda")
    out = speedtorch.gather(table, indices, device="cpu")
    assert out.device.type == "cpu"
    torch.testing.assert_close(out, table[indices.cpu()], rtol=0, atol=0)


def test_torch_pinned_memory_table_works(transfer_settings):
    table = random_table(300, 16).pin_memory()
    indices = torch.randint(0, 300, (100,), device="cuda")
    force_split(transfer_settings, 1.0)
    torch.testing.assert_close(speedtorch.gather(table, indices).cpu(), table[indices.cpu()], rtol=0, atol=0)


@pytest.mark.parametrize("fraction", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("bad", [-1, 1000, 2**40])
def test_gpu_index_errors_raise_and_touch_nothing(fraction, bad, transfer_settings):
    """CUDA indices are checked before any kernel is launched (one reduction, then the host names the bad one)."""
    force_split(transfer_settings, fraction)
    table = random_table(1000, 16, pinned=True)
    before = table.clone()
    indices = torch.randint(0, 1000, (600,), device="cuda")
    indices[123] = bad
    with pytest.raises(IndexError, match=f"holds {bad} at flat position 123.*negative indices are not wrapped"):
        speedtorch.gather(table, indices)
    with pytest.raises(IndexError, match=f"holds {bad} at flat position 123.*negative indices are not wrapped"):
        speedtorch.scatter_(table, indices, torch.randn(600, 16, device="cuda"))
    torch.cuda.synchronize()
    assert torch.equal(table, before)
    # The CUDA context is intact: the next call works.
    good = indices.clamp(0, 999)
    torch.testing.assert_close(speedtorch.gather(table, good).cpu(), table[good.cpu()], rtol=0, atol=0)


@pytest.mark.parametrize("sort", [True, False])
@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_sorted_uva_share_keeps_batch_order(sort, fraction, transfer_settings):
    """Past the UVA reach the UVA share is sorted by row for locality; results stay in batch order, duplicates and
    index errors keep their batch positions."""
    transfer_settings(
        uva_fraction=fraction, uva_reach_bytes=0, small_transfer_bytes=0, sort_uva_indices=float(sort)
    )
    table = random_table(50_000, 16, pinned=True)
    indices = torch.randint(0, 50_000, (12_000,), device="cuda")
    torch.testing.assert_close(speedtorch.gather(table, indices).cpu(), table[indices.cpu()], rtol=0, atol=0)
    src = torch.randn(12_000, 16, device="cuda")
    expected = last_wins_reference(table, indices.cpu(), src.cpu())
    speedtorch.scatter_(table, indices, src)
    torch.cuda.synchronize()
    torch.testing.assert_close(table, expected, rtol=0, atol=0)
    indices[3777] = -9
    with pytest.raises(IndexError, match="holds -9 at flat position 3777"):
        speedtorch.gather(table, indices)


def test_gpu_table_index_errors():
    table = random_table(100, 4).cuda()
    before = table.clone()
    with pytest.raises(IndexError, match="holds 100"):
        speedtorch.gather(table, torch.tensor([0, 100], device="cuda"))
    with pytest.raises(IndexError, match="holds -5 at flat position 1"):
        speedtorch.scatter_(table, torch.tensor([3, -5, 7], device="cuda"), torch.randn(3, 4, device="cuda"))
    assert torch.equal(table, before)


@pytest.mark.parametrize("table_on", ["pinned", "cuda"])
@pytest.mark.parametrize("bad", [-1, 1000, 2**40])
def test_gpu_kernels_find_bad_indices_and_touch_nothing(table_on, bad, transfer_settings, deferred_checks):
    """With deferred checks nothing is validated before launch: the kernels meet the bad index themselves, never
    touch its row, and a scatter_ writes all rows or none."""
    force_split(transfer_settings, 1.0)  # UVA only: a staged share's indices are checked on the host before any copy
    table = random_table(1000, 16, pinned=True) if table_on == "pinned" else random_table(1000, 16).cuda()
    before = table.clone()
    indices = torch.randint(0, 1000, (600,), device="cuda")
    indices[123] = bad
    found_by_gpu = f"holds {bad} at flat position 123.*found by the GPU.*; the row was not touched"
    out = speedtorch.gather(table, indices)  # no wait, no raise
    with pytest.raises(IndexError, match=found_by_gpu):
        speedtorch.check_index_errors()
    keep = torch.arange(600, device="cuda") != 123
    torch.testing.assert_close(out[keep].cpu(), before.cpu()[indices[keep].cpu()], rtol=0, atol=0)
    assert torch.isnan(out[123].cpu()).all()  # never another row's data
    speedtorch.scatter_(table, indices, torch.randn(600, 16, device="cuda"))
    with pytest.raises(IndexError, match=found_by_gpu):
        speedtorch.check_index_errors()
    torch.cuda.synchronize()
    assert torch.equal(table, before)  # all rows or none
    speedtorch.check_index_errors()  # cleared


def test_deferred_index_checks(transfer_settings, deferred_checks):
    force_split(transfer_settings, 1.0)
    table = random_table(50, 4, pinned=True)
    indices = torch.tensor([1, 77, 2], device="cuda")
    out = speedtorch.gather(table, indices)  # no wait, no raise
    with pytest.raises(IndexError, match="holds 77 at flat position 1"):
        speedtorch.check_index_errors()
    assert torch.isnan(out[1].cpu()).all()  # the row for the bad index is NaN, never another row's data
    torch.testing.assert_close(out[[0, 2]].cpu(), table[[1, 2]], rtol=0, atol=0)
    speedtorch.check_index_errors()  # cleared


def test_pageable_table_gathers_through_cpu_threads_and_refuses_gpu_writes():
    """A pageable host table (e.g. a file larger than RAM mapped without page-locking) reaches a GPU through the
    staged path; GPU writes into it are refused, and so is capturing a gather from it."""
    table = random_table(5000, 8)
    ids = torch.randint(0, 5000, (3000,))
    for indices in (ids, ids.cuda()):
        assert torch.equal(speedtorch.gather(table, indices, "cuda").cpu(), table[ids])
    with pytest.raises(IndexError, match="holds 5000"):
        speedtorch.gather(table, torch.tensor([5000], device="cuda"))
    with pytest.raises(RuntimeError, match="pageable host memory"):
        speedtorch.scatter_(table, torch.tensor([1]), torch.randn(1, 8, device="cuda"))


def test_mismatched_gpus_for_gpu_table():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    table = random_table(10, 4).cuda(0)
    with pytest.raises(RuntimeError, match="same GPU"):
        speedtorch.gather(table, torch.tensor([1], device="cuda:1"))


@pytest.mark.parametrize("fraction", [0.0, 0.5, 1.0])
def test_cuda_indices_on_another_gpu_than_the_rows(fraction, transfer_settings):
    """Indices on GPU 1, rows on GPU 0, table in pinned host memory: the indices reached pin_memory() ("cannot pin
    'torch.cuda.LongTensor'"). They are copied between the GPUs now, for gather, scatter_ and the optimizer step."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    force_split(transfer_settings, fraction)
    table = random_table(300, 16, pinned=True)
    expected = table.clone()
    indices = torch.randint(0, 300, (64,))
    out = speedtorch.gather(table, indices.to("cuda:1"), device="cuda:0")
    assert out.device == torch.device("cuda", 0)
    torch.testing.assert_close(out.cpu(), expected[indices], rtol=0, atol=0)

    rows = torch.randperm(300)[:40]
    src = torch.randn(40, 16)
    speedtorch.scatter_(table, rows.to("cuda:1"), src.to("cuda:0"))
    torch.cuda.synchronize(0)
    expected[rows] = src
    torch.testing.assert_close(table, expected, rtol=0, atol=0)

    emb = speedtorch.PinnedEmbedding(300, 16, torch.float32)
    emb.copy_(expected)
    emb.set_optimizer("sgd", {"lr": 0.5}, True)
    reference = speedtorch.PinnedEmbedding(300, 16, torch.float32)
    reference.copy_(expected)
    reference.set_optimizer("sgd", {"lr": 0.5}, True)
    grad = torch.randn(64, 16)
    for sorted_unique, ids in ((False, indices), (True, torch.unique(indices))):
        g = grad[: ids.numel()]
        emb.apply_gradients(ids.to("cuda:1"), g.to("cuda:0"), sorted_unique)
        reference.apply_gradients(ids, g, sorted_unique)  # the CPU route
    torch.cuda.synchronize(0)
    torch.testing.assert_close(emb.table(), reference.table(), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(emb.gather(indices.to("cuda:1"), torch.device("cuda:0")).cpu(),
                               reference.table()[indices], rtol=1e-6, atol=1e-6)


def test_cpu_rows_with_cuda_indices_write_a_table_gpus_only_read(tmp_path):
    """A file table opened 'r+' outside tmpfs is registered read-only for GPUs. CPU rows with CUDA indices are
    written by CPU threads, yet scatter_ refused them as a GPU write (and the optimizer's CPU route handed CUDA
    indices to a host-only check)."""
    spare = Path(speedtorch.library_path()).parent / f"speedtorch-test-{os.getpid()}"  # the build folder: on disk
    try:
        _write_a_table_gpus_only_read((tmp_path, spare))
    finally:
        shutil.rmtree(spare, ignore_errors=True)


def _write_a_table_gpus_only_read(folders) -> None:
    table = random_table(50, 8)
    ids = torch.tensor([4, 0, 7, 4], device="cuda")
    for folder in folders:  # the first outside tmpfs
        folder.mkdir(exist_ok=True)
        path = folder / "t.npy"
        speedtorch.data.save_npy(table, path)
        mapped = speedtorch.data.open_npy(path, "r+")
        try:
            speedtorch.scatter_(mapped, ids, torch.zeros(4, 8, device="cuda"))
        except RuntimeError as error:
            assert "GPUs may only read" in str(error)
            break
    else:
        pytest.skip("no folder outside tmpfs: GPUs may write every 'r+' mapping here")
    src = torch.randn(4, 8)
    speedtorch.scatter_(mapped, ids, src)
    table[[0, 7, 4]] = src[[1, 2, 3]]  # the last of the repeated id wins
    torch.testing.assert_close(mapped, table, rtol=0, atol=0)
    state = torch.zeros(50, speedtorch.PinnedEmbedding.state_width("sgd", {}, 8))
    grad = torch.randn(4, 8)
    torch.ops.speedtorch.row_optimizer_step_(mapped, state, ids, grad, "sgd", {"lr": 1.0}, 1)
    table.index_add_(0, ids.cpu(), -grad)
    torch.testing.assert_close(mapped, table, rtol=1e-6, atol=1e-6)
    del mapped
    reread = speedtorch.data.load_npy(path, pinned=False)
    torch.testing.assert_close(reread, table, rtol=1e-6, atol=1e-6)  # the writes reached the file


def test_opcheck_on_gpu():
    # opcheck clones its inputs into pageable memory, so it can only exercise GPU-resident tables here; the pinned
    # host table with CUDA rows is covered by the tests above and its fake kernel by the next test.
    table = random_table(64, 16).cuda()
    indices = torch.randint(0, 64, (10,), device="cuda")
    torch.library.opcheck(torch.ops.speedtorch.gather.default, (table, indices))
    torch.library.opcheck(torch.ops.speedtorch.scatter_rows_.default, (table, indices.unique(), torch.randn(
        indices.unique().numel(), 16, device="cuda")))


def test_fake_gather_puts_rows_where_asked():
    from torch._subclasses.fake_tensor import FakeTensorMode

    table = random_table(64, 16, pinned=True)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake_table = mode.from_tensor(table)
        out = torch.ops.speedtorch.gather(fake_table, torch.zeros(3, 5, dtype=torch.long, device="cuda"))
        assert out.shape == (3, 5, 16) and out.device.type == "cuda"
        out = torch.ops.speedtorch.gather(fake_table, torch.zeros(7, dtype=torch.long), torch.device("cuda"))
        assert out.shape == (7, 16) and out.device.type == "cuda"


def test_large_transfer_with_the_default_policy(transfer_settings):
    """The automatic plan on a table past the UVA reach and a transfer past the small size: a real split."""
    transfer_settings(uva_reach_bytes=1 << 20)
    table = random_table(200_000, 64, pinned=True)  # 51 MB
    indices = torch.randint(0, 200_000, (40_000,), device="cuda")
    torch.testing.assert_close(speedtorch.gather(table, indices).cpu(), table[indices.cpu()], rtol=0, atol=0)
    src = torch.randn(40_000, 64, device="cuda")
    expected = last_wins_reference(table, indices.cpu(), src.cpu())
    speedtorch.scatter_(table, indices, src)
    torch.cuda.synchronize()
    torch.testing.assert_close(table, expected, rtol=0, atol=0)


def _keep_stream_busy() -> None:
    """Queues ~0.5 s of GPU work on the current stream, so what is launched next is still queued afterwards."""
    torch.cuda._sleep(1_000_000_000)


class StreamGate:
    """Holds the current CUDA stream at the point of construction until open_after() has been called and its delay
    has passed, with nothing else deciding when: the stream waits (the driver's cuStreamWaitValue32) for a flag in
    pinned host memory, and a host thread blocked in read() on a timerfd writes the flag when the timer fires. That
    thread holds no GIL, so the gate opens even while the calling thread is blocked in C++ (as in `del table`,
    which waits for the GPU)."""

    def __init__(self):
        self._libc = ctypes.CDLL(None, use_errno=True)
        cuda = ctypes.CDLL("libcuda.so.1")
        self._flag = torch.zeros(2, dtype=torch.int32).pin_memory()  # read() writes 8 bytes: the expiration count
        self._timer = self._libc.timerfd_create(1, 0)  # CLOCK_MONOTONIC
        assert self._timer >= 0, f"timerfd_create: errno {ctypes.get_errno()}"
        self._set_timer(60.0)  # a safety net: should the code under test wait for the stream, it still ends
        self._writer = threading.Thread(target=self._libc.read,
                                        args=(self._timer, ctypes.c_void_p(self._flag.data_ptr()), ctypes.c_size_t(8)))
        self._writer.start()
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        # cuStreamWaitValue32_v2(stream, address, value, CU_STREAM_WAIT_VALUE_GEQ): pinned memory allocated by
        # cudaHostAlloc (Tensor.pin_memory) has the same address on the GPU.
        result = cuda.cuStreamWaitValue32_v2(stream, ctypes.c_uint64(self._flag.data_ptr()), ctypes.c_uint32(1),
                                             ctypes.c_uint(0))
        if result != 0:
            self.open_after(0.0)
            pytest.fail(f"cuStreamWaitValue32_v2 failed with CUresult {result}")

    def _set_timer(self, seconds: float) -> None:
        whole = int(seconds)
        spec = (ctypes.c_long * 4)(0, 0, whole, int((seconds - whole) * 1e9) or (0 if whole else 1))
        assert self._libc.timerfd_settime(self._timer, 0, spec, None) == 0, f"errno {ctypes.get_errno()}"

    def open_after(self, seconds: float) -> None:
        """Re-arms the timer: the gate opens `seconds` from now (a no-op once it is open)."""
        self._set_timer(seconds)

    def close(self) -> None:
        self.open_after(0.0)
        self._writer.join()
        os.close(self._timer)


def test_freeing_a_table_waits_for_its_queued_scatter(transfer_settings):
    """A temporary pinned table dropped right after a scatter_ from the GPU was unmapped under the queued kernel
    (issue 13): releasing the memory now waits for the kernels still using it. Decided without timing: the kernel
    is held behind a gate that opens only after `del` has started (a timer armed just before it, which the waiting
    `del` does not depend on), so a `del` that returns before the kernel ran is always seen (it was seen only when
    a sleep outlasted the calls before, which compute-sanitizer's slower launches broke). The kernel's end is
    observed by an event recorded right after the scatter, not by the stream being idle: under compute-sanitizer the
    stream was still busy after `del` returned (run 57) with no access to freed memory reported, which work the tool
    queues later would explain; the event tells the two apart."""
    force_split(transfer_settings, 1.0)
    table = speedtorch.pinned_empty(2000, 64)
    indices = torch.randint(0, 2000, (1000,))  # CPU indices: validated on the host, so nothing waits for the stream
    src = torch.randn(1000, 64, device="cuda")
    torch.cuda.synchronize()
    scattered = torch.cuda.Event()
    gate = StreamGate()
    try:
        speedtorch.scatter_(table, indices, src)
        scattered.record()
        assert not scattered.query(), "the scatter kernel should still be queued behind the gate"
        gate.open_after(0.2)
        del table
        assert scattered.query(), "freeing the table returned before the kernel writing it had finished"
    finally:
        gate.close()
    torch.cuda.synchronize()  # the context is intact


def test_torch_pinned_table_is_not_reused_under_a_queued_scatter(transfer_settings):
    """The same for memory from Tensor.pin_memory(): PyTorch's allocator gave a freed block to the next pin_memory()
    at once, while our queued kernel still wrote it. The launch now records its stream with that allocator."""
    force_split(transfer_settings, 1.0)
    table = torch.zeros(2000, 64).pin_memory()
    indices = torch.arange(1000)
    src = torch.ones(1000, 64, device="cuda")
    torch.cuda.synchronize()
    _keep_stream_busy()
    speedtorch.scatter_(table, indices, src)
    del table
    other = torch.empty(2000, 64).pin_memory()  # the same block, if the allocator thought it free
    other.zero_()
    torch.cuda.synchronize()
    assert other.count_nonzero() == 0, "a pinned block was reused while a queued scatter_ still wrote it"


def test_freeing_an_embedding_waits_for_its_queued_step():
    """The same for a PinnedEmbedding dropped right after an optimizer step from GPU gradients. The step waits for
    its stream while it de-duplicates the batch, so the update kernel is kept busy by its size instead: every row of
    a 300 MB table and its Adam state, over PCIe."""
    num_rows, dim = 200_000, 128
    emb = speedtorch.PinnedEmbedding(num_rows, dim, torch.float32)
    emb.set_optimizer("adam", {"lr": 0.01}, True)
    indices = torch.randperm(num_rows)
    grad = torch.randn(num_rows, dim, device="cuda")
    torch.cuda.synchronize()
    stream = torch.cuda.current_stream()
    emb.apply_gradients(indices, grad)
    queued = not stream.query()
    del emb
    assert stream.query(), "freeing the table returned before the step updating it had finished"
    torch.cuda.synchronize()  # the context is intact
    if not queued:
        pytest.skip("the step had finished before the table was freed; nothing was left to wait for")


@pytest.mark.parametrize("dim", [1025, 2048])
def test_rows_wider_than_a_staging_chunk(dim, transfer_settings):
    """A row longer than staging_chunk_bytes was copied into a chunk anyway, past its end (issue 13): a chunk now
    always holds at least one row."""
    transfer_settings(staging_chunk_bytes=4096, uva_fraction=0.0)  # every row staged
    table = random_table(64, dim, pinned=True)  # float32: 4100 and 8192 bytes a row
    indices = torch.tensor([5, 0, 63, 5, 17, 40, 41])
    out = speedtorch.gather(table, indices, device="cuda")
    torch.testing.assert_close(out.cpu(), table[indices], rtol=0, atol=0)
    src = torch.randn(7, dim, device="cuda")
    expected = last_wins_reference(table, indices, src.cpu())
    speedtorch.scatter_(table, indices.cuda(), src)
    torch.cuda.synchronize()
    torch.testing.assert_close(table, expected, rtol=0, atol=0)


def test_cuda_without_an_index_is_the_current_device():
    """device='cuda' with CPU indices went to cuda:0 whatever the current device (issue 13). Only a machine with two
    GPUs tells the two apart; on one, this checks that the rows land on the current device."""
    table = random_table(10, 4, pinned=True)
    last = torch.cuda.device_count() - 1
    with torch.cuda.device(last):
        out = speedtorch.gather(table, torch.tensor([1, 2]), device="cuda")
        assert out.device == torch.device("cuda", torch.cuda.current_device())
        assert out.device.index == last
    torch.testing.assert_close(out.cpu(), table[[1, 2]], rtol=0, atol=0)


def test_index_errors_stay_with_their_call():
    """A bad index raises in the call (and thread) that passed it; another thread's good calls never see it, and a
    deferred error is left for check_index_errors, not raised by a later checked call."""
    import threading

    table = random_table(100, 8, pinned=True)
    good = torch.randint(0, 100, (64,), device="cuda")
    bad = good.clone()
    bad[7] = 100
    errors = {"good": [], "bad": 0}

    def good_calls():
        try:
            for _ in range(50):
                speedtorch.gather(table, good)
        except Exception as error:  # noqa: BLE001 - any error here is the failure
            errors["good"].append(error)

    def bad_calls():
        for _ in range(50):
            with pytest.raises(IndexError, match="holds 100 at flat position 7"):
                speedtorch.gather(table, bad)
            errors["bad"] += 1

    threads = [threading.Thread(target=good_calls), threading.Thread(target=bad_calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == {"good": [], "bad": 50}

    with speedtorch.deferred_index_checks():
        speedtorch.gather(table, bad)  # flagged by the kernel, not raised
    speedtorch.gather(table, good)  # a checked call does not raise the deferred error
    with pytest.raises(IndexError, match="holds 100 at flat position 7"):
        speedtorch.check_index_errors()
    speedtorch.check_index_errors()  # cleared


# --- src and gradients that share the table's memory (test_row_ops.py has the CPU routes) --------------------------


@pytest.mark.parametrize("sorted_unique", [True, False])
def test_gpu_table_refuses_src_and_grad_from_its_own_rows(sorted_unique):
    table = random_table(10, 3).cuda()
    before = table.clone()
    with pytest.raises(RuntimeError, match=r"speedtorch.scatter_: src and the table share memory"):
        speedtorch.scatter_(table, torch.arange(1, 6, device="cuda"), table[0:5])
    state = torch.zeros(10, speedtorch.PinnedEmbedding.state_width("sgd", {}, 3), device="cuda")
    with pytest.raises(RuntimeError, match="grad and the weights share memory"):
        torch.ops.speedtorch.row_optimizer_step_(table, state, torch.arange(1, 6, device="cuda"), table[0:5], "sgd",
                                                 {"lr": 1.0}, 1, sorted_unique)
    assert torch.equal(table, before)


@pytest.mark.parametrize("src_on", ["cpu", "cuda"])
def test_pinned_table_refuses_src_from_its_own_rows_on_every_route(src_on, transfer_settings):
    """CUDA indices with CPU rows (a CPU write) and a CUDA src at the table's own address (the UVA kernel's route):
    addresses are compared whatever the devices."""
    force_split(transfer_settings, 1.0)
    table = random_table(10, 3, pinned=True)
    before = table.clone()
    src = rows_at(table, 5, src_on)
    with pytest.raises(RuntimeError, match="src and the table share memory"):
        speedtorch.scatter_(table, torch.arange(1, 6, device="cuda"), src)
    torch.cuda.synchronize()
    assert torch.equal(table, before)


def test_pinned_embedding_with_a_gpu_cache_refuses_grad_from_its_own_rows():
    embedding = speedtorch.PinnedEmbedding(10, 3, torch.float32)
    embedding.set_optimizer("sgd", {"lr": 1.0}, False)
    grad = rows_at(embedding.table(), 2)
    embedding.enable_cache(8, torch.device("cuda"))
    assert not embedding.host_rows_in_use()
    with pytest.raises(RuntimeError, match="PinnedEmbedding.apply_gradients: grad and the weights share memory"):
        embedding.apply_gradients(torch.arange(1, 3, device="cuda"), grad, False)
    assert embedding.step_count() == 0
