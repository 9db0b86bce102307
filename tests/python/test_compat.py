"""speedtorch.compat (SpeedTorch 0.x's API over our ops): the word2vec flows of docs/migration.md, written with the
compat layer and with the native HostEmbedding, must both train and agree; swaps are checked against references
(the collection's rows, nn.Embedding for repeated ids, torch.optim on the touched rows for all ten optimizers);
DataGadget; .npy and torch.save files; errors for bad input."""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import speedtorch
from speedtorch import compat as SpeedTorch
from speedtorch.nn import HostEmbedding

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
MIGRATION_GUIDE = Path(__file__).resolve().parents[2] / "docs" / "migration.md"


def wait_for(device) -> None:
    # Host reads of a host collection wait for the stream a GPU scatter_ ran on (one stream, not the device).
    if torch.device(device).type == "cuda":
        torch.cuda.current_stream().synchronize()


# --- the guide's flows: docs/migration.md quotes these four definitions verbatim -------------------------------------


def skip_gram_loss(centers, contexts, negatives):
    """Skip-gram with negative sampling, batch mean: centers and contexts (B, 1, D), negative contexts (B, K, D)."""
    positive = F.logsigmoid((centers * contexts).sum(-1)).squeeze(1)
    negative = F.logsigmoid(-torch.bmm(negatives, centers.transpose(1, 2)).squeeze(2)).sum(1)
    return -(positive + negative).mean()


class SkipGramBatch(torch.nn.Module):
    """SpeedTorch's model: embedding variables of one row per id of a batch, which the switchers fill."""

    def __init__(self, batch_size, negatives, dim):
        super().__init__()
        self.u_embeddings = torch.nn.Embedding(batch_size, dim)
        self.v_embeddings = torch.nn.Embedding(batch_size * (1 + negatives), dim)

    def forward(self, center_rows, context_rows, negative_rows):
        return skip_gram_loss(self.u_embeddings(center_rows), self.v_embeddings(context_rows),
                              self.v_embeddings(negative_rows))


def train_word2vec_compat(batches, vocab_size, dim, lr=0.05, device="cpu", seed=0):
    """word2vec with SpeedTorch's calls: full collections in pinned host RAM, swapped around each step."""
    batch_size, negatives = batches[0][2].shape
    model = SkipGramBatch(batch_size, negatives, dim).to(device)
    optimizer = torch.optim.Adamax(model.parameters(), lr=lr)  # dense: every row of the variables is in the batch
    u_switcher = SpeedTorch.ModelFactory(model.u_embeddings, total_classes=vocab_size, embed_dimension=dim,
                                         CPUPinn=True)
    v_switcher = SpeedTorch.ModelFactory(model.v_embeddings, total_classes=vocab_size, embed_dimension=dim,
                                         CPUPinn=True)
    u_state_switcher = SpeedTorch.OptimizerFactory(optimizer, vocab_size, dim, model, "u_embeddings", CPUPinn=True)
    v_state_switcher = SpeedTorch.OptimizerFactory(optimizer, vocab_size, dim, model, "v_embeddings", CPUPinn=True)
    torch.manual_seed(seed)
    u_switcher.uniformDistributionInit(-0.5 / dim, 0.5 / dim)  # word2vec's start: small centers, zero contexts
    v_switcher.zerosInit()
    u_state_switcher.optInit()
    v_state_switcher.optInit()
    center_rows = u_switcher.variableTransformer(batch_size, 1)
    context_rows, negative_rows = v_switcher.variableTransformer(batch_size, 1, negatives)
    losses = []
    for center_ids, context_ids, negative_ids in batches:
        u_switcher.beforeForwardPass(center_ids)
        v_switcher.beforeForwardPass(context_ids, negative_ids)
        u_state_switcher.beforeForwardPass(center_ids)
        v_state_switcher.beforeForwardPass(context_ids, negative_ids)
        optimizer.zero_grad()
        loss = model(center_rows, context_rows, negative_rows)
        loss.backward()
        optimizer.step()
        u_switcher.afterOptimizerStep(center_ids)
        v_switcher.afterOptimizerStep(context_ids, negative_ids)
        u_state_switcher.afterOptimizerStep(center_ids)
        v_state_switcher.afterOptimizerStep(context_ids, negative_ids)
        losses.append(loss.item())
    return losses


def train_word2vec_native(batches, vocab_size, dim, lr=0.05, device="cpu", seed=0):
    """The same training with HostEmbedding: tables and Adamax state in pinned host RAM, updated by a fused step."""
    adamax = {"optimizer": "adamax", "optimizer_options": {"lr": lr}, "device": device}
    centers = HostEmbedding(vocab_size, dim, init_std=0.0, **adamax)
    contexts = HostEmbedding(vocab_size, dim, init_std=0.0, **adamax)
    torch.manual_seed(seed)
    centers.weight.uniform_(-0.5 / dim, 0.5 / dim)  # the same start as the compat flow
    losses = []
    for center_ids, context_ids, negative_ids in batches:
        loss = skip_gram_loss(centers(center_ids), contexts(context_ids), contexts(negative_ids))
        loss.backward()
        centers.step()
        contexts.step()
        losses.append(loss.item())
    return losses


# --- a small synthetic corpus ----------------------------------------------------------------------------------------


def synthetic_corpus(vocab_size, topics, sentences, sentence_length, seed):
    """Sentences whose words come from one topic each (Zipf-distributed within it): neighbours share a topic, so
    skip-gram has something to learn, and frequent words repeat within batches."""
    gen = torch.Generator().manual_seed(seed)
    words_per_topic = vocab_size // topics
    zipf = 1.0 / torch.arange(1, words_per_topic + 1, dtype=torch.float64)
    topic = torch.randint(0, topics, (sentences, 1), generator=gen)
    word = torch.multinomial(zipf, sentences * sentence_length, replacement=True, generator=gen)
    return topic * words_per_topic + word.view(sentences, sentence_length)


def skip_gram_batches(corpus, vocab_size, steps, batch_size, negatives, window, seed):
    """(center (B, 1), context (B, 1), negatives (B, K)) id batches: pairs within ``window`` words, negatives from
    the unigram distribution to the 3/4."""
    gen = torch.Generator().manual_seed(seed)
    centers, contexts = [], []
    for offset in range(1, window + 1):
        centers += [corpus[:, :-offset].reshape(-1), corpus[:, offset:].reshape(-1)]
        contexts += [corpus[:, offset:].reshape(-1), corpus[:, :-offset].reshape(-1)]
    centers, contexts = torch.cat(centers), torch.cat(contexts)
    noise = torch.bincount(corpus.reshape(-1), minlength=vocab_size).double().pow(0.75)
    batches = []
    for _ in range(steps):
        pairs = torch.randint(0, centers.numel(), (batch_size,), generator=gen)
        negative_ids = torch.multinomial(noise, batch_size * negatives, replacement=True, generator=gen)
        batches.append((centers[pairs].view(batch_size, 1), contexts[pairs].view(batch_size, 1),
                        negative_ids.view(batch_size, negatives)))
    return batches


def test_migration_guide_quotes_this_code():
    guide = MIGRATION_GUIDE.read_text()
    for quoted in (skip_gram_loss, SkipGramBatch, train_word2vec_compat, train_word2vec_native):
        assert inspect.getsource(quoted) in guide, (
            f"docs/migration.md no longer quotes {quoted.__name__} as tests/python/test_compat.py defines it")


@pytest.mark.parametrize("device", DEVICES)
def test_word2vec_flows_train_and_agree(device):
    vocab_size, dim = 300, 24
    corpus = synthetic_corpus(vocab_size, topics=10, sentences=300, sentence_length=12, seed=0)
    batches = skip_gram_batches(corpus, vocab_size, steps=200, batch_size=32, negatives=4, window=2, seed=1)
    # Frequent words repeat within a batch: the case SpeedTorch got wrong and the compat layer must get right.
    assert all(torch.cat([c.view(-1), n.view(-1)]).unique().numel() < 32 * 5 for _, c, n in batches)

    compat_losses = torch.tensor(train_word2vec_compat(batches, vocab_size, dim, device=device))
    native_losses = torch.tensor(train_word2vec_native(batches, vocab_size, dim, device=device))

    for losses in (compat_losses, native_losses):
        assert torch.isfinite(losses).all()
        assert losses[-20:].mean() < 0.6 * losses[:20].mean(), losses[::20]
    # Repeated ids' gradients summed and each row updated once: the compat flow is the native flow's math.
    torch.testing.assert_close(compat_losses, native_losses, rtol=1e-3, atol=1e-4)


# --- ModelFactory ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("pinned", [True, False], ids=["CPUPinn", "device"])
@pytest.mark.parametrize("datatype", ["float32", "float16"])
def test_model_factory_round_trip(device, pinned, datatype):
    num_rows, dim = 50, 6
    variable = torch.nn.Embedding(9, dim).to(device)
    switcher = SpeedTorch.ModelFactory(variable, num_rows, dim, datatype=datatype, CPUPinn=pinned)
    switcher.normalDistributionInit(0.0, 1.0)
    collection = switcher.getTorchVar()
    assert collection.shape == (num_rows, dim)
    assert collection.dtype == getattr(torch, datatype)
    assert collection.device.type == ("cpu" if pinned else torch.device(device).type)
    before = collection.cpu().clone()
    assert before.abs().sum() > 0

    pos, neg = np.array([[3, 7], [11, 2]]), torch.tensor([40, 41, 42, 43, 0])
    ids = [3, 7, 11, 2, 40, 41, 42, 43, 0]
    storage = variable.weight.data_ptr()
    switcher.beforeForwardPass(pos, neg)
    assert variable.weight.data_ptr() == storage  # copied in place: optimizers keep their references
    assert torch.equal(variable.weight.detach().cpu(), before[ids].float())

    updated = torch.randn(9, dim)
    with torch.no_grad():
        variable.weight.copy_(updated)
    switcher.afterOptimizerStep(pos, neg)
    wait_for(device)
    expected = before.clone()
    expected[ids] = updated.to(expected.dtype)
    assert torch.equal(collection.cpu(), expected)


def test_model_factory_batch_smaller_than_variable():
    variable = torch.nn.Embedding(6, 3)
    switcher = SpeedTorch.ModelFactory(variable, 20, 3)
    switcher.uniformDistributionInit(-1.0, 1.0)
    untouched_rows = variable.weight.detach()[4:].clone()
    switcher.beforeForwardPass([5, 9, 19, 0])
    assert torch.equal(variable.weight.detach()[:4], switcher.collection[[5, 9, 19, 0]])
    assert torch.equal(variable.weight.detach()[4:], untouched_rows)
    with torch.no_grad():
        variable.weight.mul_(2.0)
    expected = switcher.collection.clone()
    expected[[5, 9, 19, 0]] *= 2.0
    switcher.afterOptimizerStep([5, 9, 19, 0])
    assert torch.equal(switcher.collection, expected)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("sparse", [False, True], ids=["dense", "sparse"])
def test_repeated_ids_sgd_equals_nn_embedding(device, sparse):
    """SpeedTorch wrote each copy of a repeated id back in turn (the last won); the compat layer sums the copies'
    gradients, so SGD gives exactly nn.Embedding's result."""
    num_rows, dim, batch = 20, 5, 12
    gen = torch.Generator().manual_seed(3)
    start = torch.randn(num_rows, dim, generator=gen)
    variable = torch.nn.Embedding(batch, dim, sparse=sparse).to(device)
    optimizer = torch.optim.SGD(variable.parameters(), lr=0.1)
    switcher = SpeedTorch.ModelFactory(variable, num_rows, dim)
    switcher.customInit(torch.Tensor.copy_, start)
    reference = torch.nn.Embedding(num_rows, dim, sparse=sparse).to(device)
    with torch.no_grad():
        reference.weight.copy_(start)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    positions = torch.arange(batch, device=device)
    for _ in range(4):
        ids = torch.randint(0, 6, (batch,), generator=gen)  # 12 ids over 6 rows: many repeats
        targets = torch.randn(batch, dim, generator=gen).to(device)
        switcher.beforeForwardPass(ids)
        optimizer.zero_grad()
        ((variable(positions) - targets) ** 2).sum().backward()
        optimizer.step()
        switcher.afterOptimizerStep(ids)
        reference_optimizer.zero_grad()
        ((reference(ids.to(device)) - targets) ** 2).sum().backward()
        reference_optimizer.step()
    wait_for(device)
    torch.testing.assert_close(switcher.collection.cpu(), reference.weight.detach().cpu())
    assert not variable.weight._backward_hooks  # the gradient merge is removed with the batch


@pytest.mark.parametrize("device", DEVICES)
def test_repeated_ids_last_copy_wins_as_in_scatter(device):
    """One rule for repeated ids, scatter_'s: the last copy of an id is what is written back (rows and state), and
    the gradient hook sums the copies' gradients into that last copy."""
    variable = torch.nn.Embedding(4, 2).to(device)
    optimizer = torch.optim.SGD(variable.parameters(), lr=0.5, momentum=0.9)
    switcher = SpeedTorch.ModelFactory(variable, 10, 2)
    switcher.zerosInit()
    state_switcher = SpeedTorch.OptimizerFactory(optimizer, 10, 2, variable, "weight")
    state_switcher.optInit()
    ids = torch.tensor([7, 3, 7, 3])
    switcher.beforeForwardPass(ids)
    state_switcher.beforeForwardPass(ids)
    grad_out = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0], [7.0, 8.0]], device=device)
    (variable(torch.arange(4, device=device)) * grad_out).sum().backward()
    # Copies 0 and 2 hold id 7, copies 1 and 3 id 3: each id's gradient sum lands on its last copy.
    expected_grad = torch.tensor([[0.0, 0.0], [0.0, 0.0], [6.0, 8.0], [10.0, 12.0]], device=device)
    torch.testing.assert_close(variable.weight.grad, expected_grad, rtol=0, atol=0)
    optimizer.step()
    switcher.afterOptimizerStep(ids)
    state_switcher.afterOptimizerStep(ids)
    wait_for(device)
    torch.testing.assert_close(switcher.collection[[7, 3]].cpu(), -0.5 * expected_grad[2:].cpu(), rtol=0, atol=0)
    momentum = state_switcher.collections["momentum_buffer"]
    torch.testing.assert_close(momentum[[7, 3]].cpu(), expected_grad[2:].cpu(), rtol=0, atol=0)

    # Without the hook (a .grad written by hand, or no gradient at all) the last copy still wins.
    switcher.beforeForwardPass(ids)
    with torch.no_grad():
        variable.weight.copy_(grad_out)
    switcher.afterOptimizerStep(ids)
    wait_for(device)
    torch.testing.assert_close(switcher.collection[[7, 3]].cpu(), grad_out[2:].cpu(), rtol=0, atol=0)


# --- OptimizerFactory against torch.optim on the touched rows --------------------------------------------------------

OPTIMIZER_CASES = [
    pytest.param(torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01}, id="SGD"),
    pytest.param(torch.optim.Adam, {"lr": 0.05, "amsgrad": True, "weight_decay": 0.01}, id="Adam"),
    pytest.param(torch.optim.AdamW, {"lr": 0.05, "weight_decay": 0.1}, id="AdamW"),
    pytest.param(torch.optim.SparseAdam, {"lr": 0.05}, id="SparseAdam"),
    pytest.param(torch.optim.Adamax, {"lr": 0.05, "weight_decay": 0.01}, id="Adamax"),
    pytest.param(torch.optim.Adagrad, {"lr": 0.1, "lr_decay": 0.01, "initial_accumulator_value": 0.1}, id="Adagrad"),
    pytest.param(torch.optim.Adadelta, {"lr": 1.0, "weight_decay": 0.01}, id="Adadelta"),
    pytest.param(torch.optim.RMSprop, {"lr": 0.01, "momentum": 0.5, "centered": True}, id="RMSprop"),
    pytest.param(torch.optim.ASGD, {"lr": 0.05, "t0": 2.0, "lambd": 1e-3}, id="ASGD"),
    pytest.param(torch.optim.Rprop, {"lr": 0.05}, id="Rprop"),
    pytest.param(speedtorch.optim.RowwiseAdagrad, {"lr": 0.1, "weight_decay": 0.01, "initial_accumulator_value": 0.1},
                 id="RowwiseAdagrad"),
]


def row_state(state: dict, parameter: torch.Tensor) -> dict:
    """State with a row per parameter row: torch.optim's (parameter-shaped) and row-wise Adagrad's (rows x 4)."""
    return {name: value for name, value in state.items()
            if isinstance(value, torch.Tensor) and value.dim() == 2 and value.shape[0] == parameter.shape[0]}


def scalar_state(state: dict, parameter: torch.Tensor) -> dict:
    return {name: float(value) for name, value in state.items() if name not in row_state(state, parameter)}


class TouchedRowsReference:
    """torch.optim applied to the rows a batch touches, each with the sum of its copies' gradients: the optimizer
    runs on a full-size parameter, then the rows the batch did not touch (and their state rows) are put back, so
    optimizers that move rows with a zero gradient (weight decay, momentum) leave them alone, as a swap does. The
    first batch must touch every row (before it there is no state to put back)."""

    def __init__(self, optimizer_class, options, start: torch.Tensor, sparse: bool):
        self.weight = torch.nn.Parameter(start.clone())
        self.optimizer = optimizer_class([self.weight], **options)
        self.sparse = sparse

    def step(self, ids: torch.Tensor, gradients: torch.Tensor) -> None:
        touched = torch.zeros(self.weight.shape[0], dtype=torch.bool)
        touched[ids] = True
        untouched = ~touched
        state = self.optimizer.state[self.weight]
        saved_rows = self.weight.detach().clone()
        saved_state = {name: value.clone() for name, value in row_state(state, self.weight).items()}
        summed = torch.zeros_like(self.weight).index_put_((ids,), gradients, accumulate=True)
        if self.sparse:
            rows = touched.nonzero().squeeze(1)
            summed = torch.sparse_coo_tensor(rows.unsqueeze(0), summed[rows], summed.shape, check_invariants=True)
        self.weight.grad = summed
        self.optimizer.step()
        with torch.no_grad():
            self.weight[untouched] = saved_rows[untouched]
            for name, value in saved_state.items():
                state[name][untouched] = value[untouched]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("optimizer_class, options", OPTIMIZER_CASES)
def test_optimizer_factory_matches_torch_on_touched_rows(device, optimizer_class, options):
    num_rows, dim, batch = 12, 6, 16
    sparse = optimizer_class is torch.optim.SparseAdam
    gen = torch.Generator().manual_seed(5)
    start = torch.randn(num_rows, dim, generator=gen)

    model = torch.nn.ModuleDict({"rows": torch.nn.Embedding(batch, dim, sparse=sparse)}).to(device)
    variable = model["rows"]
    optimizer = optimizer_class(model.parameters(), **options)
    rows_switcher = SpeedTorch.ModelFactory(variable, num_rows, dim)
    rows_switcher.customInit(torch.Tensor.copy_, start)
    state_switcher = SpeedTorch.OptimizerFactory(optimizer, num_rows, dim, model, "rows")
    state_switcher.optInit()
    swapped_state = row_state(optimizer.state[variable.weight], variable.weight)
    assert set(swapped_state) == set(state_switcher.collections)
    reference = TouchedRowsReference(optimizer_class, options, start, sparse)

    positions = torch.arange(batch, device=device)
    for step in range(6):
        if step == 0:  # every row, plus repeats
            ids = torch.cat([torch.randperm(num_rows, generator=gen), torch.randint(0, num_rows, (4,), generator=gen)])
        else:  # some rows untouched, many repeated
            ids = torch.randint(0, num_rows, (batch,), generator=gen)
        gradients = torch.randn(batch, dim, generator=gen)
        rows_switcher.beforeForwardPass(ids)
        state_switcher.beforeForwardPass(ids)
        optimizer.zero_grad()
        (variable(positions) * gradients.to(device)).sum().backward()  # copy i's gradient: gradients[i]
        optimizer.step()
        rows_switcher.afterOptimizerStep(ids)
        state_switcher.afterOptimizerStep(ids)
        reference.step(ids, gradients)

        wait_for(device)
        reference_state = reference.optimizer.state[reference.weight]
        torch.testing.assert_close(rows_switcher.collection.cpu(), reference.weight.detach(), msg=f"rows, step {step}")
        for name, collection in state_switcher.collections.items():
            torch.testing.assert_close(collection.cpu(), reference_state[name], msg=f"{name}, step {step}")
        # Scalar state (step, ASGD's eta and mu) stays with the batch-sized parameter: one global count.
        assert scalar_state(optimizer.state[variable.weight], variable.weight) == pytest.approx(
            scalar_state(reference_state, reference.weight))
    for name, tensor in row_state(optimizer.state[variable.weight], variable.weight).items():
        assert tensor is swapped_state[name]  # swapped in place, never replaced


def test_optimizer_factory_takes_existing_state_and_full_names():
    """An optimizer that already stepped (SpeedTorch's Rprop had to) keeps its state tensors; the variable may be
    named with or without '.weight'."""
    model = torch.nn.ModuleDict({"emb": torch.nn.Embedding(4, 3)})
    optimizer = torch.optim.Rprop(model.parameters(), lr=0.01)
    model["emb"](torch.arange(4)).sum().backward()
    optimizer.step()
    held = dict(optimizer.state[model["emb"].weight])
    switcher = SpeedTorch.GPUPytorchOptimizerFactory(optimizer, 10, 3, model, "emb.weight")
    switcher.optInit()
    assert optimizer.state[model["emb"].weight]["prev"] is held["prev"]
    assert torch.equal(switcher.collections["step_size"], torch.full((10, 3), 0.01))
    switcher.beforeForwardPass(torch.tensor([9, 8, 7, 6]))
    assert torch.equal(held["step_size"], torch.full((4, 3), 0.01))
    assert torch.equal(held["prev"], torch.zeros(4, 3))


def test_sgd_without_momentum_has_no_state_to_swap():
    model = torch.nn.ModuleDict({"emb": torch.nn.Embedding(4, 3)})
    switcher = SpeedTorch.OptimizerFactory(torch.optim.SGD(model.parameters(), lr=0.1), 10, 3, model, "emb")
    switcher.optInit()
    assert switcher.collections == {}
    switcher.beforeForwardPass([1, 2, 3, 4])
    switcher.afterOptimizerStep([1, 2, 3, 4])


# --- DataGadget ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("pinned", [True, False], ids=["CPUPinn", "default"])
def test_data_gadget_get_and_insert(tmp_path, pinned):
    data = np.random.default_rng(0).standard_normal((30, 3, 4)).astype(np.float32)
    np.save(tmp_path / "features.npy", data)
    gadget = SpeedTorch.DataGadget(tmp_path / "features.npy", CPUPinn=pinned)
    gadget.gadgetInit()

    rows = gadget.getData(np.array([[4, 2], [9, 4]]), torch.tensor([29]))
    expected_device = "cuda" if torch.cuda.is_available() else "cpu"
    assert rows.device.type == expected_device
    assert torch.equal(rows.cpu(), torch.from_numpy(data[[4, 2, 9, 4, 29]]))

    new_rows = torch.randn(3, 3, 4, dtype=torch.float64).to(expected_device)
    gadget.insertData(new_rows, [1, 5, 1])  # a repeated index: the last row wins, as in scatter_
    data[5] = new_rows[1].cpu().numpy()
    data[1] = new_rows[2].cpu().numpy()
    np.testing.assert_array_equal(gadget.getNumpyVersion(), data)

    gadget.saveCupy(tmp_path / "saved.npy")
    np.testing.assert_array_equal(np.load(tmp_path / "saved.npy"), data)

    labels = np.arange(7, dtype=np.int64) * 3
    np.save(tmp_path / "labels.npy", labels)
    gadget.loadCupy(tmp_path / "labels.npy")  # a new array, any shape
    assert torch.equal(gadget.getData([6, 0]).cpu(), torch.tensor([18, 0]))
    gadget.insertData(torch.tensor([-1, -2]), torch.tensor([[0], [3]]))
    np.testing.assert_array_equal(gadget.getNumpyVersion(), [-1, 3, 6, -2, 12, 15, 18])


def test_data_gadget_errors(tmp_path):
    np.save(tmp_path / "d.npy", np.ones((5, 2), dtype=np.float32))
    gadget = SpeedTorch.DataGadget(str(tmp_path / "d.npy"))
    with pytest.raises(RuntimeError, match="gadgetInit"):
        gadget.getData([0])
    gadget.gadgetInit()
    with pytest.raises(IndexError, match="5"):
        gadget.getData([0, 5])
    with pytest.raises(ValueError, match=r"2 rows of shape \(2,\).*\(3, 2\)"):
        gadget.insertData(torch.zeros(3, 2), [0, 1])
    with pytest.raises(TypeError, match="fileName"):
        SpeedTorch.DataGadget(5)
    np.save(tmp_path / "scalar.npy", np.float32(1.0))
    with pytest.raises(ValueError, match="0-d"):
        SpeedTorch.DataGadget(tmp_path / "scalar.npy").gadgetInit()


# --- files, views, initialisers -------------------------------------------------------------------------------------


def test_model_factory_npy_files_and_numpy_view(tmp_path):
    variable = torch.nn.Embedding(4, 5)
    switcher = SpeedTorch.ModelFactory(variable, 40, 5, CPUPinn=True)
    switcher.normalDistributionInit(1.0, 2.0)
    switcher.saveCupy(tmp_path / "rows.npy")
    saved = np.load(tmp_path / "rows.npy")
    np.testing.assert_array_equal(saved, switcher.getNumpyVersion())
    assert abs(saved.mean() - 1.0) < 0.5 and abs(saved.std() - 2.0) < 0.5

    view = switcher.getNumpyVersion()  # zero-copy for a host collection
    switcher.collection[3, 2] = 123.0
    assert view[3, 2] == 123.0

    loaded = SpeedTorch.ModelFactory(variable, 40, 5, datatype="float16")
    np.save(tmp_path / "rows64.npy", saved.astype(np.float64))
    loaded.loadCupy(tmp_path / "rows64.npy")  # floating types convert
    np.testing.assert_array_equal(loaded.getNumpyVersion(), saved.astype(np.float16))
    with pytest.raises(ValueError, match=r"shape \(40, 5\), expected \(39, 5\)"):
        SpeedTorch.ModelFactory(variable, 39, 5).loadCupy(tmp_path / "rows.npy")


def test_optimizer_factory_npy_files(tmp_path):
    model = torch.nn.ModuleDict({"emb": torch.nn.Embedding(4, 3)})
    optimizer = torch.optim.Adam(model.parameters())
    switcher = SpeedTorch.OptimizerFactory(optimizer, 10, 3, model, "emb", CPUPinn=True)
    switcher.optInit()
    for collection in switcher.collections.values():
        collection.normal_()
    paths = switcher.saveCupy(tmp_path / "adam.npy")
    assert [Path(p).name for p in paths] == ["adam.exp_avg.npy", "adam.exp_avg_sq.npy"]
    arrays = switcher.getNumpyVersion()
    for path, name in zip(paths, ["exp_avg", "exp_avg_sq"]):
        np.testing.assert_array_equal(np.load(path), arrays[name])
    again = SpeedTorch.OptimizerFactory(optimizer, 10, 3, model, "emb")
    again.optInit()
    again.loadCupy(tmp_path / "adam.npy")
    for name, collection in again.collections.items():
        assert torch.equal(collection, switcher.collections[name])


def test_gpu_pytorch_factories_custom_init_and_torch_files(tmp_path):
    model = torch.nn.ModuleDict({"emb": torch.nn.Embedding(4, 8)})
    switcher = SpeedTorch.GPUPytorchModelFactory(model["emb"], 30, 8, datatype=torch.float)
    switcher.customInit(torch.nn.init.xavier_uniform_)
    bound = (6.0 / (30 + 8)) ** 0.5
    collection = switcher.getTorchVar()
    assert collection.device == model["emb"].weight.device  # device memory: the variable's device (CPU without GPU)
    assert 0 < collection.abs().max() <= bound
    switcher.saveTorch(tmp_path / "rows.pt")
    saved = collection.clone()
    switcher.zerosInit()
    assert collection.abs().sum() == 0  # refilled in place
    switcher.loadTorch(tmp_path / "rows.pt")
    assert torch.equal(switcher.getTorchVar(), saved)

    adagrad = torch.optim.Adagrad(model.parameters(), initial_accumulator_value=0.5)
    state_switcher = SpeedTorch.GPUPytorchOptimizerFactory(adagrad, 30, 8, model, "emb")
    state_switcher.optInit()
    assert torch.equal(state_switcher.collections["sum"], torch.full((30, 8), 0.5))
    state_switcher.collections["sum"][2] = 7.0
    state_switcher.saveTorch(tmp_path / "state.pt")
    state_switcher.collections["sum"].zero_()
    state_switcher.loadTorch(tmp_path / "state.pt")
    assert state_switcher.collections["sum"][2].eq(7.0).all() and state_switcher.collections["sum"][3].eq(0.5).all()
    with pytest.raises(ValueError, match="state collections"):
        state_switcher.loadTorch(tmp_path / "rows.pt")


def test_variable_transformer():
    variable = torch.nn.Embedding(4 * (2 + 3), 2)
    switcher = SpeedTorch.ModelFactory(variable, 10, 2)
    pos, neg = switcher.variableTransformer(4, 2, 3)
    assert torch.equal(pos, torch.arange(8).view(4, 2))
    assert torch.equal(neg, torch.arange(8, 20).view(4, 3))
    assert torch.equal(switcher.variableTransformer(5, 4), torch.arange(20).view(5, 4))
    with pytest.raises(ValueError, match="21 rows.*holds 20"):
        switcher.variableTransformer(7, 3)
    # No negatives: an empty block, as SpeedTorch returns (it tests negPerBatch against None, not its truth).
    pos, neg = switcher.variableTransformer(4, 2, 0)
    assert torch.equal(pos, torch.arange(8).view(4, 2)) and neg.shape == (4, 0) and neg.dtype == torch.int64
    switcher.zerosInit()
    switcher.beforeForwardPass(pos, neg)  # and the swap takes it
    switcher.afterOptimizerStep(pos, neg)
    with pytest.raises(ValueError, match="negPerBatch must be >= 0, got -1"):
        switcher.variableTransformer(4, 2, -1)


def test_save_cupy_appends_npy_as_numpy_save_does(tmp_path):
    """SpeedTorch saved through cupy.save, which, as np.save, appends .npy to a name without it."""
    switcher = SpeedTorch.ModelFactory(torch.nn.Embedding(4, 3), 10, 3)
    switcher.normalDistributionInit(0.0, 1.0)
    switcher.saveCupy(tmp_path / "mf2")
    switcher.saveCupy(str(tmp_path / "mf3.npy"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mf2.npy", "mf3.npy"]
    np.testing.assert_array_equal(np.load(tmp_path / "mf2.npy"), switcher.getNumpyVersion())
    np.save(tmp_path / "d.npy", np.ones((5, 2), dtype=np.float32))
    gadget = SpeedTorch.DataGadget(tmp_path / "d.npy")
    gadget.gadgetInit()
    gadget.saveCupy(tmp_path / "d2")
    np.testing.assert_array_equal(np.load(tmp_path / "d2.npy"), np.ones((5, 2), dtype=np.float32))


# --- bad input -------------------------------------------------------------------------------------------------------


def test_model_factory_errors():
    variable = torch.nn.Embedding(4, 3)
    with pytest.raises(ValueError, match=r"embed_dimension=5.*\(4, 3\)"):
        SpeedTorch.ModelFactory(variable, 10, 5)
    with pytest.raises(TypeError, match="model_variable"):
        SpeedTorch.ModelFactory("u_embeddings", 10, 3)
    with pytest.raises(TypeError, match="total_classes must be an int, got float"):
        SpeedTorch.ModelFactory(variable, 10.0, 3)
    with pytest.raises(ValueError, match="embed_dimension must be positive, got 0"):
        SpeedTorch.ModelFactory(variable, 10, 0)
    with pytest.raises(ValueError, match="datatype must be one of .* got 'int8'"):
        SpeedTorch.ModelFactory(variable, 10, 3, datatype="int8")
    assert SpeedTorch.ModelFactory(variable, 10, 3, datatype=np.float16).dtype == torch.float16
    assert SpeedTorch.ModelFactory(variable, 10, 3, datatype="bfloat16").dtype == torch.bfloat16

    switcher = SpeedTorch.ModelFactory(variable, 10, 3)
    with pytest.raises(RuntimeError, match="not initialised.*zerosInit"):
        switcher.beforeForwardPass([0, 1])
    switcher.zerosInit()
    with pytest.raises(RuntimeError, match="call beforeForwardPass first"):
        switcher.afterOptimizerStep([0, 1])
    with pytest.raises(IndexError, match="10"):
        switcher.beforeForwardPass([0, 10])
    with pytest.raises(IndexError):
        switcher.beforeForwardPass(torch.tensor([-1]))
    with pytest.raises(TypeError, match="retrievedPosIndexes must hold integers"):
        switcher.beforeForwardPass(np.array([0.5, 1.0]))
    with pytest.raises(TypeError, match="retrievedNegIndexes must hold integers"):
        switcher.beforeForwardPass([0], torch.tensor([1.0]))
    with pytest.raises(ValueError, match="5 indexes .* holds 4 rows"):
        switcher.beforeForwardPass([0, 1, 2], [3, 4])
    switcher.beforeForwardPass([0, 1, 2])
    with pytest.raises(ValueError, match="indexes differ"):
        switcher.afterOptimizerStep([0, 1, 3])
    with pytest.raises(TypeError, match="initFunction must be callable"):
        switcher.customInit("xavier")


def test_optimizer_factory_errors():
    model = torch.nn.ModuleDict({"emb": torch.nn.Embedding(4, 3), "other": torch.nn.Linear(3, 3)})
    optimizer = torch.optim.Adam(model["emb"].parameters())
    with pytest.raises(ValueError, match="no parameter named 'u_embeddings'.*emb.weight"):
        SpeedTorch.OptimizerFactory(optimizer, 10, 3, model, "u_embeddings")
    with pytest.raises(ValueError, match="given_optimizer does not hold model.other"):
        SpeedTorch.OptimizerFactory(optimizer, 10, 3, model, "other")
    with pytest.raises(ValueError, match=r"embed_dimension=4.*\(4, 3\)"):
        SpeedTorch.OptimizerFactory(optimizer, 10, 4, model, "emb")
    with pytest.raises(TypeError, match="given_optimizer must be one of .*Adam.*got LBFGS"):
        SpeedTorch.OptimizerFactory(torch.optim.LBFGS(model["emb"].parameters()), 10, 3, model, "emb")
    with pytest.raises(TypeError, match="given_optimizer must be a torch.optim.Optimizer"):
        SpeedTorch.OptimizerFactory("adam", 10, 3, model, "emb")
    with pytest.raises(TypeError, match="model must be a torch.nn.Module"):
        SpeedTorch.OptimizerFactory(optimizer, 10, 3, {"emb": None}, "emb")
    with pytest.raises(ValueError, match="dtype must be one of"):
        SpeedTorch.OptimizerFactory(optimizer, 10, 3, model, "emb", dtype="complex64")

    switcher = SpeedTorch.OptimizerFactory(optimizer, 10, 3, model, "emb")
    with pytest.raises(RuntimeError, match="beforeForwardPass: call optInit first"):
        switcher.beforeForwardPass([0, 1])
    switcher.optInit()
    with pytest.raises(RuntimeError, match="afterOptimizerStep: no batch is swapped in"):
        switcher.afterOptimizerStep([0, 1])
    with pytest.raises(IndexError):
        switcher.beforeForwardPass([0, 99])
    switcher.beforeForwardPass([0, 1])
    with pytest.raises(ValueError, match="indexes differ"):
        switcher.afterOptimizerStep([1, 0])
    optimizer.state.clear()
    with pytest.raises(RuntimeError, match="lost 'exp_avg'"):
        switcher.beforeForwardPass([0, 1])


def test_compat_is_exported():
    assert speedtorch.compat is SpeedTorch
    assert "compat" in speedtorch.__all__
