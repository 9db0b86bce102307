"""A table lives in memory of its process (docs/training.md, "Worker processes"; docs/troubleshooting.md): a forked
child or DataLoader worker works on a copy-on-write view, a spawned one on a copy, and neither side sees the other's
writes."""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

import process_workers as workers
from speedtorch.nn import HostEmbedding

_TIMEOUT = 120


def _table(**kwargs) -> HostEmbedding:
    return HostEmbedding(16, 4, device="cpu", seed=0, **kwargs)


@pytest.mark.parametrize("placement", ["host", "gpu"], ids=["host", "device_table"])  # (a DeviceTable in CPU memory)
@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_child_process_and_its_parent_do_not_see_each_others_writes(context, placement):
    if context not in mp.get_all_start_methods():
        pytest.skip(f"no {context} start method here")
    module = _table(optimizer="adam", placement=placement)  # (a host table's state sits beside the rows)
    before = module.weight.clone()
    ctx = mp.get_context(context)
    parent, child = ctx.Pipe()
    process = ctx.Process(target=workers.write_then_read, args=(module, child))
    process.start()
    try:
        assert parent.poll(_TIMEOUT), "the child sent nothing"
        seen = torch.tensor(parent.recv())
        expected = before.clone()
        expected[0] = 7.0
        assert torch.equal(seen, expected)  # the child's copy: its own write, the parent's rows
        assert torch.equal(module.weight, before)  # the parent does not see it
        module.table.scatter_(torch.tensor([1]), torch.full((1, 4), 3.0))
        parent.send("go")
        assert parent.poll(_TIMEOUT), "the child sent nothing"
        assert torch.equal(torch.tensor(parent.recv()), before[1])  # nor the child the parent's later write
    finally:
        process.join(_TIMEOUT)
        if process.is_alive():
            process.kill()
    assert process.exitcode == 0


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_dataloader_workers_writes_stay_in_the_worker(context):
    if context not in mp.get_all_start_methods():
        pytest.skip(f"no {context} start method here")
    module = _table(dtype=torch.bfloat16)
    before = module.weight.clone()
    loader = torch.utils.data.DataLoader(workers.WritingDataset(module), batch_size=None, num_workers=1,
                                         multiprocessing_context=context, timeout=_TIMEOUT)
    assert [row for row in loader] == [[7.0] * 4, [7.0] * 4]  # the worker saw its writes
    assert torch.equal(module.weight, before)  # the training process does not


def _a_spawned_child_trains_a_copy(device: str, placement: str) -> None:
    module = HostEmbedding(16, 4, device=device, seed=0, optimizer="adam", placement=placement)
    before, state_before = module.weight.clone(), module.table.state().clone()
    ctx = mp.get_context("spawn")
    queue, results = ctx.Queue(), ctx.Queue()
    process = ctx.Process(target=workers.train_one_step, args=(queue, results))
    process.start()
    try:
        queue.put(module)  # through torch.multiprocessing's pickler, which shares tensors unless told otherwise
        rows, state, step = results.get(timeout=_TIMEOUT)
    finally:
        process.join(_TIMEOUT)
        if process.is_alive():
            process.kill()
    assert process.exitcode == 0
    assert rows[0] == [7.0] * 4 and rows[1] != before[1].tolist() and step == 1  # the child trained its copy
    assert torch.equal(module.weight, before)  # the parent's rows, optimizer state and step count are its own
    assert torch.equal(module.table.state(), state_before) and module.table.step_count() == 0


@pytest.mark.parametrize("placement", ["host", "gpu"], ids=["host", "device_table"])  # (a `gpu` id marks GPU tests)
def test_a_table_sent_through_a_queue_is_a_copy(placement):
    """placement='gpu' (a DeviceTable) was shared, not copied: the child's step moved the parent's rows and state
    while the parent's step count stayed 0."""
    _a_spawned_child_trains_a_copy("cpu", placement)


@pytest.mark.gpu
@pytest.mark.parametrize("placement", ["host", "gpu"])
def test_a_table_on_a_gpu_sent_through_a_queue_is_a_copy(placement):
    """The same with the table's rows on a GPU (placement='gpu': through CUDA IPC before)."""
    _a_spawned_child_trains_a_copy("cuda", placement)
