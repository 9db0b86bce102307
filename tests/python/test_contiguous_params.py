"""speedtorch.ContiguousParams (torch.classes.speedtorch.ContiguousParams): flat parameter and gradient buffers
checked against plain PyTorch on an untouched copy of the same model, and the errors for each way the views break."""

from __future__ import annotations

import copy

import functools

import pytest
import torch
from torch import nn

import speedtorch


def make_model(seed: int = 0, dtype=torch.float32) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(7, 16), nn.LayerNorm(16), nn.Tanh(), nn.Linear(16, 5)).to(dtype)


def run_backward(model: nn.Module, x: torch.Tensor, create_graph: bool = False) -> None:
    model(x).pow(2).sum().backward(create_graph=create_graph)


def test_params_become_views_of_one_buffer_and_keep_their_values():
    model = make_model()
    before = [p.detach().clone() for p in model.parameters()]
    params = speedtorch.ContiguousParams(model.named_parameters())
    assert len(params) == 6 and params.num_groups() == 1
    (flat,) = params.contiguous()
    assert flat is params.contiguous()[0]  # the same tensor every call: optimizers keep their state
    assert flat.is_leaf and flat.requires_grad and flat.grad is params.grad_buffers()[0]
    for i, (p, b) in enumerate(zip(model.parameters(), before)):
        assert params.original()[i] is p
        assert torch.equal(p, b)
        assert p.data_ptr() == flat.data_ptr() + params.offset_of(i) * flat.element_size()
        assert p.data_ptr() % 64 == 0
        assert p.grad is not None and p.grad.data_ptr() == flat.grad.data_ptr() + params.offset_of(i) * 4
    params.assert_buffer_is_valid()


def test_backward_accumulates_into_the_flat_grad_buffer():
    model = make_model()
    reference = copy.deepcopy(model)
    params = speedtorch.ContiguousParams(model.parameters())
    for _ in range(2):  # twice: autograd must accumulate in place, not only write once
        x = torch.randn(9, 7)
        run_backward(model, x)
        run_backward(reference, x)
    params.assert_buffer_is_valid()
    grad = params.grad_buffers()[0]
    covered = torch.zeros(grad.numel(), dtype=torch.bool)
    for i, (p, r) in enumerate(zip(model.parameters(), reference.parameters())):
        piece = grad[params.offset_of(i) : params.offset_of(i) + p.numel()]
        torch.testing.assert_close(piece, r.grad.reshape(-1), rtol=1e-6, atol=1e-7)
        covered[params.offset_of(i) : params.offset_of(i) + p.numel()] = True
    assert torch.count_nonzero(grad[~covered]) == 0  # alignment padding stays zero
    assert torch.count_nonzero(params.contiguous()[0][~covered]) == 0


OPTIMIZERS = {
    "adam": lambda ps, **kw: torch.optim.Adam(ps, lr=1e-2, weight_decay=1e-3, **kw),
    "adamw": lambda ps, **kw: torch.optim.AdamW(ps, lr=1e-2, **kw),
    "sgd_momentum": lambda ps, **kw: torch.optim.SGD(ps, lr=1e-2, momentum=0.9, nesterov=True, **kw),
}


def train_side_by_side(model, reference, make_opt, steps=6, clip=0.5, device="cpu", **opt_kwargs):
    """Steps `make_opt` on the flat buffers of `model` and on the parameters of `reference` with the same data."""
    params = speedtorch.ContiguousParams(model.named_parameters())
    opt = make_opt(params.contiguous(), **opt_kwargs)
    opt_ref = make_opt(list(reference.parameters()), **opt_kwargs)
    in_dtype = next(model.parameters()).dtype
    for _ in range(steps):
        x = torch.randn(8, 7, device=device, dtype=in_dtype)
        params.zero_grad()
        opt_ref.zero_grad()
        run_backward(model, x)
        run_backward(reference, x)
        params.assert_buffer_is_valid()
        if clip is not None:
            norm = nn.utils.clip_grad_norm_(params.contiguous(), clip)
            norm_ref = nn.utils.clip_grad_norm_(reference.parameters(), clip)
            torch.testing.assert_close(norm, norm_ref, rtol=1e-6, atol=0)
        opt.step()
        opt_ref.step()
    params.assert_buffer_is_valid()
    return params


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("foreach", [False, True])
def test_optimizer_on_flat_buffer_matches_optimizer_on_parameters(name, foreach):
    model = make_model(1)
    reference = copy.deepcopy(model)
    initial = copy.deepcopy(model)
    train_side_by_side(model, reference, OPTIMIZERS[name], foreach=foreach)
    for p, r, p0 in zip(model.parameters(), reference.parameters(), initial.parameters()):
        assert not torch.equal(r, p0)  # the steps really moved every parameter
        torch.testing.assert_close(p, r, rtol=1e-6, atol=1e-7)


def test_fused_adam_on_flat_buffer_matches():
    model = make_model(2)
    reference = copy.deepcopy(model)
    train_side_by_side(model, reference, OPTIMIZERS["adam"], fused=True)
    for p, r in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, r, rtol=1e-6, atol=1e-7)


def test_clip_grad_norm_on_the_flat_view_equals_clipping_the_originals():
    model = make_model(3)
    reference = copy.deepcopy(model)
    params = speedtorch.ContiguousParams(model.parameters())
    x = torch.randn(5, 7)
    run_backward(model, x)
    run_backward(reference, x)
    norm = nn.utils.clip_grad_norm_(params.contiguous(), 0.1)
    norm_ref = nn.utils.clip_grad_norm_(reference.parameters(), 0.1)
    assert float(norm_ref) > 0.1  # the clip really scaled the gradients
    torch.testing.assert_close(norm, norm_ref, rtol=1e-6, atol=0)
    for p, r in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, r.grad, rtol=1e-6, atol=1e-8)


class TwoDtypes(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(7, 6)
        self.b = nn.Linear(6, 4).double()
        self.c = nn.Linear(4, 3)

    def forward(self, x):
        return self.c(self.b(self.a(x).double()).float())


def test_float32_and_float64_parameters_make_two_groups():
    torch.manual_seed(4)
    model = TwoDtypes()
    reference = copy.deepcopy(model)
    params = train_side_by_side(model, reference, OPTIMIZERS["adam"])
    assert params.num_groups() == 2
    assert [t.dtype for t in params.contiguous()] == [torch.float32, torch.float64]
    assert [params.group_of(i) for i in range(len(params))] == [0, 0, 1, 1, 0, 0]
    for p, r in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, r, rtol=1e-6, atol=1e-7)


def test_channels_last_weights_keep_their_memory_format():
    conv = nn.Conv2d(3, 8, 3).to(memory_format=torch.channels_last)
    speedtorch.ContiguousParams(conv.parameters())
    assert conv.weight.is_contiguous(memory_format=torch.channels_last)
    assert conv.weight.grad.stride() == conv.weight.stride()


def test_zero_grad_keeps_the_views():
    model = make_model()
    params = speedtorch.ContiguousParams(model.parameters())
    run_backward(model, torch.randn(4, 7))
    ptrs = [p.grad.data_ptr() for p in model.parameters()]
    flat_grad = params.contiguous()[0].grad
    params.zero_grad()
    assert [p.grad.data_ptr() for p in model.parameters()] == ptrs
    assert params.contiguous()[0].grad is flat_grad and torch.count_nonzero(flat_grad) == 0
    model.zero_grad(set_to_none=False)  # in place: allowed
    params.assert_buffer_is_valid()


def test_optimizer_zero_grad_set_to_none_is_reported_until_backward():
    model = make_model()
    params = speedtorch.ContiguousParams(model.parameters())
    opt = torch.optim.SGD(params.contiguous(), lr=0.1)
    opt.zero_grad()  # set_to_none=True: the flat .grad is None until the next backward
    with pytest.raises(RuntimeError, match=r"flat parameter of group 0 \(cpu, Float\) has \.grad None"):
        params.assert_buffer_is_valid()
    params.zero_grad()
    params.assert_buffer_is_valid()
    opt.zero_grad(set_to_none=False)
    params.assert_buffer_is_valid()


def test_module_zero_grad_set_to_none_is_reported_until_backward():
    model = make_model()
    params = speedtorch.ContiguousParams(model.named_parameters())
    model.zero_grad()
    with pytest.raises(RuntimeError, match=r"parameter 0 \('0\.weight'\)\.grad is None"):
        params.assert_buffer_is_valid()
    run_backward(model, torch.randn(3, 7))  # the gradients land in the flat buffer again
    params.assert_buffer_is_valid()


@pytest.mark.parametrize("zero_grad", ["optimizer", "module", "module_and_optimizer", "set_to_none_false", "params"])
@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_the_plain_training_loop_equals_unwrapped_training(zero_grad, name):
    """optimizer.zero_grad() / model.zero_grad() (set_to_none, torch's default) in the loop: exact, and every
    gradient stays in the flat buffer."""
    model, reference = make_model(), make_model()
    params = speedtorch.ContiguousParams(model.named_parameters())
    cls = {"sgd": functools.partial(torch.optim.SGD, momentum=0.9), "adam": torch.optim.Adam}[name]
    opt, opt_ref = cls(params.contiguous(), lr=0.01), cls(reference.parameters(), lr=0.01)
    for step in range(4):
        x = torch.randn(5, 7, generator=torch.Generator().manual_seed(step))
        if zero_grad == "optimizer":
            opt.zero_grad()
        elif zero_grad == "module":
            model.zero_grad()
        elif zero_grad == "module_and_optimizer":
            model.zero_grad()
            opt.zero_grad()
        elif zero_grad == "set_to_none_false":
            opt.zero_grad(set_to_none=False)
        else:
            params.zero_grad()
        opt_ref.zero_grad()
        model(x).pow(2).sum().backward()
        reference(x).pow(2).sum().backward()
        params.assert_buffer_is_valid()
        opt.step()
        opt_ref.step()
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-6, atol=1e-7)


class TwoBranches(nn.Module):
    """A trunk and head used every step, and a branch used only in the steps asked for."""

    def __init__(self, seed: int = 0, device: str = "cpu"):
        super().__init__()
        torch.manual_seed(seed)
        self.trunk, self.branch, self.head = nn.Linear(7, 16), nn.Linear(16, 16), nn.Linear(16, 5)
        self.to(device)

    def forward(self, x, use_branch: bool):
        h = torch.tanh(self.trunk(x))
        if use_branch:
            h = h + self.branch(h)
        return self.head(h)


OPTIMIZERS_WITH_STATE_AND_DECAY = {
    "sgd": functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9, weight_decay=0.1),
    "sgd_nesterov": functools.partial(torch.optim.SGD, lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.1),
    "adam": functools.partial(torch.optim.Adam, lr=0.05, weight_decay=0.1),
    "adamw": functools.partial(torch.optim.AdamW, lr=0.05, weight_decay=0.1),
    "adam_foreach": functools.partial(torch.optim.Adam, lr=0.05, weight_decay=0.1, foreach=True),
    "adamw_fused": functools.partial(torch.optim.AdamW, lr=0.05, weight_decay=0.1, fused=True),
}


def train_two_branches(name: str, zero_grad: str, branch_steps, steps: int = 6, device: str = "cpu"):
    """The wrapped and the unwrapped model trained side by side; returns both."""
    model, reference = TwoBranches(device=device), TwoBranches(device=device)
    params = speedtorch.ContiguousParams(model.named_parameters())
    cls = OPTIMIZERS_WITH_STATE_AND_DECAY[name]
    opt, opt_ref = cls(params.contiguous()), cls(reference.parameters())
    for step in range(steps):
        x = torch.randn(5, 7, generator=torch.Generator().manual_seed(step)).to(device)
        if zero_grad == "optimizer":
            opt.zero_grad()
        elif zero_grad == "module":
            model.zero_grad()
        elif zero_grad == "params":
            params.zero_grad()
        if zero_grad in ("set_to_none_false", "params_set_to_none_false"):  # zero gradients: torch.optim steps them
            if zero_grad == "params_set_to_none_false":
                params.zero_grad(set_to_none=False)
            else:
                opt.zero_grad(set_to_none=False)
            opt_ref.zero_grad(set_to_none=False)
        else:
            opt_ref.zero_grad()
        model(x, step in branch_steps).pow(2).sum().backward()
        reference(x, step in branch_steps).pow(2).sum().backward()
        params.assert_buffer_is_valid()
        opt.step()
        opt_ref.step()
    return model, reference


@pytest.mark.parametrize("zero_grad", ["optimizer", "module", "params", "set_to_none_false",
                                       "params_set_to_none_false"])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS_WITH_STATE_AND_DECAY))
def test_a_parameter_without_a_gradient_is_skipped_as_torch_optim_skips_it(name, zero_grad):
    """A branch used in the first step only: torch.optim skips its parameters afterwards (their .grad is None), but
    their slices of the flat gradient were zeros, so momentum and weight decay kept moving them: 1.0-1.9 away from
    the unwrapped model after a few steps (issue 31). Now each step leaves them, and their optimizer state, as
    torch.optim does."""
    model, reference = train_two_branches(name, zero_grad, branch_steps={0})
    for (key, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=lambda m: f"{key}: {m}")


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["sgd", "adamw", "adamw_fused"])
def test_gpu_a_parameter_without_a_gradient_is_skipped(name):
    model, reference = train_two_branches(name, "optimizer", branch_steps={0}, device="cuda")
    for (key, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=lambda m: f"{key}: {m}")


@pytest.mark.parametrize("name", ["sgd", "sgd_nesterov"])
def test_a_parameter_first_reached_later_steps_as_torch_optim_steps_it(name):
    """A branch first used in step 2 and again in step 4: skipped before and between (SGD's momentum starts at its
    first gradient, as torch.optim's)."""
    model, reference = train_two_branches(name, "optimizer", branch_steps={2, 4})
    for (key, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=lambda m: f"{key}: {m}")


def test_adam_counts_one_step_per_flat_buffer():
    """The documented difference: Adam's bias correction uses the flat buffer's step count, torch.optim each
    parameter's. A parameter first reached in a later step (or again after steps without a gradient) then moves
    differently; until then it does not move at all, as in torch.optim."""
    model, reference = train_two_branches("adam", "optimizer", branch_steps={3}, steps=3)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    assert torch.equal(model.branch.weight, TwoBranches().branch.weight)  # untouched while unused
    model, reference = train_two_branches("adam", "optimizer", branch_steps={3}, steps=4)
    assert not torch.allclose(model.branch.weight, reference.branch.weight, rtol=1e-3, atol=1e-4)
    torch.testing.assert_close(model.trunk.weight, reference.trunk.weight, rtol=1e-5, atol=1e-6)


def test_replaced_parameter_is_named():
    model = make_model()
    params = speedtorch.ContiguousParams(model.named_parameters())
    model[3].bias.data = torch.randn(5)  # rule 1 broken: replaced, not updated in place
    with pytest.raises(RuntimeError, match=r"parameter 5 \('3\.bias'\) was replaced instead of updated in place"):
        params.assert_buffer_is_valid()
    assert not params.buffer_is_valid()


def test_in_place_updates_keep_the_buffer_valid():
    model = make_model()
    params = speedtorch.ContiguousParams(model.parameters())
    with torch.no_grad():
        model[0].weight.copy_(torch.randn(16, 7))
        model[0].bias.mul_(2.0)
    model.load_state_dict(make_model(9).state_dict())  # copies in place
    params.assert_buffer_is_valid()
    torch.testing.assert_close(model[0].weight, make_model(9)[0].weight)


def test_to_after_wrapping_is_detected():
    model = make_model()
    params = speedtorch.ContiguousParams(model.named_parameters())
    model.double()
    with pytest.raises(RuntimeError, match=r"parameter 0 \('0\.weight'\) was moved or converted after wrapping"):
        params.assert_buffer_is_valid()
    with pytest.raises(RuntimeError, match="was moved or converted after wrapping"):
        params.zero_grad()


def test_replaced_grad_is_named():
    model = make_model()
    params = speedtorch.ContiguousParams(model.named_parameters())
    model[1].weight.grad = torch.randn(16)
    with pytest.raises(RuntimeError, match=r"parameter 2 \('1\.weight'\)\.grad was replaced instead of accumulated"):
        params.assert_buffer_is_valid()


@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True")
def test_backward_with_create_graph_replaces_grads_and_is_detected():
    model = make_model()
    params = speedtorch.ContiguousParams(model.parameters())
    run_backward(model, torch.randn(3, 7), create_graph=True)  # autograd adds out of place under create_graph
    with pytest.raises(RuntimeError, match=r"parameter 0\.grad was replaced instead of accumulated"):
        params.assert_buffer_is_valid()


def test_optimizer_step_between_forward_and_backward_is_caught_by_autograd():
    # The parameters share the flat buffer's version counter, as real views do, so an in-place update of the flat
    # buffer after forward is an autograd error instead of silently wrong gradients.
    model = make_model()
    params = speedtorch.ContiguousParams(model.parameters())
    opt = torch.optim.SGD(params.contiguous(), lr=0.1)
    loss = model(torch.randn(3, 7)).pow(2).sum()
    opt.step()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_existing_grads_are_kept():
    model = make_model()
    run_backward(model, torch.randn(3, 7))
    grads = [p.grad.clone() for p in model.parameters()]
    params = speedtorch.ContiguousParams(model.parameters())
    for p, g in zip(model.parameters(), grads):
        assert torch.equal(p.grad, g)
    params.assert_buffer_is_valid()


def test_bad_input():
    model = make_model()
    model[0].bias.requires_grad_(False)
    with pytest.raises(RuntimeError, match=r"parameter 1 \('0\.bias'\) does not require grad"):
        speedtorch.ContiguousParams(model.named_parameters())
    p = nn.Parameter(torch.randn(3))
    with pytest.raises(RuntimeError, match="parameter 1 appears more than once"):
        speedtorch.ContiguousParams([p, p])
    with pytest.raises(RuntimeError, match="params must hold at least one tensor"):
        speedtorch.ContiguousParams([])
    with pytest.raises(TypeError, match="not a mix"):
        speedtorch.ContiguousParams([("a", p), nn.Parameter(torch.randn(2))])
    with pytest.raises(TypeError, match="item 0 is a int"):
        speedtorch.ContiguousParams([3])
    with pytest.raises(RuntimeError, match="parameter 0 must be a leaf tensor"):
        speedtorch.ContiguousParams([p * 2])


def test_ddp_gradient_bucket_views_are_detected(tmp_path):
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        # Without bucket views DDP copies the averaged gradients back into .grad in place: the buffer holds.
        model = make_model()
        reference = copy.deepcopy(model)
        params = speedtorch.ContiguousParams(model.parameters())
        ddp = nn.parallel.DistributedDataParallel(model)
        x = torch.randn(4, 7)
        run_backward(ddp, x)
        run_backward(reference, x)
        params.assert_buffer_is_valid()
        for p, r in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, r.grad, rtol=1e-6, atol=1e-7)

        # gradient_as_bucket_view=True points each .grad at DDP's own bucket: outside the flat buffer.
        model = make_model()
        params = speedtorch.ContiguousParams(model.parameters())
        ddp = nn.parallel.DistributedDataParallel(model, gradient_as_bucket_view=True)
        run_backward(ddp, x)
        with pytest.raises(RuntimeError, match=r"\.grad was replaced instead of accumulated.*gradient_as_bucket_view"):
            params.assert_buffer_is_valid()
    finally:
        dist.destroy_process_group()


def test_torchscript_uses_the_custom_class():
    @torch.jit.script
    def flat_grad_norm(p: torch.classes.speedtorch.ContiguousParams) -> torch.Tensor:
        p.assert_buffer_is_valid()
        return torch.stack([g.norm() for g in p.grad_buffers()]).norm()

    model = make_model()
    params = speedtorch.ContiguousParams(model.parameters())
    run_backward(model, torch.randn(3, 7))
    expected = torch.cat([p.grad.reshape(-1) for p in model.parameters()]).norm()
    torch.testing.assert_close(flat_grad_norm(params.script_object), expected, rtol=1e-6, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["adam", "sgd_momentum"])
@pytest.mark.parametrize("impl", [{"foreach": False}, {"foreach": True}, {"fused": True}])
def test_gpu_optimizer_on_flat_buffer_matches(name, impl):
    model = make_model(5).cuda()
    reference = copy.deepcopy(model)
    train_side_by_side(model, reference, OPTIMIZERS[name], device="cuda", **impl)
    for p, r in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p, r, rtol=1e-6, atol=1e-7)


@pytest.mark.gpu
def test_gpu_and_cpu_parameters_make_two_groups():
    a = nn.Parameter(torch.randn(5, device="cuda"))
    b = nn.Parameter(torch.randn(3))
    params = speedtorch.ContiguousParams([("a", a), ("b", b)])
    assert [t.device.type for t in params.contiguous()] == ["cuda", "cpu"]
    (a.sin().sum() + b.cos().sum()).backward()
    params.assert_buffer_is_valid()
    torch.testing.assert_close(params.grad_buffers()[0][:5], a.detach().cos())


@pytest.mark.gpu
def test_gpu_cuda_after_wrapping_is_detected():
    model = make_model()
    params = speedtorch.ContiguousParams(model.named_parameters())
    model.cuda()
    with pytest.raises(RuntimeError, match=r"parameter 0 \('0\.weight'\) was moved or converted after wrapping"):
        params.assert_buffer_is_valid()
