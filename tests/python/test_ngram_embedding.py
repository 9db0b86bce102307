"""speedtorch.nn.NgramHashEmbedding: forward is the table's rows at the hashed ids, training is exact (duplicates'
gradients summed, row-wise Adam on each touched row once, equal to a plain-torch lazy reference), bit for bit the
same with and without prefetch and in every placement; the serving copy (quantized, CUDA-graphed) reads the same
rows."""

from __future__ import annotations

import copy
import io
import math
import pickle
import threading

import pytest
import torch
import torch.nn.functional as F

import speedtorch
from speedtorch.nn import NgramHashEmbedding

VOCAB = 50


def batches(steps, batch=3, seq=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    # A small vocabulary: n-grams repeat within and across batches, so rows get several gradients per step.
    return [torch.randint(0, VOCAB, (batch, seq), generator=g) for _ in range(steps)]


def make(dim=4, **kwargs):
    """A module whose table starts from the same random rows whatever its placement (initialisers fill each
    placement's memory their own way)."""
    options = dict(heads=2, max_order=3, rows_per_head=31, device="cpu", init_std=0.0, optimizer_options={"lr": 0.05})
    options.update(kwargs)
    module = NgramHashEmbedding(VOCAB, dim, **options)
    start = torch.randn(module.num_rows, dim, generator=torch.Generator().manual_seed(3)) * 0.1
    module.rows.table.copy_(start)
    return module


def target(step, shape):
    return torch.randn(shape, generator=torch.Generator().manual_seed(100 + step))


def train(module, tokens_list, prefetch=False, max_sms=None):
    outputs = []
    for i, tokens in enumerate(tokens_list):
        out = module(tokens)
        loss = F.mse_loss(out.float(), target(i, out.shape).to(out.device))
        loss.backward()
        if prefetch and i + 1 < len(tokens_list):
            # before this step's update: rows it changes are read again
            module.prefetch(tokens_list[i + 1], max_sms=max_sms)
        module.step()
        outputs.append(out.detach().cpu())
    return outputs


def test_forward_reads_the_hashed_rows():
    module = make()
    tokens = batches(1)[0]
    starts = torch.zeros_like(tokens, dtype=torch.bool)
    starts[:, 6] = True
    out = module(tokens, starts)
    ids = module.hash(tokens, starts)
    assert out.shape == (3, 12, module.output_dim) and module.output_dim == 2 * 2 * 4
    assert torch.equal(out.detach(), module.rows.weight[ids].reshape(3, 12, -1))


def test_training_equals_a_lazy_rowwise_adam_reference():
    """Each step: one summed gradient per distinct row, Adam's first moment per element, the second one float per
    row, bias corrected with the table-wide step; rows not in the batch never move."""
    module = make()
    weight = module.rows.weight.detach().clone()
    m, v = torch.zeros_like(weight), torch.zeros(weight.shape[0])
    lr, b1, b2, eps = 0.05, 0.9, 0.999, 1e-8
    data = batches(4)
    train(module, data)
    for step, tokens in enumerate(data, start=1):
        ids = module.hash(tokens)
        rows = weight.clone().requires_grad_(True)
        out = F.embedding(ids, rows).reshape(3, 12, -1)
        F.mse_loss(out, target(step - 1, out.shape)).backward()
        touched = torch.unique(ids)
        g = rows.grad[touched]
        m[touched] = b1 * m[touched] + (1 - b1) * g
        v[touched] = b2 * v[touched] + (1 - b2) * g.pow(2).mean(1)
        denom = v[touched].sqrt() / math.sqrt(1 - b2**step) + eps
        weight[touched] -= (lr / (1 - b1**step)) * (m[touched] / denom.unsqueeze(1))
    torch.testing.assert_close(module.rows.weight, weight, rtol=1e-5, atol=1e-6)
    assert module.rows.table.step_count() == 4


def test_prefetch_and_placement_change_no_bit():
    data = batches(5)
    plain = train(make(), data)
    runs = {
        "prefetch": (make(), True),
        "gpu placement (CPU memory)": (make(placement="gpu"), False),
        "rowwise_adagrad": (make(optimizer="rowwise_adagrad"), False),
    }
    modules = {name: (module, train(module, data, prefetch)) for name, (module, prefetch) in runs.items()}
    reference = make()
    train(reference, data)
    assert all(torch.equal(a, b) for a, b in zip(plain, modules["prefetch"][1]))
    assert torch.equal(modules["prefetch"][0].rows.weight, reference.rows.weight)
    assert torch.equal(modules["gpu placement (CPU memory)"][0].rows.weight, reference.rows.weight)
    assert not torch.equal(modules["rowwise_adagrad"][0].rows.weight, reference.rows.weight)  # the optimizer matters


def test_prefetch_needs_the_same_tensor():
    module = make()
    first, second = batches(2)
    module.prefetch(first)
    expected = module.rows.weight[module.hash(first)].reshape(3, 12, -1)
    assert torch.equal(module(first.clone()).detach(), expected)  # another tensor: hashed again, same rows
    assert module.rows._prefetched is None  # the unused prefetch is dropped, not tracked for ever


class _SeesMaxSms:
    """Stands in for a module's table: records the transfer option ``max_sms`` in force at each gather."""

    def __init__(self, table, seen, fail=False):
        self._table, self._seen, self._fail = table, seen, fail

    def gather(self, *args, **kwargs):
        self._seen.append(speedtorch.transfer_config()["max_sms"])
        if self._fail:
            raise RuntimeError("gather failed")
        return self._table.gather(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._table, name)


def test_prefetch_max_sms_bounds_the_gather_only_and_is_restored():
    """Issue 26: the prefetch's gather runs under max_sms; the hash, the forward and everything after run under the
    setting that was in force before, also when the gather raises."""
    module = make()
    first, second = batches(2)
    seen = []
    module.rows.table = _SeesMaxSms(module.rows.table, seen)
    with speedtorch.transfer_config_override(max_sms=5):  # whatever was set before the prefetch comes back
        module.prefetch(first, max_sms=3)
        assert seen == [3.0] and speedtorch.transfer_config()["max_sms"] == 5.0
        out = module(first)  # takes the prefetched rows: no gather
        assert seen == [3.0]
        module(second)  # an ordinary forward's gather: unbounded by the prefetch's option
        assert seen == [3.0, 5.0]
        module.prefetch(second)  # None: the setting is left alone
        assert seen == [3.0, 5.0, 5.0]
        module.rows.table = _SeesMaxSms(module.rows.table._table, seen, fail=True)
        with pytest.raises(RuntimeError, match="gather failed"):
            module.prefetch(first, max_sms=7)
        assert seen[-1] == 7.0 and speedtorch.transfer_config()["max_sms"] == 5.0
    assert speedtorch.transfer_config()["max_sms"] == 0.0
    assert torch.equal(out.detach(), module.rows.weight[module.hash(first)].reshape(3, 12, -1))


def test_prefetch_max_sms_none_touches_no_setting(monkeypatch):
    calls = []
    monkeypatch.setattr(speedtorch.nn.ngram_embedding, "transfer_config_override", lambda **o: calls.append(o))
    module = make()
    module.prefetch(batches(1)[0])
    assert calls == []
    with pytest.raises(ValueError, match="max_sms"):
        module.prefetch(batches(1)[0], max_sms=-1)


def test_prefetch_with_max_sms_changes_no_bit():
    data = batches(5)
    reference = make()
    plain = train(reference, data)
    for bounded in (make(), make(placement="hybrid", cache_rows=32)):
        assert all(torch.equal(a, b) for a, b in zip(plain, train(bounded, data, prefetch=True, max_sms=2)))
        assert torch.equal(bounded.rows.weight, reference.rows.weight)


def test_quantized_copy_serves_the_trained_rows():
    module = make()
    train(module, batches(2))
    tokens = batches(1, seed=9)[0]
    for format in ("bf16", "int8_rowwise"):
        lookup = module.quantized(format)
        ids = module.hash(tokens)
        expected = lookup.rows.dequantize()[ids].reshape(3, 12, -1)
        assert torch.equal(lookup(tokens), expected)
        assert torch.equal(lookup(tokens, last_only=True), expected[:, -1:])  # a decode step's rows


@pytest.mark.gpu
def test_gpu_training_prefetch_and_placements_agree_bit_for_bit():
    data = batches(5, batch=4, seq=64)
    host = make(device="cuda", async_update=False)
    train(host, data)
    others = [(make(device="cuda"), True), (make(device="cuda", placement="gpu"), True),
              (make(device="cuda", update="backward"), True), (make(device="cuda", placement="gpu"), False)]
    for module, prefetch in others:  # async updates (the default on a GPU), prefetch, placements, update modes
        train(module, data, prefetch)
        torch.cuda.synchronize()
        assert torch.equal(module.rows.weight.cpu(), host.rows.weight.cpu())


@pytest.mark.gpu
@pytest.mark.parametrize("max_sms", [1, 4])
def test_gpu_prefetch_with_max_sms_is_bit_identical(max_sms):
    """Issue 26: the prefetch's gather bounded to a few SMs on its side stream (async updates on, host placement)
    trains the same bits as no prefetch, and leaves the process's setting as it was."""
    data = batches(5, batch=4, seq=64)
    reference = make(device="cuda", async_update=False)
    expected = train(reference, data)
    before = speedtorch.transfer_config()["max_sms"]
    for module in (make(device="cuda"), make(device="cuda", placement="hybrid", cache_rows=32)):
        outputs = train(module, data, prefetch=True, max_sms=max_sms)
        torch.cuda.synchronize()
        assert speedtorch.transfer_config()["max_sms"] == before
        assert all(torch.equal(a, b) for a, b in zip(outputs, expected))
        assert torch.equal(module.rows.weight.cpu(), reference.rows.weight.cpu())


@pytest.mark.gpu
def test_gpu_graphed_lookup_equals_eager():
    module = make(dim=32, device="cuda", rows_per_head=1000)
    train(module, batches(2))
    lookup = module.quantized("fp8_e4m3_ue8m0", row_alignment=16)
    graphed = lookup.graphed(4, 8)
    newest = lookup.graphed(4, 3, last_only=True)
    for tokens in batches(3, batch=4, seq=8, seed=5):
        assert torch.equal(graphed(tokens.cuda()).cpu(), lookup(tokens).cpu())
        assert torch.equal(newest(tokens[:, -3:].cuda()).cpu(), lookup(tokens).cpu()[:, -1:])
    with speedtorch.deferred_index_checks(False):
        speedtorch.check_index_errors()  # nothing flagged


def _copies(module) -> dict:
    """copy.deepcopy, pickle and torch.save / torch.load of a module (the three ways a model is copied)."""
    buffer = io.BytesIO()
    torch.save(module, buffer)
    buffer.seek(0)
    return {"deepcopy": copy.deepcopy(module), "pickle": pickle.loads(pickle.dumps(module)),
            "torch.save": torch.load(buffer, weights_only=False)}


class _StandIn:
    """Stands in for a CUDA stream or event on the CPU: it synchronizes (a no-op) and, as they do, cannot be pickled."""

    def __init__(self):
        self._lock = threading.Lock()

    def synchronize(self) -> None:
        pass


def test_copies_leave_the_runtime_attributes_behind():
    """The update stream and its event (CUDA objects of this process, set once a GPU update ran: stand-ins here that
    cannot be pickled) and a pending prefetch are not part of a copy, which starts without them and trains as the
    original does."""
    module = make()
    data = batches(3)
    train(module, data[:2])
    module.prefetch(data[2])
    module.rows._update_stream, module.rows._written = _StandIn(), _StandIn()
    for how, copied in _copies(module).items():
        assert copied.rows._update_stream is None and copied.rows._written is None, how
        assert copied._prefetched is None and copied.rows._prefetched is None, how
        assert torch.equal(copied.rows.weight, module.rows.weight), how
        assert copied.rows.table.step_count() == 2, how
    module.rows._update_stream, module.rows._written = None, None
    copied = _copies(module)["deepcopy"]
    train(module, data[2:])
    train(copied, data[2:])
    assert torch.equal(copied.rows.weight, module.rows.weight)


@pytest.mark.gpu
def test_gpu_copies_of_a_trained_module_train_on():
    """A module whose updates ran on its own CUDA stream (async_update) is copied, pickled and saved without that
    stream and its event; each copy holds the trained rows and trains on as the original does."""
    data = batches(4, batch=4, seq=64)
    module = make(device="cuda")
    train(module, data[:2])
    assert module.rows._update_stream is not None  # the update ran on its own stream
    for how, copied in _copies(module).items():
        assert copied.rows._update_stream is None and copied.rows._written is None, how
        torch.cuda.synchronize()
        assert torch.equal(copied.rows.weight.cpu(), module.rows.weight.cpu()), how
        reference = copy.deepcopy(module)
        train(reference, data[2:])
        train(copied, data[2:])
        torch.cuda.synchronize()
        assert torch.equal(copied.rows.weight.cpu(), reference.rows.weight.cpu()), how
