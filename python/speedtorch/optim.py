"""``speedtorch.optim``: torch.optim optimizers over speedtorch's fused row update.

:class:`HostEmbeddingOptimizer` is the fused optimizer of :class:`speedtorch.nn.HostEmbedding` tables as a
``torch.optim.Optimizer`` (param groups a scheduler changes, ``zero_grad``, ``GradScaler``), and
:class:`CombinedOptimizer` drives it together with the dense model's optimizer in one standard loop
(docs/training.md). A torch optimizer that holds a host table raises at its step, saying so.

:class:`RowwiseAdagrad` is row-wise Adagrad (FBGEMM's EXACT_ROWWISE_ADAGRAD) for 2-D parameters (embedding
weights, dense or with sparse gradients), which torch.optim lacks: each row keeps one float, the sum over steps of
the mean over the row of its squared gradient. It runs ``speedtorch::row_optimizer_step_`` (the same kernels as
``HostEmbedding(optimizer="rowwise_adagrad")``) on the parameter's rows, so :mod:`speedtorch.compat` can swap its
state rows like any torch.optim optimizer's.
"""

from __future__ import annotations

import collections

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

__all__ = ["CombinedOptimizer", "HostEmbeddingOptimizer", "RowwiseAdagrad"]

_STATE_HEADER_FLOATS = 4  # a row's step count (int32 bits), its accumulator, two spare (csrc/optim)


class RowwiseAdagrad(torch.optim.Optimizer):
    """Row-wise Adagrad over 2-D float parameters: ``sum[row] += mean(g[row] ** 2)``, then
    ``w[row] -= lr * g[row] / (sqrt(sum[row]) + eps)``, with ``g = grad + weight_decay * w``. Rows a sparse gradient
    does not name do not move. Its state per parameter is ``state_rows``: ``rows x 4`` float32 (the step count, the
    accumulator and two spare floats per row)."""

    def __init__(self, params, lr: float = 1e-2, eps: float = 1e-8, weight_decay: float = 0.0,
                 initial_accumulator_value: float = 0.0):
        for name, value in (("lr", lr), ("eps", eps), ("weight_decay", weight_decay)):
            if value < 0:
                raise ValueError(f"RowwiseAdagrad: {name} must be >= 0, got {value}")
        super().__init__(params, dict(lr=lr, eps=eps, weight_decay=weight_decay,
                                      initial_accumulator_value=initial_accumulator_value))

    def init_state(self, p: torch.Tensor) -> dict:
        """The state of a fresh parameter (created at its first step; speedtorch.compat creates it up front)."""
        if p.dim() != 2:
            raise ValueError(f"RowwiseAdagrad: parameters must be 2-D (rows x dim), got shape {tuple(p.shape)}")
        state = self.state[p]
        if "state_rows" not in state:
            state["step"] = 0
            state["state_rows"] = torch.zeros(p.shape[0], _STATE_HEADER_FLOATS, dtype=torch.float32, device=p.device)
        return state

    @torch.no_grad()
    def step(self, closure=None):
        """Hands each group's hyper-parameters to its table (when they changed) and applies the table's pending
        gradient in one fused update. ``closure`` (optional) recomputes the loss first, as torch.optim's."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            options = {k: float(group[k]) for k in ("lr", "eps", "weight_decay", "initial_accumulator_value")}
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.init_state(p)
                state["step"] += 1
                grad = p.grad
                if grad.is_sparse and grad.sparse_dim() != 1:  # not rows of an embedding's gradient
                    grad = grad.to_dense()
                if grad.is_sparse:
                    grad = grad.coalesce()
                    rows, values = grad.indices()[0], grad.values()
                else:
                    rows, values = torch.arange(p.shape[0], device=p.device), grad
                torch.ops.speedtorch.row_optimizer_step_(p, state["state_rows"], rows, values, "rowwise_adagrad",
                                                         options, state["step"])
        return loss


# --- HostEmbedding's fused optimizers as a torch.optim.Optimizer --------------------------------------------------

# torch.optim's names for options the fused optimizers take in pairs, and the flags (booleans in a param group).
_PAIRS = {"betas": ("beta1", "beta2"), "etas": ("etaminus", "etaplus"),
          "step_sizes": ("step_size_min", "step_size_max")}
_FLAGS = ("nesterov", "amsgrad", "centered", "per_row_step", "stochastic_rounding")


def _torch_style(options: dict) -> dict:
    """A table's optimizer options (speedtorch's names, all of them) as a torch.optim param group holds them."""
    group = {}
    for key, value in options.items():
        pair = next((name for name, keys in _PAIRS.items() if key in keys), None)
        if pair is not None:
            group[pair] = tuple(options[k] for k in _PAIRS[pair])
        else:
            group[key] = bool(value) if key in _FLAGS else float(value)
    return group


def _table_style(group: dict, keys) -> dict:
    """The options ``keys`` (speedtorch's names) read from a param group."""
    out = {}
    for key in keys:
        pair = next((name for name, pair_keys in _PAIRS.items() if key in pair_keys), None)
        out[key] = float(group[pair][_PAIRS[pair].index(key)]) if pair is not None else float(group[key])
    return out


def _take_table_options(group: dict, kind: str, options: dict) -> None:
    """Makes ``group`` hold the table's optimizer ``kind`` and its ``options`` (every one, defaults included), in
    place of the hyper-parameters it held; what else is in it (``params``, a scheduler's ``initial_lr``) stays."""
    old = dict(torch.classes.speedtorch.PinnedEmbedding.optimizer_defaults(group["optimizer"]))
    for key in _torch_style(old):
        dict.pop(group, key, None)
    # dict's own update: the values come from the table, there is nothing to hand back to it (_TableGroup).
    dict.update(group, optimizer=kind, **_torch_style(options))


def _host_embeddings(modules):
    from .nn import HostEmbedding, HostEmbeddingBagCollection

    if isinstance(modules, HostEmbedding):
        return [modules]
    if isinstance(modules, torch.nn.Module):
        found = []
        for m in modules.modules():
            if isinstance(m, HostEmbedding):
                found.append(m)
            elif isinstance(m, HostEmbeddingBagCollection):  # its groups are HostEmbeddings it holds itself
                found.extend(m.groups)
        return found
    out = list(modules)
    for m in out:
        if not isinstance(m, HostEmbedding):
            raise TypeError(f"HostEmbeddingOptimizer: expected HostEmbedding modules, got {type(m).__name__}")
    return out


class _TableGroup(dict):
    """A param group of :class:`HostEmbeddingOptimizer`: a dict whose changes reach its table at once. A table with
    ``update="backward"`` applies its gradient inside backward, before ``step()``, so the lr a scheduler sets after a
    step must be the table's before the next backward (issue 31: it reached the table one step late). Schedulers,
    ``load_state_dict`` and hand edits all set the keys of this dict; a value changed in place (a tensor lr a
    scheduler fills) is handed over at the next ``step()`` and ``zero_grad()``."""

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, value)
        self._hand_over(key)

    def update(self, *args, **kwargs) -> None:
        super().update(*args, **kwargs)
        self._hand_over(None)

    def _hand_over(self, key) -> None:
        optimizer = self.__dict__.get("optimizer")  # absent while torch.optim builds the group, or while unpickling
        # A copy (copy.deepcopy) fills the group before its optimizer: that copy's table gets the values at its step.
        if optimizer is not None and key != "params" and "_tables" in optimizer.__dict__:
            optimizer._sync_options(self)


class HostEmbeddingOptimizer(torch.optim.Optimizer):
    """The fused optimizers of HostEmbedding tables as one ``torch.optim.Optimizer`` (as TorchRec's fused optimizers
    are keyed optimizers): a standard training loop, LR schedulers, ``GradScaler`` and :class:`CombinedOptimizer`
    drive them like any other.

    ``modules``: a model (every :class:`speedtorch.nn.HostEmbedding` in it that trains, and the groups of every
    :class:`speedtorch.HostEmbeddingBagCollection`), a HostEmbedding, or a list of them. One param group per table:
    ``params`` is the table's ``weight`` (its :class:`HostTableParameter`), the other keys are its optimizer's
    hyper-parameters under torch.optim's names (``lr``, ``betas``, ``eps``, ``weight_decay``, ``momentum``, ...;
    every option the optimizer takes, defaults included) and ``optimizer``, its
    name. A scheduler (or you) may change them between steps: each change reaches the table at once, in place
    (``PinnedEmbedding.set_optimizer_options``), keeping its state and step count, so the next update uses it, also
    one that runs inside backward (``update="backward"``); :meth:`step` and :meth:`zero_grad` hand over a value
    changed in place (a tensor lr).

    - :meth:`step` applies each table's pending gradient (its ``weight.grad``) in one fused update; a table without
      one does not count a step (Adam's bias correction).
    - :meth:`zero_grad` drops the pending gradients.
    - ``GradScaler``: ``scaler.unscale_(opt)`` divides the pending gradients by the scale and finds non-finite values;
      ``scaler.step(opt)`` skips the update when there were any. A table with ``update="backward"`` has applied its
      (scaled) gradient already: a GradScaler stepping an optimizer that holds one raises (use ``update="step"``).
    - :meth:`state_dict` / :meth:`load_state_dict`: the hyper-parameters (what a scheduler changed). The rows'
      optimizer state and step count are in the module's ``state_dict()`` (shared with the table, never copied
      twice): save both, as for any model and optimizer.
    """

    def __init__(self, modules):
        self._tables = {}  # parameter -> its HostEmbedding
        self._generations = {}  # parameter -> the module's set_optimizer count its group last matched
        groups = []
        for module in _host_embeddings(modules):
            if not module.trains:
                continue  # a frozen table has nothing to optimize
            kind = module.table.optimizer()
            options = dict(torch.classes.speedtorch.PinnedEmbedding.optimizer_defaults(kind))
            options.update(module.table.optimizer_options())
            param = module._table_param
            self._tables[param] = module
            self._generations[param] = getattr(module, "_optimizer_generation", 0)
            groups.append(_TableGroup(params=[param], optimizer=kind, **_torch_style(options)))
        if not groups:
            raise ValueError("HostEmbeddingOptimizer: no HostEmbedding with an optimizer (frozen tables have none)")
        kinds = {g["optimizer"] for g in groups}
        # One kind: its defaults, which OneCycleLR / CyclicLR look at (betas or momentum). Several: lr alone.
        defaults = {k: v for k, v in groups[0].items() if k != "params"} if len(kinds) == 1 else {}
        super().__init__(groups, defaults)
        for group in self.param_groups:
            group.optimizer = self  # from now on a change of the group reaches its table at once

    def __getstate__(self) -> dict:
        # torch.optim keeps defaults, state and param_groups alone: a copy must also know each group's table.
        return {**super().__getstate__(), "_tables": self._tables, "_generations": self._generations}

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self.__dict__.setdefault("_generations", {})  # pickled before tables could be re-configured

    @property
    def host_embeddings(self) -> list:
        """The HostEmbedding modules this optimizer steps (one per param group)."""
        return [self._module(group) for group in self.param_groups]

    def _module(self, group: dict):
        return self._tables[group["params"][0]]

    def _sync_options(self, group: dict) -> None:
        if self._follow_reconfigured_table(group):
            return
        module = self._module(group)
        kind = module.table.optimizer()
        defaults = dict(torch.classes.speedtorch.PinnedEmbedding.optimizer_defaults(kind))
        current = dict(module.table.optimizer_options())
        wanted = _table_style(group, defaults.keys())
        if wanted == {**defaults, **current}:
            return
        # Keep the table's options as sparse as they were: the given ones, and the ones that left their default.
        module.set_optimizer_options({k: v for k, v in wanted.items() if k in current or v != defaults[k]})

    def _follow_reconfigured_table(self, group: dict) -> bool:
        """When the table got another optimizer since ``group`` last matched it (HostEmbedding.set_optimizer, a
        checkpoint that re-laid its state out, or module.table.set_optimizer), its options are the newest and the
        group's (another optimizer's names, or another layout) cannot be handed to it: the group takes the table's
        optimizer and options instead. Returns whether it did."""
        module = self._module(group)
        kind = module.table.optimizer()
        defaults = dict(torch.classes.speedtorch.PinnedEmbedding.optimizer_defaults(kind))
        options = {**defaults, **module.table.optimizer_options()}
        generation = getattr(module, "_optimizer_generation", 0)
        param = group["params"][0]
        if group["optimizer"] == kind and self._generations.get(param, 0) == generation:
            width = torch.classes.speedtorch.PinnedEmbedding.state_width
            if width(kind, _table_style(group, defaults), module.embedding_dim) == \
                    width(kind, options, module.embedding_dim):
                return False
        self._generations[param] = generation
        _take_table_options(group, kind, options)
        module._sync_weight()  # (a table re-configured through module.table: its parameter follows it here)
        return True

    @property
    def _step_supports_amp_scaling(self) -> bool:
        # Asked by an enabled torch.amp.GradScaler's step alone; True only while a table updates during backward
        # (_refuse_grad_scaler says why). GradScaler then leaves the gradients to this optimizer and sets its
        # ``found_inf`` before calling step, which is how step learns that a GradScaler drives it.
        return bool(_tables_updated_in_backward(self))

    @torch.no_grad()
    def step(self, closure=None):
        """Hands each group's hyper-parameters to its table (when they changed) and applies the table's pending
        gradient in one fused update. ``closure`` (optional) recomputes the loss first, as torch.optim's."""
        _refuse_grad_scaler(self)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            self._sync_options(group)
            self._module(group).step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drops the tables' pending gradients (and hands each group's hyper-parameters to its table, as step does)."""
        for group in self.param_groups:
            self._sync_options(group)
            self._module(group).zero_grad(set_to_none)

    def load_state_dict(self, state_dict: dict) -> None:
        """Restores the hyper-parameters of :meth:`state_dict`, in place (the groups stay the same objects, so a
        CombinedOptimizer or scheduler holding them sees the change); the tables take them at once."""
        saved = state_dict["param_groups"]
        if len(saved) != len(self.param_groups):
            raise ValueError(f"HostEmbeddingOptimizer.load_state_dict: the state holds {len(saved)} tables, this "
                             f"optimizer {len(self.param_groups)}")
        for group in self.param_groups:  # compared with the tables' optimizers as they are now
            self._follow_reconfigured_table(group)
        for i, (group, other) in enumerate(zip(self.param_groups, saved)):
            if other.get("optimizer") != group["optimizer"]:
                raise ValueError(f"HostEmbeddingOptimizer.load_state_dict: table {i} was trained with "
                                 f"{other.get('optimizer')!r}, this one is {group['optimizer']!r}")
        for group, other in zip(self.param_groups, saved):
            group.update({k: v for k, v in other.items() if k != "params"})


class CombinedOptimizer(torch.optim.Optimizer):
    """Several optimizers driven as one: ``step``, ``zero_grad``, ``state_dict`` reach each, and ``param_groups`` is
    all of theirs (the same dicts), so one LR scheduler and one ``GradScaler`` serve them all. The usual pair::

        opt = CombinedOptimizer([HostEmbeddingOptimizer(model),
                                 torch.optim.Adam(speedtorch.nn.dense_parameters(model), lr=1e-3)])
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: min(1.0, (step + 1) / 100))
        ...
        loss.backward(); opt.step(); opt.zero_grad(); sched.step()
    """

    def __init__(self, optimizers):
        self.optimizers = list(optimizers)
        if not self.optimizers:
            raise ValueError("CombinedOptimizer: no optimizers given")
        groups = [g for o in self.optimizers for g in o.param_groups]
        # Keys every group has (lr, and betas or momentum when all share them: what schedulers look for).
        common = set.intersection(*(set(o.defaults) for o in self.optimizers))
        super().__init__(groups, {k: self.optimizers[0].defaults[k] for k in common})

    @property
    def state(self):
        """The state of every optimizer (keyed by parameter)."""
        return collections.ChainMap(*(o.state for o in self.optimizers))

    @state.setter
    def state(self, value) -> None:  # torch.optim.Optimizer.__init__ sets an empty one
        pass

    @property
    def _step_supports_amp_scaling(self) -> bool:
        # As HostEmbeddingOptimizer's: GradScaler must not unscale for us and step the tables' optimizer unseen.
        return bool(_tables_updated_in_backward(self))

    @torch.no_grad()
    def step(self, closure=None):
        """Steps every optimizer (``closure`` runs once, first)."""
        _refuse_grad_scaler(self)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for o in self.optimizers:
            o.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """zero_grad of every optimizer."""
        for o in self.optimizers:
            o.zero_grad(set_to_none)

    def state_dict(self) -> dict:
        """``{"optimizers": [each optimizer's state_dict()]}``."""
        return {"optimizers": [o.state_dict() for o in self.optimizers]}

    def load_state_dict(self, state_dict: dict) -> None:
        """Loads each optimizer's part of :meth:`state_dict`."""
        saved = state_dict["optimizers"]
        if len(saved) != len(self.optimizers):
            raise ValueError(f"CombinedOptimizer.load_state_dict: the state holds {len(saved)} optimizers, this one "
                             f"{len(self.optimizers)}")
        for o, s in zip(self.optimizers, saved):
            o.load_state_dict(s)
        # torch.optim's load_state_dict replaces its group dicts: take the new ones.
        self.param_groups = [g for o in self.optimizers for g in o.param_groups]

    def add_param_group(self, param_group: dict) -> None:
        """Refused once built: add the group to one of the optimizers and build the CombinedOptimizer again."""
        if hasattr(self, "optimizers") and len(self.param_groups) == sum(len(o.param_groups) for o in self.optimizers):
            raise RuntimeError("CombinedOptimizer.add_param_group: add the group to one of its optimizers, then build "
                               "the CombinedOptimizer again")
        super().add_param_group(param_group)


def host_embeddings_stepped_by(optimizers) -> list:
    """The HostEmbedding modules that ``optimizers`` (an optimizer or a list of them) step themselves: those of each
    :class:`HostEmbeddingOptimizer`, alone or inside a :class:`CombinedOptimizer`."""
    if isinstance(optimizers, torch.optim.Optimizer):
        optimizers = [optimizers]
    found = []
    for o in optimizers:
        if isinstance(o, HostEmbeddingOptimizer):
            found.extend(o.host_embeddings)
        elif isinstance(o, CombinedOptimizer):
            found.extend(host_embeddings_stepped_by(o.optimizers))
    return found


def _tables_updated_in_backward(optimizer) -> list:
    """The HostEmbedding modules ``optimizer`` steps that apply their update during backward (``update="backward"``)
    and train."""
    return [m for m in host_embeddings_stepped_by(optimizer) if m.update == "backward" and m.trains]


def _refuse_grad_scaler(optimizer) -> None:
    """Raises when an enabled ``torch.amp.GradScaler`` steps ``optimizer`` while it holds a table with
    ``update="backward"``. Such a table applied its gradient as backward reached its rows: scaled by the loss scale
    (1024 moves a row 1024 times too far), and before any check for inf/NaN, so GradScaler can neither unscale it nor
    skip the step. GradScaler.step reads ``_step_supports_amp_scaling`` (True for such an optimizer) and then sets
    ``found_inf`` on the optimizer before calling its step: that attribute is the sign, whatever the scale (it
    changes during training)."""
    if "found_inf" not in optimizer.__dict__:
        return
    optimizer.__dict__.pop("found_inf", None)  # GradScaler deletes them after the step, which will not come
    optimizer.__dict__.pop("grad_scale", None)
    tables = ", ".join(f"{type(m).__name__}({m.num_embeddings}, {m.embedding_dim})"
                       for m in _tables_updated_in_backward(optimizer))
    raise RuntimeError(
        f"{type(optimizer).__name__}: a GradScaler steps a table built with update='backward' ({tables}). That table "
        "applies its gradient during backward, before GradScaler can unscale it or check it for inf/NaN, so the "
        "update uses the scaled gradient (the rows this backward reached have already moved by it). Build the table "
        "with update='step' (the default: its gradient then waits for the step, where GradScaler unscales it and "
        "skips non-finite steps), or train it without a GradScaler (bfloat16 autocast needs no loss scaling)")


def _refuse_tables_in_other_optimizers(optimizer, args, kwargs) -> None:  # noqa: ARG001 (the hook's signature)
    """A global step pre-hook of torch.optim: a torch optimizer holding a host table with a pending gradient would
    update the table a second time (or fail on its sparse gradient on another device): say what to do instead."""
    if isinstance(optimizer, (HostEmbeddingOptimizer, CombinedOptimizer)):
        return
    key = sum(len(g["params"]) for g in optimizer.param_groups)
    cached = optimizer.__dict__.get("_speedtorch_tables")
    if cached is None or cached[0] != key:
        from .nn import HostTableParameter

        tables = [p for g in optimizer.param_groups for p in g["params"] if isinstance(p, HostTableParameter)]
        cached = (key, tables)
        optimizer.__dict__["_speedtorch_tables"] = cached
    if any(p.grad is not None for p in cached[1]):
        raise RuntimeError(f"{type(optimizer).__module__}.{type(optimizer).__name__} holds the table of a speedtorch "
                           "HostEmbedding, whose rows its own fused optimizer updates: build this optimizer from "
                           "speedtorch.nn.dense_parameters(model), and drive the tables with "
                           "speedtorch.optim.HostEmbeddingOptimizer(model) (CombinedOptimizer steps both; "
                           "docs/training.md)")


register_optimizer_step_pre_hook(_refuse_tables_in_other_optimizers)
