"""copy.deepcopy, pickle and torch.save(model) of a model holding a HostEmbedding, whatever the table's size (the
inline limit of TorchScript pickling, SPEEDTORCH_INLINE_MAX_BYTES, does not apply), and Ctrl-C during a long save."""

from __future__ import annotations

import copy
import signal
import threading
import time

import pytest
import torch

from speedtorch.nn import HostEmbedding, HostTableParameter


def trained(**kwargs):
    emb = HostEmbedding(64, 8, device="cpu", seed=0, optimizer="adam", optimizer_options={"lr": 0.1}, **kwargs)
    emb(torch.tensor([[1, 2, 3]])).sum().backward()  # 2-D: one bag per row with mode, rows without
    emb.step()
    return emb


def same_table(a, b):
    assert a.table.optimizer() == b.table.optimizer()
    assert dict(a.table.optimizer_options()) == dict(b.table.optimizer_options())
    assert a.table.step_count() == b.table.step_count()
    assert torch.equal(a.weight, b.weight) and torch.equal(a.table.state(), b.table.state())


@pytest.mark.parametrize("placement", ["host", "hybrid"])
def test_deepcopy_past_the_inline_limit(monkeypatch, placement):
    monkeypatch.setenv("SPEEDTORCH_INLINE_MAX_BYTES", "1024")  # the table (and state) is far larger
    extra = {"cache_rows": 32} if placement == "hybrid" else {}
    model = torch.nn.Sequential(trained(placement=placement, **extra))
    clone = copy.deepcopy(model)
    same_table(clone[0], model[0])
    assert clone[0].table.table().data_ptr() != model[0].table.table().data_ptr()  # a copy, not a share
    assert isinstance(clone[0]._parameters["weight"], HostTableParameter)
    assert clone[0]._parameters["weight"].is_meta == (placement == "hybrid")
    assert clone[0].table.cache_slots() == model[0].table.cache_slots()
    # The copy trains on its own.
    clone[0](torch.tensor([5])).sum().backward()
    clone[0].step()
    assert clone[0].table.step_count() == model[0].table.step_count() + 1


def test_torch_save_of_a_whole_model_past_the_inline_limit(tmp_path, monkeypatch):
    monkeypatch.setenv("SPEEDTORCH_INLINE_MAX_BYTES", "1024")
    model = torch.nn.Sequential(trained(mode="sum", padding_idx=0), torch.nn.Linear(8, 1))
    model[0](torch.tensor([4]), torch.tensor([0])).sum().backward()  # a pending gradient is not saved
    torch.save(model, tmp_path / "model.pt")
    back = torch.load(tmp_path / "model.pt", weights_only=False)
    same_table(back[0], model[0])
    assert back[0].weight.grad is None and back[0].mode == "sum" and back[0].padding_idx == 0
    assert back[0].table.is_pinned() == model[0].table.is_pinned()
    torch.testing.assert_close(back[1].weight, model[1].weight)
    ids, offsets = torch.tensor([1, 2, 3]), torch.tensor([0, 1])
    torch.testing.assert_close(back[1](back[0](ids, offsets)), model[1](model[0](ids, offsets)))


def test_a_frozen_and_a_gpu_placement_table_copy_too():
    frozen = HostEmbedding.from_pretrained(torch.randn(20, 4), device="cpu")
    clone = copy.deepcopy(frozen)
    assert torch.equal(clone.weight, frozen.weight) and clone.table.optimizer() == "" and not clone.trains
    gpu_placed = HostEmbedding(20, 4, device="cpu", placement="gpu", seed=0)  # device memory is the CPU here
    clone = copy.deepcopy(gpu_placed)
    assert torch.equal(clone.weight, gpu_placed.weight) and clone.weight.data_ptr() != gpu_placed.weight.data_ptr()


def test_ctrl_c_stops_a_long_save_and_keeps_the_old_files(tmp_path, monkeypatch):
    """A KeyboardInterrupt during a save of several 64 MiB chunks stops it at the next chunk: the files of the
    previous save stay, no temporary is left. (Before, the save ran on to commit and Ctrl-C came after.)"""
    import speedtorch.nn.embedding as embedding

    path = tmp_path / "users.npy"
    small = HostEmbedding(10, 4, device="cpu", seed=1, optimizer=None)
    small.save(path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    # Three 64 MiB chunks and 7 rows. Ctrl-C comes from the save's own worker thread as it starts writing, so it
    # always lands during the save (a watcher thread looking for the temporary missed it on a loaded CI machine).
    big = HostEmbedding(3 * (1 << 17) + 7, 128, device="cpu", optimizer=None, init_std=0.0)
    main = threading.main_thread().ident
    real = embedding.run_interruptible

    def interrupted_as_it_starts(fn, *args):
        def write(*a):
            signal.pthread_kill(main, signal.SIGINT)  # Ctrl-C
            return fn(*a)
        return real(write, *args)

    monkeypatch.setattr(embedding, "run_interruptible", interrupted_as_it_starts)
    # Python's own Ctrl-C handling, whatever an earlier test of the process left (a handler, a blocked SIGINT).
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    blocked = signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
    try:
        big.save(path)
        time.sleep(5)  # not reached when the save was cancelled; gives a late interrupt somewhere to land
        pytest.fail(f"no KeyboardInterrupt (SIGINT handler before the test: {handler}, blocked: {blocked})")
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGINT, handler)
        if signal.SIGINT in blocked:
            signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGINT])
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    assert HostEmbedding.load(path, device="cpu").num_embeddings == 10
    # The next save is not cancelled by the old request.
    big.save(path)
    assert HostEmbedding.load(path, device="cpu").num_embeddings == big.num_embeddings
