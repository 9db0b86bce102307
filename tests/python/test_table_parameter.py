"""HostEmbedding's table as a parameter (speedtorch/nn/_table_parameter.py): visible in named_parameters and state_dict,
its pending gradient as weight.grad, left alone by module conversions, by DDP (test_distributed.py) and by dense
optimizers; clip_grad_norm_ over sparse gradients."""

from __future__ import annotations

import pytest
import torch

from speedtorch.nn import HostEmbedding, HostTableParameter, clip_grad_norm_, dense_parameters


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.users = HostEmbedding(30, 4, device="cpu", seed=0, optimizer="sgd", optimizer_options={"lr": 0.5})
        self.tower = torch.nn.Linear(4, 1)

    def forward(self, ids):
        return self.tower(self.users(ids)).squeeze(-1)


def test_the_table_is_a_parameter_that_autograd_does_not_touch():
    model = Model()
    params = dict(model.named_parameters())
    assert list(params) == ["users.weight", "tower.weight", "tower.bias"]
    table = params["users.weight"]
    assert isinstance(table, HostTableParameter) and not table.requires_grad
    assert table.data_ptr() == model.users.table.table().data_ptr()  # the table itself, no copy
    assert table is model.users.weight
    assert [p is not table for p in dense_parameters(model)] == [True, True]
    state = model.state_dict()
    assert set(state) == {"users.weight", "users.optimizer_state", "users.optimizer_step", "users._extra_state",
                          "tower.weight", "tower.bias"}
    assert state["users.weight"].data_ptr() == table.data_ptr() and type(state["users.weight"]) is torch.Tensor
    model(torch.tensor([1, 2, 2])).sum().backward()
    grad = table.grad
    assert grad.is_sparse and grad.shape == (30, 4) and grad._indices().tolist() == [[1, 2]]
    assert model.tower.weight.grad is not None


def test_module_conversions_leave_the_table_alone():
    model = Model()
    table = model.users.weight
    model.double()
    assert model.tower.weight.dtype == torch.float64
    assert model.users.weight is table and table.dtype == torch.float32
    assert model.users.table.table().data_ptr() == table.data_ptr()
    model.float().to("cpu")
    assert model.users.weight is table and model.users.device == torch.device("cpu")
    assert model.users.output_dtype == torch.float32


def test_grad_assignment_is_checked():
    host = HostEmbedding(10, 4, device="cpu")
    with pytest.raises(TypeError, match="sparse COO"):
        host.weight.grad = torch.zeros(10, 4)
    with pytest.raises(ValueError, match="shape"):
        host.weight.grad = torch.zeros(5, 4).to_sparse(1)


def test_clip_grad_norm_counts_table_rows_and_dense_gradients():
    model = Model()
    ref_emb = torch.nn.Embedding(30, 4, sparse=True)
    ids = torch.tensor([1, 2, 2, 5])
    model(ids).sum().backward()
    params = list(model.parameters())
    with pytest.raises(NotImplementedError):  # torch's clip_grad_norm_ has no norm of a sparse gradient
        torch.nn.utils.clip_grad_norm_(params, 0.1)
    dense = [model.users.weight.grad.to_dense(), model.tower.weight.grad.clone(), model.tower.bias.grad.clone()]
    expected_norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in dense]))
    total = clip_grad_norm_(params, 0.1)
    torch.testing.assert_close(total, expected_norm)
    coef = 0.1 / (expected_norm + 1e-6)
    torch.testing.assert_close(model.users.weight.grad.to_dense(), dense[0] * coef)
    torch.testing.assert_close(model.tower.weight.grad, dense[1] * coef)
    # nn.Embedding(sparse=True) works with it too.
    ref_emb(torch.tensor([1, 1])).sum().backward()
    assert clip_grad_norm_(ref_emb.parameters(), 1.0).item() == pytest.approx(2.0 * 2.0)


def test_ema_with_averaged_model_averages_the_table():
    """torch.optim.swa_utils.AveragedModel (EMA): the copy's table follows the model's as its dense weights do."""
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    model = Model()
    ema = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.5))
    ema.update_parameters(model)  # the first update copies
    start = model.users.weight.clone()
    model(torch.tensor([1, 2])).sum().backward()
    model.users.step()
    assert not torch.equal(model.users.weight, start)
    ema.update_parameters(model)
    torch.testing.assert_close(ema.module.users.weight, 0.5 * start + 0.5 * model.users.weight)
    torch.testing.assert_close(ema.module(torch.tensor([1])), ema.module.tower(ema.module.users.weight[1]))


def test_ema_of_a_hybrid_table_raises_and_weight_averages_it():
    """placement="hybrid": the parameter is a placeholder on the meta device, so AveragedModel averaged nothing,
    silently. Now it raises; averaging through `weight` (the rows) works."""
    from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

    emb = HostEmbedding(100, 4, device="cpu", seed=0, optimizer="sgd", optimizer_options={"lr": 1.0},
                        placement="hybrid", cache_rows=32)
    ema = AveragedModel(emb, multi_avg_fn=get_ema_multi_avg_fn(0.5))
    with pytest.raises(RuntimeError, match=r"placement='hybrid'.*AveragedModel.*lerp_"):
        ema.update_parameters(emb)
    assert list(emb.state_dict()) == ["weight", "_extra_state", "optimizer_state", "optimizer_step"]  # still saves
    # The documented way: average the rows through `weight`.
    emb(torch.tensor([1, 2])).sum().backward()
    emb.step()
    emb(torch.tensor([1])).sum().backward()  # the rows now sit in the cache
    emb.step()
    table = ema.module
    with torch.no_grad():
        table.weight.lerp_(emb.weight, 0.5)
    expected = 0.5 * HostEmbedding(100, 4, device="cpu", seed=0, placement="hybrid", cache_rows=32).weight + \
        0.5 * emb.weight
    torch.testing.assert_close(table.weight, expected)
    torch.testing.assert_close(table(torch.tensor([1, 2])), expected[[1, 2]])


@pytest.mark.gpu
def test_model_cuda_moves_the_dense_part_and_keeps_the_table_in_host_memory():
    model = Model()
    table = model.users.weight
    model.cuda()
    assert model.tower.weight.is_cuda and model.users.weight is table and not table.is_cuda
    assert table.is_pinned() == model.users.table.is_pinned()
    assert model.users.device.type == "cuda"  # where forward puts the rows
    model(torch.tensor([1, 2])).sum().backward()
    assert table.grad.is_cuda  # the pending gradient lives where it was computed
    model.users.step()
