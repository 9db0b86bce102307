"""The Engram GPT example (speedtorch.models.engram_gpt) at a CPU size: the standard library's bytes as the corpus, and
a few dozen training steps that lower the loss, with the Engram table in (pinned) host memory and prefetch on."""

from __future__ import annotations

import pytest
import torch

import speedtorch
from speedtorch.models.engram_gpt import EngramConfig, EngramGPT, Trainer, batches, stdlib_corpus


def test_corpus_is_the_standard_librarys_source():
    tokens, starts = stdlib_corpus(max_bytes=200_000)
    assert tokens.numel() == 200_000 and tokens.dtype == torch.int64 and int(tokens.max()) < 256
    assert bool(starts[0]) and int(starts.sum()) >= 2  # several files, each a document
    text = bytes(tokens[:2000].to(torch.uint8).tolist()).decode("utf-8", "replace")
    assert "import" in text or "def " in text


def test_the_loss_falls():
    torch.manual_seed(0)
    tokens, starts = stdlib_corpus(max_bytes=300_000)
    config = EngramConfig(layers=2, width=64, heads=2, engram_layers=(0, 1), hash_heads=2, max_order=3,
                          rows_per_head=4096, engram_dim=16, optimizer_options={"lr": 0.05})
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: a second thread only waits (and on a loaded machine, for long)
    try:
        model = EngramGPT(config, torch.device("cpu"))
        trainer = Trainer(model, lr=1e-2)
        data = batches(tokens, starts, batch=8, seq=64, count=41)
        losses = [float(trainer.step(data[i], data[i + 1])) for i in range(40)]
    finally:
        torch.set_num_threads(threads)
    assert losses[0] > 5.0  # ~log(257): nothing learnt yet
    assert sum(losses[-5:]) / 5 < losses[0] - 2.0, losses
    # The Engram tables were trained: their rows left zero where n-grams were seen.
    for memory in model.engram_modules():
        assert int((memory.rows.weight.abs().sum(1) > 0).sum()) > 100


def test_the_demo_command_trains(capsys, monkeypatch):
    """`python -m speedtorch engram-demo` (its CPU size when there is no GPU)."""
    from speedtorch.__main__ import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main(["engram-demo", "--steps", "3"]) == 0
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert "standard library" in out and "step    2  loss" in out


def test_the_trainer_bounds_each_prefetch_to_max_sms(monkeypatch):
    """Issue 26: Trainer(max_sms=...) hands the bound to every Engram layer's prefetch (its gather runs under the
    transfer option, restored after); without it, the setting is never touched."""
    seen = []
    real = speedtorch.nn.ngram_embedding.transfer_config_override

    def record(**options):
        seen.append(options)
        return real(**options)

    monkeypatch.setattr(speedtorch.nn.ngram_embedding, "transfer_config_override", record)
    tokens, starts = stdlib_corpus(max_bytes=50_000)
    config = EngramConfig(layers=2, width=32, heads=2, engram_layers=(0, 1), hash_heads=2, max_order=3,
                          rows_per_head=512, engram_dim=8)
    data = batches(tokens, starts, batch=2, seq=16, count=3)
    torch.manual_seed(0)
    trainer = Trainer(EngramGPT(config, torch.device("cpu")), max_sms=6)
    for i in range(2):
        trainer.step(data[i], data[i + 1])
    assert seen == [{"max_sms": 6}] * 4  # two steps, two Engram layers each
    assert speedtorch.transfer_config()["max_sms"] == 0.0
    seen.clear()
    Trainer(trainer.model).step(data[0], data[1])
    assert seen == []
    with pytest.raises(ValueError, match="max_sms"):
        Trainer(trainer.model, max_sms=-2)
    with pytest.raises(ValueError, match="copy_engines"):
        Trainer(trainer.model, copy_engines="yes")


# --- the prefetch beside the backward ------------------------------------------------------------------------------

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def tiny_run(device="cpu", steps=4, tokens_on_device=False):
    """A tiny GPT's config and ``steps + 1`` batches (on ``device`` when ``tokens_on_device``)."""
    tokens, starts = stdlib_corpus(max_bytes=50_000)
    config = EngramConfig(layers=2, width=32, heads=2, engram_layers=(0, 1), hash_heads=2, max_order=3,
                          rows_per_head=512, engram_dim=8, optimizer_options={"lr": 0.05})
    data = batches(tokens, starts, batch=2, seq=16, count=steps + 1)
    if tokens_on_device:
        data = [tuple(t.to(device) for t in b) for b in data]
    return config, data


def train(config, data, device="cpu", prefetch=True, before_step=None, copy_engines=True):
    """Trains a fresh model on ``data`` (each step with the next batch): the losses, every tensor the training
    changes, and the trainer."""
    torch.manual_seed(0)
    trainer = Trainer(EngramGPT(config, torch.device(device)), lr=1e-2, prefetch=prefetch, copy_engines=copy_engines)
    if before_step is not None:
        before_step(trainer)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: a second thread only waits
    try:
        losses = torch.stack([trainer.step(data[i], data[i + 1]) for i in range(len(data) - 1)]).cpu()
    finally:
        torch.set_num_threads(threads)
    return losses, trained_state(trainer.model), trainer


def trained_state(model) -> dict:
    if next(model.parameters()).is_cuda:
        torch.cuda.synchronize()
    out = {f"param {k}": v.detach().cpu().clone() for k, v in model.named_parameters()}
    for i, memory in enumerate(model.engram_modules()):
        out[f"engram {i} rows"] = memory.rows.weight.cpu().clone()
        out[f"engram {i} state"] = memory.rows.table.state().cpu().clone()
    return out


def assert_same_bits(a, b) -> None:
    assert a[0].tolist() == b[0].tolist()  # the losses
    assert a[1].keys() == b[1].keys()
    for key in a[1]:
        assert torch.equal(a[1][key], b[1][key]), key


def recorded_prefetch(monkeypatch, seen: list, also=None):
    """Wraps NgramHashEmbedding.prefetch: appends the thread's name (and ``also()``) to ``seen`` at each call."""
    import threading

    prefetch = speedtorch.nn.NgramHashEmbedding.prefetch

    def recording(self, *args, **kwargs):
        seen.append(threading.current_thread().name if also is None else (threading.current_thread().name, also()))
        return prefetch(self, *args, **kwargs)

    monkeypatch.setattr(speedtorch.nn.NgramHashEmbedding, "prefetch", recording)


@pytest.mark.parametrize("advance", [False, True])
def test_the_trainers_prefetch_on_its_own_thread_beside_the_backward_is_bit_identical(advance, monkeypatch):
    # On a GPU the next batch's prefetch runs on the prefetch thread while this thread queues the backward (on the
    # CPU by the test switch; `advance`: the rows read ahead with their state, stepped in place, as on a GPU). The
    # same bits as without prefetch and as the prefetch on the calling thread before the backward.
    monkeypatch.setattr(speedtorch.nn.HostEmbedding, "_advance_on_cpu", advance)
    config, data = tiny_run()
    without = train(config, data, prefetch=False)
    inline = train(config, data)
    threads = []
    recorded_prefetch(monkeypatch, threads)
    monkeypatch.setattr(Trainer, "_beside_backward_on_cpu", True)
    beside = train(config, data)
    assert_same_bits(without, inline)
    assert_same_bits(without, beside)
    assert len(threads) == 2 * 4 and all(name.startswith("speedtorch-prefetch") for name in threads)
    trainer = beside[2]
    assert trainer._prefetch_thread.started
    trainer.step(data[0])  # no next batch: the thread ends
    assert not trainer._prefetch_thread.started


def test_the_trainers_prefetch_thread_runs_under_the_callers_settings_and_not_under_a_profiler(monkeypatch):
    # transfer_config_override blocks are the calling thread's: the prefetch thread runs under the caller's. A
    # profiler sees the calling thread only: under one the prefetch runs there, before the backward.
    import threading

    monkeypatch.setattr(Trainer, "_beside_backward_on_cpu", True)
    seen = []
    recorded_prefetch(monkeypatch, seen, lambda: speedtorch.transfer_config()["staging_chunk_bytes"])
    config, data = tiny_run(steps=2)
    torch.manual_seed(0)
    trainer = Trainer(EngramGPT(config, torch.device("cpu")))
    with speedtorch.transfer_config_override(staging_chunk_bytes=12345):
        trainer.step(data[0], data[1])
    assert [s[1] for s in seen] == [12345, 12345] and all(s[0].startswith("speedtorch-prefetch") for s in seen)
    seen.clear()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        trainer.step(data[1], data[2])
    assert [s[0] for s in seen] == [threading.current_thread().name] * 2


def test_a_table_updated_in_backward_keeps_the_trainers_prefetch_on_the_calling_thread(monkeypatch):
    # Its update inside the backward changes rows the prefetch reads, and its prefetch slot: the prefetch runs on
    # the calling thread, before the backward, for every table.
    import threading

    monkeypatch.setattr(Trainer, "_beside_backward_on_cpu", True)

    def one_in_backward(trainer):
        trainer.model.engram_modules()[1].rows.update = "backward"

    config, data = tiny_run(steps=3)
    without = train(config, data, prefetch=False, before_step=one_in_backward)
    threads = []
    recorded_prefetch(monkeypatch, threads)
    assert_same_bits(without, train(config, data, before_step=one_in_backward))
    assert threads == [threading.current_thread().name] * 2 * 3


def test_a_backward_that_raises_still_waits_for_the_trainers_prefetch(monkeypatch):
    # The prefetch goes on until well after the backward raised: the step raises the backward's error only once the
    # prefetch is done (nothing runs on behind the caller's back).
    import threading
    import time

    monkeypatch.setattr(Trainer, "_beside_backward_on_cpu", True)
    in_backward, done = threading.Event(), []
    prefetch = speedtorch.nn.NgramHashEmbedding.prefetch

    def slow(self, *args, **kwargs):
        in_backward.wait(10)
        time.sleep(0.2)
        prefetch(self, *args, **kwargs)
        done.append(threading.current_thread().name)

    monkeypatch.setattr(speedtorch.nn.NgramHashEmbedding, "prefetch", slow)
    config, data = tiny_run(steps=2)
    torch.manual_seed(0)
    trainer = Trainer(EngramGPT(config, torch.device("cpu")))

    def boom(grad):
        in_backward.set()
        raise RuntimeError("boom in backward")

    handle = trainer.model.head.weight.register_hook(boom)
    with pytest.raises(RuntimeError, match="boom in backward"):
        trainer.step(data[0], data[1])
    assert len(done) == 2 and all(name.startswith("speedtorch-prefetch") for name in done)
    handle.remove()


def test_a_prefetch_that_fails_on_the_trainers_thread_is_dropped_and_the_step_trains(monkeypatch):
    # As TrainPipeline does: the step trains, and the next batch's own forward reads its rows (or meets the error).
    monkeypatch.setattr(Trainer, "_beside_backward_on_cpu", True)
    config, data = tiny_run(steps=3)
    without = train(config, data, prefetch=False)
    calls = []
    prefetch = speedtorch.nn.NgramHashEmbedding.prefetch

    def failing_once(self, *args, **kwargs):
        calls.append(1)
        prefetch(self, *args, **kwargs)
        if len(calls) == 4:  # step 1's second Engram layer, after its prefetch was made
            raise RuntimeError("prefetch failed")

    monkeypatch.setattr(speedtorch.nn.NgramHashEmbedding, "prefetch", failing_once)
    assert_same_bits(without, train(config, data))
    assert len(calls) == 2 * 3


@pytest.mark.gpu
@pytest.mark.parametrize("copy_engines", [True, False])
@pytest.mark.parametrize("tokens_on_device", [False, True])
def test_gpu_trainers_prefetch_beside_the_backward_is_bit_identical(tokens_on_device, copy_engines, monkeypatch):
    # On the GPU the prefetch thread's own current stream is not the caller's: tokens on the GPU are hashed on a
    # stream that waited for the caller's (Trainer._gate_for), host tokens on each table's side stream. Attention by
    # the math kernel: its backward adds in a fixed order. With the copy engines the rows read ahead come by CPU
    # copies in stream order, each step runs on them in GPU memory and writes them back the same way.
    from torch.nn.attention import SDPBackend, sdpa_kernel

    config, data = tiny_run("cuda", tokens_on_device=tokens_on_device)
    with sdpa_kernel(SDPBackend.MATH):
        without = train(config, data, "cuda", prefetch=False)
        threads = []
        recorded_prefetch(monkeypatch, threads)
        before = speedtorch.stats()
        beside = train(config, data, "cuda", copy_engines=copy_engines)
        after = speedtorch.stats()
    assert_same_bits(without, beside)
    assert len(threads) == 2 * 4 and all(name.startswith("speedtorch-prefetch") for name in threads)
    if copy_engines:  # the rows went back through staging (without, the split policy may stage a share too)
        assert after["staged_scatter_bytes"] > before["staged_scatter_bytes"]
