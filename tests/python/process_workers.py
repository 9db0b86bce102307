"""What the worker processes of test_worker_processes.py run (kept apart from the tests so a spawned child imports no
pytest): each writes rows of the HostEmbedding it was given and reports what it sees, as plain lists."""

from __future__ import annotations

import torch


def write_then_read(module, conn) -> None:
    """Writes 7s into row 0 and reports the table; after the parent's go, reports row 1 (which the parent wrote)."""
    module.table.scatter_(torch.tensor([0]), torch.full((1, module.embedding_dim), 7.0, dtype=module.output_dtype))
    conn.send(module.weight.tolist())
    conn.recv()
    conn.send(module.weight[1].tolist())
    conn.close()


class WritingDataset(torch.utils.data.Dataset):
    """A dataset holding a HostEmbedding whose items write row ``i`` (7s) and return it as the worker sees it."""

    def __init__(self, module):
        self.module = module

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int):
        dim = self.module.embedding_dim
        self.module.table.scatter_(torch.tensor([i]), torch.full((1, dim), 7.0, dtype=self.module.output_dtype))
        return self.module.weight[i].tolist()


def train_one_step(queue, results) -> None:
    """Takes a HostEmbedding from ``queue``, writes 7s into row 0, trains row 1 one step and reports the table, its
    optimizer state and step count."""
    module = queue.get()
    module.table.scatter_(torch.tensor([0]), torch.full((1, module.embedding_dim), 7.0, dtype=module.output_dtype))
    module(torch.tensor([1])).sum().backward()
    module.step()
    if module.device.type == "cuda":  # the update may still run on the GPU: the host rows are read below
        torch.cuda.synchronize(module.device)
    results.put((module.weight.cpu().tolist(), module.table.state().cpu().tolist(), module.table.step_count()))
