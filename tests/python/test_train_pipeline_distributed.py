"""speedtorch.TrainPipeline with DDP around the dense part and a DistributedHostEmbedding (two Gloo ranks on the
CPU, spawned as test_distributed.py spawns them): the pipelined loop trains the same bits as the plain one. Left out
of make sanitize with test_distributed.py (spawned Python processes)."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
import torch


@pytest.mark.parametrize("prefetch", [True, "auto"])
def test_pipeline_with_ddp_and_the_distributed_table(prefetch):
    # "auto": 29 steps, past the trial's 27; every rank must keep the same way (a distributed prefetch exchanges ids).
    if torch.__version__ < (2, 5):
        pytest.skip("speedtorch.distributed needs torch >= 2.5")
    from test_distributed import launch, succeeded

    steps = 4 if prefetch is True else 29
    shm = tempfile.mkdtemp(prefix="speedtorch-test-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        results = succeeded(launch(2, 2, "pipeline", dict(rows=61, dim=6, batch=16, steps=steps, shm_dir=shm,
                                                          prefetch=prefetch)))
        assert os.listdir(shm) == []
    finally:
        shutil.rmtree(shm, ignore_errors=True)
    kept = {result["prefetch"] for result in results.values()}
    assert len(kept) == 1 and kept <= {True, False}, kept
    for rank, result in results.items():
        plain, pipelined = result["plain"], result["pipelined"]
        assert plain["step"] == pipelined["step"] == steps
        for key in ("weight", "optimizer_state"):
            assert torch.equal(plain[key], pipelined[key]), (rank, key)
        for key in plain["dense"]:
            assert torch.equal(plain["dense"][key], pipelined["dense"][key]), (rank, key)
