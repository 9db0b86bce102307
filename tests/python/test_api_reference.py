"""The API reference stays true to the code: docs/api.md names every public name, PinnedEmbeddingAPI (what help()
shows for speedtorch.PinnedEmbedding's methods) lists exactly the custom class's methods, every public callable has
a docstring, and repr() of a table says what it is."""

from __future__ import annotations

import inspect
from pathlib import Path

import torch

import speedtorch
import speedtorch.data
import speedtorch.nn
import speedtorch.optim
import speedtorch.placement

API = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()


def test_the_reference_names_every_public_name():
    for module in (speedtorch, speedtorch.nn, speedtorch.optim, speedtorch.data, speedtorch.placement):
        for name in module.__all__:
            assert f"`{name}" in API, f"docs/api.md does not name {module.__name__}.{name}"


def test_every_public_callable_has_a_docstring():
    for module in (speedtorch, speedtorch.nn, speedtorch.optim, speedtorch.data, speedtorch.placement):
        for name in module.__all__:
            value = getattr(module, name)
            if inspect.ismodule(value) or value is speedtorch.PinnedEmbedding:
                continue
            assert inspect.getdoc(value), f"{module.__name__}.{name} has no docstring"
    for cls in (speedtorch.nn.HostEmbedding, speedtorch.optim.HostEmbeddingOptimizer, speedtorch.PinnedEmbeddingAPI):
        for name, member in inspect.getmembers(cls, callable):
            if not name.startswith("_") and member.__qualname__.startswith(cls.__name__):
                assert inspect.getdoc(member), f"{cls.__name__}.{name} has no docstring"


def test_pinned_embedding_api_lists_exactly_the_class_methods():
    table = speedtorch.PinnedEmbedding(4, 2)
    methods = {m for m in table._method_names() if not m.startswith("__")}
    statics = {"load", "open", "create", "state_width", "optimizer_defaults", "canonical_optimizer_name"}
    documented = {name for name, _ in inspect.getmembers(speedtorch.PinnedEmbeddingAPI, inspect.isfunction)
                  if not name.startswith("_")}
    assert documented == methods | statics
    for name in statics:
        assert getattr(speedtorch.PinnedEmbedding, name) is not None  # really static methods of the class


def test_repr_says_what_a_table_is():
    table = speedtorch.PinnedEmbedding(10, 4, torch.bfloat16)
    assert repr(table).startswith("PinnedEmbedding(10 x 4, BFloat16, optimizer=none")
    table.set_optimizer("adam", {}, False)
    table.apply_gradients(torch.tensor([1]), torch.ones(1, 4))
    assert "optimizer=adam, step=1, state apart" in repr(table) and str(table) == repr(table)
