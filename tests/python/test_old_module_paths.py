"""The package's old module paths, from before it was arranged by concern (issue 34), still work: each imports as the
module that holds its code now (speedtorch/_moved.py), the package names them as attributes, and objects pickled
under the old paths (torch.save(model) of a HostEmbedding named speedtorch.nn._PickledTable, a collection
speedtorch.embedding_collection.HostEmbeddingBagCollection) load."""

from __future__ import annotations

import importlib
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import speedtorch
from speedtorch._moved import MOVED


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_is_the_module_of_now(old):
    new = importlib.import_module(MOVED[old])
    assert importlib.import_module(old) is new and sys.modules[old] is new
    assert new.__name__ == new.__spec__.name == MOVED[old]  # the alias left the module its own spec
    assert getattr(speedtorch, old.rpartition(".")[2]) is new


def test_old_names_are_the_same_objects():
    from speedtorch.embedding_collection import HostEmbeddingBagCollection
    from speedtorch.quantized import QuantizedRows
    from speedtorch.train_pipeline import TrainPipeline

    assert HostEmbeddingBagCollection is speedtorch.HostEmbeddingBagCollection is speedtorch.nn.HostEmbeddingBagCollection
    assert TrainPipeline is speedtorch.TrainPipeline and QuantizedRows is speedtorch.serving.QuantizedRows
    assert speedtorch.nn.HostEmbedding is speedtorch.nn.embedding.HostEmbedding
    with pytest.raises(AttributeError, match="no attribute 'no_such_module'"):
        speedtorch.no_such_module


def test_an_old_path_imports_first_in_a_fresh_process():
    code = ("import speedtorch.train_pipeline as p, speedtorch.placement as q, speedtorch;"
            "assert p is speedtorch.pipeline and q is speedtorch.nn.placement;"
            "from speedtorch.dynamic_embedding import DynamicHostEmbedding;"
            "print(speedtorch.quantized.QuantizedRows.__module__)")
    env = dict(os.environ, PYTHONPATH=str(Path(speedtorch.__file__).resolve().parents[1]))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == "speedtorch.serving.quantized"


def test_objects_pickled_under_the_old_paths_load():
    table = speedtorch.nn.HostEmbedding(10, 4)
    collection = speedtorch.HostEmbeddingBagCollection([speedtorch.TableConfig("t", 10, 4)])
    # Protocol 2 writes each class as "module\nname\n" text: the paths are renamed below as the old files held them.
    old = pickle.dumps({"table": table, "collection": collection}, protocol=2)
    for new_path, old_path in (("speedtorch.nn.embedding", "speedtorch.nn"),
                               ("speedtorch.nn.collection", "speedtorch.embedding_collection")):
        assert f"c{new_path}\n".encode() in old
        old = old.replace(f"c{new_path}\n".encode(), f"c{old_path}\n".encode())
    loaded = pickle.loads(old)
    assert type(loaded["table"]) is speedtorch.nn.HostEmbedding
    assert type(loaded["collection"]) is speedtorch.HostEmbeddingBagCollection
    torch.testing.assert_close(loaded["table"].weight, table.weight, rtol=0, atol=0)
    assert pickle.loads(pickle.dumps(speedtorch.quantized.QuantizedRows)) is speedtorch.serving.QuantizedRows


def test_every_name_the_repositorys_scripts_import_from_the_package_is_there():
    # The move left imports inside functions that only a full run reaches (bench/train.py --cpu's stage profile
    # imported _HostRows from speedtorch.nn, where it no longer is): each `from speedtorch... import name` of the
    # benchmarks, examples, tests and the package itself, at any depth, is checked here.
    import ast

    root = Path(__file__).resolve().parents[2]
    files = [p for folder in ("bench", "torchscript_examples", "tests/python", "python/speedtorch")
             for p in sorted((root / folder).rglob("*.py"))]
    missing = []
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module
                    and node.module.split(".")[0] == "speedtorch"):
                continue
            module = importlib.import_module(node.module)
            for alias in node.names:
                if alias.name == "*" or hasattr(module, alias.name):
                    continue
                try:
                    importlib.import_module(f"{node.module}.{alias.name}")
                except ImportError:
                    missing.append(f"{path.relative_to(root)}:{node.lineno}: from {node.module} import {alias.name}")
    assert not missing, "imports of names the package does not have:\n" + "\n".join(missing)
