"""The API reference stays true to the code: docs/api.md names every public name, PinnedEmbeddingAPI (whose help()
documents speedtorch.PinnedEmbedding's methods) lists exactly the custom class's methods, every public callable of
every public module has a docstring, and repr() of a table says what it is."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest
import torch

import speedtorch
import speedtorch.data
import speedtorch.models
import speedtorch.nn
import speedtorch.optim

API = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()


def test_the_reference_names_every_public_name():
    for module in (speedtorch, speedtorch.nn, speedtorch.nn.placement, speedtorch.optim, speedtorch.data,
                   speedtorch.serving, speedtorch.pipeline, speedtorch.models):
        for name in module.__all__:
            assert f"`{name}" in API, f"docs/api.md does not name {module.__name__}.{name}"


def public_modules() -> dict:
    """speedtorch and every module below it without a leading underscore in its name, imported."""
    names = ["speedtorch"] + [info.name for info in pkgutil.walk_packages(speedtorch.__path__, "speedtorch.")
                              if not any(part.startswith("_") for part in info.name.split(".")[1:])]
    modules = {}
    for name in names:
        if name.startswith("speedtorch.distributed") and torch.__version__ < (2, 5):
            continue  # speedtorch.distributed needs torch >= 2.5
        modules[name] = importlib.import_module(name)
    return modules


def public_callables(module) -> dict:
    """name -> value: the names in ``__all__``, or, without one, the functions and classes defined in the module
    whose names have no leading underscore."""
    if hasattr(module, "__all__"):
        values = {name: getattr(module, name) for name in module.__all__}
    else:
        values = {name: value for name, value in vars(module).items()
                  if not name.startswith("_") and getattr(value, "__module__", None) == module.__name__}
    return {name: value for name, value in values.items()
            if callable(value) and not inspect.ismodule(value) and value is not speedtorch.PinnedEmbedding}


def own_docstring(value) -> str:
    """The object's own docstring (inspect.getdoc would take a base class's instead), without the one dataclasses
    and NamedTuple generate from the fields (``Name(field: type, ...)``)."""
    doc = inspect.cleandoc(value.__doc__ or "")
    name = getattr(value, "__name__", "")
    generated = inspect.isclass(value) and doc.startswith(f"{name}(") and doc.endswith(")") and "\n" not in doc
    return "" if generated else doc


def public_methods(cls) -> dict:
    """name -> function: what the class itself defines (methods, static and class methods, properties) under a name
    without a leading underscore."""
    out = {}
    for name, member in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(member, (staticmethod, classmethod)):
            member = member.__func__
        if isinstance(member, property):
            member = member.fget
        if inspect.isfunction(member):
            out[name] = member
    return out


MODULES = public_modules()


def test_the_walk_finds_the_public_modules():
    for name in ("speedtorch.compat", "speedtorch.serving.quantized", "speedtorch.models", "speedtorch.models.criteo",
                 "speedtorch.distributed", "speedtorch.distributed.sharded_table", "speedtorch.models.recommender",
                 "speedtorch.nn.collection", "speedtorch.cli.info"):
        assert name in MODULES or (name.startswith("speedtorch.distributed") and torch.__version__ < (2, 5))


@pytest.mark.parametrize("module_name", sorted(MODULES))
def test_every_public_callable_has_a_docstring(module_name):
    """Every public module, function, class and method of the package has its own docstring (issue 25)."""
    module = MODULES[module_name]
    missing = [] if inspect.getdoc(module) else [module_name]
    for name, value in public_callables(module).items():
        if not own_docstring(value):
            missing.append(f"{module_name}.{name}")
        if inspect.isclass(value) and value.__module__.startswith("speedtorch"):
            missing += [f"{module_name}.{name}.{method}" for method, function in public_methods(value).items()
                        if not own_docstring(function)]
    assert not missing, f"no docstring: {missing}"


def test_help_of_pinned_embedding_points_to_its_reference():
    """speedtorch.PinnedEmbedding is a TorchScript custom class (a torch.ScriptClass object): its __doc__ and class
    cannot be set from Python, so help(speedtorch.PinnedEmbedding) shows torch.ScriptClass. help(speedtorch) and
    docs/api.md say where its methods are documented: speedtorch.PinnedEmbeddingAPI."""
    assert isinstance(speedtorch.PinnedEmbedding, torch.ScriptClass)
    with pytest.raises(AttributeError):
        speedtorch.PinnedEmbedding.__doc__ = "documented"  # were this possible, the reference would move here
    assert "help(speedtorch.PinnedEmbeddingAPI)" in inspect.getdoc(speedtorch)
    assert "PinnedEmbeddingAPI" in API
    assert "speedtorch.PinnedEmbedding" in inspect.getdoc(speedtorch.PinnedEmbeddingAPI)


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
