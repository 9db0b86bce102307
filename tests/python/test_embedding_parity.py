"""HostEmbedding against nn.Embedding / nn.EmbeddingBag option by option: the same script run with each, the same
results (padding_idx, max_norm, from_pretrained, mode="max", include_last_offset, per_sample_weights,
scale_grad_by_freq, frozen tables, NumPy and list ids)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import speedtorch
from speedtorch.nn import HostEmbedding
from speedtorch.optim import HostEmbeddingOptimizer

N, D = 60, 6


def pair(embedding_kwargs=None, bag=None, optimizer="sgd", lr=0.5, **host_kwargs):
    """A HostEmbedding and the nn module it replaces, with the same rows, and an optimizer for each: SGD, or for
    "adam" / "sparse_adam" torch's SparseAdam and the table's "sparse_adam" (the same arithmetic)."""
    embedding_kwargs = dict(embedding_kwargs or {})
    host_optimizer = "sgd" if optimizer == "sgd" else "sparse_adam"
    host = HostEmbedding(N, D, device="cpu", seed=3, optimizer=host_optimizer, optimizer_options={"lr": lr},
                         mode=bag, **embedding_kwargs, **host_kwargs)
    # torch has no sparse gradient with scale_grad_by_freq or mode="max": a dense one there (the same SGD update).
    sparse = not embedding_kwargs.get("scale_grad_by_freq") and bag != "max"
    if bag is None:
        ref = torch.nn.Embedding(N, D, sparse=sparse, **embedding_kwargs)
    else:
        ref = torch.nn.EmbeddingBag(N, D, mode=bag, sparse=sparse, **embedding_kwargs)
    with torch.no_grad():
        ref.weight.copy_(host.weight)
    ref_opt = (torch.optim.SGD if optimizer == "sgd" else torch.optim.SparseAdam)(ref.parameters(), lr=lr)
    return host, HostEmbeddingOptimizer(host), ref, ref_opt


def run_script(emb, opt, batches, bag):
    """One training script, whichever module it gets."""
    outs = []
    gen = torch.Generator().manual_seed(9)
    for ids, offsets, weights in batches:
        args = (ids,) if bag is None else (ids, offsets, weights)
        out = emb(*args)
        outs.append(out.detach().clone())
        (out * torch.randn(out.shape, generator=gen)).sum().backward()
        opt.step()
        opt.zero_grad()
    return outs


def compare(host, host_opt, ref, ref_opt, batches, bag=None):
    got = run_script(host, host_opt, batches, bag)
    expected = run_script(ref, ref_opt, batches, bag)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(host.weight, ref.weight.detach(), rtol=1e-5, atol=1e-6)


def batches(shape=(5, 4), count=4, with_padding=None):
    gen = torch.Generator().manual_seed(1)
    out = []
    for _ in range(count):
        ids = torch.randint(0, 20, shape, generator=gen)
        if with_padding is not None:
            ids[0, 0] = with_padding
            ids[1, :2] = with_padding
        out.append((ids, None, None))
    return out


@pytest.mark.parametrize("optimizer", ["sgd", "sparse_adam"])
def test_the_same_script_trains_both_alike(optimizer):
    host, host_opt, ref, ref_opt = pair(optimizer=optimizer, lr=0.05)
    if optimizer == "sparse_adam":  # torch's default eps: "sparse_adam" adds it where SparseAdam does
        host_opt = HostEmbeddingOptimizer(host)
        ref_opt = torch.optim.SparseAdam(ref.parameters(), lr=0.05)
    compare(host, host_opt, ref, ref_opt, batches())


@pytest.mark.parametrize("padding_idx", [4, -2])
def test_padding_idx(padding_idx):
    host, host_opt, ref, ref_opt = pair({"padding_idx": padding_idx}, optimizer="adam", lr=0.05)
    row = padding_idx % N
    assert torch.count_nonzero(host.weight[row]) == 0  # starts at zero, as nn.Embedding's
    with torch.no_grad():  # nonzero, to see that it never moves
        host.weight[row] = 1.0
        ref.weight[row] = 1.0
    state = host.table.state()[row].clone()
    compare(host, host_opt, ref, ref_opt, batches(with_padding=row))
    assert torch.equal(host.weight[row], torch.ones(D))
    assert torch.equal(host.table.state()[row], state)  # no gradient, no update: its state never moved


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_bags_with_padding_idx(mode):
    host, host_opt, ref, ref_opt = pair({"padding_idx": 7}, bag=mode)
    gen = torch.Generator().manual_seed(2)
    data = []
    for _ in range(3):
        ids = torch.randint(0, 20, (14,), generator=gen)
        ids[[0, 5, 6]] = 7
        data.append((ids, torch.tensor([0, 4, 4, 9]), None))
    compare(host, host_opt, ref, ref_opt, data, bag=mode)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_bag_modes_and_include_last_offset(mode):
    host, host_opt, ref, ref_opt = pair({"include_last_offset": True}, bag=mode)
    gen = torch.Generator().manual_seed(4)
    data = [(torch.randint(0, 20, (12,), generator=gen), torch.tensor([0, 3, 3, 8, 12]), None) for _ in range(3)]
    compare(host, host_opt, ref, ref_opt, data, bag=mode)


def test_per_sample_weights():
    host, host_opt, ref, ref_opt = pair(bag="sum")
    gen = torch.Generator().manual_seed(6)
    data = [(torch.randint(0, 20, (10,), generator=gen), torch.tensor([0, 2, 7]), torch.rand(10, generator=gen))
            for _ in range(3)]
    compare(host, host_opt, ref, ref_opt, data, bag="sum")
    # 2-D input: fixed-size bags, no offsets.
    host2, host_opt2, ref2, ref_opt2 = pair(bag="sum")
    data = [(torch.randint(0, 20, (3, 4), generator=gen), None, torch.rand(3, 4, generator=gen)) for _ in range(2)]
    compare(host2, host_opt2, ref2, ref_opt2, data, bag="sum")


def test_max_norm_renormalises_the_rows_in_the_table():
    host, host_opt, ref, ref_opt = pair({"max_norm": 1.5, "norm_type": 2.0}, lr=0.1)
    with torch.no_grad():
        host.weight.mul_(3.0)
        ref.weight.mul_(3.0)
    compare(host, host_opt, ref, ref_opt, batches())
    touched = torch.unique(torch.cat([b[0].reshape(-1) for b in batches()]))
    untouched = torch.ones(N, dtype=torch.bool)
    untouched[touched] = False
    assert torch.equal(host.weight[untouched], ref.weight.detach()[untouched])  # never looked up: left as they were


def test_scale_grad_by_freq():
    host, host_opt, ref, ref_opt = pair({"scale_grad_by_freq": True})
    compare(host, host_opt, ref, ref_opt, batches())


def test_from_pretrained_is_frozen_by_default():
    vectors = torch.randn(N, D)
    host = HostEmbedding.from_pretrained(vectors, device="cpu")
    ref = torch.nn.Embedding.from_pretrained(vectors)
    ids = torch.tensor([[1, 2], [3, 1]])
    out = host(ids)
    torch.testing.assert_close(out, ref(ids))
    assert not out.requires_grad and not host.trains and host.table.optimizer() == ""
    assert host.table.nbytes() < N * D * 4 + 4096  # no optimizer state at all
    with pytest.raises(ValueError, match="no HostEmbedding with an optimizer"):
        HostEmbeddingOptimizer(host)
    # From a NumPy array, trainable, as a bag.
    bag = HostEmbedding.from_pretrained(vectors.numpy(), freeze=False, mode="mean", optimizer="sgd",
                                        optimizer_options={"lr": 1.0}, device="cpu")
    ref_bag = torch.nn.EmbeddingBag.from_pretrained(vectors, freeze=False, mode="mean")
    torch.testing.assert_close(bag(ids), ref_bag(ids))
    bag(ids).sum().backward()
    bag.step()
    assert not torch.equal(bag.weight, vectors)


def test_loading_a_plain_npy_gives_a_frozen_table(tmp_path):
    """Loading GloVe-style vectors (a plain .npy) must not attach Adam state (3x the memory) behind the user's back."""
    vectors = np.random.default_rng(0).standard_normal((N, D)).astype(np.float32)
    np.save(tmp_path / "glove.npy", vectors)
    frozen = HostEmbedding.load(tmp_path / "glove.npy", device="cpu")
    assert frozen.table.optimizer() == "" and not frozen.trains
    np.testing.assert_array_equal(frozen.weight.numpy(), vectors)
    assert not frozen(torch.tensor([1])).requires_grad
    trained = HostEmbedding.load(tmp_path / "glove.npy", device="cpu", optimizer="adagrad")
    assert trained.table.optimizer() == "adagrad" and trained.trains
    # A table saved with its optimizer keeps it.
    trained.save(tmp_path / "t.npy")
    assert HostEmbedding.load(tmp_path / "t.npy", device="cpu").table.optimizer() == "adagrad"


def test_numpy_and_list_ids():
    host = HostEmbedding(N, D, device="cpu", seed=0)
    expected = host(torch.tensor([[1, 5], [7, 1]]))
    torch.testing.assert_close(host(np.array([[1, 5], [7, 1]], dtype=np.int32)), expected)
    torch.testing.assert_close(host([[1, 5], [7, 1]]), expected)
    bag = HostEmbedding(N, D, device="cpu", seed=0, mode="sum")
    torch.testing.assert_close(bag(np.array([1, 5, 7, 1]), np.array([0, 2])), bag(torch.tensor([1, 5, 7, 1]),
                                                                              torch.tensor([0, 2])))
    with pytest.raises(TypeError, match="must be integers"):
        host(np.array([1.5]))
    with pytest.raises(TypeError, match="must be integers"):
        host([0.5, 1.0])


def test_bad_options():
    with pytest.raises(ValueError, match="padding_idx must be within"):
        HostEmbedding(10, 4, padding_idx=10)
    with pytest.raises(ValueError, match="include_last_offset needs mode"):
        HostEmbedding(10, 4, include_last_offset=True)
    with pytest.raises(ValueError, match="mode must be"):
        HostEmbedding(10, 4, mode="min")
    with pytest.raises(ValueError, match="max_norm must be > 0"):
        HostEmbedding(10, 4, max_norm=0.0)
    host = HostEmbedding(10, 4, device="cpu")
    with pytest.raises(ValueError, match="offsets and per_sample_weights need mode"):
        host(torch.tensor([1]), torch.tensor([0]))


def test_the_module_repr_names_the_options():
    text = repr(HostEmbedding(10, 4, 2, max_norm=1.0, mode="max", device="cpu", optimizer=None))
    assert "padding_idx=2" in text and "max_norm=1.0" in text and "mode=max" in text and "optimizer=None" in text
    assert speedtorch.nn.HostEmbedding.from_pretrained.__doc__
