"""state_dict checkpoints keep the embedding (speedtorch/nn/_table_state.py): HostEmbedding in every placement and any
module holding a PinnedEmbedding (track_table_state) put rows, optimizer state and step count in state_dict(),
sharing the table's memory; load_state_dict writes them back in place, refuses other shapes, and round trips are
exact through torch.save / torch.load (weights_only) and torch.distributed.checkpoint."""

from __future__ import annotations

import io

import pytest
import torch

import speedtorch
from speedtorch.nn import HostEmbedding, track_table_state


class Model(torch.nn.Module):
    def __init__(self, rows=1000, dim=8, placement="host", lr=0.01, optimizer="adam"):
        super().__init__()
        self.users = HostEmbedding(rows, dim, optimizer=optimizer, optimizer_options={"lr": lr}, device="cpu",
                                   placement=placement, hot_fraction=0.05 if placement == "hybrid" else None)
        self.dense = torch.nn.Linear(dim, 1)

    def train_steps(self, steps=3):
        for step in range(steps):
            ids = torch.randint(0, self.users.num_embeddings, (64,), generator=torch.Generator().manual_seed(step))
            self.dense(self.users(ids)).sum().backward()
            self.users.step()


def _round_trip(state_dict) -> dict:
    buffer = io.BytesIO()
    torch.save(state_dict, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def test_the_checkpoint_holds_the_table_and_a_fresh_model_gets_it_back():
    """The failure this fixes: torch.save(model.state_dict()) kept 1,957 bytes of a 1,000 x 8 table, and loading it
    into a fresh model "succeeded" with another table."""
    model = Model()
    model.train_steps()
    state = model.state_dict()
    assert state["users.weight"].data_ptr() == model.users.weight.data_ptr()  # shares the table: no copy
    buffer = io.BytesIO()
    torch.save(state, buffer)
    assert buffer.tell() > 1000 * 8 * 4  # the rows (and the Adam state) are in the file
    fresh = Model(lr=0.5)
    fresh.load_state_dict(_round_trip(state))
    assert torch.equal(fresh.users.weight, model.users.weight)
    assert torch.equal(fresh.users.table.state(), model.users.table.state())
    assert fresh.users.table.step_count() == 3 and fresh.users.table.optimizer_options() == {"lr": 0.01}
    fresh.train_steps(1)  # and training goes on from there exactly as in the original
    model.train_steps(1)
    assert torch.equal(fresh.users.weight, model.users.weight)


def _table_of(users) -> dict:
    """Everything a load may change: rows, optimizer state, step count and options (copied)."""
    return {"weight": users.weight.clone(), "state": users.table.state().clone(), "step": users.table.step_count(),
            "options": users.table.optimizer_options()}


def _assert_unchanged(users, before: dict) -> None:
    after = _table_of(users)
    assert torch.equal(after["weight"], before["weight"]) and torch.equal(after["state"], before["state"])
    assert after["step"] == before["step"] and after["options"] == before["options"]


def test_strict_loading_reports_missing_and_mismatched_entries():
    """A refused load changes nothing: not the rows, not the optimizer state, step count or options (the
    checkpoint's options differ from the target's, so applying them first would wipe the target's state)."""
    model = Model()
    model.train_steps()
    state = model.state_dict()
    smaller = Model(rows=999, lr=0.5)
    smaller.train_steps(2)
    before = _table_of(smaller.users)
    with pytest.raises(RuntimeError, match=r"size mismatch for users\.weight: the checkpoint holds shape \(1000, 8\)"):
        smaller.load_state_dict(state)
    _assert_unchanged(smaller.users, before)
    partial = {k: v for k, v in state.items() if k != "users.optimizer_state"}
    with pytest.raises(RuntimeError, match=r'Missing key\(s\) in state_dict: "users\.optimizer_state"'):
        Model().load_state_dict(partial)
    other = Model(lr=0.5)
    other.train_steps(2)
    before = _table_of(other.users)
    other.load_state_dict(partial, strict=False)  # nothing is written unless every entry fits
    _assert_unchanged(other.users, before)
    sgd = HostEmbedding(1000, 8, optimizer="sgd", device="cpu")
    with pytest.raises(RuntimeError, match="the checkpoint's optimizer is 'adam'"):
        sgd.load_state_dict({k[len("users."):]: v for k, v in state.items() if k.startswith("users.")})
    # The same for a module holding a PinnedEmbedding itself (track_table_state's hooks).
    source, target = Holder(), Holder(rows=40)
    source.emb.set_optimizer("adagrad", {"lr": 0.3}, True)
    source.emb.apply_gradients(torch.tensor([1, 2]), torch.ones(2, 4))
    target.emb.apply_gradients(torch.tensor([3, 4]), torch.ones(2, 4))
    table, rows_state = target.emb.table().clone(), target.emb.state().clone()
    with pytest.raises(RuntimeError, match=r"size mismatch for emb\.weight"):
        target.load_state_dict(source.state_dict())
    assert torch.equal(target.emb.table(), table) and torch.equal(target.emb.state(), rows_state)
    assert target.emb.step_count() == 1 and target.emb.optimizer_options() == {"lr": 0.1}


@pytest.mark.parametrize("placement", ["host", "hybrid", "gpu"])
@pytest.mark.parametrize("optimizer", ["adam", None])
@pytest.mark.parametrize("strict", [True, False])
def test_an_nn_embedding_checkpoint_loads_its_rows(placement, optimizer, strict):
    """nn.Embedding's state_dict holds `weight` alone. Strict loading used to ask for optimizer_state,
    optimizer_step and _extra_state, and strict=False returned without loading the rows, even into a frozen table.
    Now the rows load; the table's optimizer state, step count and options stay as they were."""
    ref = torch.nn.Sequential(torch.nn.Embedding(1000, 8), torch.nn.Linear(8, 1))
    model = Model(placement=placement, optimizer=optimizer)
    if optimizer:
        model.train_steps(2)
    before = {"state": model.users.table.state().clone() if optimizer else None,
              "step": model.users.table.step_count(), "options": model.users.table.optimizer_options()}
    state = {k.replace("0.", "users.").replace("1.", "dense."): v for k, v in _round_trip(ref.state_dict()).items()}
    result = model.load_state_dict(state, strict=strict)
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert torch.equal(model.users.weight, ref[0].weight.detach())
    assert torch.equal(model.dense.weight, ref[1].weight)
    assert model.users.table.step_count() == before["step"]
    assert model.users.table.optimizer_options() == before["options"]
    if optimizer:
        assert torch.equal(model.users.table.state(), before["state"])
    # Rows of another shape are refused, and nothing changes.
    weight = model.users.weight.clone()
    with pytest.raises(RuntimeError, match=r"size mismatch for users\.weight"):
        model.load_state_dict({**state, "users.weight": torch.zeros(999, 8)}, strict=strict)
    assert torch.equal(model.users.weight, weight)


def test_an_nn_embedding_checkpoint_into_a_16_bit_table():
    ref = torch.nn.Embedding(50, 4)
    emb = HostEmbedding(50, 4, dtype=torch.bfloat16, device="cpu")
    emb.load_state_dict(ref.state_dict())
    assert torch.equal(emb.weight, ref.weight.detach().to(torch.bfloat16))
    assert emb.table.step_count() == 0 and not emb.table.state().any()  # a new module's state: zero


# Every optimizer, under the names users write (torch.optim's class names too): a checkpoint names its optimizer
# canonically whatever the placement, so it loads into any other.
OPTIMIZERS = ["sgd", "adagrad", "adam", "adamw", "adamax", "rmsprop", "adadelta", "asgd", "rprop", "rowwise_adagrad",
              "sparse_adam", "SparseAdam", "AdamW"]


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_checkpoints_move_between_placements(optimizer):
    for source, target in [("host", "gpu"), ("gpu", "hybrid"), ("hybrid", "host"), ("gpu", "host")]:
        model = Model(placement=source, optimizer=optimizer)
        model.train_steps()
        other = Model(placement=target, optimizer=optimizer)
        other.load_state_dict(_round_trip(model.state_dict()))
        assert torch.equal(other.users.weight, model.users.weight), (source, target)
        assert torch.equal(other.users.table.state(), model.users.table.state()), (source, target)
        assert other.users.table.optimizer() == model.users.table.optimizer(), (source, target)
        assert other.users.table.step_count() == 3
    # A checkpoint of an older version, whose gpu placement recorded the name as the user wrote it, loads too.
    state = Model(placement="gpu", optimizer=optimizer).state_dict()
    state["users._extra_state"] = dict(state["users._extra_state"], optimizer=optimizer.lower())
    Model(placement="host", optimizer=optimizer).load_state_dict(state)


def test_distributed_checkpoint_in_one_process(tmp_path):
    import torch.distributed.checkpoint as dcp

    model = Model()
    model.train_steps()
    dcp.save(model.state_dict(), checkpoint_id=str(tmp_path))
    fresh = Model(lr=0.5)
    state = fresh.state_dict()
    dcp.load(state, checkpoint_id=str(tmp_path))
    fresh.load_state_dict(state)
    assert torch.equal(fresh.users.weight, model.users.weight)
    assert torch.equal(fresh.users.table.state(), model.users.table.state())
    assert fresh.users.table.step_count() == 3


class Holder(torch.nn.Module):
    """A module that holds a PinnedEmbedding itself (as the TorchScript examples do)."""

    def __init__(self, rows=50):
        super().__init__()
        self.emb = speedtorch.PinnedEmbedding(rows, 4)
        self.emb.set_optimizer("adagrad", {"lr": 0.1}, True)
        self.emb.normal_(0.0, 1.0, None)
        track_table_state(self, "emb")
        self.scale = torch.nn.Parameter(torch.ones(1))


class HolderOfTorch24(Holder):
    """A module as torch 2.4 makes them: without the public state-dict hook registrations (torch 2.5 added them)."""

    register_state_dict_post_hook = None
    register_load_state_dict_pre_hook = None


def test_tracking_works_through_torch_24s_private_hook_registrations():
    a, b = HolderOfTorch24(), HolderOfTorch24()
    a.emb.apply_gradients(torch.tensor([3, 4]), torch.ones(2, 4))
    state = a.state_dict()
    assert {"emb.weight", "emb.optimizer_state", "emb.optimizer_step", "emb._extra_state"} <= set(state)
    b.load_state_dict(_round_trip(state))
    assert torch.equal(b.emb.table(), a.emb.table()) and torch.equal(b.emb.state(), a.emb.state())
    assert b.emb.step_count() == 1
    with pytest.raises(RuntimeError, match=r"size mismatch for emb\.weight"):
        HolderOfTorch24(rows=40).load_state_dict(state)


def test_a_module_holding_a_pinned_embedding_keeps_it_in_its_state_dict():
    a, b = Holder(), Holder()
    a.emb.apply_gradients(torch.tensor([1, 2]), torch.ones(2, 4))
    state = a.state_dict()
    assert {"emb.weight", "emb.optimizer_state", "emb.optimizer_step", "emb._extra_state", "scale"} <= set(state)
    b.load_state_dict(_round_trip(state))
    assert torch.equal(b.emb.table(), a.emb.table()) and torch.equal(b.emb.state(), a.emb.state())
    assert b.emb.step_count() == 1
    with pytest.raises(RuntimeError, match=r"size mismatch for emb\.weight"):
        Holder(rows=40).load_state_dict(state)
    with pytest.raises(RuntimeError, match=r'Missing key\(s\) in state_dict: "emb\.weight"'):
        Holder().load_state_dict({k: v for k, v in state.items() if k != "emb.weight"})
    with pytest.raises(RuntimeError, match=r'Unexpected key\(s\) in state_dict: "emb\.bogus"'):
        Holder().load_state_dict(dict(state, **{"emb.bogus": torch.zeros(1)}))
    with pytest.raises(TypeError, match="is not a speedtorch.PinnedEmbedding"):
        track_table_state(torch.nn.Linear(2, 2), "weight")


@pytest.mark.parametrize("placement", ["host", "gpu"], ids=["host", "device_table"])  # (a `gpu` id marks GPU tests)
def test_entries_a_copy_would_refuse_are_refused_before_anything_changes(placement):
    """The options were adopted before the entries were copied, so an entry the copy refused (integer rows, an
    integer state, a step count that is no whole number) left the target with the checkpoint's options: lr 0.1 became
    0.5 in a refused load."""
    source = Model(lr=0.5, placement=placement)
    source.train_steps(2)
    state = source.state_dict()
    bad_entries = {"users.weight": state["users.weight"].to(torch.int64),
                   "users.optimizer_state": state["users.optimizer_state"].to(torch.int32),
                   "users.optimizer_step": torch.tensor(float("nan"))}
    for key, bad in bad_entries.items():
        target = Model(lr=0.1, placement=placement)
        target.train_steps(1)
        before = _table_of(target.users)
        with pytest.raises(RuntimeError, match=key.replace(".", r"\.")):
            target.load_state_dict(dict(state, **{key: bad}))
        _assert_unchanged(target.users, before)
    for step in (torch.tensor(-1), torch.tensor(2.5)):
        with pytest.raises(RuntimeError, match="the step count must be a whole number >= 0"):
            Model(placement=placement).load_state_dict(dict(state, **{"users.optimizer_step": step}))
    target = Model(lr=0.1, placement=placement)
    target.load_state_dict(dict(state, **{"users.optimizer_step": torch.tensor(2.0)}))  # a whole number: loads
    assert target.users.table.step_count() == 2 and target.users.table.optimizer_options() == {"lr": 0.5}


def test_a_hybrid_table_takes_its_own_checkpoint_after_an_lr_change():
    """A HybridTable cannot re-lay its state out, but an lr is changed in place (set_optimizer_options): its own
    checkpoint was refused after a scheduler changed the lr ("HybridTable cannot change its options")."""
    from speedtorch.nn.placement import HybridTable

    def hybrid(lr):
        host = speedtorch.PinnedEmbedding(40, 4, torch.float32)
        host.set_optimizer("adam", {"lr": lr}, True)
        return HostEmbedding(40, 4, table=HybridTable(host, "cpu", 8), device="cpu", placement="hybrid")

    module = hybrid(0.1)
    module(torch.tensor([1, 2, 3])).sum().backward()
    module.step()
    saved = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in module.state_dict().items()}
    module.set_optimizer_options({"lr": 0.5})
    module(torch.tensor([2, 5])).sum().backward()
    module.step()
    module.load_state_dict(saved)
    assert module.table.optimizer_options() == {"lr": 0.1} and module.table.step_count() == 1
    assert torch.equal(module.weight, saved["weight"])
    amsgrad = dict(saved, _extra_state=dict(saved["_extra_state"], optimizer_options={"lr": 0.1, "amsgrad": 1.0}))
    with pytest.raises(RuntimeError, match="a HybridTable cannot re-lay it out"):
        hybrid(0.1).load_state_dict(amsgrad)
