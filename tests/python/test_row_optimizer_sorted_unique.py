"""row_optimizer_step_(..., sorted_unique=True) and PinnedEmbedding.apply_gradients(..., sorted_unique=True): the
caller vouches its indices are strictly increasing, so the op skips its de-duplication. Results are exactly those
without the flag, on every route; a caller that passes duplicates (or unsorted ids) gets an error and nothing is
updated; HostEmbedding and the placements use the flag. Also: the CPU kernels give the same bits on one thread as
on several (their grain sizes decide when a second thread helps)."""

from __future__ import annotations

import pytest
import torch

import speedtorch
from speedtorch.nn import HostEmbedding
from speedtorch.nn.placement import DeviceTable

OPTIMIZERS = [("adam", {"lr": 0.01}), ("sgd", {"lr": 0.1, "momentum": 0.9}), ("rowwise_adagrad", {"lr": 0.1})]
# (where the table and state live, where the ids and gradients are)
ROUTES = [
    ("cpu", "cpu"),
    pytest.param("cuda", "cuda", marks=pytest.mark.gpu),
    pytest.param("pinned", "cuda", marks=pytest.mark.gpu),
    pytest.param("pinned", "cpu", marks=pytest.mark.gpu),
]


def make_table(n, d, kind, options, where, seed=0):
    width = speedtorch.PinnedEmbedding.state_width(kind, options, d)
    gen = torch.Generator().manual_seed(seed)
    values = torch.randn(n, d, generator=gen)
    state = torch.randn(n, width, generator=gen).abs()  # never zeros: a missed update must show
    state[:, 0].zero_()  # the per-row step count (an int32 in the header float)
    if where == "pinned":
        w, s = speedtorch.pinned_empty(n, d), speedtorch.pinned_empty(n, width)
        w.copy_(values)
        s.copy_(state)
        return w, s
    return values.to(where), state.to(where)


def sorted_batch(n, count, d, gen, dtype=torch.int64):
    ids = torch.randperm(n, generator=gen)[:count].sort().values.to(dtype)
    return ids, torch.randn(count, d, generator=gen)


def synchronize():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


@pytest.mark.parametrize(("table_at", "ids_at"), ROUTES)
@pytest.mark.parametrize(("kind", "options"), OPTIMIZERS, ids=[o[0] for o in OPTIMIZERS])
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
def test_skip_gives_the_same_bits(table_at, ids_at, kind, options, index_dtype):
    n, d = 400, 20
    w1, s1 = make_table(n, d, kind, options, table_at)
    w2, s2 = make_table(n, d, kind, options, table_at)
    gen = torch.Generator().manual_seed(5)
    for step in range(1, 5):
        ids, grad = sorted_batch(n, 150, d, gen, index_dtype)
        ids, grad = ids.to(ids_at), grad.to(ids_at)
        torch.ops.speedtorch.row_optimizer_step_(w1, s1, ids, grad, kind, options, step)
        torch.ops.speedtorch.row_optimizer_step_(w2, s2, ids, grad, kind, options, step, True)
    synchronize()
    assert torch.equal(w1.cpu(), w2.cpu())
    assert torch.equal(s1.cpu(), s2.cpu())


@pytest.mark.parametrize(("table_at", "ids_at"), ROUTES)
@pytest.mark.parametrize("ids", [[1, 3, 3, 5], [5, 3, 1], [2, 2]], ids=["duplicate", "descending", "all-same"])
def test_a_caller_that_lies_gets_an_error_and_nothing_moves(table_at, ids_at, ids):
    n, d = 10, 6
    w, s = make_table(n, d, "adam", {}, table_at)
    w0, s0 = w.clone(), s.clone()
    ids = torch.tensor(ids)
    with pytest.raises(ValueError, match=r"sorted_unique=True.*position \d+ holds"):
        torch.ops.speedtorch.row_optimizer_step_(w, s, ids.to(ids_at), torch.randn(len(ids), d).to(ids_at), "adam",
                                                 {}, 1, True)
    synchronize()
    assert torch.equal(w, w0) and torch.equal(s, s0)


@pytest.mark.parametrize(("table_at", "ids_at"), ROUTES)
def test_the_skip_still_checks_the_range(table_at, ids_at):
    w, s = make_table(10, 4, "adam", {}, table_at)
    w0 = w.clone()
    for ids in ([3, 10], [-1, 4]):
        with pytest.raises(IndexError, match="every index must be in"):
            torch.ops.speedtorch.row_optimizer_step_(w, s, torch.tensor(ids).to(ids_at), torch.randn(2, 4).to(ids_at),
                                                     "adam", {}, 1, True)
    synchronize()
    assert torch.equal(w, w0)


def test_pinned_embedding_apply_gradients_with_the_skip():
    n, d = 300, 12
    tables = []
    for _ in range(2):
        t = speedtorch.PinnedEmbedding(n, d)
        t.set_optimizer("adamw", {"lr": 0.01, "weight_decay": 0.1}, True)
        t.normal_(0.0, 1.0, 3)
        tables.append(t)
    gen = torch.Generator().manual_seed(2)
    for _ in range(3):
        ids, grad = sorted_batch(n, 80, d, gen)
        tables[0].apply_gradients(ids, grad)
        tables[1].apply_gradients(ids, grad, True)
    assert torch.equal(tables[0].table(), tables[1].table())
    assert torch.equal(tables[0].state(), tables[1].state())
    before = tables[1].table().clone(), tables[1].state().clone(), tables[1].step_count()
    with pytest.raises(ValueError, match="sorted_unique=True"):
        tables[1].apply_gradients(torch.tensor([4, 4, 7]), torch.randn(3, d), True)
    assert torch.equal(tables[1].table(), before[0]) and torch.equal(tables[1].state(), before[1])
    assert tables[1].step_count() == before[2]  # a refused step does not count
    # A row cache sums duplicates itself, but the claim is checked all the same: the same answer on every placement.
    tables[1].enable_cache(16, "cpu")
    with pytest.raises(ValueError, match="sorted_unique=True"):
        tables[1].apply_gradients(torch.tensor([4, 4, 7]), torch.randn(3, d), True)
    assert tables[1].step_count() == before[2]


def test_scripted_callers_may_leave_the_flag_out():
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = torch.classes.speedtorch.PinnedEmbedding(8, 2)
            self.table.set_optimizer("sgd", {"lr": 1.0}, True)

        def forward(self, ids: torch.Tensor, grad: torch.Tensor, skip: bool) -> torch.Tensor:
            if skip:
                self.table.apply_gradients(ids, grad, True)
            else:
                self.table.apply_gradients(ids, grad)
            return self.table.table()

    model = torch.jit.script(Model())
    model.table.zero_()
    out = model(torch.tensor([1, 1]), torch.ones(2, 2), False)  # duplicates summed
    assert torch.equal(out[1], torch.full((2,), -2.0))
    out = model(torch.tensor([1, 2]), torch.ones(2, 2), True)
    assert torch.equal(out[1], torch.full((2,), -3.0)) and torch.equal(out[2], torch.full((2,), -1.0))


class CountingTable:
    """Wraps a table, recording the sorted_unique flag of each apply_gradients (delegates everything else)."""

    def __init__(self, table):
        self._table = table
        self.flags = []

    def apply_gradients(self, indices, grad, sorted_unique=False):
        self.flags.append(sorted_unique)
        self._table.apply_gradients(indices, grad, sorted_unique)

    def __getattr__(self, name):
        return getattr(self._table, name)


@pytest.mark.parametrize("update", ["step", "backward"])
def test_host_embedding_skips_for_one_forward_and_matches_the_op(update):
    n, d = 200, 8
    module = HostEmbedding(n, d, device="cpu", seed=4, optimizer="adam", optimizer_options={"lr": 0.05}, update=update)
    reference = speedtorch.PinnedEmbedding(n, d)
    reference.set_optimizer("adam", {"lr": 0.05}, True)
    reference.copy_(module.weight)
    counting = CountingTable(module.table)
    module.table = counting
    gen = torch.Generator().manual_seed(9)
    for _ in range(4):
        ids = torch.randint(0, 50, (6, 9), generator=gen)  # many duplicates
        target = torch.randn(d, generator=gen)
        out = module(ids)
        ((out - target) ** 2).sum().backward()
        module.step()
        # The reference: every occurrence's gradient, summed by the op itself (no skip).
        rows = reference.gather(ids.reshape(-1)).requires_grad_()
        ((rows - target) ** 2).sum().backward()
        reference.apply_gradients(ids.reshape(-1), rows.grad)
    assert counting.flags == [True] * 4
    torch.testing.assert_close(module.weight, reference.table(), rtol=1e-6, atol=1e-6)


def test_host_embedding_two_forwards_before_a_step_do_not_skip():
    n, d = 50, 4
    module = HostEmbedding(n, d, device="cpu", seed=1, optimizer="sgd", optimizer_options={"lr": 1.0})
    start = module.weight.clone()
    counting = CountingTable(module.table)
    module.table = counting
    for _ in range(2):
        module(torch.tensor([3, 7])).sum().backward()  # the same rows in both: repeats the op must sum
    module.step()
    assert counting.flags == [False]
    assert torch.equal(module.weight[3], start[3] - 2.0) and torch.equal(module.weight[7], start[7] - 2.0)


@pytest.mark.gpu
@pytest.mark.parametrize("placement", ["gpu", "hybrid"])
def test_placements_pass_the_skip_and_match(placement):
    n, d = 300, 8
    kwargs = dict(device="cuda", seed=2, optimizer="adam", optimizer_options={"lr": 0.05}, placement=placement)
    if placement == "hybrid":
        kwargs["hot_rows"] = torch.arange(0, n, 7)
    module = HostEmbedding(n, d, **kwargs)
    reference = HostEmbedding(n, d, device="cuda", seed=2, optimizer="adam", optimizer_options={"lr": 0.05})
    reference.table.copy_(module.weight.cpu())
    gen = torch.Generator().manual_seed(3)
    for _ in range(3):
        ids = torch.randint(0, n, (64,), generator=gen)
        for m in (module, reference):
            m(ids).pow(2).sum().backward()
            m.step()
    torch.cuda.synchronize()
    torch.testing.assert_close(module.weight.cpu(), reference.weight.cpu(), rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
def test_device_table_refuses_a_lie():
    table = DeviceTable(10, 4, torch.float32, torch.device("cuda"))
    table.set_optimizer("adam", {})
    before = table.table().clone()
    with pytest.raises(ValueError, match="sorted_unique=True"):
        table.apply_gradients(torch.tensor([2, 2], device="cuda"), torch.ones(2, 4, device="cuda"), True)
    assert torch.equal(table.table(), before) and table.step_count() == 0


@pytest.mark.gpu
def test_host_indices_are_checked_under_deferred_checks_too(deferred_checks):
    """A GPU step with ids on the host checks the claim on the host whatever the index-check mode; a cached table's
    step checks it as the plain one does."""
    table = speedtorch.PinnedEmbedding(10, 4)
    table.set_optimizer("adam", {}, True)
    before = table.table().clone()
    with pytest.raises(ValueError, match="sorted_unique=True"):
        table.apply_gradients(torch.tensor([2, 2]), torch.ones(2, 4, device="cuda"), True)
    assert torch.equal(table.table(), before) and table.step_count() == 0


@pytest.mark.gpu
@pytest.mark.parametrize("uva_fraction", [-1.0, 0.0, 0.5])
def test_host_ids_changed_after_the_call_never_reach_the_table(uva_fraction):
    # The step checks the caller's pinned host ids, then copies them to the GPU asynchronously: it used to read the
    # caller's tensor after the check, so an id changed meanwhile (here: while the stream is held by a long kernel)
    # was used unchecked, and the CPU share wrote past the table. The values used are now a copy taken before the
    # check. uva_fraction -1: every row over UVA; 0: every row by CPU threads; 0.5: both.
    n, d = 64, 8
    w, s = make_table(n, d, "sgd", {"lr": 1.0}, "pinned")
    w0, s0 = w.clone(), s.clone()
    ids = torch.tensor([3, 9, 20], dtype=torch.int64).pin_memory()
    grad = torch.ones(3, d, device="cuda")
    with speedtorch.transfer_config_override(uva_fraction=uva_fraction):
        torch.cuda._sleep(200_000_000)  # hold the stream: the step's own copies and kernels queue behind it
        torch.ops.speedtorch.row_optimizer_step_(w, s, ids, grad, "sgd", {"lr": 1.0}, 1, True)
        ids.fill_(1 << 40)
        synchronize()
    expected = w0.clone()
    expected[[3, 9, 20]] -= 1.0
    assert torch.equal(w, expected)
    untouched = torch.ones(n, dtype=torch.bool)
    untouched[[3, 9, 20]] = False
    assert torch.equal(s[untouched], s0[untouched])


@pytest.mark.gpu
def test_a_gpu_cache_checks_the_claim_on_the_gpu():
    table = speedtorch.PinnedEmbedding(10, 4)
    table.set_optimizer("adam", {}, True)
    table.enable_cache(4, "cuda")
    with pytest.raises(ValueError, match="sorted_unique=True"):
        table.apply_gradients(torch.tensor([5, 3], device="cuda"), torch.ones(2, 4, device="cuda"), True)
    assert table.step_count() == 0


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("count", [50, 40_000])
def test_duplicates_are_summed_as_unique_and_index_add_do(threads, count):
    """The CPU route's de-duplication (cpu/row_sum_cpu.h) hands the step the bits that torch.unique and index_add_
    into zeros give, in batches small enough for one thread and large enough for two."""
    n, d = 600, 16
    kind, options = "adam", {"lr": 0.01}
    gen = torch.Generator().manual_seed(9)
    ids = torch.randint(0, n, (count,), generator=gen)
    grad = torch.randn(count, d, generator=gen)
    unique, inverse = torch.unique(ids, sorted=True, return_inverse=True)
    summed = torch.zeros(unique.numel(), d).index_add_(0, inverse, grad)
    w1, s1 = make_table(n, d, kind, options, "cpu")
    w2, s2 = make_table(n, d, kind, options, "cpu")
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        torch.ops.speedtorch.row_optimizer_step_(w1, s1, ids.int(), grad, kind, options, 1)
    finally:
        torch.set_num_threads(previous)
    torch.ops.speedtorch.row_optimizer_step_(w2, s2, unique, summed, kind, options, 1, True)
    assert torch.equal(w1, w2)
    assert torch.equal(s1, s2)


@pytest.mark.parametrize("kind", ["adam", "rowwise_adagrad"])
def test_cpu_kernels_give_the_same_bits_on_one_thread_as_on_two(kind):
    """Batches large enough to be split between threads (over the grain sizes) update and gather exactly as one
    thread does: each row is worked on by one thread."""
    n, d = 20_000, 32
    options = {"lr": 0.01}
    gen = torch.Generator().manual_seed(8)
    ids, grad = sorted_batch(n, 12_000, d, gen)
    results = []
    threads = torch.get_num_threads()
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            w, s = make_table(n, d, kind, options, "cpu")
            torch.ops.speedtorch.row_optimizer_step_(w, s, ids, grad, kind, options, 1, True)
            results.append((w, s, torch.ops.speedtorch.gather(w, ids.flip(0))))
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(*results):
        assert torch.equal(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("where", ["pinned", "cuda"])
@pytest.mark.parametrize("kind,d", [("rowwise_adagrad", 128), ("rowwise_adagrad", 16), ("adam", 16), ("adam", 7)])
def test_deferred_checks_let_a_gpu_step_run_unread_and_the_kernels_flag_what_breaks_the_claim(where, kind, d):
    """Under deferred index checks a step on CUDA ids told sorted_unique does not read them back (no wait for the
    GPU): every kernel checks each row's range and that it is above the row before it, flags what fails for
    speedtorch.check_index_errors and leaves that row alone, updating the others as the checked step does."""
    n = 64
    ids = torch.tensor([2, 5, 5, 9, 70], device="cuda")  # 5 repeated next to itself, 70 outside the table
    grad = torch.randn(5, d, generator=torch.Generator().manual_seed(3)).cuda()
    w, s = make_table(n, d, kind, {"lr": 0.1}, where)
    w_ref, s_ref = make_table(n, d, kind, {"lr": 0.1}, where)
    good = torch.tensor([0, 1, 3])  # the positions of 2, 5 (its first), 9
    torch.ops.speedtorch.row_optimizer_step_(w_ref, s_ref, ids[good], grad[good], kind, {"lr": 0.1}, 1, True)
    with speedtorch.deferred_index_checks():
        torch.ops.speedtorch.row_optimizer_step_(w, s, ids, grad, kind, {"lr": 0.1}, 1, True)
    with pytest.raises((IndexError, ValueError), match="position 2|position 4"):
        speedtorch.check_index_errors()
    speedtorch.check_index_errors()  # cleared
    assert torch.equal(w.cpu(), w_ref.cpu()) and torch.equal(s.cpu(), s_ref.cpu())


@pytest.mark.gpu
def test_an_unsorted_claim_found_by_the_gpu_is_reported_in_words():
    w, s = make_table(10, 4, "sgd", {"lr": 1.0}, "pinned")
    with speedtorch.deferred_index_checks():
        torch.ops.speedtorch.row_optimizer_step_(w, s, torch.tensor([3, 1], device="cuda"),
                                                 torch.ones(2, 4, device="cuda"), "sgd", {"lr": 1.0}, 1, True)
    with pytest.raises(ValueError, match="sorted_unique=True.*position 1 holds 1"):
        speedtorch.check_index_errors()
