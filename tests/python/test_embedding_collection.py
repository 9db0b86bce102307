"""speedtorch.HostEmbeddingBagCollection: equal to one nn.EmbeddingBag per table (one-hot and multi-hot, sum and
mean, per-sample weights, several groups), one gather and one optimizer step per group, per-table errors, per-table
state_dict entries that survive regrouping and torch.distributed.checkpoint, placements that train alike."""

from __future__ import annotations

import copy

import pytest
import torch

import speedtorch
from speedtorch import HostEmbeddingBagCollection, SparseFeatures, TableConfig

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]

# Two groups: dim 8 (t0, t1, t3) and dim 4 (t2); t1 pools by mean, t3 serves two features.
TABLES = [TableConfig("t0", 30, 8), TableConfig("t1", 17, 8, pooling="mean"), TableConfig("t2", 11, 4),
          TableConfig("t3", 23, 8, feature_names=("f3a", "f3b"))]
FEATURES = ["t0", "t1", "t2", "f3a", "f3b"]
FEATURE_TABLE = ["t0", "t1", "t2", "t3", "t3"]


def make(device, tables=TABLES, **kwargs):
    kwargs.setdefault("optimizer", "sgd")
    kwargs.setdefault("optimizer_options", {"lr": 0.5})
    return HostEmbeddingBagCollection(tables, device=device, seed=0, **kwargs)


def reference_bags(collection):
    """One nn.EmbeddingBag per table, holding the collection's rows."""
    bags = {}
    for config in collection.tables:
        bag = torch.nn.EmbeddingBag(config.num_embeddings, config.embedding_dim, mode=config.pooling)
        with torch.no_grad():
            bag.weight.copy_(collection.weight(config.name).cpu())
        bags[config.name] = bag
    return bags


def random_bags(batch, generator, weighted=False):
    lengths = torch.randint(0, 4, (len(FEATURES) * batch,), generator=generator)
    rows = {c.name: c.num_embeddings for c in TABLES}
    values = torch.cat([torch.randint(0, rows[FEATURE_TABLE[f]], (int(n),), generator=generator)
                        for f, n in enumerate(lengths.view(len(FEATURES), batch).sum(1))])
    weights = torch.rand(values.numel(), generator=generator) if weighted else None
    return SparseFeatures(FEATURES, values, lengths, weights)


def reference_output(bags, features):
    if isinstance(features, torch.Tensor):
        return torch.cat([bags[FEATURE_TABLE[f]](features[:, f:f + 1]) for f in range(len(FEATURES))], dim=1)
    batch, offsets = features.batch_size, features.offsets()
    out = []
    for f in range(len(FEATURES)):
        start, end = int(offsets[f * batch]), int(offsets[(f + 1) * batch])
        weights = None if features.weights is None else features.weights[start:end]
        out.append(bags[FEATURE_TABLE[f]](features.values[start:end], offsets[f * batch:(f + 1) * batch] - start,
                                          per_sample_weights=weights))
    return torch.cat(out, dim=1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["one_hot", "bags"])
def test_forward_and_sgd_step_equal_one_embedding_bag_per_table(device, kind):
    collection = make(device)
    bags = reference_bags(collection)
    gen = torch.Generator().manual_seed(1)
    for _ in range(3):
        if kind == "one_hot":
            features = torch.stack([torch.randint(0, dict(t0=30, t1=17, t2=11, t3=23)[FEATURE_TABLE[f]], (6,),
                                                  generator=gen) for f in range(len(FEATURES))], dim=1)
        else:
            features = random_bags(6, gen)
        target = torch.randn(6, 8 * 4 + 4, generator=gen)
        out = collection(features)
        expected = reference_output(bags, features)
        assert out.shape == (6, 36)
        torch.testing.assert_close(out.cpu(), expected, rtol=1e-5, atol=1e-6)
        ((out - target.to(device)) ** 2).sum().backward()
        collection.step()
        ((expected - target) ** 2).sum().backward()
        with torch.no_grad():
            for bag in bags.values():
                bag.weight -= 0.5 * bag.weight.grad
                bag.weight.grad = None
    for config in TABLES:
        torch.testing.assert_close(collection.weight(config.name).cpu(), bags[config.name].weight.detach(),
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_per_sample_weights_and_empty_bags(dtype):
    tables = [TableConfig("a", 9, 4), TableConfig("b", 5, 4)]
    collection = make("cpu", tables, dtype=dtype)
    features = SparseFeatures(("a", "b"), torch.tensor([1, 8, 8, 4]), torch.tensor([0, 3, 1, 0]),
                              torch.tensor([0.5, 2.0, -1.0, 3.0]))
    out = collection(features)
    assert out.dtype == dtype
    a, b = collection.weight("a").float().clone(), collection.weight("b").float().clone()
    tol = dict(rtol=1e-2, atol=1e-2) if dtype == torch.bfloat16 else {}
    torch.testing.assert_close(out[0].float(), torch.cat([torch.zeros(4), 3.0 * b[4]]), **tol)
    torch.testing.assert_close(out[1].float(), torch.cat([0.5 * a[1] + 2.0 * a[8] - a[8], torch.zeros(4)]), **tol)
    grad = torch.randn(2, 8)
    out.backward(grad.to(dtype))
    collection.step()  # SGD, lr 0.5: each row moves by its weighted bags' gradients
    after = lambda name, row: collection.weight(name)[row].float()  # noqa: E731
    torch.testing.assert_close(after("a", 1), a[1] - 0.5 * 0.5 * grad[1, :4], **tol)
    torch.testing.assert_close(after("a", 8), a[8] - 0.5 * (2.0 - 1.0) * grad[1, :4], **tol)
    torch.testing.assert_close(after("b", 4), b[4] - 0.5 * 3.0 * grad[0, 4:], **tol)


def test_adagrad_matches_torch_sparse_adagrad():
    collection = make("cpu", [TableConfig("u", 40, 8), TableConfig("v", 25, 8)], optimizer="adagrad",
                      optimizer_options={"lr": 0.1})
    # Dense gradients: Adagrad leaves rows with a zero gradient as they are, as the lazy sparse update does.
    bags = {name: torch.nn.EmbeddingBag(n, 8, mode="sum") for name, n in (("u", 40), ("v", 25))}
    for name, bag in bags.items():
        with torch.no_grad():
            bag.weight.copy_(collection.weight(name))
    opt = torch.optim.Adagrad([b.weight for b in bags.values()], lr=0.1)
    gen = torch.Generator().manual_seed(2)
    for _ in range(4):
        ids = torch.stack([torch.randint(0, 10, (16,), generator=gen), torch.randint(0, 25, (16,), generator=gen)], 1)
        target = torch.randn(16, 16, generator=gen)
        ((collection(ids) - target) ** 2).sum().backward()
        collection.step()
        opt.zero_grad()
        out = torch.cat([bags["u"](ids[:, :1]), bags["v"](ids[:, 1:])], 1)
        ((out - target) ** 2).sum().backward()
        opt.step()
    for name, bag in bags.items():
        torch.testing.assert_close(collection.weight(name), bag.weight.detach(), rtol=1e-5, atol=1e-5)


class _CountingTable:
    """Forwards to a group's table, counting its gathers and optimizer steps."""

    def __init__(self, table):
        self._table, self.calls = table, {"gather": 0, "apply_gradients": 0}

    def __getattr__(self, name):
        if name in self.calls:
            self.calls[name] += 1
        return getattr(self._table, name)


def test_one_gather_and_one_optimizer_step_per_group():
    tables = [TableConfig(f"t{i}", 50 + i, 8) for i in range(26)] + [TableConfig("wide", 10, 16)]
    collection = make("cpu", tables)
    counters = []
    for group in collection.groups:
        group.table = _CountingTable(group.table)
        counters.append(group.table.calls)
    assert len(counters) == 2
    ids = torch.randint(0, 10, (32, 27))
    collection(ids).sum().backward()
    collection.step()
    assert counters == [{"gather": 1, "apply_gradients": 1}] * 2


@pytest.mark.parametrize("bad", [-1, 17])
@pytest.mark.parametrize("kind", ["one_hot", "bags"])
def test_an_id_out_of_its_tables_range_names_the_feature(kind, bad):
    collection = make("cpu")  # t1 has 17 rows; 17 is a row of the group (t3's), so only the per-table check sees it
    before = collection.weight("t3").clone()
    if kind == "one_hot":
        features = torch.tensor([[0, 1, 2, 3, 4], [5, bad, 6, 7, 8]])
        where = rf"input holds {bad} at flat position 6 \(input\[1, 1\]\)"
    else:
        features = SparseFeatures(FEATURES, torch.tensor([0, 1, bad, 2, 3, 4]), torch.tensor([1, 0, 0, 2, 1, 0, 1, 0,
                                                                                           1, 0]))
        where = rf"input.values holds {bad} at flat position 2"
    # The library's rule (speedtorch.ops.check_indices) words it, as HostEmbedding's: the feature, its table and
    # the table's rows, the id and where the caller put it.
    named = rf"feature 't1' \(table 't1'\): {where}; every index must be in \[0, 17\) for a table of 17 rows"
    with pytest.raises(IndexError, match=named):
        collection(features)
    with pytest.raises(IndexError, match=named):
        collection.prefetch(features)
    assert torch.equal(collection.weight("t3"), before)


@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("device", DEVICES)
def test_an_out_of_range_id_is_named_where_the_caller_put_it(device, index_dtype):
    """At its place in the caller's input: not among the group's sorted distinct ids, not in group or feature order.
    Several ids out of range: the first place holding one is named, whatever feature it is."""
    collection = make(device)
    rows = {f: c.num_embeddings for f, c in zip(FEATURES, [TABLES[0], TABLES[1], TABLES[2], TABLES[3], TABLES[3]])}
    gen = torch.Generator().manual_seed(5)
    one_hot = torch.stack([torch.randint(0, rows[f], (4,), generator=gen) for f in FEATURES], dim=1)
    one_hot[2, 4] = 23  # f3b (t3, 23 rows, the first group): flat position 14
    one_hot[3, 2] = 11  # t2 (11 rows, the second group, and an earlier feature): flat position 17
    with pytest.raises(IndexError, match=r"^HostEmbeddingBagCollection, feature 'f3b' \(table 't3'\): input holds 23 "
                                         r"at flat position 14 \(input\[2, 4\]\); every index must be in \[0, 23\)"):
        collection(one_hot.to(index_dtype))
    one_hot[2, 4] = 0
    with pytest.raises(IndexError, match=r"feature 't2' \(table 't2'\): input holds 11 at flat position 17 "
                                         r"\(input\[3, 2\]\); every index must be in \[0, 11\) for a table of 11 rows"):
        collection.prefetch(one_hot.to(index_dtype))

    # values and lengths: feature by feature, sample by sample (4 samples); f3a's bags start at value 1 + 0 + 5 = 6.
    lengths = torch.tensor([0, 1, 0, 0, 0, 0, 0, 0, 2, 1, 1, 1, 1, 1, 1, 0, 0, 0, 3, 3])
    values = torch.tensor([7, 5, 6, 1, 2, 3, 4, 22, -3, 5, 9, 0, 1, -7, 23])  # -3 at 8: f3a's 3rd id (sample 2's bag)
    kjt = SparseFeatures(FEATURES, values.to(index_dtype), lengths)
    with pytest.raises(IndexError, match=r"^HostEmbeddingBagCollection, feature 'f3a' \(table 't3'\): input.values "
                                         r"holds -3 at flat position 8; every index must be in \[0, 23\)"):
        collection(kjt)
    with pytest.raises(IndexError, match=r"feature 'f3a' \(table 't3'\): input.values holds -3 at flat position 8;"):
        collection.prefetch(kjt)
    values[8] = 1
    with pytest.raises(IndexError, match=r"feature 'f3b' \(table 't3'\): input.values holds -7 at flat position 13;"):
        collection(SparseFeatures(FEATURES, values.to(index_dtype), lengths))

    weights = {c.name: collection.weight(c.name).clone() for c in TABLES}
    assert all(torch.equal(collection.weight(name), w) for name, w in weights.items())  # nothing was touched
    values[13], values[14] = 2, 4
    collection(SparseFeatures(FEATURES, values.to(index_dtype), lengths)).sum().backward()  # it still works
    one_hot[3, 2] = 10
    collection(one_hot.to(index_dtype)).sum().backward()
    collection.step()


def test_bad_inputs_say_what_is_wrong():
    collection = make("cpu")
    with pytest.raises(ValueError, match="has 3 columns, the collection has 5 features"):
        collection(torch.zeros(2, 3, dtype=torch.int64))
    with pytest.raises(TypeError, match="int32/int64"):
        collection(torch.zeros(2, 5))
    with pytest.raises(ValueError, match="keys .* must be the collection's features, in order"):
        collection(SparseFeatures(("t1", "t0", "t2", "f3a", "f3b"), torch.zeros(0, dtype=torch.int64),
                                  torch.zeros(5, dtype=torch.int64)))
    with pytest.raises(ValueError, match="per-sample weights need sum pooling"):
        collection(SparseFeatures(FEATURES, torch.tensor([1]), torch.tensor([0, 0, 1, 0, 0]), torch.ones(1)))
    with pytest.raises(ValueError, match="lengths add up to 2, but there are 1 values"):
        SparseFeatures(FEATURES, torch.tensor([1]), torch.tensor([0, 0, 2, 0, 0]))
    with pytest.raises(ValueError, match="appears twice"):
        HostEmbeddingBagCollection([TableConfig("a", 3, 2), TableConfig("a", 3, 2)], device="cpu")
    with pytest.raises(ValueError, match="needs hot_fraction"):
        HostEmbeddingBagCollection([TableConfig("a", 3, 2)], device="cpu", placement="hybrid")


def _train(collection, steps=3, seed=3):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        features = random_bags(5, gen)
        collection(features).pow(2).sum().backward()
        collection.step()


def test_state_dict_is_per_table_and_loads_into_other_groupings():
    trained = make("cpu", optimizer="adam", optimizer_options={"lr": 0.1})
    _train(trained)
    state = trained.state_dict()
    assert {k.rsplit(".", 1)[0] for k in state} == {f"embedding_bags.{c.name}" for c in TABLES}
    assert int(state["embedding_bags.t0.optimizer_step"]) == 3
    # t0 in a group of its own here ("gpu" placement on the CPU: a device table): other groups, same tables.
    regrouped = [TableConfig("t0", 30, 8, placement="gpu"), *TABLES[1:]]
    other = make("cpu", regrouped, optimizer="adam", optimizer_options={"lr": 0.1})
    assert len(other.groups) == 3
    other.load_state_dict(torch.load(_save(state), weights_only=False))
    for config in TABLES:
        assert torch.equal(other.weight(config.name), trained.weight(config.name))
    gen = torch.Generator().manual_seed(4)
    features = random_bags(4, gen)
    assert torch.equal(other(features), trained(features))


def _save(state):
    import io

    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return buffer


def test_loading_refuses_mismatches_before_writing_anything():
    trained = make("cpu", optimizer="adam", optimizer_options={"lr": 0.1})
    _train(trained)
    state = trained.state_dict()
    # Other options (lr 0.2, amsgrad: a wider state) and one table of another size: nothing may change, options
    # included.
    fresh = make("cpu", [TableConfig("t0", 31, 8), *TABLES[1:]], optimizer="adam",
                 optimizer_options={"lr": 0.2, "amsgrad": 1})
    before = fresh.weight("t1").clone()
    with pytest.raises(RuntimeError, match="size mismatch for embedding_bags.t0.weight"):
        fresh.load_state_dict(state)
    assert torch.equal(fresh.weight("t1"), before)
    assert fresh.groups[0].table.optimizer_options()["lr"] == 0.2
    # Where everything fits, the checkpoint's options win and its state comes in their layout.
    other = make("cpu", optimizer="adam", optimizer_options={"lr": 0.2, "amsgrad": 1})
    other.load_state_dict(state)
    assert other.groups[0].table.optimizer_options()["lr"] == 0.1
    assert torch.equal(other.groups[0].table.state(), trained.groups[0].table.state())
    partial = {k: v for k, v in state.items() if not k.startswith("embedding_bags.t2.")}
    with pytest.raises(RuntimeError, match="Missing key.*embedding_bags.t2"):
        make("cpu", optimizer="adam", optimizer_options={"lr": 0.1}).load_state_dict(partial)
    # Entries the copy would refuse (integer rows) are refused with the rest, before the options change.
    fresh = make("cpu", optimizer="adam", optimizer_options={"lr": 0.2})
    with pytest.raises(RuntimeError, match="embedding_bags.t1.weight: expected floating-point values"):
        fresh.load_state_dict(dict(state, **{"embedding_bags.t1.weight": state["embedding_bags.t1.weight"].long()}))
    assert fresh.groups[0].table.optimizer_options()["lr"] == 0.2


def test_distributed_checkpoint_in_one_process(tmp_path):
    import torch.distributed.checkpoint as dcp

    trained = make("cpu", optimizer="rowwise_adagrad", optimizer_options={"lr": 0.1})
    _train(trained)
    dcp.save(trained.state_dict(), checkpoint_id=str(tmp_path))
    fresh = make("cpu", optimizer="rowwise_adagrad", optimizer_options={"lr": 0.1})
    state = fresh.state_dict()
    dcp.load(state, checkpoint_id=str(tmp_path))
    fresh.load_state_dict(state)
    for config in TABLES:
        assert torch.equal(fresh.weight(config.name), trained.weight(config.name))
    assert fresh.groups[0].table.step_count() == 3
    assert torch.equal(fresh.groups[0].table.state(), trained.groups[0].table.state())


@pytest.mark.gpu
def test_placements_train_alike_on_a_gpu():
    gen = torch.Generator().manual_seed(5)
    batches = [random_bags(8, gen) for _ in range(4)]
    results = []
    start = None
    for placement in ("host", "gpu", "hybrid"):
        collection = make("cuda", placement=placement, hot_fraction=0.3, optimizer="rowwise_adagrad",
                          optimizer_options={"lr": 0.1})
        # The same starting rows for every placement (a seed draws different values on the host and on a GPU).
        if start is None:
            start = copy.deepcopy(collection.state_dict())  # tensors and the optimizers' settings
        else:
            collection.load_state_dict(start)
        for features in batches:
            collection(features).pow(2).sum().backward()
            collection.step()
        torch.cuda.synchronize()
        results.append({c.name: collection.weight(c.name).cpu() for c in TABLES})
    for other in results[1:]:
        for name, rows in results[0].items():
            assert torch.equal(other[name], rows), name


def test_frozen_tables_keep_their_rows_and_have_no_optimizer_state():
    tables = [TABLES[0], TABLES[1], TableConfig("t2", 11, 4, frozen=True), TABLES[3]]
    collection = make("cpu", tables)
    before = {c.name: collection.weight(c.name).clone() for c in tables}
    _train(collection)
    assert torch.equal(collection.weight("t2"), before["t2"])
    assert not torch.equal(collection.weight("t0"), before["t0"])
    assert [g.trains for g in collection.groups] == [True, False]
    state = collection.state_dict()
    assert "embedding_bags.t2.optimizer_state" not in state and "embedding_bags.t0.optimizer_state" in state
    fresh = make("cpu", tables)
    fresh.load_state_dict(state)
    assert all(torch.equal(fresh.weight(c.name), collection.weight(c.name)) for c in tables)
    # optimizer=None freezes every table: forward's rows need no gradient.
    frozen = make("cpu", optimizer=None)
    assert not frozen(random_bags(3, torch.Generator().manual_seed(1))).requires_grad
    assert not any(g.trains for g in frozen.groups) and all(g.table.optimizer() == "" for g in frozen.groups)


def test_requires_grad_freezes_and_unfreezes_every_table():
    collection = make("cpu")
    before = {c.name: collection.weight(c.name).clone() for c in TABLES}
    assert collection.requires_grad_(False) is collection
    features = random_bags(4, torch.Generator().manual_seed(2))
    assert not collection(features).requires_grad
    collection.requires_grad_(True)
    _train(collection, steps=1)
    assert not torch.equal(collection.weight("t2"), before["t2"])


def test_host_embedding_optimizer_drives_the_groups_as_step_does():
    """HostEmbeddingOptimizer of a model holding a collection holds its trained groups (not the frozen one): a
    CombinedOptimizer with an LR schedule trains them as collection.step() with the scheduled rates would."""
    from speedtorch.optim import CombinedOptimizer, HostEmbeddingOptimizer

    tables = [TABLES[0], TABLES[1], TableConfig("t2", 11, 4, frozen=True), TABLES[3]]
    model = torch.nn.Sequential(make("cpu", tables))
    opt = CombinedOptimizer([HostEmbeddingOptimizer(model)])
    assert opt.optimizers[0].host_embeddings == [model[0].groups[0]]
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5 ** step)
    reference = make("cpu", tables)
    gen = torch.Generator().manual_seed(6)
    for step in range(3):
        features = random_bags(5, gen)
        model(features).pow(2).sum().backward()
        opt.step()
        opt.zero_grad()
        sched.step()
        reference(features).pow(2).sum().backward()
        reference.groups[0].set_optimizer_options({"lr": 0.5 * 0.5 ** step})
        reference.step()
    for config in tables:
        assert torch.equal(model[0].weight(config.name), reference.weight(config.name)), config.name


@pytest.mark.parametrize("placement", ["host", "gpu", pytest.param("hybrid", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("mixed", [False, True], ids=["every table ranged", "beside a table without"])
def test_init_range_starts_each_tables_rows_uniform_in_its_range(placement, mixed):
    """TableConfig.init_range: each table's rows U(-r, +r), as TorchRec's tables start with r = sqrt(1 / rows)
    (MLPerf's DLRM-DCNv2 reference), in a group of such tables (one fill of the group, then scaled per table) and in
    a group with a table without one, whose rows keep the collection's N(0, init_std^2)."""
    device = "cuda" if placement == "hybrid" else "cpu"
    sizes = {"small": 40, "large": 900}
    tables = [TableConfig(name, n, 8, init_range=(1 / n) ** 0.5) for name, n in sizes.items()]
    if mixed:
        tables.append(TableConfig("plain", 500, 8))
    collection = HostEmbeddingBagCollection(tables, optimizer="adagrad", device=device, placement=placement,
                                            hot_fraction=0.5 if placement == "hybrid" else None, init_std=0.01,
                                            seed=0)
    for name, n in sizes.items():
        rows, bound = collection.weight(name).cpu(), (1 / n) ** 0.5
        assert rows.abs().max() <= bound and rows.abs().max() > 0.9 * bound, name
        assert rows.std() == pytest.approx(bound / 3 ** 0.5, rel=0.1), name  # U(-r, r): std r / sqrt(3)
        assert torch.unique(rows, dim=0).shape[0] == n, name  # no two rows equal
    if mixed:
        assert collection.weight("plain").std() == pytest.approx(0.01, rel=0.1)
    again = HostEmbeddingBagCollection(tables, optimizer="adagrad", device=device, placement=placement,
                                       hot_fraction=0.5 if placement == "hybrid" else None, init_std=0.01, seed=0)
    assert torch.equal(again.weight("large").cpu(), collection.weight("large").cpu())  # seeded


def test_without_init_range_the_rows_start_as_before():
    """No init_range: a group's rows are HostEmbedding's N(0, init_std^2) fill with the group's seed (seed + group)."""
    tables = [TableConfig("a", 40, 8), TableConfig("b", 60, 8), TableConfig("c", 30, 4)]
    collection = HostEmbeddingBagCollection(tables, optimizer="adagrad", device="cpu", init_std=0.01, seed=3)
    for g, (rows, dim) in enumerate(((100, 8), (30, 4))):
        before = speedtorch.nn.HostEmbedding(rows, dim, optimizer="adagrad", device="cpu", init_std=0.01, seed=3 + g)
        assert torch.equal(collection.groups[g].weight, before.weight)


@pytest.mark.parametrize("bad", [0.0, -0.5, float("inf"), float("nan"), "0.1"])
def test_a_bad_init_range_names_the_table(bad):
    with pytest.raises(ValueError, match=r"table 'b': init_range must be a float > 0 .* got"):
        HostEmbeddingBagCollection([TableConfig("a", 4, 2), TableConfig("b", 4, 2, init_range=bad)], device="cpu")


def test_the_distributed_collection_refuses_init_range():
    """Every rank would fill the shared rows: refused before any collective."""
    from speedtorch.distributed import DistributedHostEmbeddingBagCollection

    with pytest.raises(ValueError, match=r"init_range is not supported \(tables \['b'\]\)"):
        DistributedHostEmbeddingBagCollection([TableConfig("a", 4, 2), TableConfig("b", 4, 2, init_range=0.5)],
                                              device="cpu")
