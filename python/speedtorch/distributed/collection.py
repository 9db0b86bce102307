"""``DistributedHostEmbeddingBagCollection``: :class:`speedtorch.HostEmbeddingBagCollection` whose groups are tables
trained by every rank of a ``torch.distributed`` job (torchrun): one copy of each group per host in shared memory,
rows sharded over hosts, every group's rows moving in one exchange per lookup and one per step.

The collection's code is the single-GPU one (plans, pooling, one-hot and multi-hot ``SparseFeatures``, per-sample
weights); what differs is where rows come from and where gradients go:

- rows: each group is a :class:`DistributedHostEmbedding` (a :class:`ShardedHostTable`). With one host every rank
  reads any row of its host's copy straight from shared memory (UVA from a GPU): no row travels. With several hosts
  the rows of other hosts come through row_exchange.py's input dist / lookup / output dist, one exchange for
  all the groups of a batch;
- gradients: :meth:`step` takes every group's pending gradient (summed per distinct row by autograd) and sends each
  row's to its owner in one exchange for all groups; each owner applies its group's fused optimizer once.

After every :meth:`step` the tables, their optimizer state and step counts equal those of one process training a
``HostEmbeddingBagCollection`` on the concatenation of all ranks' batches (``reduction="mean"``: the ranks' gradients
averaged, as DDP averages the dense part; ``"sum"``: summed).
"""

from __future__ import annotations

import weakref
from typing import Optional, Sequence, Union

import torch

from ..nn.collection import HostEmbeddingBagCollection, TableConfig, _plan_used_here
from ..ops import unique_indices
from ..sparse_features import SparseFeatures
from .embedding import DistributedHostEmbedding
from .row_exchange import RowExchange
from .sharded_table import agree_on_id

__all__ = ["DistributedHostEmbeddingBagCollection"]


class _CollectionGroup(DistributedHostEmbedding):
    """A group of a :class:`DistributedHostEmbeddingBagCollection`: its rows and gradients move with the other
    groups', so its :meth:`step` is its part of the collection's one step, which runs when every group has been
    stepped (code that steps a collection's groups one by one, as TrainPipeline and HostEmbeddingOptimizer do)."""

    def step(self) -> None:
        self._collection()._group_stepped(self)


class DistributedHostEmbeddingBagCollection(HostEmbeddingBagCollection):
    """Embedding tables trained by every rank of the default process group, pooled per feature as
    :class:`speedtorch.HostEmbeddingBagCollection` pools them.

    Args are HostEmbeddingBagCollection's (``placement`` and ``update`` take their one distributed value, ``"host"``
    and ``"step"``; frozen tables are refused, as by :class:`DistributedHostEmbedding`, and so is a TableConfig's
    ``init_range``: every rank would fill the shared rows) and the sharded table's
    (``reduction``, ``local_world_size``, ``shm_dir``). Every rank builds it with the same tables, in the same order
    (a collective). Every rank calls :meth:`step` once per training step; with several hosts every forward and
    :meth:`prefetch` is a collective too (a rank without a batch forwards an empty one).

    The tables are not parameters of the module: wrap the model in ``DistributedDataParallel`` as usual.
    ``state_dict()`` holds each group's entries (``groups.<g>.weight`` / ``.optimizer_state``: ``Shard(0)``
    DTensors over the shared memory; ``.optimizer_step``, ``._extra_state``), for ``torch.distributed.checkpoint``.
    """

    # Its prefetch may exchange ids with other ranks: a TrainPipeline's prefetch="auto" trial keeps one way for all.
    _prefetch_is_collective = True

    def __init__(self, tables: Sequence[TableConfig], *, optimizer: Optional[str] = "adam",
                 optimizer_options: Optional[dict] = None, update: str = "step",
                 device: Optional[Union[torch.device, str]] = None, dtype: torch.dtype = torch.float32,
                 placement: str = "host", hot_fraction: Optional[float] = None, state_beside_rows: bool = True,
                 init_std: float = 1.0, seed: Optional[int] = None, reduction: str = "mean",
                 local_world_size: Optional[int] = None, shm_dir: str = "/dev/shm"):
        ranged = [config.name for config in tables if isinstance(config, TableConfig) and config.init_range is not None]
        if ranged:  # every rank would write the shared rows
            raise ValueError(f"DistributedHostEmbeddingBagCollection: TableConfig.init_range is not supported (tables "
                             f"{ranged}); the rows start N(0, init_std^2)")
        # Read by _group_module, which the parent's __init__ calls once per group.
        object.__setattr__(self, "_sharded_options",
                           dict(reduction=reduction, local_world_size=local_world_size, shm_dir=shm_dir))
        super().__init__(tables, optimizer=optimizer, optimizer_options=optimizer_options, update=update,
                         device=device, dtype=dtype, placement=placement, hot_fraction=hot_fraction,
                         state_beside_rows=state_beside_rows, init_std=init_std, seed=seed)
        first = self._groups[0].module.table
        config = [(m.num_embeddings, m.embedding_dim, m.table.optimizer()) for m in self.groups]
        set_id = agree_on_id(first.control_group, "DistributedHostEmbeddingBagCollection: every rank must build "
                             "the same collection", groups=config, features=self.feature_names)
        self.sharding = RowExchange([m.table.sharding for m in self.groups], first.control_group, set_id,
                                           f"collection #{set_id} ({len(self.tables)} tables in {len(config)} "
                                           f"groups)")
        self._awaiting_step = False  # a forward ran whose update step() has not applied yet
        self._queued = None  # features prefetch() was given before step(): gathered once step() is done
        self._ready = None  # (features, plan) whose rows the groups hold
        self._stepped: set = set()  # the groups stepped one by one since the last step (_group_stepped)

    def _group_module(self, num_rows: int, dim: int, **kwargs) -> DistributedHostEmbedding:
        module = _CollectionGroup(num_rows, dim, **kwargs, **self._sharded_options)
        object.__setattr__(module, "_collection", weakref.ref(self))
        return module

    # --- forward: the collection's plan and pooling; rows of other hosts in one exchange -------------------------

    def forward(self, features: Union[torch.Tensor, SparseFeatures]) -> torch.Tensor:
        """``(batch, sum of feature dims)``: each feature's pooled rows, in :attr:`feature_names` order (as
        HostEmbeddingBagCollection's); with gradients enabled, marks the step that :meth:`step` must apply."""
        plan = self._take_ready(features)
        if plan is None:
            plan = self._planned(features)
            self._hand_rows(plan)
        if torch.is_grad_enabled():
            self._awaiting_step = True
        pieces = [self._pool(group, lookup) for group, lookup in zip(self._groups, plan)]
        return pieces[0] if len(pieces) == 1 else self._interleave(pieces)

    def prefetch(self, next_features: Union[torch.Tensor, SparseFeatures]) -> None:
        """Gathers the next batch's rows ahead (one host: each group on a side stream; several hosts: one exchange
        for all groups, a collective). Other ranks' updates of this step may touch any row, so a prefetch asked for
        before :meth:`step` starts once the step's updates are done. Pass the same object to the next forward."""
        if self._awaiting_step:
            self._queued = next_features
            return
        plan = self._planned(next_features)
        if self.sharding.topology.num_hosts == 1:
            for group, lookup in zip(self._groups, plan):
                group.module.prefetch(lookup.ids)  # HostEmbedding's: on a side stream, no collective
        else:
            self._hand_rows(plan)
        self._ready = (next_features, plan)

    def _planned(self, features):
        """The collection's plan (ids checked in range); with several hosts a rank whose ids fail the check still
        opens the lookup's exchange, flagging it, so every rank raises instead of waiting for its rows."""
        try:
            return self._plan(features)
        except IndexError:
            self.sharding.refuse_lookup(True)  # several hosts: the others raise too
            raise

    def _hand_rows(self, plan) -> None:
        """Several hosts: every group's distinct rows in one exchange, handed to the group for its lookup of this
        plan. One host: nothing (each group reads its rows from shared memory when it pools)."""
        if self.sharding.topology.num_hosts == 1:
            return
        distinct = [unique_indices(lookup.ids) for lookup in plan]
        rows = self.sharding.gather([unique for unique, _ in distinct], self.device)
        for group, lookup, (unique, inverse), r in zip(self._groups, plan, distinct, rows):
            group.module.hand_rows(lookup.ids, unique, inverse, r)

    def _take_ready(self, features):
        ready, self._ready = self._ready, None  # for the next forward only, as every prefetch
        if ready is None or ready[0] is not features:
            return None
        return _plan_used_here(ready[1], self.device)

    # --- step: every group's gradients in one exchange -------------------------------------------------------------

    def _group_stepped(self, module) -> None:
        self._stepped.add(id(module))
        if len(self._stepped) == len(self._groups):
            self.step()

    @torch.no_grad()
    def step(self) -> None:
        """The synchronous update of every table: each rank's gradients reach the rows' owners in one exchange, and
        each owner applies its group's fused optimizer once per row. Every rank calls it once per training step
        (or steps every group, in any order: the last one's ``step()`` runs this)."""
        self._stepped = set()
        ids, grads = [], []
        for group in self._groups:
            taken = group.module._take_gradient()
            if taken is None:  # this rank has no gradient for this group: it still takes part
                ids.append(torch.empty(0, dtype=torch.int64, device=self.device))
                grads.append(torch.empty(0, group.module.embedding_dim, dtype=torch.float32, device=self.device))
            else:
                ids.append(taken[0])
                grads.append(taken[1])
        self.sharding.apply_gradients(ids, grads)
        self._awaiting_step = False
        if self._queued is not None:
            queued, self._queued = self._queued, None
            self.prefetch(queued)

    def weight(self, table: str) -> torch.Tensor:
        """The rows of ``table`` (shared memory); with several hosts a host holds part of each group only: read the
        tables through ``state_dict()`` (DTensors) instead."""
        if self.sharding.topology.num_hosts > 1:
            raise RuntimeError("DistributedHostEmbeddingBagCollection.weight: with several hosts each host holds part "
                               "of every group's rows; use state_dict() (Shard(0) DTensors per group)")
        return super().weight(table)

    # --- state_dict: each group's DTensors (DistributedHostEmbedding's) ---------------------------------------------

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        torch.nn.Module._save_to_state_dict(self, destination, prefix, keep_vars)
        for g, group in enumerate(self._groups):
            group.module._save_to_state_dict(destination, f"{prefix}groups.{g}.", keep_vars)  # _extra_state too

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        ours = f"{prefix}groups."
        rest = {k: v for k, v in state_dict.items() if not k.startswith(ours)}
        torch.nn.Module._load_from_state_dict(self, rest, prefix, local_metadata, strict, missing_keys,
                                              unexpected_keys, error_msgs)
        for g, group in enumerate(self._groups):
            mine = f"{ours}{g}."
            group.module._load_from_state_dict({k: v for k, v in state_dict.items() if k.startswith(mine)}, mine,
                                               local_metadata, strict, missing_keys, unexpected_keys, error_msgs)
        self._ready = self._queued = None
