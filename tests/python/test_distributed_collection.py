"""speedtorch.distributed.DistributedHostEmbeddingBagCollection with real processes (Gloo on CPU): world sizes 1, 2
and 4 on one simulated host and 4 as two hosts of two (LOCAL_WORLD_SIZE), one-hot and multi-hot features, three
groups of two widths and two optimizers, the dense part under DDP. Each run equals one process training a
HostEmbeddingBagCollection on the concatenation of the ranks' batches (rows, optimizer state, step counts, dense
parameters), and each step is one exchange for all the groups (not one per group). The run at world 2 prefetches
each next batch before step(), the one on two hosts trains through TrainPipeline."""

from __future__ import annotations

import pytest
import torch

if torch.__version__ < (2, 5):
    pytest.skip("speedtorch.distributed needs torch >= 2.5", allow_module_level=True)

import distributed_workers as workers  # noqa: E402
from test_distributed import TOL, launch, shm_dir, succeeded  # noqa: E402,F401 (shm_dir: the fixture)

BATCH, STEPS = 8, 3


def reference(world: int, multi_hot: bool, reduction: str):
    """One process, one HostEmbeddingBagCollection, the ranks' batches concatenated at every step."""
    from speedtorch import HostEmbeddingBagCollection

    collection = HostEmbeddingBagCollection(workers.collection_configs(), optimizer="adam",
                                            optimizer_options={"lr": 0.05}, device="cpu", state_beside_rows=False)
    for g, module in enumerate(collection.groups):
        module.table.copy_(workers.collection_initial(module.num_embeddings, module.embedding_dim, g))
    model = workers.CollectionModel(collection)
    opt = torch.optim.SGD(model.dense.parameters(), lr=0.1)
    for step in range(STEPS):
        batches = [workers.collection_batch(step, r, BATCH, multi_hot) for r in range(world)]
        features, target = workers.concatenated_batches(batches, multi_hot)
        losses = (model(features) - target).pow(2).view(world, BATCH).mean(1)  # each rank's loss
        (losses.mean() if reduction == "mean" else losses.sum()).backward()
        collection.step()
        if reduction == "sum":  # DDP averages the dense gradients whatever the tables' reduction
            for p in model.dense.parameters():
                p.grad /= world
        opt.step()
        opt.zero_grad()
    return model


@pytest.mark.parametrize("world,local_world,reduction", [(1, 1, "mean"), (2, 2, "sum"), (4, 4, "mean"),
                                                         (4, 2, "mean")])
def test_collection_training_equals_single_process(world, local_world, reduction, shm_dir):
    check_collection(world, local_world, reduction, shm_dir)


@pytest.mark.gpu
@pytest.mark.parametrize("world,local_world", [(2, 2), (2, 1)])
def test_collection_on_gpu_ranks_equals_single_process(world, local_world, shm_dir):
    """Ranks computing on a GPU (UVA reads of the shared tables, the groups' fused updates on the GPU, the pipeline's
    side streams) with Gloo between them, so one GPU is enough; with NCCL every test here runs on GPUs anyway."""
    check_collection(world, local_world, "mean", shm_dir, device="cuda", tol=dict(rtol=1e-4, atol=1e-5))


def check_collection(world, local_world, reduction, shm_dir, device=None, tol=None):
    tol = tol or TOL
    # prefetch before step() by hand at world 2, TrainPipeline (prefetch, groups stepped one by one) on two hosts
    cfg = dict(batch=BATCH, steps=STEPS, reduction=reduction, shm_dir=shm_dir, prefetch=world == local_world == 2,
               pipeline=local_world < world, bad_id_rank=1 if local_world < world else None, device=device)
    results = succeeded(launch(world, local_world, "collection", cfg))
    for variant in ("one_hot", "multi_hot"):
        ref = reference(world, variant == "multi_hot", reduction)
        for g, module in enumerate(ref.sparse.groups):
            got = [results[r][variant]["groups"][g] for r in range(world)]
            torch.testing.assert_close(torch.cat([b["weight"] for b in got]), module.weight, **tol)
            torch.testing.assert_close(torch.cat([b["optimizer_state"] for b in got]), module.table.state(), **tol)
            assert {b["step"] for b in got} == {module.table.step_count()}
            assert {b["own_exchanges"] for b in got} == {0}  # the groups' tables never exchange on their own
        for r in range(world):
            for k, v in ref.dense.state_dict().items():
                torch.testing.assert_close(results[r][variant]["dense"][k], v, **tol)
            # One exchange per step for all three groups, and with two hosts one per forward.
            assert results[r][variant]["exchanges"] == STEPS * (1 if local_world == world else 2)
            assert results[r][variant]["state_dict_keys"] == sorted(
                f"groups.{g}.{k}" for g in range(3) for k in ("weight", "optimizer_state", "optimizer_step",
                                                              "_extra_state"))
        if world > 1:
            assert min(results[r][variant]["bytes_sent"] for r in range(world)) > 0
    if local_world < world:  # several hosts: rank 1's id out of range makes every rank raise, then all go on
        assert "feature 'd' (table 't2')" in results[1]["bad_id"] and "input[2, 3]" in results[1]["bad_id"], \
            results[1]["bad_id"]
        for r in (r for r in range(world) if r != 1):
            assert results[r]["bad_id"].startswith("speedtorch.distributed: rank 1's ids hold an id out of range "
                                                   "for collection #"), results[r]["bad_id"]
        assert {results[r]["after_bad_id"] for r in range(world)} == {(BATCH, 18)}
        assert results[0]["idle_rank"].shape == (0, 18)  # and the others got their rows
        for r in range(2, world):
            torch.testing.assert_close(results[r]["idle_rank"], results[1]["idle_rank"], rtol=0, atol=0)


def test_the_dlrm_benchmark_runs_under_torchrun_on_the_cpu(tmp_path):
    """bench/dlrm_distributed.py at its tiny size, world 2 on two simulated hosts (Gloo; what it reports, not how
    fast), then --report on the records it appended."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from test_distributed import _free_port

    root = Path(__file__).resolve().parents[2]
    results = tmp_path / "records.jsonl"
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                          str(_free_port()), str(root / "bench" / "dlrm_distributed.py"), "--backend", "gloo",
                          "--tiny", "--hosts", "2", "--results", str(results)],
                         capture_output=True, text=True, timeout=240, cwd=tmp_path,
                         env=dict(os.environ, PYTHONPATH=str(root / "python"), OMP_NUM_THREADS="1"))
    assert run.returncode == 0, run.stderr[-3000:]
    record = json.loads(run.stdout.strip().splitlines()[-1])["record"]
    assert record["world"] == 2 and record["hosts"] == 2 and record["samples_per_s"] > 0
    assert min(record["bytes_to_other_hosts_per_rank_step"]) > 0  # rows and gradients crossed the hosts
    assert set(record["bytes_by_stage_rank0"]) == {"headers", "input_dist", "output_dist", "gradients"}
    assert 1.0 <= record["host_ram_ratio"] <= 1.02  # one copy per host (+ the files' header pages at this size)
    printed = subprocess.run([sys.executable, str(root / "bench" / "dlrm_distributed.py"), "--report", str(results)],
                             capture_output=True, text=True, timeout=120,
                             env=dict(os.environ, PYTHONPATH=str(root / "python")))
    assert printed.returncode == 0 and "weak scaling" in printed.stdout, printed.stderr[-2000:]
