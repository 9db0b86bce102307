"""speedtorch.models: the Criteo table sizes, synthetic power-law batches, DLRM (dot and DCNv2) over speedtorch's
tables and over torch's, learning on the CPU; docs/dlrm.md's example. (bench/dlrm.py and bench/report.py:
test_bench_report.py.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from speedtorch import HostEmbeddingBagCollection, SparseFeatures, TableConfig, TrainPipeline
from speedtorch.models import (CRITEO_1TB_ROWS, DLRM, MLPERF_POOLING_FACTORS, DLRMTrain, TorchEmbeddingBags, criteo_rows,
                               synthetic_batches)
from speedtorch.models.criteo import power_law_ids

ROOT = Path(__file__).resolve().parents[2]


def test_criteo_sizes_capped_at_40m():
    rows = criteo_rows()
    assert len(rows) == 26 and rows == list(CRITEO_1TB_ROWS)
    assert sum(rows) == 204_184_588 and max(rows) == 40_000_000
    assert criteo_rows(1000)[:3] == [1000, 1000, 1000] and criteo_rows(1000)[5] == 3
    assert len(MLPERF_POOLING_FACTORS) == 26 and sum(MLPERF_POOLING_FACTORS) == 214
    with pytest.raises(ValueError, match="cap must be >= 1"):
        criteo_rows(0)


def test_power_law_ids_cover_the_table_and_skew_with_the_exponent():
    gen = torch.Generator().manual_seed(0)
    # The hash spreads ranks over the table as a bijection: uniform ids over a small table reach every row.
    assert torch.unique(power_law_ids(97, 20_000, 0.0, gen)).numel() == 97
    distinct = [torch.unique(power_law_ids(1_000_000, 50_000, a, gen)).numel() for a in (0.0, 1.0, 1.3)]
    assert distinct[0] > distinct[1] > distinct[2]
    ids = power_law_ids(1_000_000_000, 10_000, 1.05, gen)  # no overflow at a billion rows
    assert int(ids.min()) >= 0 and int(ids.max()) < 1_000_000_000


def test_synthetic_batches_are_criteo_shaped_and_seeded():
    rows = criteo_rows(500)
    one, again = synthetic_batches(rows, 64, 2, seed=5), synthetic_batches(rows, 64, 2, seed=5)
    b = one[0]
    assert b.dense.shape == (64, 13) and b.dense.dtype == torch.float32
    assert b.sparse.shape == (64, 26) and b.sparse.dtype == torch.int64
    assert ((b.sparse >= 0) & (b.sparse < torch.tensor(rows))).all()
    assert set(b.labels.unique().tolist()) <= {0.0, 1.0}
    assert torch.equal(b.sparse, again[0].sparse) and not torch.equal(one[0].sparse, one[1].sparse)
    bags = synthetic_batches(rows, 8, 1, pooling_factors=[2] * 25 + [3])[0].sparse
    assert isinstance(bags, SparseFeatures) and bags.keys[0] == "t0"
    assert bags.values.numel() == 8 * (2 * 25 + 3) and bags.batch_size == 8


def _collection(rows, dim, **kwargs):
    return HostEmbeddingBagCollection([TableConfig(f"t{i}", n, dim) for i, n in enumerate(rows)], device="cpu",
                                      seed=0, init_std=0.05, **kwargs)


@pytest.mark.parametrize("interaction", ["dot", "dcn"])
def test_dlrm_learns_on_the_cpu(interaction):
    rows = criteo_rows(200)
    batches = synthetic_batches(rows, 128, 4, exponent=1.2, seed=1)
    torch.manual_seed(0)
    tables = _collection(rows, 8, optimizer="rowwise_adagrad", optimizer_options={"lr": 0.1})
    model = DLRMTrain(DLRM(tables, 26, 8, bottom=(16, 8), top=(16, 1), interaction=interaction, dcn_layers=2,
                           dcn_rank=8))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = [float(out[0].detach()) for out in TrainPipeline(model, opt, batches * 5, device="cpu")]
    assert sum(losses[-4:]) < 0.9 * sum(losses[:4])
    assert tables.groups[0].table.step_count() == len(losses)


def test_torch_tables_look_up_as_the_collection_does():
    rows = [30, 12, 50]
    tables = [TableConfig(f"t{i}", n, 4) for i, n in enumerate(rows)]
    ours = HostEmbeddingBagCollection(tables, device="cpu", seed=1)
    theirs = TorchEmbeddingBags(tables, sparse=True)
    with torch.no_grad():
        for config, bag in zip(tables, theirs.bags):
            bag.weight.copy_(ours.weight(config.name))
    ids = torch.stack([torch.randint(0, n, (10,)) for n in rows], dim=1)
    torch.testing.assert_close(theirs(ids), ours(ids))
    bags = SparseFeatures(("t0", "t1", "t2"), torch.tensor([1, 2, 3, 4, 5]), torch.tensor([2, 0, 1, 1, 0, 1]),
                          torch.tensor([1.0, 0.5, 2.0, 1.0, -1.0]))
    torch.testing.assert_close(theirs(bags), ours(bags))


def test_dlrm_checks_its_sizes():
    tables = _collection([5, 6], 8)
    with pytest.raises(ValueError, match="bottom MLP must end at the embedding dim 8"):
        DLRM(tables, 2, 8, bottom=(16, 4))
    with pytest.raises(ValueError, match="top MLP must end at 1"):
        DLRM(tables, 2, 8, bottom=(8,), top=(4, 2))
    with pytest.raises(ValueError, match="interaction must be 'dot' or 'dcn'"):
        DLRM(tables, 2, 8, bottom=(8,), interaction="cat")


def test_amp_runs_the_mlps_in_bfloat16():
    tables = _collection([5, 6], 8)
    model = DLRM(tables, 2, 8, bottom=(8,), top=(4, 1), amp=True)
    seen = []
    model.top[0].register_forward_hook(lambda m, i, o: seen.append(o.dtype))
    logits = model(torch.rand(3, 13), torch.tensor([[1, 2], [3, 4], [0, 5]]))
    assert seen == [torch.bfloat16] and logits.dtype == torch.float32 and logits.shape == (3,)


def test_the_docs_example_runs():
    text = (ROOT / "docs" / "dlrm.md").read_text()
    (block,) = [b for b in re.findall(r"```python\n(.*?)```", text, flags=re.DOTALL) if "TrainPipeline(" in b]
    sizes = "cap, batch, dim = 40_000_000, 65_536, 128"
    assert sizes in block, "docs/dlrm.md's sizes line changed: update this test's substitution"
    namespace: dict = {"__name__": "docs"}
    exec(compile(block.replace(sizes, "cap, batch, dim = 300, 64, 8"), "docs/dlrm.md", "exec"), namespace)
    assert bool(torch.isfinite(namespace["loss"]))
