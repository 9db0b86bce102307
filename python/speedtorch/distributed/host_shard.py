"""One copy of a host's rows and optimizer state in shared memory, mapped by every rank of that host.

The first local rank creates the table's files in a memory file system (``/dev/shm``: tmpfs, so each GPU may
register the pages for writing and reach them over UVA) with :meth:`speedtorch.PinnedEmbedding.create`; the other
local ranks map the same files with :meth:`~speedtorch.PinnedEmbedding.open` (``"r+"``). Once every rank has mapped
them, the files are unlinked: the memory lives exactly as long as the last process that maps it, so nothing is left
in ``/dev/shm`` when the ranks exit, crash or are killed. Host RAM is one table, however many ranks share it.

Only a crash inside this setup (between creating and unlinking, well under a second) could leave files behind; their
folder is named after the creating process, and the next setup on the host removes folders whose process is gone.
"""

from __future__ import annotations

import glob
import os
import shutil
import tempfile
from typing import Optional

import torch
import torch.distributed as dist

from .._library import PinnedEmbedding
from .topology import HostTopology, control_group_timeout

__all__ = ["open_host_shard", "share_on_host", "share_rows", "SHM_PREFIX"]

SHM_PREFIX = "speedtorch-"


def _remove_stale_folders(shm_dir: str) -> None:
    """Folders of earlier setups whose creating process no longer runs (it died mid-setup)."""
    for folder in glob.glob(os.path.join(shm_dir, SHM_PREFIX + "*")):
        try:
            pid = int(os.path.basename(folder)[len(SHM_PREFIX):].split("-", 1)[0])
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except (ValueError, PermissionError):
            continue  # not ours, or another user's live process


def share_on_host(topology: HostTopology, host_group: dist.ProcessGroup, create, open_, shm_dir: str = "/dev/shm"):
    """The protocol every per-host shared object follows (all local ranks call it): local rank 0 calls
    ``create(folder)`` in a fresh folder of ``shm_dir``, the others ``open_(folder)`` once it exists; when every rank
    has its mapping the folder is removed (the mappings keep the memory). Returns what create / open_ returned; a
    failure on any rank raises on every rank."""
    leader = topology.host_ranks(topology.host)[0]
    obj, folder, error = None, None, None
    if topology.local_rank == 0:
        try:
            _remove_stale_folders(shm_dir)
            folder = tempfile.mkdtemp(prefix=f"{SHM_PREFIX}{os.getpid()}-", dir=shm_dir)
            obj = create(folder)
        except Exception as e:  # noqa: BLE001 (every rank of the host must hear of it, or they wait forever)
            error = f"local rank 0 (rank {leader}) could not create the shared table in {shm_dir}: {e}"
            if folder is not None:
                shutil.rmtree(folder, ignore_errors=True)  # nothing of a failed setup is left behind
    message = [folder if error is None else None, error]
    dist.broadcast_object_list(message, src=leader, group=host_group)
    folder, error = message
    if error is None and obj is None:
        try:
            obj = open_(folder)
        except Exception as e:  # noqa: BLE001
            error = f"rank {topology.rank} could not map the shared table {folder}: {e}"
    errors: list = [None] * topology.local_world_size
    dist.all_gather_object(errors, error, group=host_group)  # every rank has mapped it (or failed) now
    if topology.local_rank == 0 and folder is not None:
        shutil.rmtree(folder, ignore_errors=True)  # the mappings keep the memory; no name is left behind
    failed = [e for e in errors if e is not None]
    if failed:
        raise RuntimeError("speedtorch.distributed: " + "; ".join(dict.fromkeys(failed)))
    return obj


def open_host_shard(topology: HostTopology, host_group: dist.ProcessGroup, num_rows: int, dim: int,
                    dtype: torch.dtype, optimizer: str, options: dict, shm_dir: str = "/dev/shm") -> PinnedEmbedding:
    """This host's ``num_rows x dim`` rows and optimizer state, shared by its ranks (all of them call this)."""
    if num_rows == 0:  # a host the layout leaves without rows: nothing to share
        table = PinnedEmbedding(0, dim, dtype)
        table.set_optimizer(optimizer, options, False)
        return table
    return share_on_host(
        topology, host_group,
        lambda folder: PinnedEmbedding.create(os.path.join(folder, "rows"), num_rows, dim, dtype, optimizer, options),
        lambda folder: PinnedEmbedding.open(os.path.join(folder, "rows"), "r+"), shm_dir)


def share_rows(rows, local_world_size: Optional[int] = None, shm_dir: str = "/dev/shm"):
    """One copy per host of a serving table (:class:`speedtorch.serving.quantized.QuantizedRows`, e.g. an Engram layer's
    fp8 rows) for every local rank: local rank 0 passes its rows (the others may pass None) and every rank gets a
    QuantizedRows over the same pinned pages of ``shm_dir``, read-only: host RAM holds one table however many ranks
    read it. Collective over the default process group (every rank calls it)."""
    from ..serving.quantized import QuantizedRows

    topology = HostTopology.of(None, local_world_size)
    host_groups = [dist.new_group(topology.host_ranks(h), backend="gloo", timeout=control_group_timeout())
                   for h in range(topology.num_hosts)]

    def create(folder):
        if rows is None:
            raise ValueError("share_rows: local rank 0 must pass the rows to share")
        rows.save(os.path.join(folder, "rows.npy"))
        return QuantizedRows.open(os.path.join(folder, "rows.npy"), pin=True)

    return share_on_host(topology, host_groups[topology.host], create,
                         lambda folder: QuantizedRows.open(os.path.join(folder, "rows.npy"), pin=True), shm_dir)
