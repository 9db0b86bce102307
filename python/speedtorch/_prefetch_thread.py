"""The thread a training loop's next-batch prefetch runs on while the calling thread queues the backward.

A prefetch's host work (hashing, counting the distinct ids, which waits for the GPU, Python, queueing the gather's
chunks) held the backward's launch on the calling thread: the GPU sat idle 2-2.6 ms a DLRM step (bench/RESULTS.md,
fourteenth session). :class:`PrefetchThread` owns the way around it, for ``speedtorch.TrainPipeline`` and the Engram
GPT's ``Trainer``:

- when a prefetch may run there (:meth:`PrefetchThread.may_run_beside`): on a GPU (on the CPU only by a test switch)
  and not while a profiler records. Whether the prefetch is safe beside the backward (no table it reads is updated
  inside the backward) is the caller's to say;
- one worker thread, ``speedtorch-prefetch``, made at first use, its current GPU the caller's;
- :meth:`PrefetchThread.submit`: the work under the calling thread's speedtorch settings (transfer settings and the
  deferred-check mode are per thread); its current CUDA stream is that thread's default one, not the caller's;
- :meth:`PrefetchThread.wait`: waits for the work, a Ctrl-C included, then raises what it raised;
- :meth:`PrefetchThread.shutdown`: the thread ends (a later submit starts another).
"""

from __future__ import annotations

import concurrent.futures
import weakref
from typing import Callable, Optional

import torch

from .ops import deferred_index_checks, transfer_config, transfer_config_override

__all__ = ["PrefetchThread"]


class PrefetchThread:
    """The prefetch thread of a training loop on ``device`` (see the module's docstring). ``on_cpu``: use it on the
    CPU too (tests: the GPU's code path without a GPU)."""

    def __init__(self, device, on_cpu: bool = False):
        self.device = torch.device(device)
        self.on_device = self.device.type == "cuda" or bool(on_cpu)
        self._executor: Optional[concurrent.futures.ThreadPoolExecutor] = None

    @property
    def started(self) -> bool:
        """Whether the worker thread exists (made by a submit, ended by :meth:`shutdown`)."""
        return self._executor is not None

    #: Diagnosis switch (bench/dlrm.py --trace-as-run): the prefetch stays on its thread while a profiler records, so
    #: a trace shows the schedule as it runs untraced; its kernels then have no phase (the profiler sees the calling
    #: thread's operators and ranges only).
    under_profiler = False

    def may_run_beside(self) -> bool:
        """Whether a prefetch may run on the thread now: on a GPU (or ``on_cpu``), and no profiler recording (it sees
        the calling thread's operators and ranges only, and a trace must name the phase of every kernel: bench/dlrm.py
        --phases) unless :attr:`under_profiler` is set; else the caller prefetches on its own thread."""
        return self.on_device and (PrefetchThread.under_profiler or not torch.autograd._profiler_enabled())

    def submit(self, fn: Callable, *args) -> concurrent.futures.Future:
        """Starts ``fn(*args)`` on the thread, under the calling thread's speedtorch settings."""
        return self._started().submit(_with_settings, _thread_settings(), fn, *args)

    @staticmethod
    def wait(future: concurrent.futures.Future) -> None:
        """Waits for ``future`` to finish, a Ctrl-C included (the prefetch must not run on behind the caller's back),
        then raises the first KeyboardInterrupt, or what the work raised."""
        interrupted = None
        while not future.done():
            try:
                concurrent.futures.wait([future])
            except KeyboardInterrupt as e:
                interrupted = interrupted or e
        if interrupted is not None:
            raise interrupted
        future.result()

    def shutdown(self) -> None:
        """Ends the thread once its work is done (idle: no thread left behind; a fork after the loop copies none)."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def _started(self) -> concurrent.futures.ThreadPoolExecutor:
        if self._executor is None:
            # The thread's current GPU is the loop's ("cuda" without an index: the caller's current one).
            index = None if self.device.type != "cuda" else \
                self.device.index if self.device.index is not None else torch.cuda.current_device()
            self._executor = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="speedtorch-prefetch",
                initializer=(lambda: torch.cuda.set_device(index)) if index is not None else None)
            weakref.finalize(self, self._executor.shutdown, wait=False)
        return self._executor


def _thread_settings() -> tuple[dict, bool]:
    """The calling thread's speedtorch settings: its transfer settings and deferred-check mode in force."""
    return transfer_config(), bool(torch.ops.speedtorch.deferred_index_checks())


def _with_settings(settings: tuple[dict, bool], fn: Callable, *args) -> None:
    """``fn(*args)`` under ``settings`` (another thread's :func:`_thread_settings`)."""
    config, deferred = settings
    with transfer_config_override(**config), deferred_index_checks(deferred):
        fn(*args)
