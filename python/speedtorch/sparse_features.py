"""``SparseFeatures``: a batch's ids for several sparse features, in the layout of TorchRec's ``KeyedJaggedTensor``
(without depending on TorchRec): the ids of feature 0's bags, sample by sample, then feature 1's, and so on, with
the number of ids of each (feature, sample) bag.

    keys     ("f0", "f1")                    the features, in order
    values   [a0 a1 | a2 | b0 | b1 b2 b3]    every id, feature-major, then sample by sample (int32 or int64)
    lengths  [2, 1, 1, 3]                    ids per bag: f0's samples 0, 1, then f1's samples 0, 1
    weights  None, or one float per id       per-sample weights (sum pooling)

:class:`speedtorch.HostEmbeddingBagCollection` pools each bag; a feature with one id per sample (one-hot) may
instead be given as a ``(batch, features)`` tensor (:meth:`SparseFeatures.from_dense` converts one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch

__all__ = ["SparseFeatures"]

_INT_TYPES = (torch.int32, torch.int64)


@dataclass
class SparseFeatures:
    """The ids of a batch's sparse features, bag by bag (the layout of the module's docstring); checked when made."""

    keys: tuple
    values: torch.Tensor
    lengths: torch.Tensor
    weights: Optional[torch.Tensor] = None

    def __post_init__(self):
        self.keys = tuple(self.keys)
        if not self.keys:
            raise ValueError("SparseFeatures: keys must name at least one feature")
        if len(set(self.keys)) != len(self.keys):
            raise ValueError(f"SparseFeatures: keys must be distinct, got {self.keys}")
        for name in ("values", "lengths"):
            t = getattr(self, name)
            if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.dtype not in _INT_TYPES:
                raise TypeError(f"SparseFeatures: {name} must be a 1-D int32 or int64 tensor, got "
                                f"{_describe(t)}")
        if self.lengths.numel() % len(self.keys):
            raise ValueError(f"SparseFeatures: lengths holds {self.lengths.numel()} bags, not a multiple of the "
                             f"{len(self.keys)} keys (one bag per feature and sample)")
        if self.weights is not None and (not isinstance(self.weights, torch.Tensor) or
                                         tuple(self.weights.shape) != tuple(self.values.shape) or
                                         not self.weights.is_floating_point()):
            raise TypeError(f"SparseFeatures: weights must be a floating tensor shaped like values "
                            f"{tuple(self.values.shape)}, got {_describe(self.weights)}")
        if self.lengths.device.type == "cpu":  # free to check here; on a GPU the collection checks at its sync
            self.check_lengths()

    @property
    def batch_size(self) -> int:
        """Samples in the batch: bags per feature (``lengths.numel() // len(keys)``)."""
        return self.lengths.numel() // len(self.keys)

    def check_lengths(self) -> None:
        """Raises unless every length is >= 0 and they add up to the number of values (waits for the lengths'
        device)."""
        if self.lengths.numel() == 0:
            total, smallest = 0, 0
        else:
            total, smallest = torch.stack([self.lengths.sum(), self.lengths.min()]).tolist()
        if smallest < 0:
            raise ValueError(f"SparseFeatures: lengths must be >= 0, got {smallest}")
        if total != self.values.numel():
            raise ValueError(f"SparseFeatures: the lengths add up to {total}, but there are {self.values.numel()} "
                             f"values")

    @classmethod
    def from_dense(cls, keys: Sequence[str], ids: torch.Tensor) -> "SparseFeatures":
        """One id per (sample, feature): ``ids`` is ``(batch, len(keys))``, column ``f`` feature ``keys[f]``."""
        if ids.dim() != 2 or ids.shape[1] != len(keys):
            raise ValueError(f"SparseFeatures.from_dense: ids must be (batch, {len(keys)}), got {tuple(ids.shape)}")
        lengths = torch.ones(ids.numel(), dtype=ids.dtype, device=ids.device)
        return cls(tuple(keys), ids.t().reshape(-1), lengths)

    def offsets(self) -> torch.Tensor:
        """Where each bag starts in ``values`` (``lengths.numel() + 1`` entries, the last one the total)."""
        return torch.cat([self.lengths.new_zeros(1), torch.cumsum(self.lengths, 0)])

    def to(self, device, non_blocking: bool = False) -> "SparseFeatures":
        """A copy with ``values``, ``lengths`` and ``weights`` moved to ``device`` (``Tensor.to``; ``non_blocking`` as
        there); keys are shared."""
        move = lambda t: None if t is None else t.to(device, non_blocking=non_blocking)  # noqa: E731
        return SparseFeatures(self.keys, move(self.values), move(self.lengths), move(self.weights))

    def pin_memory(self) -> "SparseFeatures":
        """A copy with the tensors in pinned host memory (``Tensor.pin_memory``), as a DataLoader with
        ``pin_memory=True`` asks of a batch."""
        pin = lambda t: None if t is None else t.pin_memory()  # noqa: E731
        return SparseFeatures(self.keys, pin(self.values), pin(self.lengths), pin(self.weights))

    def record_stream(self, stream) -> None:
        """Marks the CUDA tensors as used on ``stream`` (``Tensor.record_stream``), for a batch moved on a side stream;
        CPU tensors are skipped."""
        for t in (self.values, self.lengths, self.weights):
            if t is not None and t.is_cuda:
                t.record_stream(stream)


def _describe(t) -> str:
    if isinstance(t, torch.Tensor):
        return f"a {t.dim()}-D {t.dtype} tensor"
    return type(t).__name__
