"""nn.Module's methods on a model that holds a HostEmbedding (speedtorch.nn), as a training script calls them: to,
cpu, cuda, float / half / bfloat16 / double, share_memory, train / eval, requires_grad_, zero_grad, apply, the
state_dict round trip, parameters / named_modules and repr. Every conversion used to raise TypeError (HostEmbedding
overrode nn.Module._apply by accident). The table itself never moves or changes dtype; forward follows the model.
The table is the module's parameter (speedtorch/nn/_table_parameter.py): zero_grad and requires_grad_ reach it."""

from __future__ import annotations

import os
import socket
import tempfile

import pytest
import torch
import torch.nn.functional as F

from speedtorch.nn import HostEmbedding

ROWS, DIM = 40, 8
PLACEMENTS = [dict(placement="host"), dict(placement="gpu"), dict(placement="hybrid", cache_rows=16)]
IDS = torch.tensor([3, 7, 7, 21, 39])
UNTOUCHED = torch.tensor([0, 1, 2, 38])


class Model(torch.nn.Module):
    def __init__(self, **kwargs):
        super().__init__()
        self.users = HostEmbedding(ROWS, DIM, optimizer="adam", optimizer_options={"lr": 0.05}, device="cpu",
                                   seed=0, **kwargs)
        torch.manual_seed(0)
        self.head = torch.nn.Linear(DIM, 1)

    def forward(self, ids):
        return self.head(self.users(ids)).squeeze(-1)


def train_step(model: Model, ids=IDS) -> torch.Tensor:
    out = model(ids)
    F.mse_loss(out, torch.ones_like(out)).backward()
    model.users.step()
    return out


def host_rows(model: Model) -> torch.Tensor:
    return model.users.weight.detach().cpu().clone()


@pytest.mark.parametrize("kwargs", PLACEMENTS, ids=lambda k: k["placement"])
@pytest.mark.parametrize("convert, dtype", [
    (lambda m: m.float(), torch.float32), (lambda m: m.double(), torch.float64), (lambda m: m.half(), torch.float16),
    (lambda m: m.bfloat16(), torch.bfloat16), (lambda m: m.to(torch.float64), torch.float64),
    (lambda m: m.to("cpu"), torch.float32), (lambda m: m.cpu(), torch.float32),
    (lambda m: m.type(torch.float64), torch.float64)],
    ids=["float", "double", "half", "bfloat16", "to_dtype", "to_device", "cpu", "type"])
def test_conversions_change_what_forward_returns_not_the_table(kwargs, convert, dtype):
    model = Model(**kwargs)
    weight = model.users.weight
    before = host_rows(model)
    assert convert(model) is model
    assert model.users.weight.dtype == torch.float32 and model.users.weight.data_ptr() == weight.data_ptr()
    torch.testing.assert_close(host_rows(model), before, rtol=0, atol=0)
    assert model.head.weight.dtype == dtype
    out = model.users(IDS)
    assert out.dtype == dtype and out.device.type == "cpu"
    torch.testing.assert_close(out, before[IDS].to(dtype), rtol=0, atol=0)
    # The rest of the model computes in the new dtype, and the gradients come back to the float32 table.
    train_step(model)
    after = host_rows(model)
    assert not torch.equal(after[IDS], before[IDS])
    torch.testing.assert_close(after[UNTOUCHED], before[UNTOUCHED], rtol=0, atol=0)
    assert model.users.table.step_count() == 1
    assert f"output_dtype={dtype}" in repr(model) or dtype == torch.float32


def test_double_model_trains_the_table_like_a_float_model():
    """The gradient reaching the table through the cast is the float64 model's, rounded: the update matches."""
    a, b = Model(), Model()
    b.double()
    train_step(a)
    train_step(b)
    torch.testing.assert_close(host_rows(b), host_rows(a), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kwargs", PLACEMENTS, ids=lambda k: k["placement"])
def test_share_memory_refuses_a_table_only_this_process_holds(kwargs):
    model = Model(**kwargs)
    with pytest.raises(RuntimeError, match="DistributedHostEmbedding"):
        model.share_memory()
    assert model.users.device == torch.device("cpu") and model.users.output_dtype == torch.float32
    train_step(model)  # still usable


def test_train_eval_apply_parameters_modules_and_repr():
    model = Model()
    assert model.eval() is model and not model.users.training
    assert model.train() is model and model.users.training
    # The table is the module's one parameter, outside autograd (speedtorch.nn.dense_parameters leaves it out).
    assert [type(p).__name__ for p in model.users.parameters()] == ["HostTableParameter"]
    assert [name for name, _ in model.named_parameters()] == ["users.weight", "head.weight", "head.bias"]
    assert [name for name, p in model.named_parameters() if p.requires_grad] == ["head.weight", "head.bias"]
    assert dict(model.named_modules())["users"] is model.users
    seen = []
    assert model.apply(lambda m: seen.append(type(m).__name__)) is model
    assert seen == ["HostEmbedding", "Linear", "Model"]
    text = repr(model)
    assert "(users): HostEmbedding(40, 8, mode=None, optimizer=adam" in text and "placement=host" in text


def test_requires_grad_freezes_the_table():
    model = Model()
    before = host_rows(model)
    assert model.users.requires_grad_(False) is model.users
    train_step(model)
    torch.testing.assert_close(host_rows(model), before, rtol=0, atol=0)
    assert model.users.table.step_count() == 0 and model.head.weight.grad is not None
    model.users.requires_grad_(True)
    train_step(model)
    assert not torch.equal(host_rows(model)[IDS], before[IDS]) and model.users.table.step_count() == 1
    # model.requires_grad_ reaches the table through its parameter, as it reaches an nn.Embedding's weight; the
    # parameter's own flag stays False (DDP and the dense optimizers leave it alone).
    model.requires_grad_(False)
    assert not model.users.trains and not model.users.weight.requires_grad
    trained = host_rows(model)
    out = model(IDS)
    assert not out.requires_grad
    model.users.step()
    torch.testing.assert_close(host_rows(model), trained, rtol=0, atol=0)
    model.requires_grad_(True)
    assert model.users.trains and not model.users.weight.requires_grad
    train_step(model)
    assert model.users.table.step_count() == 2


def test_requires_grad_leaves_a_table_without_optimizer_frozen():
    frozen = HostEmbedding.from_pretrained(torch.randn(ROWS, DIM), device="cpu")
    frozen.requires_grad_(True)
    assert not frozen.trains and not frozen(IDS).requires_grad


def test_zero_grad_of_the_model_and_of_the_table():
    model = Model()
    before = host_rows(model)
    out = model(IDS)
    out.sum().backward()
    assert model.users.weight.grad is not None
    model.zero_grad()  # the dense part's gradients and the table's pending one (its parameter's grad)
    assert model.head.weight.grad is None and model.users.weight.grad is None
    model.users.step()
    torch.testing.assert_close(host_rows(model), before, rtol=0, atol=0)
    model(IDS).sum().backward()
    model.users.zero_grad()  # the module's own drops it too
    model.users.step()
    torch.testing.assert_close(host_rows(model), before, rtol=0, atol=0)


def test_state_dict_round_trip_continues_training_identically():
    a = Model()
    for _ in range(2):
        train_step(a)
    b = Model(init_std=0.5)
    b.load_state_dict(a.state_dict())
    assert b.users.table.step_count() == 2
    torch.testing.assert_close(host_rows(b), host_rows(a), rtol=0, atol=0)
    torch.testing.assert_close(b.users.table.state(), a.users.table.state(), rtol=0, atol=0)
    train_step(a)
    train_step(b)
    torch.testing.assert_close(host_rows(b), host_rows(a), rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("kwargs", PLACEMENTS, ids=lambda k: k["placement"])
def test_cuda_moves_forward_to_the_gpu_and_cpu_back(kwargs):
    model = Model(**kwargs)
    weight = model.users.weight
    before = host_rows(model)
    assert model.cuda() is model
    assert model.users.device == torch.device("cuda", torch.cuda.current_device())
    assert model.users.weight.data_ptr() == weight.data_ptr()  # the table stayed where it was
    out = train_step(model, IDS.cuda())
    assert out.is_cuda
    torch.cuda.synchronize()
    assert not torch.equal(host_rows(model)[IDS], before[IDS])
    model.cpu()
    assert train_step(model).device.type == "cpu" and model.users.table.step_count() == 2


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def single_rank_group():
    """A one-rank Gloo process group in this process, for DistributedHostEmbedding."""
    if torch.__version__ < (2, 5):
        pytest.skip("speedtorch.distributed needs torch >= 2.5")
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    folder = tempfile.mkdtemp(prefix="speedtorch-test-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        yield folder
    finally:
        dist.destroy_process_group()
        os.rmdir(folder)  # the table's files are gone with the module


def test_distributed_module_methods(single_rank_group):
    from speedtorch.distributed import DistributedHostEmbedding

    model = torch.nn.Sequential(
        DistributedHostEmbedding(ROWS, DIM, device="cpu", seed=0, local_world_size=1, shm_dir=single_rank_group),
        torch.nn.Linear(DIM, 1))
    users = model[0]
    before = users.weight.clone()
    model.double()
    model.cpu()
    assert model.share_memory() is model  # its rows are in /dev/shm already
    assert model.to(torch.float32) is model and users.output_dtype == torch.float32
    out = model(IDS).squeeze(-1)
    assert out.dtype == torch.float32
    F.mse_loss(out, torch.ones_like(out)).backward()
    users.step()
    assert not torch.equal(users.weight[IDS], before[IDS])
    assert "DistributedHostEmbedding(40, 8" in repr(model)
    del model, users
