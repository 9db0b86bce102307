"""The row cache (csrc/cache/row_cache.h; PinnedEmbedding.enable_cache, HostEmbedding(placement="hybrid")): every
path gives bit for bit what the host table gives without it (gathers, optimizer steps with duplicates, eviction under
pressure, sets that overflow), and the host table is exact whenever it is read (table(), state(), save, state_dict,
pickling). On the CPU here; the same tests run the CUDA kernels where a GPU is present.

On a GPU the host path sums a row's gradients with atomic adds (index_add_), so with three or more duplicates of a
row in one step even two host tables differ in the last bits; the batches here name each row at most twice (two
addends sum the same in either order), which HostEmbedding's own batches (distinct ids per backward) never exceed
either. The CPU sums in batch order: there, the duplicate test uses more."""

from __future__ import annotations

import io
import os
import tempfile

import numpy as np
import pytest
import torch

import speedtorch
from speedtorch.nn import HostEmbedding
from speedtorch.nn.placement import HybridTable

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]

OPTIMIZERS = [
    ("sgd", {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01}),
    ("adagrad", {"lr": 0.1, "lr_decay": 0.01, "initial_accumulator_value": 0.1}),
    ("adam", {"lr": 0.01, "amsgrad": 1.0}),
    ("adamw", {"lr": 0.01, "weight_decay": 0.1, "per_row_step": 1.0}),
    ("rmsprop", {"lr": 0.01, "momentum": 0.5, "centered": 1.0}),
    ("rprop", {"lr": 0.01}),
    ("rowwise_adagrad", {"lr": 0.1, "weight_decay": 0.01}),
]


def pair(n, d, dtype, optimizer, options, beside, cache_rows, device, seed=0):
    """The same table twice: plain, and with a row cache on `device`."""
    init = torch.randn(n, d, generator=torch.Generator().manual_seed(seed)).to(dtype)
    tables = []
    for _ in range(2):
        t = speedtorch.PinnedEmbedding(n, d, dtype)
        t.set_optimizer(optimizer, {k: float(v) for k, v in options.items()}, beside)
        t.copy_(init)
        tables.append(t)
    tables[1].enable_cache(cache_rows, torch.device(device))
    return tables


def batches(n, d, count, size, seed=1, hot=None):
    """`count` batches of `size` ids in [0, hot or n), each id at most twice (a quarter of them twice)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        distinct = torch.randperm(hot or n, generator=gen)[:size - size // 4]
        ids = torch.cat([distinct, distinct[:size - distinct.numel()]])
        ids = ids[torch.randperm(ids.numel(), generator=gen)]
        out.append((ids, torch.randn(ids.numel(), d, generator=gen)))
    return out


def assert_same_table(a, b):
    assert torch.equal(a.table(), b.table())
    if a.state() is not None:
        assert torch.equal(a.state(), b.state())
    assert a.step_count() == b.step_count()


def run_both(host, cached, steps, device):
    for ids, grad in steps:
        ids, grad = ids.to(device), grad.to(device)
        assert torch.equal(host.gather(ids, torch.device(device)), cached.gather(ids, torch.device(device)))
        host.apply_gradients(ids, grad)
        cached.apply_gradients(ids, grad)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("optimizer,options", OPTIMIZERS, ids=[o for o, _ in OPTIMIZERS])
def test_steps_match_the_host_table_bit_for_bit(device, optimizer, options):
    # 64 cache rows for ~150 distinct rows a batch: rows are evicted (written back) and re-read every step, and
    # some sets overflow (their extra rows are updated on the host).
    host, cached = pair(300, 8, torch.float32, optimizer, options, True, 64, device)
    run_both(host, cached, batches(300, 8, 6, 200), device)
    assert cached.cached_rows() > 0
    assert_same_table(host, cached)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype,dim,beside", [(torch.bfloat16, 5, True), (torch.float16, 12, False),
                                              (torch.float32, 3, False)])
def test_layouts_and_dtypes_match(device, dtype, dim, beside):
    host, cached = pair(200, dim, dtype, "adam", {"lr": 0.01}, beside, 40, device)
    run_both(host, cached, batches(200, dim, 5, 120, seed=3), device)
    assert_same_table(host, cached)


@pytest.mark.parametrize("device", DEVICES)
def test_cache_larger_than_the_touched_rows_keeps_them_all(device):
    host, cached = pair(1000, 4, torch.float32, "adagrad", {"lr": 0.1}, True, 512, device)
    steps = batches(1000, 4, 5, 64, hot=100)  # 100 hot rows, all fit
    run_both(host, cached, steps, device)
    assert cached.cached_rows() == len(torch.unique(torch.cat([ids for ids, _ in steps])))
    assert cached.cache_slots() == 512
    assert_same_table(host, cached)


@pytest.mark.parametrize("device", DEVICES)
def test_a_tiny_cache_overflows_and_stays_exact(device):
    # One set of 3 ways for 40 distinct rows a step: most rows stay on the host, the cached ones churn.
    host, cached = pair(100, 4, torch.float32, "adam", {"lr": 0.01}, True, 3, device)
    assert cached.cache_slots() == 3
    run_both(host, cached, batches(100, 4, 4, 60, seed=7), device)
    assert_same_table(host, cached)


@pytest.mark.parametrize("device", DEVICES)
def test_duplicates_in_one_batch_sum_like_the_host(device):
    host, cached = pair(50, 6, torch.float32, "sgd", {"lr": 0.5}, True, 8, device)
    many = device == "cpu"  # see the top of this file
    ids = torch.tensor([3, 3, 7, 3, 9, 7, 3, 40, 40] if many else [3, 3, 7, 9, 7, 40, 40, 12])
    grad = torch.randn(ids.numel(), 6, generator=torch.Generator().manual_seed(2))
    run_both(host, cached, [(ids, grad), (ids.flip(0), grad)], device)
    assert_same_table(host, cached)


@pytest.mark.parametrize("device", DEVICES)
def test_flush_writes_back_and_keeps_rows_cached(device):
    host, _ = pair(100, 4, torch.float32, "adam", {"lr": 0.1}, False, 32, device)
    with tempfile.TemporaryDirectory(dir="/dev/shm" if os.path.isdir("/dev/shm") else None) as folder:
        # A table over a file (tmpfs, so that GPUs may write it), and a second mapping of that file: the host rows
        # as they are, read without asking the table (table() writes the cache back, and a tensor it hands out
        # makes the cache stand aside).
        cached = speedtorch.PinnedEmbedding.create(os.path.join(folder, "t"), 100, 4, torch.float32, "adam",
                                                   {"lr": 0.1})
        cached.copy_(host.table())
        cached.enable_cache(32, torch.device(device))
        rows = torch.from_numpy(np.load(os.path.join(folder, "t.npy"), mmap_mode="r+"))  # only read
        run_both(host, cached, batches(100, 4, 2, 20), device)
        before = cached.cached_rows()
        assert not torch.equal(rows, host.table())  # updates still only in the cache
        cached.flush_cache()
        assert cached.cached_rows() == before > 0
        assert torch.equal(rows, host.table())  # flush_cache() itself wrote them back
        snap = cached.table().clone()  # table() writes back and empties: the caller may write what it gets
        assert cached.cached_rows() == 0
        assert torch.equal(snap, host.table())
        del rows, cached


@pytest.mark.parametrize("device", DEVICES)
def test_host_writes_reach_the_cached_rows(device):
    host, cached = pair(60, 4, torch.float32, "sgd", {"lr": 0.1}, True, 16, device)
    run_both(host, cached, batches(60, 4, 2, 30), device)
    for t in (host, cached):
        t.scatter_(torch.tensor([1, 2, 2]), torch.arange(12, dtype=torch.float32).reshape(3, 4))
    run_both(host, cached, batches(60, 4, 2, 30, seed=4), device)
    for t in (host, cached):
        t.normal_(0.0, 1.0, 5)
    run_both(host, cached, batches(60, 4, 2, 30, seed=5), device)
    values = torch.randn(60, 4)
    for t in (host, cached):
        t.copy_(values)
    run_both(host, cached, batches(60, 4, 2, 30, seed=6), device)
    # Writes through the tensor table() hands out are seen too.
    cached.table()[5] = 7.0
    host.table()[5] = 7.0
    run_both(host, cached, [(torch.tensor([5, 6]), torch.ones(2, 4))], device)
    assert_same_table(host, cached)


@pytest.mark.parametrize("device", DEVICES)
def test_set_optimizer_and_disable_keep_it_exact(device):
    host, cached = pair(80, 4, torch.float32, "adam", {"lr": 0.1}, True, 16, device)
    run_both(host, cached, batches(80, 4, 2, 30), device)
    for t in (host, cached):
        t.set_optimizer("rmsprop", {"lr": 0.01}, False)
    assert cached.cache_slots() == 16
    run_both(host, cached, batches(80, 4, 2, 30, seed=8), device)
    cached.disable_cache()
    assert cached.cache_slots() == 0
    assert_same_table(host, cached)


@pytest.mark.parametrize("device", DEVICES)
def test_save_and_snapshots_see_the_cached_updates(tmp_path, device):
    host, cached = pair(100, 4, torch.float32, "adagrad", {"lr": 0.1}, True, 16, device)
    run_both(host, cached, batches(100, 4, 3, 40), device)
    cached.save(str(tmp_path / "c"))
    back = speedtorch.PinnedEmbedding.load(str(tmp_path / "c"), True)
    assert_same_table(host, back)
    # Pickled inline (torch.jit.save of a module holding the table): a snapshot, written back first.
    run_both(host, cached, batches(100, 4, 1, 40, seed=9), device)
    assert cached.cached_rows() > 0
    copy = torch.jit.load(save_scripted(TableHolder(cached)))
    assert copy.table.cache_slots() == 0  # the cache is runtime state
    assert_same_table(host, copy.table)


@pytest.mark.parametrize("device", DEVICES)
def test_a_table_over_files_gets_the_cached_updates(tmp_path, device):
    """flush() of an "r+" table writes the cache back (files verified against their new hashes), and so does
    dropping the table."""
    path = str(tmp_path / "mapped")
    mapped = speedtorch.PinnedEmbedding.create(path, 120, 4, torch.float32, "adagrad", {"lr": 0.1})
    host = speedtorch.PinnedEmbedding(120, 4, torch.float32)
    host.set_optimizer("adagrad", {"lr": 0.1}, False)
    init = torch.randn(120, 4)
    host.copy_(init)
    mapped.copy_(init)
    mapped.enable_cache(32, torch.device(device))
    if device == "cuda":
        try:
            mapped.apply_gradients(torch.tensor([1], device="cuda"), torch.ones(1, 4, device="cuda"))
        except RuntimeError as e:  # pages of a file outside tmpfs: GPUs may only read them
            assert "GPUs may only read" in str(e) and "disable_cache()" in str(e)
            assert torch.equal(mapped.table(), host.table()) and mapped.step_count() == 0
            return
        host.apply_gradients(torch.tensor([1], device="cuda"), torch.ones(1, 4, device="cuda"))
    run_both(host, mapped, batches(120, 4, 3, 50), device)
    mapped.flush()
    assert_same_table(host, speedtorch.PinnedEmbedding.load(path, True))
    run_both(host, mapped, batches(120, 4, 2, 50, seed=11), device)
    assert mapped.cached_rows() > 0
    del mapped
    back = speedtorch.PinnedEmbedding.open(path, "r")
    assert torch.equal(back.table(), host.table()) and torch.equal(back.state(), host.state())


class TableHolder(torch.nn.Module):
    def __init__(self, table):
        super().__init__()
        self.table = table

    def forward(self, ids: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
        rows = self.table.gather(ids, None)
        self.table.apply_gradients(ids, grad)
        self.table.flush_cache()
        return rows

    @torch.jit.export
    def cache(self, rows: int, device: torch.device) -> int:
        self.table.enable_cache(rows, device)
        return self.table.cache_slots()


def save_scripted(module):
    buffer = io.BytesIO()
    torch.jit.save(torch.jit.script(module), buffer)
    buffer.seek(0)
    return buffer


@pytest.mark.parametrize("device", DEVICES)
def test_torchscript_enables_and_uses_the_cache(device):
    host, plain = pair(100, 4, torch.float32, "adam", {"lr": 0.1}, True, 16, device)
    plain.disable_cache()
    scripted = torch.jit.load(save_scripted(TableHolder(plain)))
    assert scripted.cache(40, torch.device(device)) == 64  # two sets of 32
    for ids, grad in batches(100, 4, 3, 50):
        ids, grad = ids.to(device), grad.to(device)
        assert torch.equal(scripted(ids, grad), host.gather(ids, torch.device(device)))
        host.apply_gradients(ids, grad)
    assert_same_table(host, scripted.table)


@pytest.mark.parametrize("device", DEVICES)
def test_hybrid_host_embedding_trains_like_host(device):
    n, d = 500, 8
    gen = torch.Generator().manual_seed(5)
    init = torch.randn(n, d, generator=gen)
    data = [(torch.randint(0, n, (8, 6), generator=gen), torch.randn(8, d, generator=gen)) for _ in range(6)]
    kwargs = dict(device=device, optimizer="adam", optimizer_options={"lr": 0.05}, mode="sum")
    modules = {"host": HostEmbedding(n, d, **kwargs),
               "hybrid": HostEmbedding(n, d, placement="hybrid", cache_rows=32, **kwargs),
               "hybrid_hot": HostEmbedding(n, d, placement="hybrid", hot_rows=torch.arange(0, 40), **kwargs)}
    results = {}
    for name, module in modules.items():
        module.table.copy_(init)
        losses = []
        for ids, target in data:
            loss = ((module(ids.to(device)) - target.to(device)) ** 2).sum()
            loss.backward()
            module.step()
            losses.append(loss.detach().cpu())
        results[name] = (torch.stack(losses), module.weight.clone(), module.table.state().clone())
    assert modules["hybrid_hot"].table.cache_slots() == 64
    ref = results["host"]
    for name, got in results.items():
        for a, b in zip(got, ref):
            assert torch.equal(a, b), name
    # state_dict round trip through a hybrid module.
    other = HostEmbedding(n, d, placement="hybrid", cache_rows=16, **kwargs)
    other.load_state_dict(modules["hybrid"].state_dict())
    assert torch.equal(other.weight, ref[1])


def _every_placement(n, d, device, init):
    kwargs = dict(device=device, optimizer="adam", optimizer_options={"lr": 0.05})
    host = speedtorch.PinnedEmbedding(n, d, torch.float32)
    host.set_optimizer("adam", {"lr": 0.05}, True)
    modules = {"host": HostEmbedding(n, d, **kwargs), "gpu": HostEmbedding(n, d, placement="gpu", **kwargs),
               "hybrid": HostEmbedding(n, d, placement="hybrid", cache_rows=32, **kwargs),
               "HybridTable": HostEmbedding(n, d, table=HybridTable(host, device, 8, hot_rows=torch.arange(8)),
                                            **kwargs)}
    for module in modules.values():
        module.table.copy_(init)
    return modules


def _train(module, ids, device):
    module(ids.to(device)).square().sum().backward()
    module.step()
    if device == "cuda":
        torch.cuda.synchronize()  # before the host reads or writes the rows (HostEmbedding.weight's rule)


@pytest.mark.parametrize("device", DEVICES)
def test_a_kept_weight_tensor_is_the_table_in_every_placement(device):
    """HostEmbedding.weight / table.state() (or a state_dict) kept while training: what is written through them after
    the next gather reaches later gathers and is not overwritten by a flush, and reading them shows every update, as
    with the host table itself; the cache comes back into use once they are dropped."""
    n, d = 200, 4
    init = torch.randn(n, d, generator=torch.Generator().manual_seed(21))
    hot = torch.tensor([1, 3, 5, 40, 41])
    results = {}
    for name, module in _every_placement(n, d, device, init).items():
        weight, state = module.weight, module.table.state()  # kept
        _train(module, hot, device)  # the rows are cached now (the hybrid placements)
        with torch.no_grad():
            weight[hot[:3]] = 5.0  # written through the kept tensors after the gather
            state[hot[3:]] = 0.25
        assert torch.equal(module(hot).detach().cpu()[:3], torch.full((3, d), 5.0)), name
        _train(module, hot, device)
        seen = (weight.cpu().clone(), state.cpu().clone())  # what the kept tensors show: every update
        del weight, state
        _train(module, torch.arange(0, 60), device)
        if name == "hybrid":
            assert module.table.cached_rows() > 0  # dropped: the cache is in use again
        results[name] = seen + (module.weight.cpu().clone(), module.table.state().cpu().clone())
    for name, got in results.items():
        for a, b in zip(got, results["host"]):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6, msg=name)


@pytest.mark.parametrize("device", DEVICES)
def test_prefetch_on_a_side_stream_trains_like_host(device):
    """HostEmbedding.prefetch gathers the next batch (on a side stream on a GPU) while the step updates the cache on
    the current one: the cache orders its calls across streams, and rows the step changed are gathered again."""
    n, d = 300, 8
    gen = torch.Generator().manual_seed(12)
    init = torch.randn(n, d, generator=gen)
    ids = [torch.randint(0, 60, (40,), generator=gen).to(device) for _ in range(6)]
    kwargs = dict(device=device, optimizer="adagrad", optimizer_options={"lr": 0.1})
    modules = [HostEmbedding(n, d, **kwargs), HostEmbedding(n, d, placement="hybrid", cache_rows=32, **kwargs)]
    for module in modules:
        module.table.copy_(init)
        for i, batch in enumerate(ids):
            module(batch).square().sum().backward()
            if i + 1 < len(ids):
                module.prefetch(ids[i + 1])
            module.step()
    assert torch.equal(modules[0].weight, modules[1].weight)
    assert torch.equal(modules[0].table.state(), modules[1].table.state())


def test_arguments_are_checked():
    table = speedtorch.PinnedEmbedding(10, 4, torch.float32)
    with pytest.raises(RuntimeError, match="num_rows .* must be >= 1, got 0"):
        table.enable_cache(0, torch.device("cpu"))
    with pytest.raises(RuntimeError, match="device must be a CUDA device or the CPU, got meta"):
        table.enable_cache(4, torch.device("meta"))
    table.enable_cache(4, torch.device("cpu"))
    with pytest.raises(IndexError, match="10"):
        table.gather(torch.tensor([1, 10]), None)
    with pytest.raises(RuntimeError, match="no optimizer"):
        table.apply_gradients(torch.tensor([1]), torch.ones(1, 4))
    with pytest.raises(ValueError, match="cache_rows, hot_fraction"):
        HostEmbedding(10, 4, device="cpu", placement="hybrid")
    with pytest.raises(ValueError, match="cache_rows must be >= 1"):
        HostEmbedding(10, 4, device="cpu", placement="hybrid", cache_rows=0)
    with pytest.raises(ValueError, match="hot_fraction must be in"):
        HostEmbedding(10, 4, device="cpu", placement="hybrid", hot_fraction=1.5)
    hybrid = HostEmbedding(10, 4, device="cpu", placement="hybrid", cache_rows=2)
    with pytest.raises(ValueError, match="room for 2"):
        hybrid.set_hot_rows(torch.tensor([1, 2, 3]))
    with pytest.raises(IndexError, match="hot row ids"):
        hybrid.set_hot_rows(torch.tensor([10]))
    with pytest.raises(RuntimeError, match="follows the ids"):
        hybrid.update_hot_rows()
    with pytest.raises(RuntimeError, match="hybrid"):
        HostEmbedding(10, 4, device="cpu").set_hot_rows(torch.tensor([1]))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("beside", [True, False])
def test_gather_with_state_reads_the_state_of_updates_still_in_the_cache(device, beside):
    # The cache holds the newer rows and their state until it writes them back: gather_with_state must give both as
    # they are (what gather() and, after state()'s write-back, state()[ids] give), not the host's older state.
    host, cached = pair(100, 4, torch.float32, "adam", {"lr": 0.1}, beside, 32, device)
    run_both(host, cached, batches(100, 4, 3, 20), device)
    assert cached.cached_rows() > 0
    ids = torch.tensor([3, 50, 99, 3, 0], device=device)
    rows, state = cached.gather_with_state(ids, torch.device(device))
    expected_rows, expected_state = host.gather_with_state(ids, torch.device(device))
    assert torch.equal(rows, expected_rows)
    assert torch.equal(state, expected_state)
    assert torch.equal(state.cpu(), cached.state()[ids.cpu()])
