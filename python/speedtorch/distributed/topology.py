"""Which ranks share a host: the process group's topology, as torchrun lays it out.

torchrun numbers ranks host by host (``rank = host * LOCAL_WORLD_SIZE + LOCAL_RANK``) and exports
``LOCAL_WORLD_SIZE``; ranks of one host share its RAM, so they share one copy of the host's rows. Tests and
single-machine runs may set ``LOCAL_WORLD_SIZE`` themselves to simulate several hosts on one machine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Optional

import torch
import torch.distributed as dist

__all__ = ["HostTopology", "control_group_timeout"]


def control_group_timeout() -> timedelta:
    """The default process group's ``timeout`` (``init_process_group(timeout=...)``), which the Gloo groups the
    tables create (headers, fences, object exchanges) take too: ``new_group`` would give them Gloo's default (30
    minutes), so a rank that died would be noticed only then."""
    group = dist.distributed_c10d._get_default_group()
    for device in ("cuda", "cpu"):
        try:
            return group._get_backend(torch.device(device)).options._timeout
        except (RuntimeError, AttributeError):
            continue
    return dist.default_pg_timeout


@dataclass(frozen=True)
class HostTopology:
    """How the ranks of a process group sit on hosts: ``world_size`` ranks, this process's ``rank``, and
    ``local_world_size`` ranks per host, numbered host by host as torchrun does. :meth:`of` reads it from a process
    group."""

    world_size: int
    rank: int
    local_world_size: int

    @property
    def num_hosts(self) -> int:
        """How many hosts: ``world_size // local_world_size``."""
        return self.world_size // self.local_world_size

    @property
    def host(self) -> int:
        """This rank's host: ``rank // local_world_size``."""
        return self.rank // self.local_world_size

    @property
    def local_rank(self) -> int:
        """This rank's number within its host: ``rank % local_world_size``."""
        return self.rank % self.local_world_size

    def host_ranks(self, host: int) -> list[int]:
        """The global ranks that run on ``host``, in order."""
        return list(range(host * self.local_world_size, (host + 1) * self.local_world_size))

    @classmethod
    def of(cls, group: Optional[dist.ProcessGroup] = None, local_world_size: Optional[int] = None) -> "HostTopology":
        """The topology of ``group`` (default: the default group); ``local_world_size`` defaults to the
        ``LOCAL_WORLD_SIZE`` environment variable (torchrun's), else every rank on one host."""
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("speedtorch.distributed: call torch.distributed.init_process_group first (torchrun "
                               "sets the environment it reads)")
        world, rank = dist.get_world_size(group), dist.get_rank(group)
        if local_world_size is None:
            local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        if local_world_size < 1 or world % local_world_size:
            raise ValueError(f"speedtorch.distributed: the world size {world} is not a multiple of the local world "
                             f"size {local_world_size} (LOCAL_WORLD_SIZE): every host must run as many ranks")
        return cls(world, rank, local_world_size)
