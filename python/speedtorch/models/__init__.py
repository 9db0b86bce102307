"""Models trained with speedtorch's host tables: DLRM (dlrm.py) and its synthetic Criteo-shaped data (criteo.py),
with plain-PyTorch embedding tables beside them for comparison (torch_tables.py); a small GPT with Engram tables
(engram_gpt.py) and the recommender of ``python -m speedtorch demo`` and bench/train.py (recommender.py), imported by
name."""

from .criteo import CRITEO_1TB_ROWS, MLPERF_POOLING_FACTORS, CriteoBatch, criteo_rows, synthetic_batches
from .dlrm import DLRM, DLRMTrain
from .torch_tables import TorchEmbeddingBags

__all__ = ["CRITEO_1TB_ROWS", "MLPERF_POOLING_FACTORS", "CriteoBatch", "DLRM", "DLRMTrain", "TorchEmbeddingBags", "criteo_rows",
           "synthetic_batches"]
