"""``speedtorch.HostEmbeddingBagCollection``: many embedding tables in one module, looked up and trained together,
as FBGEMM's table-batched embedding (and TorchRec's ``EmbeddingBagCollection`` over it) does.

Tables that agree on dim, dtype, optimizer (with its options) and placement form one *group*: one
:class:`speedtorch.nn.HostEmbedding` whose rows are the tables' rows stacked, each table at its own row offset. A
feature's id ``i`` of table ``t`` is the group's row ``offset[t] + i``. Per step a group de-duplicates the ids of all
its tables together, gathers the distinct rows in one call and, after backward, applies the fused optimizer to them
in one call: 26 tables of one dim cost one gather and one optimizer launch, not 26. Pooling (sum or mean per table)
runs on the compute device over the gathered distinct rows (``embedding_bag`` with the remapped ids), so backward
yields one gradient per distinct row, which is what the fused optimizer takes.

Inputs: a ``(batch, features)`` integer tensor (one id per sample and feature), or :class:`SparseFeatures` (values
and lengths per feature: multi-hot bags, optional per-sample weights). Output: ``(batch, sum of the features' dims)``,
feature by feature in :attr:`feature_names` order (TorchRec's ``KeyedTensor.values()``); :meth:`split` cuts it.

``state_dict()`` holds, per table, ``embedding_bags.<table>.weight`` and ``.optimizer_state`` (sharing the group's
memory, no copy), ``.optimizer_step`` and ``._extra_state``, so a checkpoint does not depend on how tables are
grouped; ``torch.save`` and ``torch.distributed.checkpoint`` keep it, and ``load_state_dict`` writes it back in place.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional, Sequence, Union

import torch
import torch.nn.functional as F

from .._library import PinnedEmbedding
from .._phases import phase
from ..ops import _first_out_of_range, check_indices
from ..sparse_features import SparseFeatures
from ._table_state import adopt_options, checked_extra_state, entry_error, entry_shapes, table_extra_state
from .embedding import HostEmbedding

__all__ = ["TableConfig", "HostEmbeddingBagCollection"]

_POOLINGS = ("sum", "mean")


@dataclass(frozen=True)
class TableConfig:
    """One table of a :class:`HostEmbeddingBagCollection`. ``None`` fields take the collection's value.

    ``feature_names``: the features looked up in this table (default: one, named as the table). ``pooling``: how a
    bag's rows combine, ``"sum"`` or ``"mean"``. ``hot_fraction``: for ``placement="hybrid"``, the share of this
    table's rows the group's GPU row cache holds room for. ``frozen``: no optimizer (no state, never updated; e.g.
    pretrained rows), as ``HostEmbedding(optimizer=None)``; frozen tables form groups of their own.
    ``init_range``: the table's rows start U(-init_range, +init_range) (a float > 0), in place of the collection's
    N(0, init_std^2); TorchRec's tables start so by default with ``init_range = sqrt(1 / num_embeddings)``, and so do
    those of MLPerf's DLRM-DCNv2 reference. Tables with other ranges still share a group.
    """

    name: str
    num_embeddings: int
    embedding_dim: int
    pooling: str = "sum"
    feature_names: tuple = ()
    dtype: Optional[torch.dtype] = None
    optimizer: Optional[str] = None
    optimizer_options: Optional[dict] = field(default=None, hash=False)
    placement: Optional[str] = None
    hot_fraction: Optional[float] = None
    frozen: bool = False
    init_range: Optional[float] = None


@dataclass
class _Group:
    """Tables stacked in one HostEmbedding, and which features (columns of the one-hot input) read it."""

    module: HostEmbedding
    tables: list  # (TableConfig, row offset)
    features: list  # feature indices, ascending


class HostEmbeddingBagCollection(torch.nn.Module):
    """Embedding tables in pinned host RAM (or GPU memory, or both: ``placement``), pooled per feature, trained by a
    fused optimizer, looked up and updated a group of tables at a time.

    Args:
        tables: the tables (:class:`TableConfig`); names distinct, feature names distinct over all tables.
        optimizer, optimizer_options, update, device, dtype, state_beside_rows, init_std, seed: as
            :class:`speedtorch.nn.HostEmbedding`'s (the defaults of tables that leave theirs ``None``; ``init_std``
            for the tables without an ``init_range``, ``seed`` for every table's rows). The tables of
            a group share one step count (Adam's bias correction counts the group's steps). ``optimizer=None``:
            every table frozen (``TableConfig.frozen`` freezes one).
        placement: ``"host"``, ``"gpu"`` or ``"hybrid"`` (every row in pinned host RAM, a GPU row cache in front).
        hot_fraction: for ``"hybrid"``: the cache holds room for this share of each table's rows.
    """

    def __init__(self, tables: Sequence[TableConfig], *, optimizer: Optional[str] = "adam",
                 optimizer_options: Optional[dict] = None, update: str = "step",
                 device: Optional[Union[torch.device, str]] = None, dtype: torch.dtype = torch.float32,
                 placement: str = "host", hot_fraction: Optional[float] = None, state_beside_rows: bool = True,
                 init_std: float = 1.0, seed: Optional[int] = None):
        super().__init__()
        tables = list(tables)
        if not tables:
            raise ValueError("HostEmbeddingBagCollection: give at least one TableConfig")
        _check_names(tables)
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        self.tables = tables
        self.feature_names: list[str] = []
        feature_table: list[int] = []
        for t, config in enumerate(tables):
            for name in config.feature_names or (config.name,):
                self.feature_names.append(name)
                feature_table.append(t)

        defaults = dict(optimizer=optimizer, optimizer_options=optimizer_options or {}, dtype=dtype,
                        placement=placement, hot_fraction=hot_fraction)
        groups: dict[tuple, list[int]] = {}
        for t, config in enumerate(tables):
            groups.setdefault(_group_key(config, defaults), []).append(t)
        self._groups: list[_Group] = []
        self._group_of_table = [0] * len(tables)
        self._offset_of_table = [0] * len(tables)
        for g, (key, members) in enumerate(groups.items()):
            dim, dtype_name, opt, options, where, fraction = key
            offset, stacked = 0, []
            for t in members:
                self._group_of_table[t], self._offset_of_table[t] = g, offset
                stacked.append((tables[t], offset))
                offset += tables[t].num_embeddings
            cache_rows = None
            if where == "hybrid":
                if fraction is None or not 0.0 < fraction <= 1.0:
                    raise ValueError(f"HostEmbeddingBagCollection: placement='hybrid' needs hot_fraction in (0, 1] "
                                     f"(tables {[tables[t].name for t in members]}), got {fraction!r}")
                cache_rows = sum(max(1, math.ceil(fraction * tables[t].num_embeddings)) for t in members)
            module = self._group_module(offset, dim, optimizer=opt or None, optimizer_options=dict(options),
                                        update=update, device=self.device, dtype=getattr(torch, dtype_name),
                                        state_beside_rows=state_beside_rows, init_std=init_std,
                                        seed=None if seed is None else seed + g, placement=where,
                                        cache_rows=cache_rows)
            _fill_uniform_tables(module, stacked, None if seed is None else seed + g)
            features = [f for f, t in enumerate(feature_table) if t in members]
            self._groups.append(_Group(module, stacked, features))

        # Per feature: its group, its table's row offset in the group, its table's rows, dim and pooling.
        self._feature_table = feature_table
        self._feature_group = [self._group_of_table[t] for t in feature_table]
        self._feature_offset = torch.tensor([self._offset_of_table[t] for t in feature_table], dtype=torch.int64)
        self._feature_rows = [tables[t].num_embeddings for t in feature_table]
        self._feature_mean = torch.tensor([tables[t].pooling == "mean" for t in feature_table])
        self.feature_dims = [tables[t].embedding_dim for t in feature_table]
        self._constants: dict = {}
        self._prefetched = None

    def _group_module(self, num_rows: int, dim: int, **kwargs) -> HostEmbedding:
        """The module of one group (``HostEmbedding``'s arguments); speedtorch.distributed's collection makes it a
        table shared by the ranks of a process group."""
        return HostEmbedding(num_rows, dim, **kwargs)

    def extra_repr(self) -> str:
        """The module's repr lines: table and feature counts, the device, and each group's tables, size, optimizer and
        placement."""
        lines = [f"{len(self.tables)} tables, {len(self.feature_names)} features, device={self.device}"]
        for g, group in enumerate(self._groups):
            m = group.module
            lines.append(f"group {g}: tables {[c.name for c, _ in group.tables]}, {m.num_embeddings:,} x "
                         f"{m.embedding_dim} rows, optimizer={m.table.optimizer()}, placement={m.placement}")
        return "\n".join(lines)

    @property
    def groups(self) -> list[HostEmbedding]:
        """The groups' tables (one :class:`HostEmbedding` each; its rows are its tables' rows stacked)."""
        return [group.module for group in self._groups]

    def weight(self, table: str) -> torch.Tensor:
        """The rows of ``table`` (shares memory with its group's :attr:`HostEmbedding.weight`; synchronize first while
        updates may be running)."""
        t = self._table_index(table)
        rows = self._groups[self._group_of_table[t]].module.weight
        offset = self._offset_of_table[t]
        return rows[offset:offset + self.tables[t].num_embeddings]

    def split(self, pooled: torch.Tensor) -> dict[str, torch.Tensor]:
        """forward's output cut into ``{feature name: (batch, dim)}``."""
        return dict(zip(self.feature_names, pooled.split(self.feature_dims, dim=1)))

    # --- forward ------------------------------------------------------------------------------------------------

    def forward(self, features: Union[torch.Tensor, SparseFeatures]) -> torch.Tensor:
        """``(batch, sum of feature dims)``: each feature's pooled rows, in :attr:`feature_names` order."""
        with phase("ids"):
            plan = self._take_prefetched(features)
            if plan is None:
                plan = self._plan(features)
        with phase("pooling"):  # around each group's lookup (its own phases: de-duplication, gather)
            pieces = [self._pool(group, lookup) for group, lookup in zip(self._groups, plan)]
            if len(pieces) == 1:
                return pieces[0]
            return self._interleave(pieces)

    def prefetch(self, next_features: Union[torch.Tensor, SparseFeatures]) -> None:
        """Starts gathering the rows of the next batch (on a side stream on a GPU; :meth:`HostEmbedding.prefetch`)
        while this step computes. Pass the same object to the next forward, which takes them; the updates in between
        hand the prefetch the rows they change, so nothing stale is used. A forward with other features drops it."""
        self._prefetched = None
        with phase("ids"):
            plan = self._plan(next_features)
        for group, lookup in zip(self._groups, plan):
            group.module.prefetch(lookup.ids)
        self._prefetched = (next_features, plan)

    def drop_prefetch(self) -> None:
        """Forgets a prefetch the next forward will not use (the groups' too)."""
        self._prefetched = None
        for group in self._groups:
            group.module.drop_prefetch()

    def __getstate__(self) -> dict:
        # A prefetch belongs to this process's next forward (its tensors were made on this process's streams): copies
        # and pickles start without one, as the groups' own do.
        return dict(self.__dict__, _prefetched=None)

    def _take_prefetched(self, features):
        prefetched, self._prefetched = self._prefetched, None  # for the next forward only
        if prefetched is None or prefetched[0] is not features:
            return None
        return _plan_used_here(prefetched[1], self.device)

    def _plan(self, features) -> list["_Lookup"]:
        """Per group: the group's row ids for this batch, and how they pool into bags."""
        if isinstance(features, SparseFeatures):
            return self._plan_bags(features)
        if not isinstance(features, torch.Tensor) or features.dim() != 2 or features.dtype not in (torch.int32,
                                                                                                    torch.int64):
            raise TypeError("HostEmbeddingBagCollection: input must be a (batch, features) int32/int64 tensor or "
                            f"SparseFeatures, got {_describe(features)}")
        if features.shape[1] != len(self.feature_names):
            raise ValueError(f"HostEmbeddingBagCollection: input has {features.shape[1]} columns, the collection "
                             f"has {len(self.feature_names)} features {self.feature_names}")
        ids = features.to(self.device, non_blocking=True)
        if ids.shape[0]:  # each column's smallest and largest id (one pass; one wait for a GPU)
            self._check_ranges(_extremes_on_host(*torch.aminmax(ids, dim=0)), ids, "input")
        c = self._device_constants(ids.device)
        plan = []
        for g, group in enumerate(self._groups):
            cols = c["group_features"][g]
            local = ids if cols is None else ids.index_select(1, cols)
            offset = c["offset"] if cols is None else c["offset"][cols]
            plan.append(_Lookup(local.to(torch.int64) + offset, one_hot=True, columns=group.features))
        return plan

    def _plan_bags(self, kjt: SparseFeatures) -> list["_Lookup"]:
        if list(kjt.keys) != self.feature_names:
            raise ValueError(f"HostEmbeddingBagCollection: SparseFeatures keys {list(kjt.keys)} must be the "
                             f"collection's features, in order: {self.feature_names}")
        kjt = kjt.to(self.device, non_blocking=True)
        if kjt.lengths.device.type != "cpu":
            kjt.check_lengths()
        c = self._device_constants(kjt.values.device)
        num_features, batch = len(self.feature_names), kjt.batch_size
        lengths = kjt.lengths.to(torch.int64).view(num_features, batch)
        per_feature = lengths.sum(1)
        feature_of_value = torch.repeat_interleave(c["feature_index"], per_feature, output_size=kjt.values.numel())
        values = kjt.values.to(torch.int64)
        if values.device.type == "cpu":  # each feature's run of values: one pass in all
            self._check_ranges(values.split(per_feature.tolist()), kjt.values, "input.values", per_feature)
        else:  # one wait for the GPU: whether any id is outside its feature's table; the details only if one is
            # (a per-feature min / max of millions of ids is a scatter onto a few dozen places: 4.1 ms of a DLRM-DCNv2
            # step of 3.5M ids on an H200, bench/RESULTS.md, fourteenth session; this check is two element-wise passes)
            outside = (values < 0) | (values >= c["rows"][feature_of_value])
            if bool(outside.any()):
                lo, hi = (values.new_zeros(num_features).scatter_reduce(0, feature_of_value, values, reduce,
                                                                        include_self=False)
                          for reduce in ("amin", "amax"))
                self._check_ranges(_extremes_on_host(lo, hi), kjt.values, "input.values", per_feature)
        ids = values + c["offset"][feature_of_value]
        plan = []
        for g, group in enumerate(self._groups):
            cols = c["group_features"][g]
            if cols is None:
                g_ids, g_lengths, g_weights = ids, lengths, kjt.weights
            else:
                mine = c["feature_group"][feature_of_value] == g
                g_ids = ids[mine]
                g_lengths = lengths.index_select(0, cols)
                g_weights = None if kjt.weights is None else kjt.weights[mine]
            mean = c["mean"] if cols is None else c["mean"][cols]
            if g_weights is not None and bool(self._feature_mean[group.features].any()):
                raise ValueError("HostEmbeddingBagCollection: per-sample weights need sum pooling; tables "
                                 f"{[t.name for t, _ in group.tables if t.pooling == 'mean']} pool by mean")
            plan.append(_Lookup(g_ids, one_hot=False, columns=group.features, lengths=g_lengths,
                                weights=g_weights, mean=mean, any_mean=bool(self._feature_mean[group.features].any())))
        return plan

    def _pool(self, group: _Group, lookup: "_Lookup") -> torch.Tensor:
        """This group's part of the output: (batch, its features x dim), features in ascending order."""
        inverse, rows = group.module.distinct_rows(lookup.ids)
        dim = rows.shape[-1]
        if lookup.one_hot:  # a bag of one id: its row, whatever the pooling (as HostEmbedding's mode=None)
            if rows.device.type == "cpu":  # index_select's backward (index_add_) is the fast one on the CPU
                out = rows.index_select(0, inverse.reshape(-1))
            else:
                out = F.embedding(inverse.reshape(-1), rows)
            return out.view(inverse.shape[0], inverse.shape[1] * dim)
        num_features, batch = lookup.lengths.shape
        lengths = lookup.lengths.reshape(-1)
        offsets = torch.cumsum(lengths, 0) - lengths
        weights = None if lookup.weights is None else lookup.weights.to(rows.dtype)  # embedding_bag wants one dtype
        if rows.device.type == "cpu" and (weights is None or not weights.requires_grad):
            pooled = _SumBagsCPU.apply(rows, inverse, offsets, lengths, weights)
        else:
            pooled = F.embedding_bag(inverse, rows, offsets, mode="sum", per_sample_weights=weights)
        if lookup.any_mean:
            divisor = torch.where(lookup.mean.unsqueeze(1), lookup.lengths.clamp(min=1),
                                  torch.ones_like(lookup.lengths))
            pooled = pooled / divisor.reshape(-1, 1).to(pooled.dtype)
        return pooled.view(num_features, batch, dim).transpose(0, 1).reshape(batch, num_features * dim)

    def _interleave(self, pieces: list[torch.Tensor]) -> torch.Tensor:
        """The groups' outputs put back in feature order."""
        columns = []
        for piece, group in zip(pieces, self._groups):
            start = 0
            for f in group.features:
                columns.append((f, piece[:, start:start + self.feature_dims[f]]))
                start += self.feature_dims[f]
        columns.sort(key=lambda fc: fc[0])
        return torch.cat([c for _, c in columns], dim=1)

    def _check_ranges(self, per_feature: Sequence[torch.Tensor], caller_ids: torch.Tensor, arg: str,
                      counts: Optional[torch.Tensor] = None) -> None:
        """Every feature's ids in its table's range, by the library's one rule (speedtorch.ops.check_indices) over
        ``per_feature[f]`` (feature f's ids on the host, or its smallest and largest). Raises the rule's error for the
        first place ``caller_ids`` (the caller's tensor, named ``arg``) holds an id out of its table's range: a
        (batch, features) input, or (``counts``: ids per feature) the values of SparseFeatures, feature by feature."""
        refused = []
        for f, ids in enumerate(per_feature):
            try:
                check_indices(ids, self._feature_rows[f])
            except IndexError:
                refused.append(f)
        if not refused:
            return
        # Per refused feature, the caller's ids with every other feature's zeroed (row 0 is in every table), so that
        # the rule finds the feature's first bad place in the caller's tensor; the first of those places is named.
        probes = []
        for f in refused:
            probe = torch.zeros_like(caller_ids)
            if counts is None:
                probe[:, f] = caller_ids[:, f]
            else:
                start, end = int(counts[:f].sum()), int(counts[:f + 1].sum())
                probe[start:end] = caller_ids[start:end]
            probes.append((_first_out_of_range(probe, self._feature_rows[f])[0], f, probe))
        _, f, probe = min(probes, key=lambda p: p[0])
        table = self.tables[self._feature_table[f]].name
        check_indices(probe, self._feature_rows[f],
                      f"HostEmbeddingBagCollection, feature {self.feature_names[f]!r} (table {table!r})", arg)
        raise AssertionError("HostEmbeddingBagCollection: internal error: the range check did not repeat")

    def _device_constants(self, device: torch.device) -> dict:
        """The per-feature tables of the plan, on ``device`` (made once per device)."""
        key = str(device)
        if key not in self._constants:
            everything = list(range(len(self.feature_names)))
            self._constants[key] = {
                "offset": self._feature_offset.to(device),
                "rows": torch.tensor(self._feature_rows, dtype=torch.int64, device=device),
                "mean": self._feature_mean.to(device),
                "feature_index": torch.arange(len(self.feature_names), device=device),
                "feature_group": torch.tensor(self._feature_group, device=device),
                # None: the group reads every feature, in order (no column selection needed)
                "group_features": [None if g.features == everything else torch.tensor(g.features, device=device)
                                   for g in self._groups],
            }
        return self._constants[key]

    # --- optimizer ------------------------------------------------------------------------------------------------

    @torch.no_grad()
    def step(self) -> None:
        """Applies every group's gradients (one fused update per group); nothing to do with ``update="backward"``."""
        for group in self._groups:
            group.module.step()

    def zero_grad(self, set_to_none: bool = True) -> None:  # noqa: ARG002 (nn.Module's signature)
        """Drops gradients not yet applied by :meth:`step`."""
        for group in self._groups:
            group.module.zero_grad()

    def requires_grad_(self, requires_grad: bool = True) -> "HostEmbeddingBagCollection":
        """Freezes (``False``) or unfreezes every table (:meth:`speedtorch.nn.HostEmbedding.requires_grad_`; frozen
        tables stay frozen). The tables are not parameters of the collection (DDP and the dense optimizer leave them
        alone), so ``model.requires_grad_()`` does not reach them: call this."""
        for group in self._groups:
            group.module.requires_grad_(requires_grad)
        return super().requires_grad_(requires_grad)

    # --- state_dict: per table, sharing the groups' memory ---------------------------------------------------------

    def _table_entries(self, t: int) -> dict:
        config, group = self.tables[t], self._groups[self._group_of_table[t]].module
        start, end = self._offset_of_table[t], self._offset_of_table[t] + config.num_embeddings
        out = {"weight": _rows_with_own_storage(group.weight, start, end)}
        if group.table.optimizer():
            out["optimizer_state"] = _rows_with_own_storage(group.table.state(), start, end)
        out["optimizer_step"] = torch.tensor(group.table.step_count(), dtype=torch.int64)
        return out

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        self._sync_for_host_access()
        for t, config in enumerate(self.tables):
            ours = f"{prefix}embedding_bags.{config.name}."
            for name, value in self._table_entries(t).items():
                destination[ours + name] = value
            destination[ours + "_extra_state"] = table_extra_state(self._groups[self._group_of_table[t]].module.table)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # All or nothing, as HostEmbedding's: every group's optimizer and every table's entries are checked before
        # anything changes; then the checkpoint's optimizer options are adopted (they may re-lay the state out) and
        # the entries copied in.
        ours = prefix + "embedding_bags."
        owner = type(self).__name__
        rest = {k: v for k, v in state_dict.items() if not k.startswith(ours)}
        super()._load_from_state_dict(rest, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)
        known = {f"{ours}{c.name}.{n}" for c in self.tables
                 for n in ("weight", "optimizer_state", "optimizer_step", "_extra_state")}
        unexpected_keys.extend(k for k in state_dict if k.startswith(ours) and k not in known)
        extras: dict[int, dict] = {}
        options: dict[int, Optional[dict]] = {}
        for t, config in enumerate(self.tables):
            key = f"{ours}{config.name}._extra_state"
            if key not in state_dict:
                missing_keys.append(key)
                continue
            g = self._group_of_table[t]
            if g not in extras:
                extras[g] = state_dict[key]
                options[g] = checked_extra_state(self._groups[g].module.table, extras[g], owner)  # raises if it must
            elif state_dict[key] != extras[g]:
                error_msgs.append(f"{key}: tables {self._group_names(g)} share one optimizer here, but the "
                                  f"checkpoint's differ ({extras[g]} and {state_dict[key]})")
        found, steps = {}, {}
        for t, config in enumerate(self.tables):
            g = self._group_of_table[t]
            shapes = entry_shapes(self._table_entries(t), self._groups[g].module.table, options.get(g))
            for name, shape in shapes.items():
                key = f"{ours}{config.name}.{name}"
                value = state_dict.get(key)
                if value is None:
                    missing_keys.append(key)
                elif (error := entry_error(key, value, shape, owner)) is not None:
                    error_msgs.append(error)
                elif name == "optimizer_step":
                    steps.setdefault(g, set()).add(int(value))
                else:
                    found[(t, name)] = value
        for g, values in steps.items():
            if len(values) > 1:
                error_msgs.append(f"{ours}: tables {self._group_names(g)} share one step count here, but the "
                                  f"checkpoint's differ ({sorted(values)})")
        if any(k.startswith(ours) for k in missing_keys) or error_msgs:
            return  # nothing is written unless every entry fits
        self._sync_for_host_access()
        for g, adopted in options.items():
            adopt_options(self._groups[g].module.table, adopted)
        with torch.no_grad():
            for t in range(len(self.tables)):
                targets = self._table_entries(t)  # after the options: the state may have a new layout
                for name in ("weight", "optimizer_state"):
                    if (t, name) in found and targets[name].data_ptr() != found[(t, name)].data_ptr():
                        targets[name].copy_(found[(t, name)])
        for g, values in steps.items():
            self._groups[g].module.table.set_step_count(values.pop())
        for group in self._groups:
            group.module.zero_grad()
            group.module._prefetched = None
        self._prefetched = None

    def _group_names(self, g: int) -> list[str]:
        return [c.name for c, _ in self._groups[g].tables]

    def _sync_for_host_access(self) -> None:
        for group in self._groups:  # updates on the groups' own streams too
            group.module._sync_for_host_access()

    def _table_index(self, name: str) -> int:
        for t, config in enumerate(self.tables):
            if config.name == name:
                return t
        raise KeyError(f"HostEmbeddingBagCollection: no table {name!r}; tables: {[c.name for c in self.tables]}")


class _SumBagsCPU(torch.autograd.Function):
    """``embedding_bag(ids, rows, offsets, mode="sum")`` whose backward is an ``index_add_`` of each id's bag gradient:
    on the CPU about 2x faster than embedding_bag's own backward, which sorts the ids again."""

    @staticmethod
    def forward(ctx, rows, ids, offsets, lengths, weights):
        ctx.save_for_backward(ids, lengths, weights)
        ctx.num_rows = rows.shape[0]
        return F.embedding_bag(ids, rows, offsets, mode="sum", per_sample_weights=weights)

    @staticmethod
    def backward(ctx, grad):
        ids, lengths, weights = ctx.saved_tensors
        bag_of_id = torch.repeat_interleave(torch.arange(lengths.numel()), lengths, output_size=ids.numel())
        per_id = grad.index_select(0, bag_of_id)
        if weights is not None:
            per_id = per_id * weights.unsqueeze(1).to(per_id.dtype)
        grad_rows = grad.new_zeros(ctx.num_rows, grad.shape[1]).index_add_(0, ids, per_id)
        return grad_rows, None, None, None, None


@dataclass
class _Lookup:
    """One group's part of a batch: its row ids (each feature's ids checked in its table's range, plus the table's
    row offset), and for bags, the lengths (features x batch), weights and mean pooling per feature."""

    ids: torch.Tensor
    one_hot: bool
    columns: list
    lengths: Optional[torch.Tensor] = None
    weights: Optional[torch.Tensor] = None
    mean: Optional[torch.Tensor] = None
    any_mean: bool = False


def _plan_used_here(plan: list, device: torch.device) -> list:
    """A plan made on the stream a prefetch ran on, from here on used (and freed) on the current one."""
    if device.type == "cuda":
        current = torch.cuda.current_stream(device)
        for lookup in plan:
            for t in (lookup.ids, lookup.lengths, lookup.weights, lookup.mean):
                if t is not None and t.is_cuda:
                    t.record_stream(current)
    return plan


def _extremes_on_host(lo: torch.Tensor, hi: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Per feature, its smallest and largest id as a host tensor of two (one copy from the GPU for all features)."""
    return torch.stack([lo, hi], 1).cpu().unbind(0)


@torch.no_grad()
def _fill_uniform_tables(module: HostEmbedding, stacked: list, seed: Optional[int]) -> None:
    """The rows of the tables of ``stacked`` (TableConfig, row offset) that have an ``init_range``: U(-r, +r) each.
    A group of such tables only: one U(-1, 1) fill of the group's table (its threads, no temporary), then each table's
    rows scaled by its r; a group with other tables too: each such table's rows filled by torch."""
    ranged = [(config, offset) for config, offset in stacked if config.init_range is not None]
    if not ranged:
        return
    whole = len(ranged) == len(stacked) and hasattr(module.table, "uniform_")
    if whole:
        module.table.uniform_(-1.0, 1.0, seed)
    weight = module.weight.detach()
    generator = None if whole or seed is None else torch.Generator(weight.device).manual_seed(seed)
    for config, offset in ranged:
        rows = weight[offset:offset + config.num_embeddings]
        if whole:
            rows.mul_(config.init_range)
        else:
            rows.uniform_(-config.init_range, config.init_range, generator=generator)
    del weight, rows  # a hybrid table's row cache stands aside while its rows are held


def _group_key(config: TableConfig, defaults: dict) -> tuple:
    pick = lambda name: defaults[name] if getattr(config, name) is None else getattr(config, name)  # noqa: E731
    frozen = config.frozen or pick("optimizer") is None
    options = {} if frozen else {k: float(v) for k, v in pick("optimizer_options").items()}
    placement = pick("placement")
    if placement not in ("host", "gpu", "hybrid"):
        raise ValueError(f"HostEmbeddingBagCollection: table {config.name!r}: placement must be 'host', 'gpu' or "
                         f"'hybrid', got {placement!r}")
    fraction = pick("hot_fraction") if placement == "hybrid" else None
    # One group whatever the spelling; "" for frozen tables (no optimizer).
    optimizer = "" if frozen else PinnedEmbedding.canonical_optimizer_name(pick("optimizer"))
    return (config.embedding_dim, str(pick("dtype")).replace("torch.", ""), optimizer, tuple(sorted(options.items())),
            placement, fraction)


def _check_names(tables: list) -> None:
    seen_tables, seen_features = set(), set()
    for config in tables:
        if not isinstance(config, TableConfig):
            raise TypeError(f"HostEmbeddingBagCollection: tables must be TableConfig, got {type(config).__name__}")
        if config.name in seen_tables:
            raise ValueError(f"HostEmbeddingBagCollection: table name {config.name!r} appears twice")
        seen_tables.add(config.name)
        if config.num_embeddings < 1 or config.embedding_dim < 1:
            raise ValueError(f"HostEmbeddingBagCollection: table {config.name!r} must have >= 1 rows and dim, got "
                             f"{config.num_embeddings} x {config.embedding_dim}")
        if config.pooling not in _POOLINGS:
            raise ValueError(f"HostEmbeddingBagCollection: table {config.name!r}: pooling must be 'sum' or 'mean', "
                             f"got {config.pooling!r}")
        if config.init_range is not None and not (isinstance(config.init_range, (int, float)) and
                                                  0 < config.init_range < math.inf):
            raise ValueError(f"HostEmbeddingBagCollection: table {config.name!r}: init_range must be a float > 0 (rows "
                             f"start U(-init_range, +init_range)) or None, got {config.init_range!r}")
        for name in config.feature_names or (config.name,):
            if name in seen_features:
                raise ValueError(f"HostEmbeddingBagCollection: feature {name!r} appears twice")
            seen_features.add(name)


def _rows_with_own_storage(t: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """Rows [start, end) of ``t`` sharing its memory, as a tensor whose storage is exactly those rows where it can be
    (host memory): serializers (torch.distributed.checkpoint) copy a view whose storage is larger than itself."""
    if t.device.type != "cpu":
        return t[start:end]
    if t.dtype == torch.bfloat16:  # NumPy has no bfloat16: the same bits as int16
        return torch.from_numpy(t.view(torch.int16).numpy()[start:end]).view(torch.bfloat16)
    return torch.from_numpy(t.numpy()[start:end])


def _describe(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"a {x.dim()}-D {x.dtype} tensor"
    return type(x).__name__
