"""Rows read ahead (HostEmbedding.prefetch, speedtorch/nn/_prefetched_rows.py) stay exact while the table changes: every
update after a prefetch hands it the rows it changes (the fused step's ``updated_rows`` output), so the forward that
takes them equals one that reads the table; a prefetch the next forward does not use is dropped, not tracked for
ever (issue 31, item 6); ``PinnedEmbedding.apply_gradients(..., updated_rows=)`` returns exactly the rows it wrote,
and refuses what it cannot fill."""

from __future__ import annotations

import pytest
import torch

import speedtorch
from speedtorch import HostEmbeddingBagCollection, TableConfig
from speedtorch.nn import HostEmbedding

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
# Dims and optimizers that reach each kernel of the fused step on a GPU: row-wise Adagrad on 128-wide rows (the
# 16-byte kernel), on 16-wide rows (the register kernel); Adam on 16 (the 4-wide kernel) and 7 (the scalar kernel).
KERNELS = [("rowwise_adagrad", 128), ("rowwise_adagrad", 16), ("adam", 16), ("adam", 7), ("sgd", 8)]


def trained_pair(device, optimizer, dim, dtype=torch.float32):
    def build():
        return HostEmbedding(64, dim, optimizer=optimizer, optimizer_options={"lr": 0.1}, device=device, seed=3,
                             dtype=dtype)
    return build(), build()


@pytest.fixture(params=["patch", "advance"])
def way(request, monkeypatch):
    """How the rows read ahead are kept exact on the CPU: the update's new rows (patch), or the GPU's way, the update
    applied to the rows and state read ahead (advance). On a GPU a host table always advances."""
    monkeypatch.setattr(HostEmbedding, "_advance_on_cpu", request.param == "advance")
    return request.param


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("optimizer,dim", KERNELS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_read_ahead_take_every_update_made_after_them(device, optimizer, dim, dtype, way):
    ahead, plain = trained_pair(device, optimizer, dim, dtype)
    first = torch.tensor([[1, 5, 9, 5], [40, 2, 9, 63]])
    following = torch.tensor([[5, 9, 11], [63, 0, 1]])  # shares rows 1, 5, 9, 63 with the first batch
    for module, prefetch in ((ahead, True), (plain, False)):
        out = module(first)
        if prefetch:
            module.prefetch(following)  # reads rows the step below then changes
        (out.float() * torch.arange(out.numel(), device=out.device).view_as(out)).sum().backward()
        module.step()
    # 16-bit tables round stochastically by default: their update draws bits from the row id, so it is not advanced.
    rounds = bool(ahead.table.optimizer_options().get("stochastic_rounding", 0.0))
    assert (ahead._prefetched.state is not None) == ((way == "advance" or device == "cuda") and not rounds)
    got, expected = ahead(following), plain(following)
    assert ahead._prefetched is None  # taken
    assert torch.equal(got, expected)
    assert torch.equal(ahead.weight.cpu(), plain.weight.cpu())


@pytest.mark.parametrize("device", DEVICES)
def test_updates_in_backward_and_renormalised_rows_reach_the_rows_read_ahead(device, way):
    def build():
        return HostEmbedding(32, 8, optimizer="adagrad", optimizer_options={"lr": 0.5}, device=device, seed=1,
                             max_norm=1.0, update="backward", init_std=2.0)
    ahead, plain = build(), build()
    following = torch.tensor([3, 4, 30])
    for module, prefetch in ((ahead, True), (plain, False)):
        if prefetch:
            module.prefetch(following)  # before the forward that renormalises and updates rows 3 and 4
        module(torch.tensor([3, 4, 4, 7])).sum().backward()
    assert torch.equal(ahead(following), plain(following))


def test_a_prefetch_the_next_forward_does_not_use_is_dropped():
    module = HostEmbedding(50, 4, optimizer="sgd", optimizer_options={"lr": 0.1})
    module.prefetch(torch.tensor([1, 2, 3]))
    for _ in range(3):  # forwards of other ids, and their updates: nothing is kept for the unused prefetch
        module(torch.tensor([2, 4])).sum().backward()
        module.step()
        assert module._prefetched is None
    collection = HostEmbeddingBagCollection([TableConfig("a", 20, 4), TableConfig("b", 30, 4)], optimizer="sgd")
    collection.prefetch(torch.tensor([[1, 2], [3, 4]]))
    for _ in range(3):
        collection(torch.tensor([[5, 6]])).sum().backward()
        collection.step()
        assert collection._prefetched is None
        assert all(group._prefetched is None for group in collection.groups)


def test_drop_prefetch_forgets_it():
    module = HostEmbedding(10, 4, optimizer="sgd")
    ids = torch.tensor([1, 2])
    module.prefetch(ids)
    module.drop_prefetch()
    assert module._prefetched is None
    assert torch.equal(module(ids), module.weight[ids])


def test_a_prefetch_refuses_ids_out_of_range_naming_the_callers_position():
    module = HostEmbedding(10, 4)
    with pytest.raises(IndexError, match="10"):
        module.prefetch(torch.tensor([[1, 2], [10, 3]]))
    assert module._prefetched is None


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("optimizer,dim", KERNELS)
def test_apply_gradients_hands_back_the_rows_it_wrote(device, optimizer, dim):
    table = speedtorch.PinnedEmbedding(100, dim)
    table.normal_(0.0, 1.0, 4)
    table.set_optimizer(optimizer, {"lr": 0.1})
    ids = torch.tensor([3, 7, 8, 50, 99], device=device)
    grad = torch.randn(5, dim, generator=torch.Generator().manual_seed(2)).to(device)
    out = torch.full((5, dim), float("nan"), device=device)
    table.apply_gradients(ids, grad, True, out)
    if device == "cuda":
        torch.cuda.synchronize()
    assert torch.equal(out.cpu(), table.table()[ids.cpu()])


def test_apply_gradients_refuses_updated_rows_it_cannot_fill():
    table = speedtorch.PinnedEmbedding(10, 4)
    table.set_optimizer("sgd", {"lr": 0.1})
    ids, grad = torch.tensor([1, 2]), torch.ones(2, 4)
    before = table.table().clone()
    with pytest.raises(RuntimeError, match="sorted_unique"):
        table.apply_gradients(ids, grad, False, torch.empty(2, 4))
    with pytest.raises(RuntimeError, match=r"shape \(2, 4\)"):
        table.apply_gradients(ids, grad, True, torch.empty(3, 4))
    with pytest.raises(RuntimeError, match="dtype"):
        table.apply_gradients(ids, grad, True, torch.empty(2, 4, dtype=torch.float64))
    assert torch.equal(table.table(), before) and table.step_count() == 0  # refused before anything changed


@pytest.mark.parametrize("device", DEVICES)
def test_two_updates_before_the_forward_advance_the_rows_read_ahead_twice(device, way):
    """Two updates between the prefetch and its forward (two backward passes with update="backward"): the rows and
    state read ahead follow both."""
    def build():
        return HostEmbedding(40, 8, optimizer="adam", optimizer_options={"lr": 0.1}, device=device, seed=2,
                             update="backward")
    ahead, plain = build(), build()
    following = torch.tensor([1, 2, 3, 30])
    for module, prefetch in ((ahead, True), (plain, False)):
        out = module(torch.tensor([2, 3, 5]))
        if prefetch:
            module.prefetch(following)
        out.sum().backward(retain_graph=True)  # update="backward": two updates of rows 2, 3, 5
        (out * 2).sum().backward()
    assert torch.equal(ahead(following), plain(following))
    assert torch.equal(ahead.weight.cpu(), plain.weight.cpu())


def test_copies_of_a_collection_start_without_its_prefetch():
    import copy
    import pickle

    collection = HostEmbeddingBagCollection([TableConfig("a", 20, 4), TableConfig("b", 30, 4)], optimizer="sgd")
    features = torch.tensor([[1, 2], [3, 4]])
    collection.prefetch(features)
    for copied in (copy.deepcopy(collection), pickle.loads(pickle.dumps(collection))):
        assert copied._prefetched is None
        assert all(group._prefetched is None for group in copied.groups)
        assert torch.equal(copied(features), collection(features))


@pytest.mark.parametrize("device", DEVICES)
def test_an_update_the_rows_read_ahead_are_refreshed_for_leaves_their_state_unused(device, monkeypatch):
    # Two updates between a prefetch and its forward, the first on ids not known to be sorted and distinct: the rows
    # read ahead are read again, but their optimizer state stays as read. The second update (sorted, distinct ids)
    # then advanced those rows with that older state: rows the plain loop does not have.
    monkeypatch.setattr(HostEmbedding, "_advance_on_cpu", True)
    ahead, plain = trained_pair(device, "adam", 8)
    ids = torch.tensor([1, 5, 9])
    grads = torch.arange(24, dtype=torch.float32).view(3, 8) / 10
    for module, prefetch in ((ahead, True), (plain, False)):
        if prefetch:
            module.prefetch(ids)
            assert module._prefetched.state is not None
        module._apply_gradients(ids.to(device), grads.to(device), sorted_unique=False)
        module._apply_gradients(ids.to(device), grads.to(device) * 2, sorted_unique=True)
    assert torch.equal(ahead(ids), plain(ids))
    assert torch.equal(ahead.weight.cpu(), plain.weight.cpu())
