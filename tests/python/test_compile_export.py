"""torch.compile(fullgraph=True) and torch.export over the speedtorch operators: no graph break, same results as
eager. (A PinnedEmbedding is used inside compiled code through its table: see docs/torchscript.md.)"""

from __future__ import annotations

import pytest
import torch

import speedtorch


class Scorer(torch.nn.Module):
    def __init__(self, table: torch.Tensor):
        super().__init__()
        self.table = table
        self.head = torch.nn.Linear(table.shape[1], 1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.ops.speedtorch.gather(self.table, ids)).squeeze(-1)


def make_scorer():
    emb = speedtorch.PinnedEmbedding(200, 16)
    emb.normal_(0.0, 1.0, 0)
    return Scorer(emb.table())


@pytest.mark.parametrize("backend", ["eager", "inductor"])
def test_compile_fullgraph_gather(backend):
    model = make_scorer()
    ids = torch.randint(0, 200, (8, 3))
    compiled = torch.compile(model, fullgraph=True, backend=backend)
    torch.testing.assert_close(compiled(ids), model(ids))
    other = torch.randint(0, 200, (5, 3))  # a second shape compiles too
    torch.testing.assert_close(compiled(other), model(other))


def test_compile_scatter_is_functionalized():
    table = torch.randn(50, 4)
    ids = torch.tensor([3, 7, 3])
    src = torch.randn(3, 4)
    expected = table.clone()
    expected[7] = src[1]
    expected[3] = src[2]

    @torch.compile(fullgraph=True, backend="aot_eager")
    def write(t, i, s):
        speedtorch.scatter_(t, i, s)
        return t.sum()

    write(table, ids, src)
    torch.testing.assert_close(table, expected)


def test_export_gather():
    model = make_scorer()
    ids = torch.randint(0, 200, (6, 2))
    exported = torch.export.export(model, (ids,))
    assert "speedtorch.gather" in exported.graph_module.code
    torch.testing.assert_close(exported.module()(ids), model(ids))


def test_ngram_hash_scripts_exports_and_compiles():
    """speedtorch.ngram.NgramHash (the ngram_hash op over its buffers) in TorchScript, torch.export and
    torch.compile(fullgraph=True), equal to eager."""
    from speedtorch.ngram import NgramHash

    module = NgramHash(1000, 31, heads=2, max_order=3)
    tokens = torch.randint(0, 1000, (2, 7))
    expected = module(tokens)
    assert torch.equal(torch.jit.script(module)(tokens), expected)
    exported = torch.export.export(module, (tokens,))
    assert "speedtorch.ngram_hash" in exported.graph_module.code
    assert torch.equal(exported.module()(tokens), expected)
    assert torch.equal(torch.compile(module, fullgraph=True, backend="eager")(tokens), expected)


def test_gather_dequant_compiles_and_exports():
    from speedtorch.quantized import quantize_rows

    table = quantize_rows(torch.randn(100, 32), "int8_rowwise")

    class Lookup(torch.nn.Module):
        def forward(self, ids):
            return torch.ops.speedtorch.gather_dequant(table, ids, "int8_rowwise", 32).float().sum(-1)

    ids = torch.randint(0, 100, (4, 3))
    expected = Lookup()(ids)
    torch.testing.assert_close(torch.compile(Lookup(), fullgraph=True, backend="eager")(ids), expected)
    assert torch.equal(torch.export.export(Lookup(), (ids,)).module()(ids), expected)


@pytest.mark.gpu
def test_compile_pinned_table_to_gpu():
    emb = speedtorch.PinnedEmbedding(1000, 32)
    emb.normal_(0.0, 1.0, 1)
    table = emb.table()

    @torch.compile(fullgraph=True)
    def score(ids):
        return torch.ops.speedtorch.gather(table, ids).sum(-1)

    ids = torch.randint(0, 1000, (64,), device="cuda")
    torch.testing.assert_close(score(ids), table[ids.cpu()].sum(-1).cuda())
