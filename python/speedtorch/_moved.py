"""The package's old module paths, from before it was arranged by concern (issue 34), kept importable: ``import
speedtorch.embedding_collection``, ``speedtorch.quantized.QuantizedRows`` after ``import speedtorch``, and pickles that
name a class by its old module (``speedtorch.embedding_collection.HostEmbeddingBagCollection``) reach the module that
holds it now. The old name is the new module object itself (one table below, one finder on ``sys.meta_path``), so
``speedtorch.quantized.QuantizedRows is speedtorch.serving.quantized.QuantizedRows``. The old module ``speedtorch.nn``
is the package of that name; speedtorch/nn/__init__.py keeps the names its pickles hold."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys

#: old module -> the module that holds its code now
MOVED = {
    "speedtorch._prefetched_rows": "speedtorch.nn._prefetched_rows",
    "speedtorch.benchmarking": "speedtorch.cli.benchmarking",
    "speedtorch.dynamic_embedding": "speedtorch.nn.dynamic_embedding",
    "speedtorch.embedding_collection": "speedtorch.nn.collection",
    "speedtorch.engram_gpt": "speedtorch.models.engram_gpt",
    "speedtorch.info": "speedtorch.cli.info",
    "speedtorch.ngram_embedding": "speedtorch.nn.ngram_embedding",
    "speedtorch.ngram_lookup": "speedtorch.serving.ngram_lookup",
    "speedtorch.placement": "speedtorch.nn.placement",
    "speedtorch.quantized": "speedtorch.serving.quantized",
    "speedtorch.rank_preserving_rounding": "speedtorch.serving.rank_preserving_rounding",
    "speedtorch.recommender": "speedtorch.models.recommender",
    "speedtorch.table_parameter": "speedtorch.nn._table_parameter",
    "speedtorch.table_state": "speedtorch.nn._table_state",
    "speedtorch.train_demo": "speedtorch.cli.train_demo",
    "speedtorch.train_pipeline": "speedtorch.pipeline",
    "speedtorch.transfer_demo": "speedtorch.cli.transfer_demo",
}


class _OldPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old module name as the module that holds its code now."""

    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name in MOVED else None

    def create_module(self, spec):
        module = importlib.import_module(MOVED[spec.name])
        spec.loader_state = module.__spec__  # the import system sets the old name's spec: exec_module gives it back
        return module

    def exec_module(self, module):
        module.__spec__ = module.__spec__.loader_state


def old_module(name: str):
    """``speedtorch.<name>`` for an old module's name (the package's ``__getattr__``, PEP 562)."""
    if f"speedtorch.{name}" not in MOVED:
        raise AttributeError(f"module 'speedtorch' has no attribute {name!r}")
    return importlib.import_module(f"speedtorch.{name}")


if not any(isinstance(finder, _OldPaths) for finder in sys.meta_path):
    sys.meta_path.insert(0, _OldPaths())
