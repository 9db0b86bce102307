"""A table's entries in a module's ``state_dict``: its rows, optimizer state and step count as tensors that share
the table's memory (no copy), and its optimizer's name and options as extra state, so ``torch.save``, training
frameworks and ``torch.distributed.checkpoint`` keep an embedding table like any parameter; loading writes them
back in place and refuses entries of another shape.

:class:`speedtorch.nn.HostEmbedding` (every placement, and the distributed module) keeps its table this way; a
module that holds a :class:`speedtorch.PinnedEmbedding` itself calls :func:`track_table_state` once.

Entries under the table's prefix: ``weight``, ``optimizer_state`` (when there is an optimizer), ``optimizer_step``
and ``_extra_state`` (``{"format", "optimizer", "optimizer_options"}``).
"""

from __future__ import annotations

import functools
import math
from typing import Optional

import torch

from .._library import PinnedEmbedding
from .placement import DeviceTable

__all__ = ["track_table_state", "table_entries", "table_extra_state", "set_table_extra_state", "checked_extra_state",
           "adopt_options", "entry_shapes", "entry_error", "load_table_entries"]

FORMAT = "speedtorch.HostEmbedding/1"


def table_entries(table) -> dict:
    """The table's state_dict tensors, sharing its memory: ``weight``, ``optimizer_state`` (with an optimizer) and
    ``optimizer_step`` (a 0-d int64 tensor)."""
    out = {"weight": table.table()}
    if table.optimizer():
        out["optimizer_state"] = table.state()
    out["optimizer_step"] = torch.tensor(table.step_count(), dtype=torch.int64)
    return out


def table_extra_state(table) -> dict:
    """The table's ``_extra_state``: the format tag, the optimizer's name and its options."""
    return {"format": FORMAT, "optimizer": table.optimizer(), "optimizer_options": dict(table.optimizer_options())}


def checked_extra_state(table, state, owner: str) -> Optional[dict]:
    """Checks a checkpoint's ``_extra_state`` against the table without changing anything: the optimizer must be the
    table's (names compared canonically, PinnedEmbedding.canonical_optimizer_name); its options win (as
    torch.optim's load_state_dict restores lr & co). Returns the options to adopt, or None when they are the
    table's own. Raises before any change when the checkpoint cannot be loaded."""
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise RuntimeError(f"{owner}.load_state_dict: _extra_state is not a speedtorch table's (got "
                           f"{type(state).__name__}); the checkpoint was written by another module")
    optimizer, options = state["optimizer"], {k: float(v) for k, v in state["optimizer_options"].items()}
    if optimizer:
        optimizer = PinnedEmbedding.canonical_optimizer_name(optimizer)  # checkpoints of older versions
    if optimizer != table.optimizer():
        raise RuntimeError(f"{owner}.load_state_dict: the checkpoint's optimizer is {optimizer or 'none'!r}, this "
                           f"table's is {table.optimizer() or 'none'!r}; build it with optimizer={optimizer!r}")
    if not optimizer or options == dict(table.optimizer_options()):
        return None
    width = PinnedEmbedding.state_width(optimizer, options, table.dim())  # validates them before anything changes
    if width != _state_width(table) and not _relays_state_out(table):
        # In place (an lr, betas ...: set_optimizer_options) every table can; a new layout needs set_optimizer.
        raise RuntimeError(f"{owner}.load_state_dict: the checkpoint's optimizer options {options} lay the "
                           f"optimizer state out otherwise than this table's {dict(table.optimizer_options())} "
                           f"({width} floats a row, not {_state_width(table)}: momentum from or to 0, amsgrad or "
                           f"centered), and a {type(table).__name__} cannot re-lay it out; build it with them")
    return options


def _relays_state_out(table) -> bool:
    """Whether the table's set_optimizer can give its state a new layout (a PinnedEmbedding, a DeviceTable; a
    HybridTable or a sharded table keeps the one it was built with)."""
    return isinstance(table, (torch.ScriptObject, DeviceTable))


def _state_width(table) -> int:
    """The width of the table's optimizer state rows, from its configuration (asking for the state itself would
    write a row cache back)."""
    return PinnedEmbedding.state_width(table.optimizer(), dict(table.optimizer_options()), table.dim())


def adopt_options(table, options: Optional[dict]) -> None:
    """Gives the table a checked checkpoint's options (checked_extra_state): in place when they keep the state's
    layout (an LR schedule's lr, betas ...: set_optimizer_options); otherwise the optimizer is re-configured, its
    state re-laid out for them, zeroed. Either way the checkpoint's state is copied in right after."""
    if options is None:
        return
    if PinnedEmbedding.state_width(table.optimizer(), options, table.dim()) == _state_width(table):
        table.set_optimizer_options(options)
        return
    weight = table.table()
    beside = weight.stride(0) != weight.shape[1]
    del weight  # no tensor of the old layout may be held: the rows' old memory is released as they move
    table.set_optimizer(table.optimizer(), options, beside)


def set_table_extra_state(table, state, owner: str) -> None:
    """Checks a checkpoint's optimizer against the table's and adopts its options (nn.Module.set_extra_state)."""
    adopt_options(table, checked_extra_state(table, state, owner))


def entry_shapes(targets: dict, table, options: Optional[dict]) -> dict:
    """The shapes the table's entries (name -> tensor) will have once ``options`` are adopted: the width of the
    optimizer state follows the options (amsgrad=1 adds a vector)."""
    shapes = {name: tuple(target.shape) for name, target in targets.items()}
    if options is not None and "optimizer_state" in shapes:
        width = PinnedEmbedding.state_width(table.optimizer(), options, table.dim())
        shapes["optimizer_state"] = (shapes["optimizer_state"][0], width)
    return shapes


def load_table_entries(shapes: dict, state_dict, prefix: str, missing_keys: list, error_msgs: list,
                       owner: str):
    """The checkpoint's entries for ``shapes`` (name -> the shape the table's entry has, entry_shapes), or None
    (with the reason recorded in ``missing_keys`` / ``error_msgs``) unless every one is there with that shape."""
    found = {}
    for name, shape in shapes.items():
        key = prefix + name
        if key not in state_dict:
            missing_keys.append(key)
            continue
        error = entry_error(key, state_dict[key], shape, owner)
        if error is not None:
            error_msgs.append(error)
        else:
            found[name] = state_dict[key]
    return found if len(found) == len(shapes) else None


def entry_error(key: str, value, shape, owner: str) -> Optional[str]:
    """Why the checkpoint's entry ``key`` (``...weight``, ``...optimizer_state``, ``...optimizer_step``) cannot be
    loaded into a table entry of ``shape``, or None when it can: everything a copy into the table would refuse is
    found here, before anything changes (rows and optimizer state are floating point, the step count a whole number
    >= 0)."""
    if not isinstance(value, torch.Tensor):
        return f"{key}: expected a tensor, got {type(value).__name__}"
    if tuple(value.shape) != tuple(shape):
        return (f"size mismatch for {key}: the checkpoint holds shape {tuple(value.shape)}, this {owner} has "
                f"{tuple(shape)}")
    if key.endswith("optimizer_step"):
        if value.is_complex() or value.dtype == torch.bool:
            return f"{key}: the step count must be a whole number >= 0, got a {value.dtype} tensor"
        step = float(value)
        if not math.isfinite(step) or step < 0 or step != int(step):
            return f"{key}: the step count must be a whole number >= 0, got {step}"
    elif key.endswith(("weight", "optimizer_state")) and not value.is_floating_point():
        return f"{key}: expected floating-point values, got {value.dtype}"
    return None  # (a subclass's own entries, a growing table's id index: their shape alone is checked here)


@torch.no_grad()
def copy_table_entries(table, found: dict) -> None:
    """Writes loaded entries into the table, in place (entries that already are the table's tensors are skipped)."""
    table.copy_(found["weight"])
    if "optimizer_state" in found:
        state = table.state()
        if state.data_ptr() != found["optimizer_state"].data_ptr():
            state.copy_(found["optimizer_state"])
    table.set_step_count(int(found["optimizer_step"]))


def _save_hook(name, module, state_dict, prefix, local_metadata):  # noqa: ARG001
    table = getattr(module, name)
    for entry, value in table_entries(table).items():
        state_dict[f"{prefix}{name}.{entry}"] = value
    state_dict[f"{prefix}{name}._extra_state"] = table_extra_state(table)


def _load_hook(name, module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,  # noqa: ARG001
               error_msgs):
    # Everything is checked before anything changes: a refused load leaves rows, state, step count and options.
    table, owner = getattr(module, name), f"{type(module).__name__}.{name}"
    ours = f"{prefix}{name}."
    extra = ours + "_extra_state"
    options = None
    if extra in state_dict:
        options = checked_extra_state(table, state_dict[extra], owner)
    else:
        missing_keys.append(extra)
    targets = table_entries(table)
    found = load_table_entries(entry_shapes(targets, table, options), state_dict, ours, missing_keys, error_msgs,
                               owner)
    for key in [k for k in state_dict if k.startswith(ours)]:  # taken here, so the module reports none of them
        if key != extra and key[len(ours):] not in targets:
            unexpected_keys.append(key)
        del state_dict[key]
    del targets  # tensors of the table's present layout, which adopting the options may replace
    if found is not None and extra not in missing_keys and not error_msgs:
        adopt_options(table, options)
        copy_table_entries(table, found)


def track_table_state(module: torch.nn.Module, name: str) -> torch.nn.Module:
    """Makes ``module.<name>`` (a :class:`speedtorch.PinnedEmbedding` attribute) part of ``module.state_dict()`` and
    ``load_state_dict()``: ``<name>.weight``, ``<name>.optimizer_state``, ``<name>.optimizer_step`` and
    ``<name>._extra_state``. Call it once, after setting the attribute; returns ``module``."""
    if not isinstance(getattr(module, name, None), torch.ScriptObject):
        raise TypeError(f"track_table_state: {type(module).__name__}.{name} is not a speedtorch.PinnedEmbedding")
    # The public hook registrations came in torch 2.5; torch 2.4 has the same hooks under private names.
    post_hook = getattr(module, "register_state_dict_post_hook", None) or module._register_state_dict_hook
    post_hook(functools.partial(_save_hook, name))
    pre_hook = getattr(module, "register_load_state_dict_pre_hook", None) or functools.partial(
        module._register_load_state_dict_pre_hook, with_module=True)
    pre_hook(functools.partial(_load_hook, name))
    return module
