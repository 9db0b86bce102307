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


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_a_child_process_and_its_parent_do_not_see_each_others_writes(context):
    if context not in mp.get_all_start_methods():
        pytest.skip(f"no {context} start method here")
    module = _table(optimizer="adam")  # (its optimizer state sits beside the rows: it travels with them)
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
