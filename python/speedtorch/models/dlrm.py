"""DLRM (Naumov et al., 2019) as MLPerf trains it on Criteo 1TB, over any embedding module.

    dense (batch, 13) -> bottom MLP 512-256-128 ---------------\\
    sparse ids -> embeddings (batch, 26 x 128) -----------------> interaction -> top MLP 1024-1024-512-256-1 -> logit

Interaction ``"dot"``: the pairwise dot products of the 27 vectors (bottom output and the 26 pooled embeddings), the
strict lower triangle (351 numbers), beside the bottom output. ``"dcn"`` (DLRM-DCNv2, MLPerf's since v3.0): the 27
vectors concatenated (3,456 numbers) through low-rank cross layers, ``x <- x0 * (U (V x) + b) + x``.

The embedding module maps the batch's ``sparse`` field to ``(batch, 26 x dim)``: a
:class:`speedtorch.HostEmbeddingBagCollection` (tables in host RAM, GPU memory, or both) or
:class:`~speedtorch.models.TorchEmbeddingBags` (``nn.EmbeddingBag``: the plain-PyTorch way). ``amp=True`` runs
the MLPs and the interaction under bf16 autocast; the embeddings stay in their own dtype.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .._phases import phase
from ..nn import HostEmbedding, HostEmbeddingBagCollection

__all__ = ["DLRM", "DLRMTrain", "mlp"]


def mlp(sizes: Sequence[int], last_relu: bool) -> nn.Sequential:
    """Linear layers ``sizes[0] -> sizes[1] -> ...``, ReLU between them (and after the last if ``last_relu``)."""
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2 or last_relu:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class DotInteraction(nn.Module):
    """The bottom output beside the strict lower triangle of the vectors' pairwise dot products."""

    def __init__(self, num_vectors: int):
        super().__init__()
        rows, cols = torch.tril_indices(num_vectors, num_vectors, offset=-1)
        self.register_buffer("_lower", rows * num_vectors + cols, persistent=False)  # in the flattened products

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        vectors = torch.cat([dense.unsqueeze(1), sparse], dim=1)  # (batch, 1 + features, dim)
        products = torch.bmm(vectors, vectors.transpose(1, 2))
        return torch.cat([dense, products.flatten(1).index_select(1, self._lower)], dim=1)


class CrossNet(nn.Module):
    """DCNv2's low-rank cross layers: ``x <- x0 * (U (V x) + b) + x``, ``layers`` times."""

    def __init__(self, width: int, layers: int, rank: int):
        super().__init__()
        self.down = nn.ModuleList(nn.Linear(width, rank, bias=False) for _ in range(layers))
        self.up = nn.ModuleList(nn.Linear(rank, width) for _ in range(layers))
        # As TorchRec's LowRankCrossNet (MLPerf's reference) starts: both kernels Xavier-normal, the bias zero, so a
        # layer starts as x0 * (U V x) + x. nn.Linear's default would start the down kernel at half that scale and
        # the bias at +-1/sqrt(rank), each layer then scaling x0 by up to 4% before any step.
        with torch.no_grad():
            for down, up in zip(self.down, self.up):
                nn.init.xavier_normal_(down.weight)
                nn.init.xavier_normal_(up.weight)
                nn.init.zeros_(up.bias)

    def forward(self, x0: torch.Tensor) -> torch.Tensor:
        x = x0
        for down, up in zip(self.down, self.up):
            x = x0 * up(down(x)) + x
        return x


class DLRM(nn.Module):
    """DLRM over ``embeddings`` (``num_features`` features of ``dim`` each); ``forward(dense, sparse)`` -> logits.

    Args:
        embeddings: maps ``sparse`` to ``(batch, num_features * dim)``.
        num_features, dim: the sparse features and their width (the bottom MLP ends at ``dim``).
        dense_features: dense inputs (13 for Criteo).
        bottom, top: hidden sizes of the bottom MLP (ending at ``dim``) and the top MLP (ending at 1).
        interaction: ``"dot"`` or ``"dcn"``; ``dcn_layers``, ``dcn_rank`` for the latter.
        amp: bf16 autocast for the MLPs and the interaction.
    """

    def __init__(self, embeddings: nn.Module, num_features: int, dim: int = 128, *, dense_features: int = 13,
                 bottom: Sequence[int] = (512, 256, 128), top: Sequence[int] = (1024, 1024, 512, 256, 1),
                 interaction: str = "dot", dcn_layers: int = 3, dcn_rank: int = 512, amp: bool = False):
        super().__init__()
        if bottom[-1] != dim:
            raise ValueError(f"DLRM: the bottom MLP must end at the embedding dim {dim}, got {list(bottom)}")
        if top[-1] != 1:
            raise ValueError(f"DLRM: the top MLP must end at 1 (the logit), got {list(top)}")
        self.embeddings = embeddings
        self.num_features, self.dim, self.amp = num_features, dim, amp
        self.bottom = mlp([dense_features, *bottom], last_relu=True)
        if interaction == "dot":
            self.interaction = DotInteraction(num_features + 1)
            width = dim + (num_features + 1) * num_features // 2
        elif interaction == "dcn":
            width = dim * (num_features + 1)
            self.interaction = CrossNet(width, dcn_layers, dcn_rank)
        else:
            raise ValueError(f"DLRM: interaction must be 'dot' or 'dcn', got {interaction!r}")
        self.interaction_kind = interaction
        self.top = mlp([width, *top], last_relu=False)

    def forward(self, dense: torch.Tensor, sparse) -> torch.Tensor:
        """Logits ``(batch,)``: the bottom MLP of ``dense`` ``(batch, dense_features)``, the embeddings of ``sparse``
        (ids or :class:`speedtorch.SparseFeatures`), their interaction, the top MLP."""
        pooled = self.embeddings(sparse)
        batch = dense.shape[0]
        with torch.autocast(dense.device.type, dtype=torch.bfloat16, enabled=self.amp):
            with phase("mlp"):
                bottom = self.bottom(dense)
            with phase("interaction"):
                if self.interaction_kind == "dot":
                    features = self.interaction(bottom, pooled.view(batch, self.num_features, self.dim))
                else:
                    features = self.interaction(torch.cat([bottom, pooled.to(bottom.dtype)], dim=1))
            with phase("mlp"):
                return self.top(features).float().squeeze(1)


class DLRMTrain(nn.Module):
    """``forward(batch) -> (loss, logits)`` with binary cross-entropy, for :class:`speedtorch.TrainPipeline`;
    :meth:`sparse_inputs` tells the pipeline what the host tables will be given."""

    def __init__(self, model: DLRM):
        super().__init__()
        self.model = model

    def forward(self, batch):
        """``(loss, logits)`` of a :class:`speedtorch.models.CriteoBatch`: binary cross-entropy with the batch's
        labels."""
        logits = self.model(batch.dense, batch.sparse)
        with phase("loss"):
            return F.binary_cross_entropy_with_logits(logits, batch.labels), logits

    def sparse_inputs(self, batch) -> list:
        """``[(host module, its input)]``: the embeddings if they are one, else what their own ``sparse_inputs``
        says (a wrapper around host tables), else nothing."""
        embeddings = self.model.embeddings
        if isinstance(embeddings, (HostEmbeddingBagCollection, HostEmbedding)):
            return [(embeddings, batch.sparse)]
        if hasattr(embeddings, "sparse_inputs"):
            return embeddings.sparse_inputs(batch)
        return []
