"""speedtorch.ContiguousParams: a model's parameters and gradients in one flat buffer per (device, dtype), so the
optimizer and gradient clipping run a few large kernels instead of a few per parameter.

A thin wrapper of ``torch.classes.speedtorch.ContiguousParams`` (csrc/contiguous/contiguous_params.h), which does
the work and which TorchScript and C++ use directly. See docs/contiguous_params.md for the two rules and where it
breaks.
"""

from __future__ import annotations

import functools
from typing import Iterable, Union

import torch

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


def _reattach_grads(flat, buffer, params, views, _grad) -> None:
    if flat.grad is None:  # the optimizer's zero_grad(set_to_none=True): every gradient of the group is gone
        buffer.zero_()
        flat.grad = buffer
        for p, view in zip(params, views):
            p.grad = view
        return
    for p, view in zip(params, views):
        if p.grad is None:  # the module's zero_grad(set_to_none=True)
            view.zero_()
            p.grad = view


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
    """

    def __init__(self, parameters: ParamsArg):
        params, names = _split_names(parameters)
        self._impl = torch.classes.speedtorch.ContiguousParams(params, names)
        self._hooks = self._reattach_grads_before_backward()

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
        return [torch.autograd.graph.register_multi_grad_hook(
                    [params[i] for i in idx],
                    functools.partial(_reattach_grads, flats[g], buffers[g], [params[i] for i in idx],
                                      [views[i] for i in idx]),
                    mode="any")
                for g, idx in members.items()]

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

    def zero_grad(self) -> None:
        """Zeroes the flat gradient buffers in place and points every ``.grad`` back at its view at once (the
        optimizer's or module's ``zero_grad()`` leaves that to the next backward)."""
        self._impl.zero_grad()

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
