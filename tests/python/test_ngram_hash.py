"""speedtorch::ngram_hash: bit for bit the plain-torch reference of the hash below (docs/engram.md states it) on CPU and
GPU, the paper's padding at sequence and document starts, the configuration helpers, bad input, opcheck, deferred
checks and CUDA graph capture (TorchScript and torch.export: test_compile_export.py)."""

from __future__ import annotations

import pytest
import torch

import speedtorch
from speedtorch.ngram import NgramHash, hash_multipliers, ngram_hash, prime_bucket_sizes

INT64_MAX = (1 << 63) - 1


def reference_ngram_hash(tokens, multipliers, bucket_sizes, pad_id, document_starts=None):
    """The hash in plain torch: for order n and head h, XOR over k < n of v_k * multipliers[h, k] (int64 products,
    wrapping), masked to 63 bits, modulo the column's size, plus the column's first row; v_k is the token k positions
    back, or pad_id once a lookback leaves the row or crosses a document start."""
    tokens = tokens.long()
    batch, seq = tokens.shape
    heads, max_order = multipliers.shape
    sizes = bucket_sizes.reshape(-1)
    offsets = (torch.cumsum(sizes, 0) - sizes).reshape(max_order - 1, heads)
    starts = torch.zeros(batch, seq, dtype=torch.bool) if document_starts is None else document_starts
    position = torch.arange(seq)
    blocked = torch.zeros(batch, seq, dtype=torch.bool)
    mix = torch.zeros(batch, seq, heads, dtype=torch.int64)
    columns = []
    for k in range(max_order):
        if k == 0:
            value = tokens
        else:
            back = torch.full_like(tokens, pad_id)
            back[:, k:] = tokens[:, :-k]
            crossed = torch.zeros_like(starts)  # a document starts at t - k + 1: t - k lies in an earlier one
            crossed[:, k - 1:] = starts[:, :seq - k + 1]
            blocked = blocked | (position < k) | crossed
            value = torch.where(blocked, torch.full_like(back, pad_id), back)
        mix = mix ^ (value.unsqueeze(-1) * multipliers[:, k])
        if k >= 1:
            columns.append(offsets[k - 1] + (mix & INT64_MAX) % bucket_sizes[k - 1])
    return torch.stack(columns, 2).reshape(batch, seq, (max_order - 1) * heads)


def python_int_hash(tokens, multipliers, bucket_sizes, pad_id):
    """The same hash one position at a time with Python integers (products reduced modulo 2**64 explicitly): the
    check that the torch reference's wrapping products are the op's."""
    heads, max_order = multipliers.shape
    sizes = bucket_sizes.reshape(-1).tolist()
    offsets = [sum(sizes[:c]) for c in range(len(sizes))]
    out = []
    for row in tokens.tolist():
        out_row = []
        for t in range(len(row)):
            values = [row[t - k] if t - k >= 0 else pad_id for k in range(max_order)]
            ids = [0] * ((max_order - 1) * heads)
            for h in range(heads):
                mix = 0
                for k in range(max_order):
                    mix ^= (values[k] % (1 << 64)) * (int(multipliers[h, k]) % (1 << 64)) % (1 << 64)
                    if k >= 1:
                        c = (k - 1) * heads + h
                        ids[c] = offsets[c] + (mix & INT64_MAX) % sizes[c]
            out_row.append(ids)
        out.append(out_row)
    return torch.tensor(out, dtype=torch.int64)


def config(heads=3, max_order=3, vocab=1000, rows=97, layer=1):
    return hash_multipliers(vocab, heads, max_order, layer=layer), prime_bucket_sizes(rows, heads, max_order)


@pytest.mark.parametrize("token_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("max_order", [2, 3, 4])
def test_matches_the_torch_reference(token_dtype, max_order):
    torch.manual_seed(max_order)
    multipliers, sizes = config(heads=4, max_order=max_order)
    tokens = torch.randint(0, 1000, (3, 17), dtype=token_dtype)
    starts = torch.rand(3, 17) < 0.2
    for document_starts in (None, starts):
        ids = ngram_hash(tokens, multipliers, sizes, 5, document_starts)
        assert ids.dtype == torch.int64 and ids.shape == (3, 17, (max_order - 1) * 4)
        assert torch.equal(ids, reference_ngram_hash(tokens, multipliers, sizes, 5, document_starts))


def test_wrapping_products_equal_python_integers():
    """Multipliers far above the paper's bound wrap modulo 2**64: the op, the torch reference and Python integers
    agree."""
    multipliers = torch.tensor([[0x7FFF_FFFF_FFFF_FFF1, 0x5DEE_CE66_D123_4567, 0x1234_5678_9ABC_DEF1]])
    sizes = torch.tensor([[1009], [2003]])
    tokens = torch.randint(0, 1 << 40, (2, 9))
    ids = ngram_hash(tokens, multipliers, sizes, 3)
    assert torch.equal(ids, python_int_hash(tokens, multipliers, sizes, 3))
    assert torch.equal(ids, reference_ngram_hash(tokens, multipliers, sizes, 3))


def test_padding_is_the_papers_and_documents_restart_it():
    multipliers, sizes = config()
    pad = 7
    tokens = torch.randint(0, 1000, (1, 12))
    ids = ngram_hash(tokens, multipliers, sizes, pad)
    # The positions before the sequence hash as pad_id: left-padding by hand gives the same ids.
    padded = torch.cat([torch.full((1, 2), pad), tokens], 1)
    assert torch.equal(ngram_hash(padded, multipliers, sizes, pad)[:, 2:], ids)
    # A document starting at position 5 hashes from there as a sequence of its own; before it nothing changes.
    starts = torch.zeros(1, 12, dtype=torch.bool)
    starts[0, 5] = True
    split = ngram_hash(tokens, multipliers, sizes, pad, starts)
    assert torch.equal(split[:, :5], ids[:, :5])
    assert torch.equal(split[:, 5:], ngram_hash(tokens[:, 5:], multipliers, sizes, pad))


def test_ids_stay_in_their_columns():
    multipliers, sizes = config(heads=5, max_order=4, rows=31)
    ids = ngram_hash(torch.randint(0, 1000, (4, 50)), multipliers, sizes, 0)
    flat = sizes.reshape(-1)
    first = torch.cumsum(flat, 0) - flat
    assert bool((ids >= first).all()) and bool((ids < first + flat).all())


def test_configuration_helpers_are_deterministic_and_documented():
    a = hash_multipliers(50_000, 8, 3, layer=2, seed=9)
    assert torch.equal(a, hash_multipliers(50_000, 8, 3, layer=2, seed=9))
    assert not torch.equal(a, hash_multipliers(50_000, 8, 3, layer=3, seed=9))  # per layer
    assert len(set(a[:, 0].tolist())) == 8  # per head
    assert bool((a % 2 == 1).all()) and int(a.max()) * 50_000 < 1 << 63  # odd; token * multiplier never wraps
    taken: set = set()
    first = prime_bucket_sizes([100, 200], 4, 3, taken)
    second = prime_bucket_sizes([100, 200], 4, 3, taken)
    values = first.reshape(-1).tolist() + second.reshape(-1).tolist()
    assert len(set(values)) == 16 and min(first[0].tolist()) >= 100 and min(first[1].tolist()) >= 200
    assert first[0].tolist() == [101, 103, 107, 109]  # the smallest primes from 100 up


def test_module_holds_the_configuration():
    module = NgramHash(1000, [50, 60], heads=2, max_order=3, pad_id=1, layer=4)
    assert module.num_rows == int(module.bucket_sizes.sum()) and module.columns == 4
    tokens = torch.randint(0, 1000, (2, 8))
    assert torch.equal(module(tokens), ngram_hash(tokens, module.multipliers, module.bucket_sizes, 1))
    restored = NgramHash(1000, 1)  # another configuration, overwritten by the state dict
    with pytest.raises(RuntimeError):
        restored.load_state_dict(module.state_dict())  # shapes differ: (8, 3) multipliers
    clone = NgramHash(1000, [50, 60], heads=2, max_order=3, pad_id=1, layer=0)
    clone.load_state_dict(module.state_dict())
    assert torch.equal(clone(tokens), module(tokens))


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        (dict(tokens=torch.zeros(2, 2, dtype=torch.int64)), ValueError, "fewer than the longest n-gram"),
        (dict(tokens=torch.tensor([[1, -4, 2]])), ValueError, "tokens holds -4 at flat position 1"),
        (dict(tokens=torch.zeros(2, 5)), RuntimeError, "tokens must be int64 or int32"),
        (dict(tokens=torch.zeros(5, dtype=torch.int64)), RuntimeError, "tokens must be 2-D"),
        (dict(sizes=torch.tensor([[5, 0], [3, 3]])), ValueError, "bucket_sizes holds 0"),
        (dict(sizes=torch.tensor([[5, 5]])), RuntimeError, "bucket_sizes must be int64 of shape"),
        (dict(multipliers=torch.ones(2, 3, dtype=torch.int32)), RuntimeError, "multipliers must be a 2-D int64"),
        (dict(multipliers=torch.ones(2, 1, dtype=torch.int64)), RuntimeError, "must be in \\[2, 8\\]"),
        (dict(starts=torch.zeros(2, 5, dtype=torch.int64)), RuntimeError, "document_starts must be bool"),
        (dict(pad=-1), ValueError, "pad_id must be >= 0"),
    ],
)
def test_bad_input_raises_clearly(change, error, message):
    args = dict(tokens=torch.ones(2, 5, dtype=torch.int64), multipliers=torch.ones(2, 3, dtype=torch.int64),
                sizes=torch.full((2, 2), 7), pad=0, starts=None)
    args.update(change)
    with pytest.raises(error, match=message):
        ngram_hash(args["tokens"], args["multipliers"], args["sizes"], args["pad"], args["starts"])


def test_opcheck():
    multipliers, sizes = config()
    tokens = torch.randint(0, 1000, (2, 6))
    starts = torch.zeros(2, 6, dtype=torch.bool)
    starts[1, 3] = True
    for args in ((tokens, multipliers, sizes, 2, None), (tokens.int(), multipliers, sizes, 2, starts)):
        torch.library.opcheck(torch.ops.speedtorch.ngram_hash.default, args)


@pytest.mark.gpu
def test_gpu_equals_cpu():
    multipliers, sizes = config(heads=8, max_order=4, rows=1 << 20)
    tokens = torch.randint(0, 1000, (5, 300))
    starts = torch.rand(5, 300) < 0.05
    for document_starts in (None, starts):
        expected = ngram_hash(tokens, multipliers, sizes, 3, document_starts)
        cuda_starts = None if document_starts is None else document_starts.cuda()
        got = ngram_hash(tokens.cuda().int(), multipliers.cuda(), sizes.cuda(), 3, cuda_starts)
        assert got.is_cuda and torch.equal(got.cpu(), expected)


@pytest.mark.gpu
def test_gpu_bad_tokens_raise_or_are_flagged_when_deferred(deferred_checks):
    multipliers, sizes = config()
    tokens = torch.tensor([[4, 5, -2, 6]], device="cuda")
    ids = ngram_hash(tokens, multipliers.cuda(), sizes.cuda(), 0)  # deferred: the kernel flags the token
    assert ids[0, 2].tolist() == [-1] * ids.shape[-1]
    with pytest.raises(ValueError, match="tokens holds -2 at flat position 2"):
        speedtorch.check_index_errors()
    with speedtorch.deferred_index_checks(False), pytest.raises(ValueError, match="tokens holds -2"):
        ngram_hash(tokens, multipliers.cuda(), sizes.cuda(), 0)


@pytest.mark.gpu
def test_gpu_capture_in_a_cuda_graph():
    multipliers, sizes = config()
    multipliers, sizes = multipliers.cuda(), sizes.cuda()
    tokens = torch.randint(0, 1000, (4, 16), device="cuda")
    ngram_hash(tokens, multipliers, sizes, 0)  # warm-up outside the graph
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        ids = ngram_hash(tokens, multipliers, sizes, 0)
    for _ in range(2):
        tokens.copy_(torch.randint(0, 1000, (4, 16), device="cuda"))
        graph.replay()
        assert torch.equal(ids.cpu(), reference_ngram_hash(tokens.cpu(), multipliers.cpu(), sizes.cpu(), 0))
