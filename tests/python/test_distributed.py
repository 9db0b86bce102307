"""speedtorch.distributed with real processes (Gloo on CPU): world sizes 1-4 on one simulated host and on two
(LOCAL_WORLD_SIZE), every optimizer, repeated ids and ids other ranks own, each compared after several steps with a
single-process HostEmbedding trained on the concatenation of the ranks' batches. Also DDP around the model,
checkpoints that reshard (torch.distributed.checkpoint), a killed rank, bad input, and no /dev/shm leftovers."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time

import pytest
import torch
import torch.multiprocessing as mp

if torch.__version__ < (2, 5):
    pytest.skip("speedtorch.distributed needs torch >= 2.5", allow_module_level=True)

import distributed_workers as workers  # noqa: E402
from speedtorch.distributed import HostTopology, RowLayout  # noqa: E402
from speedtorch.nn import HostEmbedding  # noqa: E402

ROWS, DIM, BATCH, STEPS = 61, 6, 16, 3  # 61 rows: blocks of unequal size at every world size
# SPEEDTORCH_TEST_DIST_BACKEND=nccl runs every test here with NCCL and a GPU per rank (the multi-GPU run): the GPU's
# fused kernels round differently from the CPU reference, hence the tolerance.
NCCL = os.environ.get("SPEEDTORCH_TEST_DIST_BACKEND", "gloo") == "nccl"
TOL = dict(rtol=1e-4, atol=1e-5) if NCCL else dict(rtol=1e-5, atol=1e-6)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def shm_dir():
    """A folder of its own in /dev/shm, which must be empty once the ranks are gone."""
    folder = tempfile.mkdtemp(prefix="speedtorch-test-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    yield folder
    left = os.listdir(folder)
    shutil.rmtree(folder, ignore_errors=True)
    assert left == [], f"shared memory left behind: {left}"


def launch(world: int, local_world: int, scenario: str, cfg: dict, deadline: float = 240.0) -> dict:
    """Runs ``scenario`` on ``world`` spawned ranks; returns rank -> result (a dict) or error text (a str)."""
    out_dir = tempfile.mkdtemp(prefix="speedtorch-dist-")
    ctx = mp.get_context("spawn")
    port = _free_port()
    procs = [ctx.Process(target=workers.run, args=(r, world, port, local_world, scenario, cfg, out_dir))
             for r in range(world)]
    for p in procs:
        p.start()
    end = time.monotonic() + deadline
    for p in procs:
        p.join(max(0.0, end - time.monotonic()))
    hung = [r for r, p in enumerate(procs) if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    results = {}
    for r in range(world):
        ok, err = os.path.join(out_dir, f"{r}.pt"), os.path.join(out_dir, f"{r}.err")
        if os.path.exists(ok):
            results[r] = torch.load(ok, weights_only=False)
        elif os.path.exists(err):
            results[r] = open(err).read()
        else:
            results[r] = f"no result (exit code {procs[r].exitcode})"
    shutil.rmtree(out_dir, ignore_errors=True)
    assert not hung, f"ranks {hung} still ran after {deadline} s: {results}"
    return results


def succeeded(results: dict) -> dict:
    failed = {r: v for r, v in results.items() if isinstance(v, str)}
    assert not failed, "\n".join(f"rank {r}: {v}" for r, v in failed.items())
    return results


def reference(world: int, name: str, options: dict, steps: int, reduction: str = "mean",
              ranks_at: dict | None = None) -> HostEmbedding:
    """Single-process training on the concatenation of every rank's batches (at step s, those of the ranks
    ``ranks_at[s]`` when given)."""
    ref = HostEmbedding(ROWS, DIM, optimizer=name, optimizer_options=options, device="cpu", state_beside_rows=False)
    ref.table.copy_(workers.initial_table(ROWS, DIM))
    for step in range(steps):
        batches = [workers.batch(step, r, ROWS, BATCH, DIM) for r in (ranks_at or {}).get(step, range(world))]
        if not batches:
            ref.step()  # nothing to apply: the step count stays, as in one process
            continue
        out = ref(torch.cat([ids for ids, _ in batches]))
        loss = sum((part * w).sum() for part, (_, w) in zip(out.split(BATCH), batches))
        (loss / world if reduction == "mean" else loss).backward()
        ref.step()
    return ref


def assemble(results: dict, *path: str) -> dict:
    """The whole table from the ranks' blocks."""
    parts = []
    for r in sorted(results):
        value = results[r]
        for key in path:
            value = value[key]
        parts.append(value)
    return {"weight": torch.cat([p["weight"] for p in parts]),
            "optimizer_state": torch.cat([p["optimizer_state"] for p in parts]),
            "steps": {p["step"] for p in parts}}


def assert_matches(got: dict, ref: HostEmbedding) -> None:
    torch.testing.assert_close(got["weight"], ref.weight, **TOL)
    torch.testing.assert_close(got["optimizer_state"], ref.table.state(), **TOL)
    assert got["steps"] == {ref.table.step_count()}


# --- layout (no processes) --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("world,local_world", [(1, 1), (3, 3), (4, 2), (4, 1)])
def test_layout_covers_every_row_once(world, local_world):
    layouts = [RowLayout(ROWS, HostTopology(world, r, local_world)) for r in range(world)]
    blocks = [layouts[0].rank_range(r) for r in range(world)]
    assert [b for block in blocks for b in range(*block)] == list(range(ROWS))  # torch.chunk's blocks, in order
    ids = torch.arange(ROWS)
    owners = layouts[0].owner_of(ids)
    for r, layout in enumerate(layouts):
        start, end = layout.host_range(layout.topology.host)
        mine = ids[owners == r]
        assert ((mine >= start) & (mine < end)).all()  # an owner's rows are on its own host
    assert torch.equal(torch.bincount(owners, minlength=world).sum(), torch.tensor(ROWS))


# --- training equals single-process training on the concatenated batches ---------------------------------------

@pytest.mark.parametrize("world,local_world,reduction", [
    (1, 1, "mean"), (2, 2, "mean"), (3, 3, "sum"), (4, 4, "mean"),  # one host
    (2, 1, "sum"), (4, 2, "mean"),  # two hosts
])
def test_training_equals_single_process(world, local_world, reduction, shm_dir):
    cfg = dict(rows=ROWS, dim=DIM, batch=BATCH, steps=STEPS, reduction=reduction, shm_dir=shm_dir,
               optimizers=workers.OPTIMIZERS)
    results = succeeded(launch(world, local_world, "train", cfg))
    for name, options in workers.OPTIMIZERS:
        assert_matches(assemble(results, name), reference(world, name, options, STEPS, reduction))
    sent = [results[r]["adam"]["bytes_sent"] for r in range(world)]
    if world > 1:
        assert min(sent) > 0  # gradients of rows other ranks own did travel


@pytest.mark.gpu
def test_gpu_ranks_on_one_gpu_equal_single_process(shm_dir):
    """Two ranks computing on a GPU (UVA reads and fused UVA updates of the shared table): Gloo between them, so one
    GPU is enough; the multi-GPU run repeats every test here with NCCL (SPEEDTORCH_TEST_DIST_BACKEND=nccl)."""
    cfg = dict(rows=ROWS, dim=DIM, batch=BATCH, steps=STEPS, reduction="mean", shm_dir=shm_dir, device="cuda",
               optimizers=[("adam", {"lr": 0.05}), ("sgd", {"lr": 0.1, "momentum": 0.9})])
    results = succeeded(launch(2, 2, "train", cfg))
    for name, options in cfg["optimizers"]:
        got = assemble(results, name)
        ref = reference(2, name, options, STEPS)
        torch.testing.assert_close(got["weight"], ref.weight, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(got["optimizer_state"], ref.table.state(), rtol=1e-4, atol=1e-5)


def test_prefetch_before_step_sees_every_ranks_update(shm_dir):
    cfg = dict(rows=ROWS, dim=DIM, batch=BATCH, steps=STEPS, reduction="mean", shm_dir=shm_dir, prefetch=True,
               optimizers=[("adam", {"lr": 0.05})])
    results = succeeded(launch(2, 2, "train", cfg))
    assert_matches(assemble(results, "adam"), reference(2, "adam", {"lr": 0.05}, STEPS))


def test_ddp_around_the_model(shm_dir):
    cfg = dict(rows=ROWS, dim=DIM, batch=BATCH, steps=STEPS, shm_dir=shm_dir)
    results = succeeded(launch(4, 2, "ddp", cfg))
    # The reference: one process, the mean of the ranks' losses (what DDP's averaged gradients amount to).
    torch.manual_seed(0)
    emb = HostEmbedding(ROWS, DIM, optimizer="adam", optimizer_options={"lr": 0.01}, device="cpu",
                        state_beside_rows=False, seed=0)
    dense = torch.nn.Linear(DIM, 1)
    emb.table.copy_(workers.initial_table(ROWS, DIM))
    opt = torch.optim.SGD(dense.parameters(), lr=0.1)
    for step in range(STEPS):
        batches = [workers.batch(step, r, ROWS, BATCH, DIM) for r in range(4)]
        losses = [(dense(emb(ids)).squeeze(-1) - w[:, 0]).pow(2).mean() for ids, w in batches]
        (sum(losses) / 4).backward()
        emb.step()
        opt.step()
        opt.zero_grad()
    got = assemble(results)
    torch.testing.assert_close(got["weight"], emb.weight, **TOL)
    torch.testing.assert_close(got["optimizer_state"], emb.table.state(), **TOL)
    for r in range(4):
        for k, v in dense.state_dict().items():
            torch.testing.assert_close(results[r]["dense"][k], v, **TOL)


def test_standard_flows_ddp_around_a_host_embedding_and_the_distributed_modules_arguments(shm_dir):
    cfg = dict(rows=ROWS, dim=DIM, batch=BATCH, steps=STEPS, shm_dir=shm_dir)
    results = succeeded(launch(2, 2, "standard_flows", cfg))
    # A plain HostEmbedding is a registered parameter: ddp_ignore_host_tables keeps DDP from broadcasting it (each
    # rank keeps its own table) while the dense part is synchronised as usual: on the CPU (Gloo) and on GPUs (NCCL,
    # whose group has no CPU backend: every tensor DDP touches must be on the GPU, as the table's is not).
    ignored = {r: results[r]["ddp_ignored"] for r in (0, 1)}
    for r in (0, 1):
        torch.testing.assert_close(ignored[r]["after_wrap"], ignored[r]["initial"], rtol=0, atol=0)
        assert ignored[r]["steps"] == STEPS
    assert not torch.equal(ignored[0]["initial"], ignored[1]["initial"])
    for k in ignored[0]["dense"]:
        torch.testing.assert_close(ignored[0]["dense"][k], ignored[1]["dense"][k])
    plain = {r: results[r]["ddp_plain"] for r in (0, 1)}
    if NCCL:  # without it DDP refuses a model whose parameters are on the CPU (the table) and a GPU
        for r in (0, 1):
            assert "same type of devices" in plain[r]["refused"], plain[r]
    else:  # without it DDP copies rank 0's table over the others' at construction, as for any parameter
        torch.testing.assert_close(plain[1]["after_wrap"], plain[0]["initial"], rtol=0, atol=0)
    # DistributedHostEmbedding takes HostEmbedding's arguments, and refuses with a reason those that cannot apply.
    for r in (0, 1):
        shared = results[r]["shared_arguments"]
        refused = shared["refused"]
        assert "update='backward'" in refused["update"] and "placement='gpu'" in refused["placement"]
        assert "max_norm" in refused["max_norm"] and "hybrid" in refused["cache_rows"]
        assert shared["out_shape"] == (2, DIM) and shared["steps"] == 1
    shared = results[0]["shared_arguments"]
    assert torch.count_nonzero(shared["padding_row_at_start"]) == 0  # padding_idx: starts at zero ...
    assert torch.count_nonzero(shared["padding_row"]) == 0  # ... and never moves


# --- checkpoints that reshard -------------------------------------------------------------------------------------

def test_checkpoint_reshards_between_world_sizes_and_single_process(shm_dir, tmp_path):
    import torch.distributed.checkpoint as dcp

    saved = str(tmp_path / "at-4")
    cfg = dict(rows=ROWS, dim=DIM, batch=BATCH, steps=2, more_steps=2, shm_dir=shm_dir, checkpoint=saved)
    at_4 = succeeded(launch(4, 2, "dcp_save", cfg))
    table_at_save = assemble(at_4, "at_save")
    assert_matches(table_at_save, reference(4, "adam", {"lr": 0.01}, 2))

    # World size 4 (2 hosts) -> 2, 1 and 3 ranks: the table as saved; at 4 again, training resumes exactly.
    for world, local_world in [(2, 2), (1, 1), (3, 3), (4, 2)]:
        loaded = succeeded(launch(world, local_world, "dcp_load", cfg))
        got = assemble(loaded, "loaded")
        torch.testing.assert_close(got["weight"], table_at_save["weight"], rtol=0, atol=0)
        torch.testing.assert_close(got["optimizer_state"], table_at_save["optimizer_state"], rtol=0, atol=0)
        assert got["steps"] == {2}
        if world == 4:
            after = assemble(loaded, "after")
            torch.testing.assert_close(after["weight"], assemble(at_4, "after")["weight"], rtol=0, atol=0)

    # Distributed -> a single-process HostEmbedding (no process group), and its files.
    single = HostEmbedding(ROWS, DIM, optimizer="adam", optimizer_options={"lr": 0.01}, device="cpu")
    state = {"emb": single.state_dict()}
    dcp.load(state, checkpoint_id=saved)
    single.load_state_dict(state["emb"])
    torch.testing.assert_close(single.weight, table_at_save["weight"], rtol=0, atol=0)
    torch.testing.assert_close(single.table.state(), table_at_save["optimizer_state"], rtol=0, atol=0)
    single.save(str(tmp_path / "files"))
    assert torch.equal(HostEmbedding.load(str(tmp_path / "files")).weight, table_at_save["weight"])

    # A single-process HostEmbedding -> distributed at world size 3.
    ref = reference(4, "adam", {"lr": 0.01}, 2)
    from_single = str(tmp_path / "from-single")
    dcp.save({"emb": ref.state_dict()}, checkpoint_id=from_single)
    loaded = succeeded(launch(3, 3, "dcp_load", dict(cfg, checkpoint=from_single)))
    got = assemble(loaded, "loaded")
    torch.testing.assert_close(got["weight"], ref.weight, rtol=0, atol=0)
    torch.testing.assert_close(got["optimizer_state"], ref.table.state(), rtol=0, atol=0)


# --- faults and bad input -----------------------------------------------------------------------------------------

def test_a_killed_rank_fails_the_others_within_the_timeout(shm_dir):
    """A rank dies between two steps: the others raise our error (the headers travel over Gloo whatever the data
    backend, so with NCCL too, instead of NCCL's watchdog aborting them) within the process group's timeout, and the
    host's table is that of the last step every rank finished."""
    timeout = 20
    cfg = dict(rows=ROWS, dim=DIM, batch=BATCH, shm_dir=shm_dir, victim=2, timeout=timeout)
    results = launch(3, 3, "kill", cfg, deadline=120)
    assert "exit code 9" in results[2]
    ref = reference(3, "adam", {"lr": 0.01}, 1)
    for r in (0, 1):
        assert isinstance(results[r], dict) and results[r]["error"], results[r]
        assert results[r]["error"].startswith(f"RuntimeError: speedtorch.distributed: rank {r} could not reach every "
                                              f"rank at step()"), results[r]["error"]
        assert results[r]["seconds"] < timeout, results[r]
        torch.testing.assert_close(results[r]["table"], ref.weight, **TOL)
        torch.testing.assert_close(results[r]["optimizer_state"], ref.table.state(), **TOL)
        assert results[r]["step"] == 1


def test_one_host_an_out_of_range_id_fails_its_rank_only_and_a_rank_may_skip_a_forward(shm_dir):
    """One host: a forward moves no row between ranks, so a rank whose forward raised (here an id out of range, named
    where its batch holds it) may skip that step's forward and still call step(); the others train on."""
    cfg = dict(rows=ROWS, dim=DIM, batch=BATCH, shm_dir=shm_dir, bad_rank=1, table_gather_rank=1, timeout=15)
    results = succeeded(launch(2, 2, "bad_ids", cfg, deadline=120))
    assert results[0]["errors"] == [None, None, None]
    error = results[1]["errors"][1]
    assert error.startswith("IndexError") and f"input holds {ROWS} at flat position 5;" in error, error
    # The sharded table itself, in the library's words, at the place in the caller's indices (of their shape).
    assert results[1]["table_gather"].startswith(f"ShardedHostTable (rank 1): indices holds {ROWS} at flat position 4 "
                                                 f"(indices[1, 1]); every index must be in [0, {ROWS})"), results[1]
    assert_matches(assemble(results, "blocks"), reference(2, "adam", {"lr": 0.01}, 3, ranks_at={1: [0]}))


def test_several_hosts_every_rank_raises_when_a_rank_fails_or_skips_a_collective(shm_dir):
    """Two hosts: every forward is a collective. A rank whose ids fail its checks still takes part, flagging the
    error, so every rank raises it (no rows of another step, no hang) and all may go on together; a rank with no
    batch forwards an empty one; a rank that skips a forward makes every rank raise at the next exchange."""
    cfg = dict(rows=ROWS, dim=DIM, batch=BATCH, shm_dir=shm_dir, bad_rank=1, empty_rank=0, skipper=1, timeout=15)
    results = succeeded(launch(2, 1, "bad_ids", cfg, deadline=120))
    for r in range(2):
        ok, bad_id, ok_again, skipped = results[r]["errors"]
        assert ok is None and ok_again is None, results[r]
        assert skipped.startswith("RuntimeError") and "rank 1 is in step()" in skipped, skipped
    assert results[0]["errors"][1].startswith(f"IndexError: speedtorch.distributed: rank 1's ids hold {ROWS},")
    assert f"input holds {ROWS} at flat position 5;" in results[1]["errors"][1]
    # Step 1 updated nothing on any rank (nor counted as a step): the table is that of steps 0 and 2.
    assert_matches(assemble(results, "blocks"), reference(2, "adam", {"lr": 0.01}, 3, ranks_at={1: [], 2: [1]}))


def test_several_hosts_a_rank_that_skips_one_tables_forward_makes_every_rank_raise_naming_both_tables(shm_dir):
    """Two tables, two hosts: rank 1 skips A's lookup and runs B's, which meets rank 0's lookup of A (both the first
    lookup of their table). The headers name the table, so both ranks raise, naming both tables, instead of rank 0
    getting B's rows as A's and rank 1 A's rows as B's."""
    cfg = dict(rows=ROWS, dim=DIM, shm_dir=shm_dir, skipper=1, timeout=15)
    results = succeeded(launch(2, 1, "two_tables", cfg, deadline=120))
    for r in range(2):
        assert results[r]["aligned"] == [("A", [1.0]), ("B", [2.0])], results[r]
        # Its first lookup after the skip raised (no rows of the other table came back as this one's).
        assert [name for name, _ in results[r]["skipped"]] == ["A" if r == 0 else "B"], results[r]
        error = results[r]["skipped"][0][1]
        assert error.startswith("RuntimeError") and \
            f"rank 1 is in a lookup (a forward or a prefetch) of table #1 ({ROWS} rows x {DIM})" in error and \
            f"where rank 0 is in a lookup (a forward or a prefetch) of table #0 ({ROWS} rows x {DIM})" in error, error


def test_ranks_that_disagree_on_the_table_all_fail(shm_dir):
    cfg = dict(shm_dir=shm_dir, kwargs=dict(num_embeddings=ROWS, embedding_dim=DIM), per_rank={1: {"embedding_dim": 7}})
    results = launch(2, 2, "build", cfg, deadline=120)
    for r in (0, 1):
        assert results[r].startswith("ValueError") and "rank 1 has dim=7 where rank 0 has dim=6" in results[r], results[r]


def test_a_world_size_that_is_no_multiple_of_the_hosts_is_refused(shm_dir):
    cfg = dict(shm_dir=shm_dir, kwargs=dict(num_embeddings=ROWS, embedding_dim=DIM))
    results = launch(3, 2, "build", cfg, deadline=120)
    for r in range(3):
        assert "world size 3 is not a multiple of the local world size 2" in results[r], results[r]


def test_a_shm_dir_too_small_for_the_table_is_an_error_on_every_local_rank(tiny_tmpfs):
    """Not a SIGBUS of the rank creating the files (a container's /dev/shm is often 64 MB), nor its peers waiting."""
    cfg = dict(shm_dir=tiny_tmpfs, kwargs=dict(num_embeddings=20_000, embedding_dim=16), timeout=15)
    results = launch(2, 2, "build", cfg, deadline=120)
    for r in (0, 1):
        assert isinstance(results[r], str) and f"could not create the shared table in {tiny_tmpfs}" in results[r] \
            and "No space left on device" in results[r], results[r]
    assert os.listdir(tiny_tmpfs) == []  # nothing of the failed setup is left


def test_host_shards_hold_a_host_each(shm_dir):
    cfg = dict(shm_dir=shm_dir, kwargs=dict(num_embeddings=ROWS, embedding_dim=DIM))
    results = succeeded(launch(4, 2, "build", cfg))
    # 61 rows in blocks of 16: host 0 holds rows 0-31, host 1 rows 32-60.
    assert [results[r]["host_rows"] for r in range(4)] == [(32, DIM), (32, DIM), (29, DIM), (29, DIM)]
    assert all(results[r]["block_storage_is_block"] and results[r]["block_shares_table"] for r in range(4))


def test_the_benchmark_runs_both_world_sizes_in_one_call():
    """bench/distributed.py at tiny sizes (what it reports, not how fast)."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    run = subprocess.run([sys.executable, str(root / "bench" / "distributed.py"), "--backend", "gloo", "--worlds",
                          "1,2", "--rows", "3000", "--dim", "8", "--batch", "256", "--items", "100", "--steps", "2",
                          "--warmup", "1", "--threads", "1"], capture_output=True, text=True, timeout=240,
                         env=dict(os.environ, PYTHONPATH=str(root / "python")))
    assert run.returncode == 0, run.stderr
    assert "vs world 1" in run.stdout
    report = json.loads(run.stdout.strip().splitlines()[-1])
    one, two = report["worlds"]["1"], report["worlds"]["2"]
    assert one["mb_sent_per_rank_per_step"] == [0.0] and min(two["mb_sent_per_rank_per_step"]) > 0
    # One table in shared memory, however many ranks map it, not one per rank (+ the .npy headers' pages at this size).
    for w in (one, two):
        assert 1.0 <= w["host_ram_ratio"] <= 1.02


def test_the_torchrun_example_of_the_docs_runs(tmp_path):
    """docs/distributed.md's training script, run as it says: torchrun with two processes (Gloo on this CPU)."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    script = re.search(r"```python\n(# train\.py.*?)```", (root / "docs" / "distributed.md").read_text(), re.S)[1]
    (tmp_path / "train.py").write_text(script)
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                          "--master-port", str(_free_port()), str(tmp_path / "train.py")],
                         capture_output=True, text=True, timeout=240, cwd=tmp_path,
                         env=dict(os.environ, PYTHONPATH=str(root / "python"), OMP_NUM_THREADS="1"))
    assert run.returncode == 0, run.stderr[-3000:]
    assert re.search(r"loss \d+\.\d+ after 20 steps on 2 ranks", run.stdout), run.stdout


def test_share_rows_one_serving_table_per_host(shm_dir):
    """speedtorch.distributed.share_rows: every local rank reads the rows local rank 0 quantized, from one copy in
    shared memory (whose name is gone once all have mapped it: the fixture checks)."""
    from speedtorch.serving.quantized import QuantizedRows

    results = succeeded(launch(2, 2, "share_rows", dict(rows=ROWS, shm_dir=shm_dir), deadline=120))
    expected = QuantizedRows.from_table(workers.initial_table(ROWS, 32), "fp8_e4m3_ue8m0").dequantize()
    for r in range(2):
        assert results[r]["format"] == "fp8_e4m3_ue8m0" and results[r]["pinned"]
        assert torch.equal(results[r]["rows"], expected)
