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
