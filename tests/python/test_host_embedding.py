"""speedtorch.nn.HostEmbedding and PinnedEmbedding's optimizer: equal to nn.Embedding(sparse=True) + SparseAdam
(and to nn.EmbeddingBag), per-row gradients, both update modes, prefetch, autocast, TorchScript."""

from __future__ import annotations

import pytest
import torch

import speedtorch
from speedtorch.nn import HostEmbedding
from speedtorch.nn.placement import HybridTable

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def make_pair(n, d, device, **kwargs):
    host = HostEmbedding(n, d, device=device, seed=0, **kwargs)
    ref = torch.nn.Embedding(n, d, sparse=True).to(device)
    with torch.no_grad():
        ref.weight.copy_(host.weight)
    return host, ref


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("update", ["step", "backward"])
def test_trains_like_sparse_adam(device, update):
    n, d = 500, 16
    host, ref = make_pair(n, d, device, optimizer="adam", optimizer_options={"lr": 0.05}, update=update)
    opt = torch.optim.SparseAdam(ref.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(11)
    target = torch.randn(d, generator=gen).to(device)
    for _ in range(6):
        ids = torch.randint(0, 60, (8, 7), generator=gen)  # skewed: many duplicates
        loss_h = ((host(ids) - target) ** 2).sum()
        loss_r = ((ref(ids.to(device)) - target) ** 2).sum()
        torch.testing.assert_close(loss_h, loss_r, rtol=1e-4, atol=1e-4)
        loss_h.backward()
        host.step()
        opt.zero_grad()
        loss_r.backward()
        opt.step()
    if device == "cuda":
        torch.cuda.synchronize()
    # SparseAdam adds eps before the bias correction of the second moment, Adam after it: elements whose gradient
    # stays near zero may differ by ~lr * 1e-2 (test_row_optimizer.py checks equality with torch.optim.Adam).
    torch.testing.assert_close(host.weight, ref.weight.detach().cpu(), rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_embedding_bag_modes(mode):
    n, d = 100, 8
    host = HostEmbedding(n, d, mode=mode, device="cpu", seed=1, optimizer="sgd", optimizer_options={"lr": 0.5})
    bag = torch.nn.EmbeddingBag(n, d, mode=mode)
    with torch.no_grad():
        bag.weight.copy_(host.weight)
    ids = torch.randint(0, n, (20,))
    offsets = torch.tensor([0, 3, 3, 11])
    out = host(ids, offsets)
    expected = bag(ids, offsets)
    torch.testing.assert_close(out, expected)
    out.sum().backward()
    expected.sum().backward()
    host.step()
    with torch.no_grad():
        bag.weight -= 0.5 * bag.weight.grad
    torch.testing.assert_close(host.weight, bag.weight.detach())


def test_gradient_is_summed_per_distinct_row():
    host = HostEmbedding(50, 4, device="cpu", seed=2)
    ids = torch.tensor([[3, 3, 9], [9, 3, 1]])
    weights = torch.randn(2, 3, 4)
    (host(ids) * weights).sum().backward()
    grad = host.weight.grad  # the pending gradient, sparse as nn.Embedding(sparse=True)'s
    unique = grad._indices()[0]
    assert unique.tolist() == [1, 3, 9] and grad.is_coalesced()
    expected = torch.zeros(50, 4).index_add_(0, ids.reshape(-1), weights.reshape(-1, 4))[unique]
    torch.testing.assert_close(grad._values(), expected)
    host.zero_grad()
    assert host.weight.grad is None


def test_only_touched_rows_move_and_state_is_counted():
    host = HostEmbedding(1000, 8, device="cpu", seed=3, optimizer="adam")
    assert host.table.nbytes() >= 1000 * (8 * 4 + 2 * 8 * 4)
    before = host.weight.clone()
    host(torch.tensor([5, 6])).sum().backward()
    host.step()
    moved = (host.weight != before).any(1).nonzero().squeeze(1).tolist()
    assert moved == [5, 6]
    assert host.table.step_count() == 1


@pytest.mark.parametrize("device", DEVICES)
def test_prefetch_sees_the_current_steps_update(device):
    host = HostEmbedding(200, 8, device=device, seed=4, optimizer="sgd", optimizer_options={"lr": 1.0})
    first = torch.tensor([1, 2, 3])
    second = torch.tensor([3, 4])  # row 3 is updated by the first step after the prefetch starts
    out = host(first)
    host.prefetch(second)
    out.sum().backward()
    host.step()
    got = host(second)
    if device == "cuda":
        torch.cuda.synchronize()
    torch.testing.assert_close(got.cpu(), host.weight[second])


@pytest.mark.gpu
def test_prefetch_keeps_the_hybrid_rows_it_reads_alive(monkeypatch, deferred_checks):
    """prefetch reads a hybrid table's device-resident rows on a side stream; when the current stream replaces them
    (set_hot_rows) before that read ran, their memory must not go to a new tensor that the current stream writes."""
    n, d, hot = 4096, 64, 1024
    host = speedtorch.PinnedEmbedding(n, d, torch.float32)
    host.set_optimizer("sgd", {}, True)
    host.normal_(0.0, 1.0, 0)
    # The Python HybridTable (placement="hybrid" itself is the C++ row cache, tests/python/test_row_cache.py).
    emb = HostEmbedding(n, d, device="cuda", placement="hybrid",
                        table=HybridTable(host, "cuda", hot, torch.arange(hot)))
    table = emb.table
    split = table._split
    sleep_cycles = 1

    def slow_split(ids):  # holds the side stream back between the split and the read of the hot rows
        out = split(ids)
        torch.cuda._sleep(sleep_cycles)
        return out

    monkeypatch.setattr(table, "_split", slow_split)
    # Deferred checks (the fixture): no index check waits for the side stream (a checked gather would sit out the
    # sleep first).
    rows_bytes = hot * d * 4
    # Round one loads every kernel (a first launch may wait for the whole device); round two holds the side stream
    # back ~0.5 s while the current stream replaces the hot rows and then takes every free cached block there is.
    for sleep_cycles, first in ((1, 0), (1_000_000_000, hot)):
        ids = torch.arange(first, first + hot, device="cuda")  # the hot rows
        expected = table.host.table()[first:first + hot].clone()  # equal to the device copies
        emb.prefetch(ids)
        old_rows = table.hot_table.data_ptr()
        emb.set_hot_rows(torch.arange(hot - first, 2 * hot - first, device="cuda"))
        stats = torch.cuda.memory_stats()
        free = stats["reserved_bytes.all.current"] - stats["allocated_bytes.all.current"]
        fillers = [torch.full((hot, d), float("nan"), device="cuda") for _ in range(free // rows_bytes + 1)]
        if sleep_cycles > 1:
            assert old_rows not in {f.data_ptr() for f in fillers}, "the rows the side stream reads went to a new tensor"
        got = emb(ids)
        torch.cuda.synchronize()
        torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0)
        del fillers


def test_autocast_forward_and_update():
    host, ref = make_pair(100, 8, "cpu", optimizer="sgd", optimizer_options={"lr": 0.1})
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    lin = torch.nn.Linear(8, 1)
    ids = torch.tensor([1, 2, 3, 2])
    before = host.weight.clone()
    outs = []
    for emb in (host, ref):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = lin(emb(ids))
        out.float().sum().backward()
        outs.append(out)
    assert outs[0].dtype == torch.bfloat16
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)
    host.step()
    opt.step()
    torch.testing.assert_close(host.weight, ref.weight.detach(), rtol=1e-6, atol=1e-6)
    assert not torch.equal(host.weight[1:4], before[1:4])  # the rows did move


def test_bad_arguments():
    with pytest.raises(ValueError, match="mode must be"):
        HostEmbedding(10, 4, mode="min")
    with pytest.raises(ValueError, match="update must be"):
        HostEmbedding(10, 4, update="later")
    with pytest.raises(RuntimeError, match="unknown optimizer"):
        HostEmbedding(10, 4, optimizer="lamb")
    e = speedtorch.PinnedEmbedding(10, 4)
    with pytest.raises(RuntimeError, match="no optimizer"):
        e.apply_gradients(torch.tensor([1]), torch.randn(1, 4))


def _placements(n, d):
    yield HostEmbedding(n, d, device="cpu")
    yield HostEmbedding(n, d, device="cpu", placement="gpu")  # a DeviceTable, here in CPU memory
    yield HostEmbedding(n, d, device="cpu", placement="hybrid", cache_rows=4)  # the C++ row cache
    host = speedtorch.PinnedEmbedding(n, d, torch.float32)
    host.set_optimizer("adam", {}, True)
    yield HostEmbedding(n, d, device="cpu", table=HybridTable(host, "cpu", 2, hot_rows=torch.tensor([1, 3])))


@pytest.mark.parametrize("index", range(4), ids=["host", "DeviceTable", "hybrid", "HybridTable"])
def test_an_out_of_range_id_is_named_where_the_caller_put_it(index):
    """Not by its position among the sorted distinct ids the table is asked for (6 and 0 here)."""
    emb = list(_placements(10, 4))[index]
    with pytest.raises(IndexError, match=r"input holds 12 at flat position 5 \(input\[1, 1\]\);") as e:
        emb(torch.tensor([[5, 3, 9, 1], [0, 12, 2, 12]]))
    assert "position 6" not in str(e.value)
    with pytest.raises(IndexError, match=r"input holds -1 at flat position 1;"):
        emb(torch.tensor([4, -1, 7]), torch.tensor([0]) if emb.mode else None)
    emb(torch.tensor([[9, 0]])).sum().backward()  # the module still works
    emb.step()


@pytest.mark.parametrize("optimizer", ["adamw", "rmsprop"])
def test_state_layouts_agree(optimizer):
    results = []
    for beside in (True, False):
        e = speedtorch.PinnedEmbedding(64, 6)
        e.normal_(0.0, 1.0, 9)
        e.set_optimizer(optimizer, {"lr": 0.1}, beside)
        assert (e.table().stride(0) > 6) == beside  # the layouts do differ: state beside the row or apart
        gen = torch.Generator().manual_seed(0)
        for _ in range(3):
            ids = torch.randint(0, 64, (30,), generator=gen)
            e.apply_gradients(ids, torch.randn(30, 6, generator=gen))
        results.append((e.table().clone(), e.state().clone()))
    torch.testing.assert_close(results[0], results[1], rtol=0, atol=0)


def test_scripted_training_step():
    @torch.jit.script
    def train_step(table: torch.classes.speedtorch.PinnedEmbedding, ids: torch.Tensor, target: torch.Tensor):
        rows = table.gather(ids, None).requires_grad_()
        loss = ((rows - target) ** 2).sum()
        grads = torch.autograd.grad([loss], [rows])
        grad = grads[0]
        assert grad is not None
        table.apply_gradients(ids, grad)
        return loss

    e = speedtorch.PinnedEmbedding(20, 3)
    e.normal_(0.0, 1.0, 0)
    e.set_optimizer("sgd", {"lr": 0.25}, True)
    ids = torch.tensor([2, 5, 2])
    target = torch.zeros(3)
    # The same steps in plain torch: nn.Embedding and torch.optim.SGD.
    ref = torch.nn.Embedding(20, 3)
    with torch.no_grad():
        ref.weight.copy_(e.table())
    opt = torch.optim.SGD(ref.parameters(), lr=0.25)
    for _ in range(2):
        loss = train_step(e, ids, target)
        opt.zero_grad()
        ref_loss = ((ref(ids) - target) ** 2).sum()
        ref_loss.backward()
        opt.step()
        torch.testing.assert_close(loss, ref_loss.detach())
        torch.testing.assert_close(e.table(), ref.weight.detach())


def test_rowwise_adagrad_everywhere(tmp_path):
    """Row-wise Adagrad through HostEmbedding equals the plain-torch reference, and its one float per row survives
    save / load, state_dict and TorchScript like every optimizer's state."""
    from helpers import RowwiseAdagrad

    n, d = 40, 8
    options = {"lr": 0.1, "eps": 1e-6}  # (weight decay is tested on the op, tests/python/test_row_optimizer.py)
    emb = HostEmbedding(n, d, optimizer="rowwise_adagrad", optimizer_options=options, device="cpu", seed=0)
    reference = torch.nn.Embedding(n, d, _weight=emb.weight.clone())
    opt = RowwiseAdagrad(reference.parameters(), **options)
    for step in range(4):
        ids = torch.randint(0, n, (24,), generator=torch.Generator().manual_seed(step))
        target = torch.randn(24, d, generator=torch.Generator().manual_seed(100 + step))
        (emb(ids) * target).sum().backward()
        emb.step()
        opt.zero_grad()
        (reference(ids) * target).sum().backward()
        opt.step()  # rows outside the batch have a zero gradient: neither they nor their sums move
    torch.testing.assert_close(emb.weight, reference.weight.detach(), rtol=1e-5, atol=1e-6)
    assert emb.table.state().shape == (n, 4)

    emb.save(str(tmp_path / "rw"))
    loaded = HostEmbedding.load(str(tmp_path / "rw"))
    assert loaded.table.optimizer() == "rowwise_adagrad" and torch.equal(loaded.table.state(), emb.table.state())
    other = HostEmbedding(n, d, optimizer="rowwise_adagrad", optimizer_options=options, device="cpu")
    other.load_state_dict(emb.state_dict())
    assert torch.equal(other.weight, emb.weight) and torch.equal(other.table.state(), emb.table.state())

    class Scripted(torch.nn.Module):
        def __init__(self, table):
            super().__init__()
            self.table = table

        def forward(self, ids: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
            self.table.apply_gradients(ids, grad)
            return self.table.gather(ids, None)

    table = speedtorch.PinnedEmbedding(n, d)
    table.set_optimizer("rowwise_adagrad", options, True)
    rows = torch.jit.script(Scripted(table))(torch.tensor([3]), torch.ones(1, d))
    torch.testing.assert_close(rows, table.table()[3:4])
    assert torch.allclose(table.state()[3, 1], torch.tensor(1.0))  # the mean of the squared ones


def test_module_conversions_reach_a_model_holding_one():
    """nn.Module.to / .float() / .cpu() walk every child's _apply(fn): HostEmbedding once defined its own _apply
    (for its updates), so moving any model that held one raised a TypeError."""
    model = torch.nn.Sequential(HostEmbedding(10, 4, device="cpu"), torch.nn.Linear(4, 1))
    model.to("cpu").float()
    assert model(torch.tensor([1, 2])).shape == (2, 1)


def test_distinct_rows_are_forwards_rows_before_pooling():
    """distinct_rows (what HostEmbeddingBagCollection pools) renormalises by max_norm as forward does, and a frozen
    table's rows need no gradient."""
    ids = torch.tensor([[4, 1], [4, 7]])
    host = HostEmbedding(10, 4, max_norm=1.0, init_std=3.0, seed=0, device="cpu", optimizer="sgd")
    inverse, rows = host.distinct_rows(ids)
    assert rows.requires_grad and torch.equal(rows[inverse], host(ids))
    norms = torch.linalg.vector_norm(rows.detach(), dim=1)
    assert bool((norms <= 1.0 + 1e-5).all()) and bool((norms > 0.99).all())
    torch.testing.assert_close(host.weight[torch.tensor([1, 4, 7])], rows.detach())  # renormalised in the table
    frozen = HostEmbedding(10, 4, device="cpu", optimizer=None)
    assert not frozen.distinct_rows(ids)[1].requires_grad
