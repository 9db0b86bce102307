"""Long file writes that Ctrl-C stops: the write runs in a worker thread while the calling thread waits, so a
KeyboardInterrupt reaches Python at once; it then cancels the writes in progress (``speedtorch::cancel_writes``,
csrc/io/write_cancellation.h: each stops at its next 64 MiB chunk, committing nothing) and is raised once the worker
has stopped, with the files at the path as they were. A write too short to reach a chunk boundary may still commit:
it is then whole. (A C++ call made from the main thread directly cannot see Ctrl-C until it returns: the library
never looks at signals.)"""

from __future__ import annotations

import threading

import torch


def run_interruptible(fn, *args):
    """``fn(*args)`` in a worker thread, cancelled on KeyboardInterrupt (see the module's docstring)."""
    result: dict = {}
    # The worker uses the caller's GPU and stream, so that the write is ordered after the caller's queued work.
    stream = torch.cuda.current_stream() if torch.cuda.is_available() and torch.cuda.is_initialized() else None

    done = threading.Event()  # not Thread.join: a join interrupted by Ctrl-C marks a running thread as stopped

    def work():
        try:
            if stream is None:
                result["value"] = fn(*args)
            else:
                with torch.cuda.stream(stream):
                    result["value"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 (handed to the caller's thread)
            result["error"] = e
        finally:
            done.set()

    worker = threading.Thread(target=work, name="speedtorch-write", daemon=True)
    try:
        worker.start()
        while not done.wait(0.05):
            pass
    except KeyboardInterrupt:
        _cancel_until_done(done)
        raise
    error = result.pop("error", None)
    if error is not None:
        try:
            raise error
        finally:
            # No cycle through this frame: the error's traceback holds the worker's arguments (a tensor mapping a
            # file, say), which must go as soon as the caller drops the error.
            error = result = None
    return result.get("value")


def _cancel_until_done(done: threading.Event) -> None:
    # Cancel until the worker is done: a write that began after the first request is cancelled by a later one. A
    # second Ctrl-C does not abandon the worker (its files would be committed behind the caller's back).
    while not done.is_set():
        try:
            torch.ops.speedtorch.cancel_writes()
            done.wait(0.05)
        except KeyboardInterrupt:
            continue
