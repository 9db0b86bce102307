"""speedtorch.TrainPipeline: the same bits as the plain training loop (losses, dense parameters, host tables and
their optimizer state) for a DLRM over a HostEmbeddingBagCollection (one-hot and multi-hot ids, several groups),
for a model with a single HostEmbedding; rows gathered ahead are really used; the side stream's transfer bound is
passed on. (DDP and the distributed table: test_train_pipeline_distributed.py.)"""

from __future__ import annotations

import pytest
import torch

import speedtorch
from speedtorch import HostEmbeddingBagCollection, TableConfig, TrainPipeline
from speedtorch.models import DLRM, DLRMTrain, synthetic_batches
from speedtorch.nn import HostEmbedding

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
ROWS = [40, 7, 300, 25, 3, 90]
DIM = 8


def tiny_dlrm(device, placement="host", dims=None, optimizer="rowwise_adagrad", interaction="dot", update="step"):
    dims = dims or [DIM] * len(ROWS)
    tables = [TableConfig(f"t{i}", n, d) for i, (n, d) in enumerate(zip(ROWS, dims))]
    torch.manual_seed(0)
    embeddings = HostEmbeddingBagCollection(tables, optimizer=optimizer, optimizer_options={"lr": 0.05},
                                            device=device, seed=1, init_std=0.1, placement=placement,
                                            hot_fraction=0.2, update=update)
    model = DLRMTrain(DLRM(embeddings, len(ROWS), DIM, bottom=(16, DIM), top=(32, 1), interaction=interaction))
    if dims != [DIM] * len(ROWS):  # tables of two widths: the model sees them through a projection to DIM
        model.model.embeddings = _Widen(embeddings, dims)
    model.to(device)
    return model, torch.optim.Adam(model.parameters(), lr=0.01)


class _Widen(torch.nn.Module):
    """Pads every feature to DIM columns (tables of two widths, so the collection has two groups)."""

    def __init__(self, collection, dims):
        super().__init__()
        self.collection, self.dims = collection, dims

    def forward(self, sparse):
        parts = self.collection.split(self.collection(sparse)).values()
        return torch.cat([torch.nn.functional.pad(p, (0, DIM - p.shape[1])) for p in parts], dim=1)

    def sparse_inputs(self, batch):
        return [(self.collection, batch.sparse)]


def plain_loop(model, optimizer, batches, device):
    losses = []
    for batch in batches:
        loss, _ = model(batch.to(device))
        loss.backward()
        for module in speedtorch.pipeline.host_modules(model):
            module.step()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())
    return losses


def everything(model, device) -> dict:
    """Every tensor the training changes: dense parameters, host rows and their optimizer state."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()
    out = {f"param {k}": v.detach().cpu().clone() for k, v in model.named_parameters()}
    for i, m in enumerate(speedtorch.pipeline.host_modules(model)):
        for g, group in enumerate(m.groups if hasattr(m, "groups") else [m]):
            out[f"host module {i} group {g} rows"] = group.weight.cpu().clone()
            out[f"host module {i} group {g} state"] = group.table.state().cpu().clone()
    return out


def assert_same_bits(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def prefetch_threads(monkeypatch) -> list:
    """The names of the threads HostEmbedding.prefetch runs on from here on, in call order."""
    import threading

    threads = []
    prefetch = HostEmbedding.prefetch
    monkeypatch.setattr(HostEmbedding, "prefetch",
                        lambda self, ids: (threads.append(threading.current_thread().name), prefetch(self, ids))[1])
    return threads


def run_both(build, batches, device, **pipeline_args):
    model, opt = build()
    plain_losses = plain_loop(model, opt, batches, device)
    expected = everything(model, device)
    model, opt = build()
    pipeline = TrainPipeline(model, opt, batches, device=device, **pipeline_args)
    losses = [out[0].detach() for out in pipeline]
    assert len(losses) == len(batches)
    assert_same_bits({"losses": torch.stack(plain_losses).cpu()}, {"losses": torch.stack(losses).cpu()})
    assert_same_bits(expected, everything(model, device))
    return model, pipeline


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ids", ["one_hot", "bags"])
def test_pipelined_dlrm_is_bit_identical_to_the_plain_loop(device, ids):
    # Skewed ids (exponent 1.3) over small tables: consecutive batches share most rows, which each step updates
    # after the next batch's gather has read them.
    pooling = None if ids == "one_hot" else [1, 3, 2, 1, 4, 2]
    batches = synthetic_batches(ROWS, 32, 5, exponent=1.3, pooling_factors=pooling, seed=2,
                                pin_memory=device == "cuda")
    run_both(lambda: tiny_dlrm(device), batches, device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("optimizer", ["rowwise_adagrad", "adam"])
def test_steps_on_rows_read_ahead_only_write_the_table_with_the_same_bits(device, optimizer, monkeypatch):
    # Stream-ordered staging (no SM for transfers): rows read ahead with their state are stepped where they are
    # (PrefetchedRows.step) and written back with scatter_with_state_, never read from the table again. On the CPU
    # the GPU's way runs by the test switch. Both loops run under the option: the plain one through the usual update.
    from speedtorch.nn._prefetched_rows import PrefetchedRows

    monkeypatch.setattr(HostEmbedding, "_advance_on_cpu", True)
    stepped = []
    step = PrefetchedRows.step
    monkeypatch.setattr(PrefetchedRows, "step", lambda self, *a: (stepped.append(1), step(self, *a))[1])
    batches = synthetic_batches(ROWS, 32, 5, exponent=1.3, seed=4, pin_memory=device == "cuda")
    with speedtorch.transfer_config_override(stream_ordered_staging=1):
        run_both(lambda: tiny_dlrm(device, optimizer=optimizer), batches, device)
    # Each pipelined step after the first (read at its forward), for each of the collection's tables' groups.
    assert len(stepped) == len(batches) - 1


def test_pipelined_two_groups_and_dcn_are_bit_identical():
    batches = synthetic_batches(ROWS, 16, 4, exponent=1.2, seed=3)
    run_both(lambda: tiny_dlrm("cpu", dims=[DIM, 4, DIM, 4, DIM, DIM], optimizer="adam", interaction="dcn"), batches,
             "cpu")


@pytest.mark.parametrize("placement,update", [("hybrid", "step"), ("host", "backward")])
def test_pipelined_row_cache_and_updates_in_backward_are_bit_identical(placement, update):
    """A row cache (here on the CPU) holds rows the refresh must re-read from it; updates applied inside backward
    change rows after the next batch's gather, as step() does."""
    batches = synthetic_batches(ROWS, 32, 4, exponent=1.3, seed=8)
    run_both(lambda: tiny_dlrm("cpu", placement=placement, update=update), batches, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("placement,max_sms", [("gpu", None), ("hybrid", None), ("host", 8)])
def test_pipelined_dlrm_on_gpu_placements_is_bit_identical(placement, max_sms):
    batches = synthetic_batches(ROWS, 64, 5, exponent=1.3, seed=4, pin_memory=True)
    run_both(lambda: tiny_dlrm("cuda", placement=placement), batches, "cuda", max_sms=max_sms)


class UsersItems(torch.nn.Module):
    """One HostEmbedding (users) and a torch table (items), scored by a dot product: speedtorch's recommender."""

    def __init__(self, device, placement="host"):
        super().__init__()
        torch.manual_seed(0)
        self.users = HostEmbedding(200, DIM, optimizer="adam", optimizer_options={"lr": 0.05}, device=device, seed=1,
                                   placement=placement, hot_fraction=0.1 if placement == "hybrid" else None)
        self.items = torch.nn.Embedding(30, DIM, device=device)

    def forward(self, batch):
        users, items, labels = batch
        logits = (self.users(users) * self.items(items)).sum(-1)
        return torch.nn.functional.binary_cross_entropy_with_logits(logits, labels), logits


def user_batches(count, pin=False):
    gen = torch.Generator().manual_seed(5)
    out = []
    for _ in range(count):
        users = torch.randint(0, 20, (48,), generator=gen)  # 20 of 200 users: batches overlap heavily
        b = (users, torch.randint(0, 30, (48,), generator=gen), torch.randint(0, 2, (48,), generator=gen).float())
        out.append(tuple(t.pin_memory() for t in b) if pin else b)
    return out


@pytest.mark.parametrize("device", DEVICES)
def test_a_single_host_embedding_pipelines_bit_identically(device):
    batches = user_batches(5, pin=device == "cuda")

    def build():
        model = UsersItems(device)
        model.sparse_inputs = lambda batch: [(model.users, batch[0])]
        return model, torch.optim.SGD(model.items.parameters(), lr=0.1)

    model, opt = build()
    for users, items, labels in batches:
        loss, _ = model(tuple(t.to(device) for t in (users, items, labels)))
        loss.backward()
        model.users.step()
        opt.step()
        opt.zero_grad(set_to_none=True)
    expected = everything(model, device)
    model, opt = build()
    pipeline = TrainPipeline(model, opt, batches, device=device)
    assert pipeline.host_modules == [model.users]
    assert sum(1 for _ in pipeline) == len(batches)
    assert_same_bits(expected, everything(model, device))


def test_forward_takes_the_rows_gathered_ahead(monkeypatch):
    """After each step the collection holds the next batch's rows, and forward uses them (no gather of its own)."""
    batches = synthetic_batches(ROWS, 16, 3, exponent=1.2, seed=6)
    model, opt = tiny_dlrm("cpu")
    pipeline = TrainPipeline(model, opt, batches, device="cpu")
    collection = model.model.embeddings
    pipeline.progress()
    group = collection.groups[0]
    assert collection._prefetched is not None and collection._prefetched[0] is pipeline._staged[0].batch.sparse
    assert group._prefetched is not None
    gathers = []
    table = group.table

    class Counting:
        def __getattr__(self, name):
            if name == "gather":
                gathers.append(1)
            return getattr(table, name)

    group.table = Counting()
    pipeline.progress()
    # One gather: the next batch's, ahead. The rows this step updates reach it from the update itself, not from a
    # second read of the table.
    assert len(gathers) == 1
    assert pipeline.steps == 2


@pytest.mark.gpu
@pytest.mark.parametrize("copy_engines", [True, False])
def test_the_copy_engines_setting_is_passed_on_on_a_gpu(monkeypatch, copy_engines):
    seen = []
    real = speedtorch.pipeline.transfer_config_override
    monkeypatch.setattr(speedtorch.pipeline, "transfer_config_override",
                        lambda **options: (seen.append(options), real(**options))[1])
    batches = synthetic_batches(ROWS, 8, 3, seed=7, pin_memory=True)
    model, opt = tiny_dlrm("cuda")
    for _ in TrainPipeline(model, opt, batches, device="cuda", max_sms=16, copy_engines=copy_engines):
        pass
    expected = {"max_sms": 16, "stream_ordered_staging": 1} if copy_engines else {"max_sms": 16}
    # The pipeline's own overrides; the prefetch thread also applies the calling thread's whole configuration.
    own = [options for options in seen if set(options) <= {"max_sms", "stream_ordered_staging"}]
    assert own == [expected] * 5


def test_the_side_streams_transfer_bound_is_passed_on(monkeypatch):
    seen = []
    real = speedtorch.pipeline.transfer_config_override

    def record(**options):
        seen.append(options)
        return real(**options)

    monkeypatch.setattr(speedtorch.pipeline, "transfer_config_override", record)
    batches = synthetic_batches(ROWS, 8, 3, seed=7)
    model, opt = tiny_dlrm("cpu")
    for _ in TrainPipeline(model, opt, batches, device="cpu", max_sms=16):
        pass
    # Once per batch gathered ahead (the second and the third) and once per step of the tables (three).
    assert seen == [{"max_sms": 16}] * 5


def test_max_sms_is_a_quarter_of_the_gpus_by_default_and_checked():
    model, opt = tiny_dlrm("cpu")
    batches = synthetic_batches(ROWS, 8, 1, seed=7)
    assert TrainPipeline(model, opt, batches, device="cpu").max_sms is None  # nothing to bound on the CPU
    assert TrainPipeline(model, opt, batches, device="cpu", max_sms=12).max_sms == 12
    for bad in (-1, "half", 2.5, True):
        with pytest.raises(ValueError, match="max_sms must be 'auto', None or an int >= 0"):
            TrainPipeline(model, opt, batches, device="cpu", max_sms=bad)
    for bad in (1, "yes", None):
        with pytest.raises(ValueError, match="copy_engines must be True, False or 'auto'"):
            TrainPipeline(model, opt, batches, device="cpu", copy_engines=bad)


def test_max_sms_auto_leaves_tables_in_gpu_memory_unbounded(monkeypatch):
    # Tables with placement="gpu" read nothing ahead and step on the model's own stream: a bound there only slows
    # them (bench/dlrm.py's all-GPU yardstick runs unbounded for that reason). Host tables get a quarter of the SMs.
    # The GPU's properties are faked, so this runs without one.
    class Properties:
        multi_processor_count = 132

    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device=None: Properties())
    cuda = torch.device("cuda", 0)
    tables = {placement: speedtorch.pipeline._tables_of([tiny_dlrm("cpu", placement)[0].model.embeddings])
              for placement in ("host", "gpu")}
    assert speedtorch.pipeline._resolved_max_sms("auto", cuda, tables["host"]) == 33
    assert speedtorch.pipeline._resolved_max_sms("auto", cuda, tables["gpu"]) is None
    assert speedtorch.pipeline._resolved_max_sms("auto", cuda, tables["gpu"] + tables["host"]) == 33
    assert speedtorch.pipeline._resolved_max_sms(16, cuda, tables["gpu"]) == 16  # asked for: kept
    assert speedtorch.pipeline._resolved_max_sms("auto", torch.device("cpu"), tables["host"]) is None
    speedtorch.set_transfer_config(max_sms=20)  # the process's own bound stands: "auto" adds none
    try:
        assert speedtorch.pipeline._resolved_max_sms("auto", cuda, tables["host"]) is None
    finally:
        speedtorch.set_transfer_config(max_sms=0)


@pytest.mark.gpu
def test_max_sms_auto_on_a_gpu():
    model, opt = tiny_dlrm("cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    pipeline = TrainPipeline(model, opt, synthetic_batches(ROWS, 8, 1, seed=7), device="cuda")
    assert pipeline.max_sms == max(1, sms // 4)


def test_tables_a_host_embedding_optimizer_steps_are_left_to_it():
    """With CombinedOptimizer([HostEmbeddingOptimizer, SGD]) and an LR schedule, the pipeline trains as the standard
    loop does. It used to step the table itself before the optimizer, with the learning rate of the step before."""
    from speedtorch.optim import CombinedOptimizer, HostEmbeddingOptimizer

    batches = user_batches(4)

    def build():
        model = UsersItems("cpu")
        model.sparse_inputs = lambda batch: [(model.users, batch[0])]
        opt = CombinedOptimizer([HostEmbeddingOptimizer(model), torch.optim.SGD(model.items.parameters(), lr=0.1)])
        return model, opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (step + 1))

    model, opt, sched = build()
    for batch in batches:
        loss, _ = model(batch)
        loss.backward()
        opt.step()
        opt.zero_grad()
        sched.step()
    expected = everything(model, "cpu")
    model, opt, sched = build()
    pipeline = TrainPipeline(model, opt, batches, device="cpu")
    for _ in pipeline:
        sched.step()
    assert model.users.table.step_count() == len(batches)
    assert_same_bits(expected, everything(model, "cpu"))
    assert pipeline._tables_to_step == []
    # A table no optimizer holds is still stepped by the pipeline.
    model, _, _ = build()
    assert TrainPipeline(model, torch.optim.SGD(model.items.parameters(), lr=0.1), batches,
                         device="cpu")._tables_to_step == [model.users]


def test_a_bad_id_in_the_next_batch_raises_at_its_own_step_and_this_step_trains():
    """Issue 31, item 4: the prefetch of batch t+1 used to raise t+1's IndexError inside step t, before its backward,
    so step t never trained. Now a loop that skips bad batches trains what the plain loop trains."""
    batches = user_batches(5)
    bad_users = batches[2][0].clone()
    bad_users[3] = 10_000
    batches[2] = (bad_users, *batches[2][1:])

    def build():
        model = UsersItems("cpu")
        model.sparse_inputs = lambda batch: [(model.users, batch[0])]
        return model, torch.optim.SGD(model.items.parameters(), lr=0.1)

    model, opt = build()
    plain_trained = 0
    for batch in batches:
        try:
            loss, _ = model(batch)
        except IndexError:
            continue
        loss.backward()
        model.users.step()
        opt.step()
        opt.zero_grad(set_to_none=True)
        plain_trained += 1
    expected = everything(model, "cpu")
    model, opt = build()
    pipeline = TrainPipeline(model, opt, batches, device="cpu")
    trained, errors = 0, []
    while True:
        try:
            pipeline.progress()
            trained += 1
        except IndexError as e:
            errors.append((pipeline.steps, str(e)))
        except StopIteration:
            break
    assert trained == plain_trained == 4
    assert len(errors) == 1 and errors[0][0] == 2 and "10000" in errors[0][1]  # at the step of batch 2, not 1
    assert_same_bits(expected, everything(model, "cpu"))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("ids", ["one_hot", "bags"])
def test_the_next_prefetch_on_its_own_thread_beside_the_backward_is_bit_identical(device, ids, monkeypatch):
    # On a GPU the next batch's prefetch runs on a thread of its own while the backward is queued (on the CPU by the
    # test switch), with the rows read ahead advanced as on a GPU.
    monkeypatch.setattr(TrainPipeline, "_beside_backward_on_cpu", True)
    monkeypatch.setattr(HostEmbedding, "_advance_on_cpu", True)
    threads = prefetch_threads(monkeypatch)
    pooling = None if ids == "one_hot" else [1, 3, 2, 1, 4, 2]
    batches = synthetic_batches(ROWS, 32, 5, exponent=1.3, pooling_factors=pooling, seed=6,
                                pin_memory=device == "cuda")
    _, pipeline = run_both(lambda: tiny_dlrm(device), batches, device)
    assert pipeline._gathers_beside_backward
    assert threads and all(name.startswith("speedtorch-prefetch") for name in threads)


@pytest.mark.parametrize("placement,update", [("host", "backward"), ("hybrid", "step")])
def test_a_prefetch_stays_on_the_calling_thread_for_tables_updated_in_backward(placement, update, monkeypatch):
    # A table updated inside backward changes rows (and its prefetch slot) while the backward runs: its prefetch
    # waits for the backward, on the calling thread. (A hybrid table is a plain HostEmbedding: it may.)
    monkeypatch.setattr(TrainPipeline, "_beside_backward_on_cpu", True)
    threads = prefetch_threads(monkeypatch)
    batches = synthetic_batches(ROWS, 32, 3, exponent=1.3, seed=7)
    _, pipeline = run_both(lambda: tiny_dlrm("cpu", placement=placement, update=update), batches, "cpu")
    assert pipeline._gathers_beside_backward == (update == "step")
    assert threads and all(name.startswith("speedtorch-prefetch") == (update == "step") for name in threads)


def test_the_prefetch_thread_runs_under_the_callers_settings_and_only_for_modules_the_model_holds(monkeypatch):
    # transfer_config_override and deferred_index_checks blocks are the calling thread's: the prefetch thread runs
    # under the caller's. A module sparse_inputs names but the model does not hold prefetches after the backward.
    import threading

    monkeypatch.setattr(TrainPipeline, "_beside_backward_on_cpu", True)
    seen = []
    prefetch = HostEmbedding.prefetch

    def recording(self, ids):
        seen.append((threading.current_thread().name, speedtorch.transfer_config()["staging_chunk_bytes"],
                     bool(torch.ops.speedtorch.deferred_index_checks())))
        return prefetch(self, ids)

    monkeypatch.setattr(HostEmbedding, "prefetch", recording)
    model, opt = tiny_dlrm("cpu")
    pipeline = TrainPipeline(model, opt, synthetic_batches(ROWS, 16, 3, exponent=1.3, seed=10), device="cpu")
    with speedtorch.transfer_config_override(staging_chunk_bytes=12345):
        pipeline.progress()
    assert seen[-1][0].startswith("speedtorch-prefetch") and seen[-1][1] == 12345
    stranger = HostEmbedding(8, 4, device="cpu")
    inner = pipeline.sparse_inputs
    pipeline.sparse_inputs = lambda batch: inner(batch) + [(stranger, torch.tensor([1, 2]))]
    pipeline.progress()
    assert not seen[-1][0].startswith("speedtorch-prefetch") and not seen[-2][0].startswith("speedtorch-prefetch")
    assert pipeline._prefetch_thread.started
    pipeline.progress()  # the third and last batch
    with pytest.raises(StopIteration):
        pipeline.progress()
    assert not pipeline._prefetch_thread.started  # shut down at the end of the batches


def test_under_a_profiler_the_prefetch_runs_on_the_calling_thread(monkeypatch):
    # A profiler records the calling thread's operators and ranges only: every kernel of a trace must find its phase.
    import threading

    monkeypatch.setattr(TrainPipeline, "_beside_backward_on_cpu", True)
    threads = prefetch_threads(monkeypatch)
    model, opt = tiny_dlrm("cpu")
    pipeline = TrainPipeline(model, opt, synthetic_batches(ROWS, 16, 4, exponent=1.3, seed=9), device="cpu")
    pipeline.progress()
    assert threads[-1].startswith("speedtorch-prefetch")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        pipeline.progress()
    assert threads[-1] == threading.current_thread().name


@pytest.mark.parametrize("copy_engines", [True, "auto"])
@pytest.mark.parametrize("device", DEVICES)
def test_prefetch_auto_tries_both_ways_keeps_one_and_trains_the_same_bits(device, copy_engines):
    # The trial's steps (CPU: 3 with prefetch, then 1 + 5 with, 1 + 5 without, twice; GPU: a third block each
    # round, with prefetch over UVA row kernels instead of the copy engines), then 6 more, in the way kept once the
    # last block is read. On a GPU the blocks are timed by events of the training stream, never waited for.
    from speedtorch.pipeline import prefetch_trial_steps

    three = device == "cuda" and copy_engines == "auto"
    count = prefetch_trial_steps(device, copy_engines) + 6
    assert count == (45 if three else 33)
    batches = synthetic_batches(ROWS, 16, count, exponent=1.3, seed=11, pin_memory=device == "cuda")
    _, pipeline = run_both(lambda: tiny_dlrm(device), batches, device, prefetch="auto", copy_engines=copy_engines)
    assert pipeline.prefetch in (True, False) and pipeline.copy_engines in (True, False)
    ways = {"with", "with, UVA row kernels", "without"} if three else {"with", "without"}
    assert set(pipeline.prefetch_trial) == ways and min(pipeline.prefetch_trial.values()) > 0


def test_prefetch_auto_schedule_and_choice():
    from speedtorch.pipeline import _PrefetchTrial

    trial = _PrefetchTrial()
    assert trial.STEPS == 27
    assert [trial.prefetches(s) for s in range(27)] == [True] * 9 + [False] * 6 + [True] * 6 + [False] * 6
    # Each block: a step to settle (untimed), then 5 timed between two waits.
    assert [s for s in range(28) if trial.at_edge(s)] == [3, 4, 9, 10, 15, 16, 21, 22, 27]
    # With prefetch 10 ms a step, without 9.8 (within the 3% margin): prefetch is kept. The settling steps (3-4,
    # 9-10, ...) take 1 s each and count for neither.
    clock = {3: 0.0, 4: 1.0, 9: 1.050, 10: 2.050, 15: 2.099, 16: 3.099, 21: 3.149, 22: 4.149, 27: 4.198}
    assert [trial.record(s, t) for s, t in clock.items()] == [False] * 8 + [True]
    assert trial.choice() == (True, True) and trial.summary() == pytest.approx({"with": 10.0, "without": 9.8})
    faster = _PrefetchTrial()  # without prefetch 8 ms a step: 20% less, so no prefetch
    for s, t in {3: 0.0, 4: 0.0, 9: 0.050, 10: 0.060, 15: 0.100, 16: 0.110, 21: 0.160, 22: 0.170, 27: 0.210}.items():
        faster.record(s, t)
    assert faster.choice() == (False, True)


def test_prefetch_auto_with_copy_engines_auto_tries_three_ways_and_keeps_the_fastest():
    # On a GPU with copy_engines="auto": blocks of prefetch with the copy engines, with UVA row kernels, and without
    # prefetch, in turns, twice: 39 steps. The copy engines' CPU copies can run slow on a machine (10 GB/s where
    # another moved 29: bench/RESULTS.md, sixteenth session): the trial then keeps the UVA row kernels.
    from speedtorch.pipeline import _PrefetchTrial

    ways = ((True, True), (True, False), (False, True))
    trial = _PrefetchTrial(ways)
    assert trial.STEPS == 39
    assert [trial.way(s) for s in (0, 2, 3, 8, 9, 14, 15, 20, 21, 38)] == [ways[0]] * 4 + [ways[1]] * 2 + \
        [ways[2]] * 2 + [ways[0], ways[2]]
    edges = [s for s in range(40) if trial.at_edge(s)]
    assert edges == [3, 4, 9, 10, 15, 16, 21, 22, 27, 28, 33, 34, 39]
    per_step = {ways[0]: 0.030, ways[1]: 0.018, ways[2]: 0.026}  # seconds a step: UVA fastest
    now, done = 0.0, []
    for s in edges:
        if (s - 3) % 6 == 0 and s > 3:
            now += 5 * per_step[trial.way(s - 1)]
        done.append(trial.record(s, now))
    assert done == [False] * 12 + [True]
    assert trial.choice() == (True, False)
    assert trial.summary() == pytest.approx({"with": 30.0, "with, UVA row kernels": 18.0, "without": 26.0})


def test_prefetch_must_be_true_false_or_auto():
    model, opt = tiny_dlrm("cpu")
    with pytest.raises(ValueError, match=r"prefetch must be True, False or 'auto', got 'yes'"):
        TrainPipeline(model, opt, [], device="cpu", prefetch="yes")


def test_prefetch_auto_agrees_across_ranks_only_for_tables_whose_prefetch_is_a_collective():
    # A distributed table's prefetch exchanges ids: every rank must keep the same way (an all-reduce at the trial's
    # end). Plain tables decide on each rank alone: no collective that a rank with fewer batches would never reach.
    from speedtorch.pipeline import _prefetch_is_collective

    model, _ = tiny_dlrm("cpu")
    assert not _prefetch_is_collective(list(speedtorch.pipeline.host_modules(model)))
    if torch.__version__ >= (2, 5):
        from speedtorch.distributed.collection import DistributedHostEmbeddingBagCollection
        from speedtorch.distributed.embedding import DistributedHostEmbedding

        assert DistributedHostEmbedding._prefetch_is_collective
        assert DistributedHostEmbeddingBagCollection._prefetch_is_collective

    class Shared(HostEmbedding):
        _prefetch_is_collective = True

    assert _prefetch_is_collective([HostEmbedding(4, 2, device="cpu"), Shared(4, 2, device="cpu")])


def test_a_diagnosis_switch_keeps_the_prefetch_on_its_thread_under_a_profiler(monkeypatch):
    # bench/dlrm.py --trace-as-run: a trace of the schedule as it runs untraced.

    from speedtorch._prefetch_thread import PrefetchThread

    monkeypatch.setattr(TrainPipeline, "_beside_backward_on_cpu", True)
    monkeypatch.setattr(PrefetchThread, "under_profiler", True)
    threads = prefetch_threads(monkeypatch)
    model, opt = tiny_dlrm("cpu")
    pipeline = TrainPipeline(model, opt, synthetic_batches(ROWS, 16, 3, exponent=1.3, seed=9), device="cpu")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        pipeline.progress()
    assert threads and threads[-1].startswith("speedtorch-prefetch")


def test_prefetch_auto_without_anything_to_read_ahead_runs_no_trial():
    # No sparse_inputs: nothing can be prefetched, so "auto" is False at once (no trial's waits for the device).
    model, opt = tiny_dlrm("cpu")
    batches = synthetic_batches(ROWS, 16, 2, exponent=1.3, seed=3)
    pipeline = TrainPipeline(model, opt, batches, device="cpu")
    pipeline.sparse_inputs = None  # the model's sparse_inputs method is the default
    pipeline.progress()
    assert pipeline.prefetch is False and pipeline.prefetch_trial is None
