"""speedtorch.optim.HostEmbeddingOptimizer and CombinedOptimizer: HostEmbedding in the standard torch training loop
(one optimizer, an LR scheduler, GradScaler, zero_grad), equal to nn.Embedding(sparse=True) + SparseAdam."""

from __future__ import annotations

import pytest
import torch

import speedtorch
from speedtorch.nn import HostEmbedding, dense_parameters
from speedtorch.optim import CombinedOptimizer, HostEmbeddingOptimizer

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


class Model(torch.nn.Module):
    """The README's recommender, small: a user table (HostEmbedding or nn.Embedding) and a dense tower."""

    def __init__(self, users: torch.nn.Module, dim: int, device):
        super().__init__()
        self.users = users
        self.tower = torch.nn.Linear(dim, 1).to(device)

    def forward(self, ids):
        return self.tower(self.users(ids)).squeeze(-1)


def make_models(n, d, device, lr, optimizer="sparse_adam"):
    host = HostEmbedding(n, d, device=device, seed=0, optimizer=optimizer, optimizer_options={"lr": lr})
    ref = torch.nn.Embedding(n, d, sparse=True, device=device)
    with torch.no_grad():
        ref.weight.copy_(host.weight)
    torch.manual_seed(0)
    a = Model(host, d, device)
    torch.manual_seed(0)
    b = Model(ref, d, device)
    return a, b


def standard_loop(model, optimizer, device, steps=8, scale=None, poison_step=None):
    """The README's training loop written the standard way: one optimizer, a warm-up schedule, GradScaler."""
    sched = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / 4))
    scaler = torch.amp.GradScaler(device if isinstance(device, str) else device.type, init_scale=scale or 1.0,
                                  enabled=scale is not None, growth_interval=3)
    gen = torch.Generator().manual_seed(5)
    for step in range(steps):
        ids = torch.randint(0, 40, (16,), generator=gen)  # skewed: repeats
        labels = torch.rand(16, generator=gen).to(device)
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(ids.to(device)), labels)
        if step == poison_step:
            loss = loss * float("inf")  # every gradient non-finite: GradScaler must skip this step
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        sched.step()
    return scaler


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scale", [None, 1024.0])
def test_the_standard_loop_trains_like_sparse_adam(device, scale):
    """The target: one combined optimizer, an LR schedule, GradScaler and zero_grad drive HostEmbedding to the numbers
    of nn.Embedding(sparse=True) + SparseAdam, default eps (optimizer="sparse_adam": SparseAdam adds eps before the
    bias correction, Adam after; the test used to hide that with eps=1e-12)."""
    a, b = make_models(200, 8, device, lr=0.05)
    opt_a = CombinedOptimizer([HostEmbeddingOptimizer(a), torch.optim.Adam(dense_parameters(a), lr=0.01)])
    opt_b = CombinedOptimizer([torch.optim.SparseAdam(b.users.parameters(), lr=0.05),
                               torch.optim.Adam(b.tower.parameters(), lr=0.01)])
    standard_loop(a, opt_a, device, scale=scale)
    standard_loop(b, opt_b, device, scale=scale)
    if device == "cuda":
        torch.cuda.synchronize()
    # float32 rounding: the CUDA kernels (fused, FMA) round differently from torch's
    tol = dict(rtol=1e-5, atol=1e-6) if device == "cpu" else dict(rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(a.users.weight, b.users.weight.detach().cpu(), **tol)
    torch.testing.assert_close(a.tower.weight, b.tower.weight, **tol)
    assert a.users.table.step_count() == 8
    assert opt_a.param_groups[0]["lr"] == pytest.approx(0.05)  # the schedule reached the table's group


@pytest.mark.parametrize("device", DEVICES)
def test_sparse_adam_matches_torch_where_eps_decides(device):
    """Gradients of 1e-9 (a saturated logit's): there eps, not the gradient, sets the step, so where eps enters
    decides the result. "sparse_adam" follows torch.optim.SparseAdam; "adam" follows torch.optim.Adam (its moves are
    30x SparseAdam's at step 1 here, so a mix-up cannot pass)."""
    moved = {}
    for optimizer in ("sparse_adam", "adam"):
        host = HostEmbedding(50, 4, device=device, seed=0, optimizer=optimizer, optimizer_options={"lr": 0.01})
        ref = torch.nn.Embedding(50, 4, sparse=True, device=device)
        with torch.no_grad():
            ref.weight.copy_(host.weight)
        start = ref.weight.detach().cpu().clone()
        ref_opt = torch.optim.SparseAdam(ref.parameters(), lr=0.01)
        gen = torch.Generator().manual_seed(1)
        for _ in range(5):
            ids = torch.randint(0, 20, (32,), generator=gen).to(device)
            for emb in (host, ref):
                (emb(ids).sum() * 1e-9).backward()
            host.step()
            ref_opt.step()
            ref_opt.zero_grad()
        if device == "cuda":
            torch.cuda.synchronize()
        moved[optimizer] = (host.weight.detach().cpu() - start).abs().max().item()
        if optimizer == "sparse_adam":
            torch.testing.assert_close(host.weight.detach().cpu(), ref.weight.detach().cpu(), rtol=1e-5, atol=1e-7)
            assert host.table.optimizer() == "sparse_adam"
    assert moved["adam"] > 10 * moved["sparse_adam"]


def test_grad_scaler_unscales_the_rows_gradient():
    """The issue's case: with a loss scale of 1024 the row must move as nn.Embedding's does (0.0368), not by the
    scaled gradient (37.68)."""
    a = HostEmbedding(20, 4, device="cpu", seed=0, optimizer="sgd", optimizer_options={"lr": 0.1})
    ref = torch.nn.Embedding(20, 4, sparse=True)
    with torch.no_grad():
        ref.weight.copy_(a.weight)
    before = a.weight[3].clone()
    for emb, opt in ((a, HostEmbeddingOptimizer(a)), (ref, torch.optim.SGD(ref.parameters(), lr=0.1))):
        scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
        scaler.scale((emb(torch.tensor([3, 3])) * 0.184).sum()).backward()
        scaler.step(opt)
        scaler.update()
    torch.testing.assert_close(a.weight, ref.weight.detach())
    torch.testing.assert_close(before - a.weight[3], torch.full((4,), 0.0368), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_grad_scaler_skips_a_step_with_non_finite_gradients(device):
    a, b = make_models(200, 8, device, lr=0.05)
    opt = CombinedOptimizer([HostEmbeddingOptimizer(a), torch.optim.Adam(dense_parameters(a), lr=0.01)])
    scaler = standard_loop(a, opt, device, steps=1, scale=1024.0)
    table, steps = a.users.weight.clone(), a.users.table.step_count()
    scale = scaler.get_scale()
    # One poisoned step: skipped whole (no row, no state, no step count moves), and the scale backs off.
    scaler = torch.amp.GradScaler(device, init_scale=scale)
    loss = a(torch.tensor([1, 2, 3], device=device)).sum() * float("inf")
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
    assert a.users.table.step_count() == steps
    torch.testing.assert_close(a.users.weight, table, rtol=0, atol=0)
    assert scaler.get_scale() < scale
    assert a.users.weight.grad is None


@pytest.mark.parametrize("combined", [False, True])
@pytest.mark.parametrize("scale", [1024.0, 1.0])
def test_grad_scaler_refuses_tables_updated_in_backward(combined, scale):
    """update="backward" applies the gradient inside backward, scaled by the loss scale and unchecked for inf/NaN:
    with a CombinedOptimizer and scale 1024 the row moved 27.8 instead of ~0.03, silently, and without a dense
    optimizer GradScaler failed with "No inf checks were recorded". Now a GradScaler stepping such a table raises,
    at any scale (it grows during training), saying to use update="step"."""
    emb = HostEmbedding(20, 4, device="cpu", seed=0, optimizer="sgd", optimizer_options={"lr": 0.1},
                        update="backward")
    model = torch.nn.Sequential(emb, torch.nn.Linear(4, 1))
    opt = HostEmbeddingOptimizer(model)
    if combined:
        opt = CombinedOptimizer([opt, torch.optim.SGD(dense_parameters(model), lr=0.1)])
    scaler = torch.amp.GradScaler("cpu", init_scale=scale)
    scaler.scale(model(torch.tensor([3, 3])).sum()).backward()
    with pytest.raises(RuntimeError, match=r"update='backward'.*scaled gradient.*update='step'"):
        scaler.step(opt)
    # Explicit unscale_ first (for clipping) does not hide it either.
    scaler = torch.amp.GradScaler("cpu", init_scale=scale)
    scaler.scale(model(torch.tensor([3])).sum()).backward()
    scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="update='backward'"):
        scaler.step(opt)
    # Without a GradScaler (or with a disabled one) the same optimizer steps: a scheduler's lr reaches the table.
    opt.zero_grad()
    opt.param_groups[0]["lr"] = 0.25
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    scaler.scale(model(torch.tensor([3])).sum()).backward()
    scaler.step(opt)
    scaler.update()
    assert emb.table.optimizer_options()["lr"] == pytest.approx(0.25)
    assert "found_inf" not in opt.__dict__ and "grad_scale" not in opt.__dict__
    # update="step" tables keep GradScaler's own path: unscaled by it, as test_grad_scaler_unscales_the_rows_gradient.
    emb.update = "step"
    assert not HostEmbeddingOptimizer(model)._step_supports_amp_scaling


def test_a_scheduler_changes_the_learning_rate_without_resetting_the_state():
    """LambdaLR over a HostEmbeddingOptimizer equals LambdaLR over SparseAdam, step by step: lr changes in place,
    the moments and the step count stay (before, set_optimizer with a new lr zeroed them)."""
    a, b = make_models(100, 4, "cpu", lr=0.1)
    opts = [HostEmbeddingOptimizer(a.users), torch.optim.SparseAdam(b.users.parameters(), lr=0.1)]
    scheds = [torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5) for o in opts]
    gen = torch.Generator().manual_seed(1)
    for _ in range(6):
        ids = torch.randint(0, 30, (12,), generator=gen)
        for model, opt, sched in zip((a, b), opts, scheds):
            model.users(ids).pow(2).sum().backward()
            opt.step()
            opt.zero_grad()
            sched.step()
        torch.testing.assert_close(a.users.weight, b.users.weight.detach(), rtol=1e-5, atol=1e-6)
    # The table holds what the scheduler set last (for the next step), not what the last step used.
    assert a.users.table.optimizer_options()["lr"] == pytest.approx(0.1 * 0.5 ** 3)
    assert a.users.table.step_count() == 6


def test_model_zero_grad_drops_the_pending_gradient():
    emb = HostEmbedding(50, 4, device="cpu", seed=0, optimizer="sgd", optimizer_options={"lr": 1.0})
    model = torch.nn.Sequential(emb)
    before = emb.weight.clone()
    model(torch.tensor([1, 2])).sum().backward()
    assert emb.weight.grad is not None and emb.weight.grad.is_sparse
    model.zero_grad()
    emb.step()
    torch.testing.assert_close(emb.weight, before, rtol=0, atol=0)
    assert emb.table.step_count() == 0
    # set_to_none=False empties the gradient in place: nothing is applied either.
    model(torch.tensor([1, 2])).sum().backward()
    model.zero_grad(set_to_none=False)
    HostEmbeddingOptimizer(model).step()
    torch.testing.assert_close(emb.weight, before, rtol=0, atol=0)
    assert emb.table.step_count() == 0


def test_optimizer_zero_grad_drops_the_pending_gradient_and_step_applies_it():
    emb = HostEmbedding(50, 4, device="cpu", seed=0, optimizer="sgd", optimizer_options={"lr": 1.0})
    opt = HostEmbeddingOptimizer(emb)
    before = emb.weight.clone()
    emb(torch.tensor([1, 1, 2])).sum().backward()
    opt.zero_grad()
    opt.step()
    torch.testing.assert_close(emb.weight, before, rtol=0, atol=0)
    emb(torch.tensor([1, 1, 2])).sum().backward()
    emb(torch.tensor([2])).sum().backward()  # a second backward adds to the pending gradient
    opt.step()
    expected = before.clone()
    expected[1] -= 2.0
    expected[2] -= 2.0
    torch.testing.assert_close(emb.weight, expected)


def test_an_empty_batch_is_no_step():
    """An empty batch must not advance the step count (it shifts Adam's bias correction)."""
    emb = HostEmbedding(50, 4, device="cpu", seed=0)
    opt = HostEmbeddingOptimizer(emb)
    emb(torch.empty(0, dtype=torch.int64)).sum().backward()
    opt.step()
    emb.step()
    assert emb.table.step_count() == 0
    emb(torch.tensor([3])).sum().backward()
    opt.step()
    assert emb.table.step_count() == 1


def test_state_dict_round_trip_keeps_the_scheduled_hyper_parameters():
    emb = HostEmbedding(30, 4, device="cpu", seed=0, optimizer="adam", optimizer_options={"lr": 0.1})
    opt = HostEmbeddingOptimizer(emb)
    opt.param_groups[0]["lr"] = 0.025
    opt.param_groups[0]["betas"] = (0.8, 0.99)
    saved = opt.state_dict()
    assert saved["param_groups"][0]["optimizer"] == "adam" and saved["state"] == {}
    other = HostEmbedding(30, 4, device="cpu", seed=0, optimizer="adam", optimizer_options={"lr": 0.1})
    opt2 = HostEmbeddingOptimizer(other)
    group = opt2.param_groups[0]
    opt2.load_state_dict(saved)
    assert opt2.param_groups[0] is group and group["lr"] == 0.025  # in place
    other(torch.tensor([1])).sum().backward()
    opt2.step()
    assert other.table.optimizer_options()["lr"] == pytest.approx(0.025)
    assert other.table.optimizer_options()["beta1"] == pytest.approx(0.8)
    sgd = HostEmbeddingOptimizer(HostEmbedding(30, 4, device="cpu", optimizer="sgd"))
    with pytest.raises(ValueError, match="trained with 'adam'"):
        sgd.load_state_dict(saved)


def test_param_groups_hold_every_option_under_torch_names():
    emb = HostEmbedding(10, 4, device="cpu", optimizer="adam", optimizer_options={"lr": 0.5, "amsgrad": 1})
    group = HostEmbeddingOptimizer(emb).param_groups[0]
    assert group["params"] == [emb.weight] and group["lr"] == 0.5 and group["amsgrad"] is True
    assert group["betas"] == (pytest.approx(0.9), pytest.approx(0.999)) and group["weight_decay"] == 0.0
    frozen = HostEmbedding(10, 4, device="cpu", optimizer=None)
    with pytest.raises(ValueError, match="no HostEmbedding with an optimizer"):
        HostEmbeddingOptimizer(frozen)


def test_one_cycle_schedule_drives_lr_and_betas():
    """OneCycleLR cycles lr and beta1 (it looks for betas in the optimizer's defaults): each step uses the values
    the schedule set before it."""
    emb = HostEmbedding(10, 4, device="cpu", optimizer="adam")
    opt = CombinedOptimizer([HostEmbeddingOptimizer(emb)])
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.1, total_steps=10)
    seen = set()
    for _ in range(4):
        group = opt.param_groups[0]
        emb(torch.tensor([1])).sum().backward()
        opt.step()
        opt.zero_grad()
        options = emb.table.optimizer_options()
        assert options["lr"] == pytest.approx(group["lr"], rel=1e-6)
        assert options["beta1"] == pytest.approx(group["betas"][0], rel=1e-6)
        seen.add(round(options["beta1"], 6))
        sched.step()
    assert len(seen) == 4 and emb.table.step_count() == 4


def test_a_torch_optimizer_holding_the_table_raises():
    """model.parameters() holds the table: a dense torch optimizer built from it would update the table twice."""
    emb = HostEmbedding(10, 4, device="cpu", optimizer="sgd")
    model = torch.nn.Sequential(emb, torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.tensor([1, 2])).sum().backward()
    with pytest.raises(RuntimeError, match="dense_parameters"):
        opt.step()
    # Built the documented way it steps; a frozen table in model.parameters() is harmless (it never has a gradient).
    torch.optim.SGD(dense_parameters(model), lr=0.1).step()
    frozen = torch.nn.Sequential(HostEmbedding(10, 4, device="cpu", optimizer=None), torch.nn.Linear(4, 1))
    adam = torch.optim.Adam(frozen.parameters())
    frozen(torch.tensor([1])).sum().backward()
    adam.step()


def test_set_optimizer_options_keeps_state_and_step():
    e = speedtorch.PinnedEmbedding(20, 4)
    e.normal_(0.0, 1.0, 0)
    e.set_optimizer("adam", {"lr": 0.1}, True)
    e.apply_gradients(torch.tensor([1, 2]), torch.ones(2, 4))
    state = e.state().clone()
    e.set_optimizer_options({"lr": 0.01, "beta1": 0.5})
    assert e.step_count() == 1 and torch.equal(e.state(), state)
    assert dict(e.optimizer_options()) == {"lr": 0.01, "beta1": 0.5}
    with pytest.raises(RuntimeError, match="change the layout"):
        e.set_optimizer_options({"amsgrad": 1})
    with pytest.raises(RuntimeError, match="does not apply to adam"):
        e.set_optimizer_options({"momentum": 0.9})
    assert dict(e.optimizer_options()) == {"lr": 0.01, "beta1": 0.5}  # a refused change leaves the options alone
    defaults = dict(speedtorch.PinnedEmbedding.optimizer_defaults("sgd"))
    assert defaults == {"lr": pytest.approx(1e-3), "per_row_step": 0.0, "stochastic_rounding": 0.0, "momentum": 0.0,
                        "dampening": 0.0, "nesterov": 0.0, "weight_decay": 0.0}

    @torch.jit.script
    def schedule(table: torch.classes.speedtorch.PinnedEmbedding, lr: float):
        table.set_optimizer_options({"lr": lr})

    schedule(e, 0.5)
    assert dict(e.optimizer_options()) == {"lr": 0.5}


def _train_step(module, optimizer, ids=(1, 2, 3)):
    module(torch.tensor(list(ids))).sum().backward()
    optimizer.step()
    optimizer.zero_grad()


def test_set_optimizer_moves_the_parameter_and_the_optimizer_follows():
    """A new optimizer re-lays the rows out (Adam's state beside each row; SGD without momentum has none): the
    registered parameter kept the old rows (torch.compile, torch.export and AveragedModel read stale rows), and an
    existing HostEmbeddingOptimizer failed at its step (KeyError 'momentum'; after amsgrad, "these options change
    the layout")."""
    module = HostEmbedding(20, 4, device="cpu", seed=0, optimizer="adam", optimizer_options={"lr": 0.1})
    opt = HostEmbeddingOptimizer(module)
    _train_step(module, opt)
    module.set_optimizer("sgd", {"lr": 0.5, "momentum": 0.9})
    param = dict(module.named_parameters())["weight"]
    assert param.data_ptr() == module.table.table().data_ptr() and torch.equal(param, module.table.table())
    eager = module.eval()(torch.tensor([1, 5]))
    compiled = torch.compile(module, fullgraph=True, backend="eager")(torch.tensor([1, 5]))
    exported = torch.export.export(module, (torch.tensor([1, 5]),)).module()(torch.tensor([1, 5]))
    assert torch.equal(compiled, eager) and torch.equal(exported, eager)
    averaged = torch.optim.swa_utils.AveragedModel(module)
    assert torch.equal(dict(averaged.module.named_parameters())["weight"], module.weight)
    module.train()
    before = module.weight.clone()
    _train_step(module, opt)  # SGD's first step with momentum: w -= lr * g (g = 1 for each looked-up element)
    assert opt.param_groups[0]["optimizer"] == "sgd" and opt.param_groups[0]["momentum"] == 0.9
    assert "betas" not in opt.param_groups[0] and module.table.optimizer_options()["lr"] == 0.5
    torch.testing.assert_close(module.weight[1:4], before[1:4] - 0.5)
    assert torch.equal(module.weight[4:], before[4:]) and module.table.step_count() == 1
    opt.param_groups[0]["lr"] = 0.25  # a scheduler's change still reaches the table
    _train_step(module, opt)
    assert module.table.optimizer_options()["lr"] == 0.25
    module.set_optimizer("adam", {"lr": 0.1, "amsgrad": 1})  # another layout of the same optimizer
    _train_step(module, opt)
    assert opt.param_groups[0]["amsgrad"] is True and module.table.optimizer_options()["amsgrad"] == 1.0
    module.set_optimizer("adam", {"lr": 0.3, "amsgrad": 1})  # the same layout: the new lr is kept, not the group's
    _train_step(module, opt)
    assert opt.param_groups[0]["lr"] == 0.3 and module.table.optimizer_options()["lr"] == 0.3


def test_an_optimizer_follows_a_table_re_configured_behind_the_module():
    """module.table.set_optimizer: the module cannot see it, but the optimizer's next step takes the table's new
    optimizer and moves the parameter onto the new rows."""
    module = HostEmbedding(20, 4, device="cpu", seed=0, optimizer="adam", optimizer_options={"lr": 0.1})
    opt = HostEmbeddingOptimizer(module)
    module.table.set_optimizer("sgd", {"lr": 0.5}, True)
    before = module.weight.clone()
    _train_step(module, opt)
    assert opt.param_groups[0]["optimizer"] == "sgd" and opt.param_groups[0]["lr"] == 0.5
    torch.testing.assert_close(module.weight[1:4], before[1:4] - 0.5)
    assert dict(module.named_parameters())["weight"].data_ptr() == module.table.table().data_ptr()
    module.table.set_optimizer("sgd", {"lr": 0.5, "momentum": 0.9}, True)
    _train_step(module, opt)
    assert opt.param_groups[0]["momentum"] == 0.9


@pytest.mark.parametrize("combined", [False, True])
@pytest.mark.parametrize("update", ["step", "backward"])
def test_update_in_backward_uses_the_learning_rate_the_scheduler_set_for_this_step(update, combined):
    """With update="backward" the update runs inside backward, before opt.step(): the scheduler's lr used to reach the
    table only inside opt.step(), so a schedule 0, 1, 2, 3, 4 moved the row by 1, 0, 1, 2, 3 (issue 31). A change
    to a param group now reaches the table at once: both modes move the row by the schedule."""
    emb = HostEmbedding(10, 3, device="cpu", seed=0, optimizer="sgd", optimizer_options={"lr": 1.0}, update=update)
    opt = HostEmbeddingOptimizer(emb)
    if combined:
        opt = CombinedOptimizer([opt, torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: float(step))
    moves = []
    for _ in range(5):
        before = emb.weight[2].clone()
        emb(torch.tensor([2])).sum().backward()  # the row's gradient is 1 in every column
        opt.step()
        opt.zero_grad()
        sched.step()
        moves.append(float((before - emb.weight[2]).mean()))
    assert moves == pytest.approx([0.0, 1.0, 2.0, 3.0, 4.0])
    # A value set by hand reaches the next backward too.
    opt.param_groups[0]["lr"] = 0.5
    before = emb.weight[2].clone()
    emb(torch.tensor([2])).sum().backward()
    opt.step()
    assert float((before - emb.weight[2]).mean()) == pytest.approx(0.5)


def test_copies_of_the_optimizer_hand_changes_to_their_own_table():
    """The groups hand their changes to the table of their own optimizer: a deep copy's to the copied table, which
    the copy steps."""
    import copy

    emb = HostEmbedding(10, 3, device="cpu", seed=0, optimizer="sgd", optimizer_options={"lr": 1.0})
    opt = HostEmbeddingOptimizer(emb)
    emb2, opt2 = copy.deepcopy((emb, opt))
    assert type(opt2.param_groups[0]).__name__ == "_TableGroup"
    opt2.param_groups[0]["lr"] = 0.25
    assert emb2.table.optimizer_options()["lr"] == pytest.approx(0.25)
    assert emb.table.optimizer_options()["lr"] == pytest.approx(1.0)
    emb2(torch.tensor([1])).sum().backward()
    before = emb2.weight[1].clone()
    opt2.step()  # the copy steps its own table (it used to lose the tables: torch.optim copies three attributes)
    assert float((before - emb2.weight[1]).mean()) == pytest.approx(0.25)
