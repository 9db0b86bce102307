"""speedtorch.ContiguousParams: a model's parameters and gradients in one flat buffer per (device, dtype), so the
optimizer and gradient clipping run a few large kernels instead of a few per parameter.

A thin wrapper of ``torch.classes.speedtorch.ContiguousParams`` (csrc/contiguous/contiguous_params.h), which does
the work and which TorchScript and C++ use directly. See docs/contiguous_params.md for the two rules and where it
breaks.
"""

from __future__ import annotations

import functools
import weakref
from typing import Iterable, Union

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

ParamsArg = Union[Iterable[torch.Tensor], Iterable[tuple[str, torch.Tensor]]]


def _split_names(parameters: ParamsArg) -> tuple[list[torch.Tensor], list[str]]:
    params: list[torch.Tensor] = []
    names: list[str] = []
    for position, item in enumerate(parameters):
        if isinstance(item, tuple):
            if len(item) != 2 or not isinstance(item[0], str) or not isinstance(item[1], torch.Tensor):
                raise TypeError(
                    "speedtorch.ContiguousParams: parameters must be tensors or (name, tensor) pairs; "
                    f"item {position} is a tuple of {tuple(type(x).__name__ for x in item)}"
                )
            names.append(item[0])
            params.append(item[1])
        elif isinstance(item, torch.Tensor):
            params.append(item)
        else:
            raise TypeError(
                "speedtorch.ContiguousParams: parameters must be tensors or (name, tensor) pairs; "
                f"item {position} is a {type(item).__name__}"
            )
    if names and len(names) != len(params):
        raise TypeError(
            "speedtorch.ContiguousParams: give either tensors or (name, tensor) pairs, not a mix "
            f"({len(names)} named of {len(params)})"
        )
    return params, names


def _reattach_grads(flat, buffer, params, views, indices, has_grad, _grad) -> None:
    if flat.grad is None:  # the optimizer's zero_grad(set_to_none=True): every gradient of the group is gone
        buffer.zero_()
        flat.grad = buffer
        for p, view, i in zip(params, views, indices):
            p.grad = view
            has_grad[i] = False
        return
    for p, view, i in zip(params, views, indices):
        if p.grad is None:  # the module's zero_grad(set_to_none=True)
            view.zero_()
            p.grad = view
            has_grad[i] = False


def _mark_gradient(has_grad, index, _param) -> None:
    has_grad[index] = True


class _SkippedSlices:
    """What one optimizer step must leave as it found it: the parameters of a flat buffer that have no gradient (in
    torch.optim terms: their ``.grad`` would be None), whose slices of the flat buffer and of every optimizer state
    tensor shaped like it are copied before the step and put back after it. ``ranges``: (offset, numel) each."""

    def __init__(self, optimizer, flat, ranges):
        self.optimizer = optimizer
        self.flat = flat
        self.ranges = ranges
        self.data = [flat.detach()[start:start + n].clone() for start, n in ranges]
        state = optimizer.state.get(flat, {})
        self.state = {key: [value[start:start + n].clone() for start, n in ranges]
                      for key, value in state.items() if _shaped_like(value, flat)}

    def restore(self) -> None:
        with torch.no_grad():
            data = self.flat.detach()
            for (start, n), saved in zip(self.ranges, self.data):
                data[start:start + n].copy_(saved)
            for key, value in self.optimizer.state.get(self.flat, {}).items():
                if not _shaped_like(value, self.flat):
                    continue
                saved = self.state.get(key)  # None: made by this step (the first): a skipped parameter has none
                for j, (start, n) in enumerate(self.ranges):
                    if saved is None:
                        value[start:start + n].zero_()
                    else:
                        value[start:start + n].copy_(saved[j])


def _shaped_like(value, flat) -> bool:
    return isinstance(value, torch.Tensor) and value.shape == flat.shape and value.device == flat.device


_live = weakref.WeakSet()  # every ContiguousParams: the optimizer step hooks look for their flat buffers
_hooks_registered = False


def _before_optimizer_step(optimizer, _args, _kwargs) -> None:
    for params in list(_live):
        params._before_step(optimizer)


def _after_optimizer_step(optimizer, _args, _kwargs) -> None:
    for params in list(_live):
        params._after_step(optimizer)


def _register_step_hooks() -> None:
    global _hooks_registered
    if not _hooks_registered:
        register_optimizer_step_pre_hook(_before_optimizer_step)
        register_optimizer_step_post_hook(_after_optimizer_step)
        _hooks_registered = True


class ContiguousParams:
    """Moves ``parameters`` (an iterable of tensors, or of ``(name, tensor)`` pairs such as
    ``model.named_parameters()``) into one flat buffer per (device, dtype) and makes each parameter and its
    ``.grad`` a view of it. Create it after the model is on its device and in its dtype, pass only trainable
    parameters, and give :meth:`contiguous` to the optimizer::

        params = speedtorch.ContiguousParams(model.named_parameters())
        opt = torch.optim.Adam(params.contiguous())
        for x in data:
            opt.zero_grad()                         # or model.zero_grad(), or params.zero_grad()
            model(x).sum().backward()
            params.assert_buffer_is_valid()         # names a parameter or grad that was replaced
            torch.nn.utils.clip_grad_norm_(params.contiguous(), 1.0)
            opt.step()

    A parameter without a gradient in a step (a branch the batch did not use) is skipped as torch.optim skips it:
    a torch.optim step leaves its slice of the flat buffer and of each optimizer state tensor shaped like the flat
    buffer (momentum, Adam's moments) as they were. One difference remains: optimizers that count steps (Adam's bias
    correction) count one per flat buffer, torch.optim one per parameter, so a parameter that gets a gradient again
    after steps without one (or first gets one after the first step) moves differently (docs/contiguous_params.md).
    """

    def __init__(self, parameters: ParamsArg):
        params, names = _split_names(parameters)
        # Which parameters have a gradient, as torch.optim sees it (a .grad that is not None): set when a backward
        # reaches one, cleared by a zero_grad that sets gradients to None. The flat gradient buffer cannot say it:
        # there a parameter without a gradient has zeros.
        had_grad = [p.grad is not None for p in params]
        self._impl = torch.classes.speedtorch.ContiguousParams(params, names)
        self._has_grad = bytearray(had_grad)
        self._skipped: list[_SkippedSlices] = []
        self._hooks = self._reattach_grads_before_backward()
        self._hooks += [p.register_post_accumulate_grad_hook(functools.partial(_mark_gradient, self._has_grad, i))
                        for i, p in enumerate(self._impl.original())]
        _live.add(self)
        _register_step_hooks()

    def _reattach_grads_before_backward(self) -> list:
        """``optimizer.zero_grad()`` and ``model.zero_grad()`` set gradients to None (torch's default): one hook
        per group, run before the first gradient of a backward reaches the group, points them back at their
        zeroed views, so autograd accumulates into the flat buffer again (as FSDP routes its views' gradients into
        its flat parameter). One Python call per group per backward; nothing is copied."""
        params = self._impl.original()
        views = [p.grad for p in params]  # the constructor pointed every .grad at its view of the flat buffer
        flats, buffers = self._impl.contiguous(), self._impl.grad_buffers()
        members: dict[int, list[int]] = {}
        for i in range(len(params)):
            members.setdefault(self._impl.group_of(i), []).append(i)
        self._members = members
        return [torch.autograd.graph.register_multi_grad_hook(
                    [params[i] for i in idx],
                    functools.partial(_reattach_grads, flats[g], buffers[g], [params[i] for i in idx],
                                      [views[i] for i in idx], idx, self._has_grad),
                    mode="any")
                for g, idx in members.items()]

    def _before_step(self, optimizer) -> None:
        """A torch.optim step pre-hook: for each flat buffer ``optimizer`` holds, saves the slices of the parameters
        without a gradient (torch.optim would skip them), which :meth:`_after_step` puts back. Nothing is copied in
        a step where every parameter has one."""
        self._skipped = [s for s in self._skipped if s.optimizer is not optimizer]  # a step that raised
        held = {id(p) for group in optimizer.param_groups for p in group["params"]}
        params = self._impl.original()
        for g, flat in enumerate(self._impl.contiguous()):
            if id(flat) not in held or flat.grad is None:  # no gradient buffer: the optimizer skips it whole
                continue
            ranges = [(self._impl.offset_of(i), params[i].numel()) for i in self._members[g]
                      if not self._has_grad[i] or params[i].grad is None]
            if ranges:
                self._skipped.append(_SkippedSlices(optimizer, flat, ranges))

    def _after_step(self, optimizer) -> None:
        mine = [s for s in self._skipped if s.optimizer is optimizer]
        self._skipped = [s for s in self._skipped if s.optimizer is not optimizer]
        for skipped in mine:
            skipped.restore()

    @property
    def script_object(self):
        """The ``torch.classes.speedtorch.ContiguousParams`` object, to hand to TorchScript or C++."""
        return self._impl

    def contiguous(self) -> list[torch.Tensor]:
        """The flat parameters, one per (device, dtype) group; each one's ``.grad`` is its flat gradient buffer.
        Only for in-place optimizers and shape-independent operations (clip_grad_norm_ is one)."""
        return self._impl.contiguous()

    def original(self) -> list[torch.Tensor]:
        """The parameters as given (now views of the flat buffers): use these for anything shape-dependent."""
        return self._impl.original()

    def grad_buffers(self) -> list[torch.Tensor]:
        """The flat gradient buffers, one per group."""
        return self._impl.grad_buffers()

    def assert_buffer_is_valid(self) -> None:
        """Raises RuntimeError naming the first parameter (index and name) or group whose data or ``.grad`` was
        replaced instead of updated in place. Call it after backward, at least once per step while developing."""
        self._impl.assert_buffer_is_valid()

    def buffer_is_valid(self) -> bool:
        """Whether every parameter and its ``.grad`` are still views of the flat buffers (False once one was replaced
        instead of updated in place); :meth:`assert_buffer_is_valid` names the culprit."""
        return self._impl.buffer_is_valid()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zeroes the flat gradient buffers in place and points every ``.grad`` back at its view at once (the
        optimizer's or module's ``zero_grad()`` leaves that to the next backward). The ``.grad`` views stay, but
        for the optimizer's step ``set_to_none`` means what it means to torch's ``zero_grad``: True (the default)
        leaves every parameter without a gradient until a backward reaches it (a step skips those that none
        reached); False keeps zero gradients, which a step applies (momentum, weight decay)."""
        self._impl.zero_grad()
        if set_to_none:
            self._has_grad[:] = bytes(len(self._has_grad))
        else:
            self._has_grad[:] = b"\x01" * len(self._has_grad)

    def __len__(self) -> int:
        return self._impl.num_params()

    def num_groups(self) -> int:
        """How many flat buffers there are: one per (device, dtype) of the parameters."""
        return self._impl.num_groups()

    def group_of(self, index: int) -> int:
        """The group (index into :meth:`contiguous`) that parameter ``index`` lives in."""
        return self._impl.group_of(index)

    def offset_of(self, index: int) -> int:
        """Parameter ``index``'s element offset in its group's flat buffers (views are 64-byte aligned)."""
        return self._impl.offset_of(index)
