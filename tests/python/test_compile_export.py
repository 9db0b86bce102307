"""torch.compile(fullgraph=True) and torch.export over the speedtorch operators: no graph break, same results as
eager. (A PinnedEmbedding is used inside compiled code through its table: see docs/torchscript.md.)"""

from __future__ import annotations

import inspect

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
    from speedtorch.serving.quantized import quantize_rows

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


# --- a model holding a HostEmbedding -----------------------------------------------------------------------------

from speedtorch.nn import HostEmbedding  # noqa: E402


class Recommender(torch.nn.Module):
    def __init__(self, **kwargs):
        super().__init__()
        self.users = HostEmbedding(300, 8, device="cpu", seed=0, **kwargs)
        self.head = torch.nn.Linear(8, 1)

    def forward(self, ids, offsets=None):
        rows = self.users(ids) if offsets is None else self.users(ids, offsets)
        return self.head(rows).squeeze(-1)


@pytest.mark.parametrize("mode", [None, "sum", "max"])
def test_compile_fullgraph_of_a_model_holding_a_host_embedding(mode):
    model = Recommender(mode=mode, padding_idx=3)
    ids = torch.tensor([[1, 3, 5], [7, 7, 2]])
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        torch.testing.assert_close(compiled(ids), model(ids))
    model.eval()  # in eval mode a lookup holds no gradient for the table either: it compiles whole
    torch.testing.assert_close(compiled(ids), model(ids))


def test_compiled_training_breaks_the_graph_at_the_table_and_trains_like_eager():
    """Training under torch.compile: the table hands its gradient to its module in backward, a side effect no graph
    holds, so the graph breaks around it (fullgraph=True cannot hold it) and the rest compiles; same numbers."""
    models = [Recommender(optimizer="adam", optimizer_options={"lr": 0.1}) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    compiled = torch.compile(models[1], backend="aot_eager")
    for model, run in ((models[0], models[0]), (models[1], compiled)):
        opt = torch.optim.SGD(model.head.parameters(), lr=0.1)
        for step in range(3):
            ids = torch.tensor([[1, 2], [2, step]])
            run(ids).pow(2).sum().backward()
            model.users.step()
            opt.step()
            opt.zero_grad()
    torch.testing.assert_close(models[1].users.weight, models[0].users.weight)
    torch.testing.assert_close(models[1].head.weight, models[0].head.weight)


def test_export_of_a_model_holding_a_host_embedding():
    model = Recommender(mode="mean").eval()
    ids = torch.tensor([1, 3, 5, 7, 7, 2])
    offsets = torch.tensor([0, 2])
    exported = torch.export.export(model, (ids, offsets))
    assert "speedtorch.gather" in exported.graph_module.code
    torch.testing.assert_close(exported.module()(ids, offsets), model(ids, offsets))


def test_jit_script_of_a_host_embedding():
    for kwargs in ({}, {"mode": "sum", "padding_idx": 4}, {"max_norm": 0.5}):
        eager = HostEmbedding(100, 8, device="cpu", seed=1, **kwargs)
        other = HostEmbedding(100, 8, device="cpu", seed=1, **kwargs)
        scripted = torch.jit.script(other)
        ids = torch.tensor([4, 1, 9, 4, 2])
        offsets = torch.tensor([0, 3]) if "mode" in kwargs else None
        with torch.no_grad():
            expected = eager(ids, offsets)
        torch.testing.assert_close(scripted(ids, offsets), expected)
        torch.testing.assert_close(other.weight, eager.weight)  # max_norm renormalised the same rows in both
    with pytest.raises(RuntimeError, match="TorchScript cannot hold"):
        torch.jit.script(HostEmbedding(10, 4, device="cpu", placement="gpu"))


@pytest.mark.gpu
def test_compile_fullgraph_of_a_host_table_read_by_the_gpu():
    model = Recommender(mode="sum").cuda()  # the head on the GPU; the table stays in host memory, read over UVA
    ids = torch.tensor([[1, 3, 5], [7, 7, 2]])
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(ids), model(ids))


# --- max_norm, placement="hybrid" (issue 25) ---------------------------------------------------------------------

_DISABLE_HAS_REASON = "reason" in inspect.signature(torch.compiler.disable).parameters


@pytest.mark.parametrize("mode", [None, "sum"])
def test_compile_and_export_of_a_max_norm_lookup(mode):
    """A max_norm lookup without gradient is in the graph: the rows come back renormalised, equal to eager's; the
    graph leaves the stored rows as they were (eager writes them back)."""
    torch._dynamo.reset()  # Recommender.forward compiled above: past the recompile limit dynamo would run it eagerly
    ids = torch.tensor([[1, 3, 5], [7, 7, 2]])
    eager = Recommender(mode=mode, max_norm=0.5).eval()
    with torch.no_grad():
        expected = eager(ids)
    assert not torch.equal(eager.users.weight, Recommender(mode=mode, max_norm=0.5).users.weight)  # written back
    model = Recommender(mode=mode, max_norm=0.5).eval()
    model.head.load_state_dict(eager.head.state_dict())
    before = model.users.weight.clone()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(ids), expected)
    torch.testing.assert_close(torch.export.export(model, (ids,)).module()(ids), expected)
    assert torch.equal(model.users.weight, before)


def test_hybrid_placement_under_compile_and_export():
    """placement='hybrid' keeps rows in a row cache no graph can hold: torch.compile breaks the graph around the
    lookup (same results), fullgraph=True and torch.export refuse it saying so, and a host copy exports."""
    torch._dynamo.reset()
    model = Recommender(placement="hybrid", cache_rows=32).eval()
    ids = torch.tensor([[1, 3, 5], [7, 7, 2]])
    with torch.no_grad():
        expected = model(ids)
        with pytest.raises(Exception, match="placement='hybrid'" if _DISABLE_HAS_REASON else "disable"):
            torch.compile(model, fullgraph=True, backend="eager")(ids)
        torch._dynamo.reset()
        torch.testing.assert_close(torch.compile(model, backend="eager")(ids), expected)
    with pytest.raises(RuntimeError, match="torch.export of a HostEmbedding with placement='hybrid' is not "
                                           "supported.*placement='host'"):
        torch.export.export(model, (ids,))
    model.users = HostEmbedding.from_pretrained(model.users.weight)  # the advised copy: placement='host'
    torch.testing.assert_close(torch.export.export(model, (ids,)).module()(ids), expected)


@pytest.mark.skipif(not _DISABLE_HAS_REASON, reason="torch.compiler.disable(reason=) needs a newer torch")
def test_fullgraph_refusal_of_a_training_lookup_says_why():
    torch._dynamo.reset()
    model = Recommender(optimizer="adam")
    with pytest.raises(Exception, match="a lookup that trains the table runs outside the graph"):
        torch.compile(model, fullgraph=True, backend="eager")(torch.tensor([[1, 2]]))
