"""``ShardedHostTable``: one embedding table and its optimizer state trained by every rank of a process group.

Each host keeps its rows once, in shared memory that all of its ranks map (host_shard.py); rows move between hosts
and gradients reach their owners through ``torch.distributed`` collectives (row_exchange.py). It offers the part of
:class:`speedtorch.PinnedEmbedding`'s API that :class:`speedtorch.nn.HostEmbedding` uses, so the module's code is
the same as for the single-process placements; :class:`DistributedHostEmbedding` (embedding.py) is that module.
"""

from __future__ import annotations

import os
from typing import Optional

import torch
import torch.distributed as dist

from .._library import PinnedEmbedding
from ..ops import _first_out_of_range, check_indices
from .host_shard import open_host_shard
from .row_sharding import RowLayout, RowSharding
from .topology import HostTopology, control_group_timeout

__all__ = ["ShardedHostTable"]

_INIT_BLOCK_ROWS = 1 << 16  # rows per seeded block of the initialisation (values depend on seed and row only)

# The number the next table built in this process may take (exchange_headers.py: a table's identity in the headers).
_next_table_id = 0


def _control_group():
    # Headers, object exchanges and barriers run on the CPU: Gloo, whatever the data path's backend, with the default
    # group's timeout (a new group's default is Gloo's 30 minutes).
    if dist.get_backend() == "gloo":
        return dist.group.WORLD
    return dist.new_group(backend="gloo", timeout=control_group_timeout())


def _rows_with_own_storage(t: torch.Tensor, start: int, end: int) -> torch.Tensor:
    """Rows [start, end) of a contiguous host tensor as a tensor whose storage is exactly those rows (it still shares
    the memory): serializers (torch.distributed.checkpoint) copy a view whose storage is larger than itself."""
    if t.dtype == torch.bfloat16:  # NumPy has no bfloat16: the same bits as int16
        return torch.from_numpy(t.view(torch.int16).numpy()[start:end]).view(torch.bfloat16)
    return torch.from_numpy(t.numpy()[start:end])


def agree_on_id(control_group, what: str, **config) -> int:
    """Checks that every rank passes the same ``config`` (a ``ValueError`` on every rank, starting with ``what``,
    naming the first rank and setting that differ) and returns the number the ranks agree on for the new table (or
    set of tables): its identity in the exchange headers (exchange_headers.py). A collective of every rank."""
    # Before any other collective: a rank whose table differs would otherwise hang or corrupt the others.
    global _next_table_id
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, (config, _next_table_id), group=control_group)
    for rank, (other, _) in enumerate(everyone):
        for name, value in other.items():
            if value != everyone[0][0][name]:
                raise ValueError(f"{what}, but rank {rank} has {name}={value!r} where rank 0 has "
                                 f"{name}={everyone[0][0][name]!r}")
    # The largest proposal: the same on every rank, and above every number this process gave out before (a rank
    # whose count differs, say it built a table in an earlier process group, cannot make two ranks disagree).
    table_id = max(proposed for _, proposed in everyone)
    _next_table_id = table_id + 1
    return table_id


class ShardedHostTable:
    """``num_rows x dim`` rows and their ``optimizer`` state, sharded by rows over hosts, shared within a host.

    Every rank of the default process group constructs it with the same arguments (checked: a mismatch raises on
    every rank). ``reduction`` is how the ranks' gradients combine: ``"mean"`` (as DDP does for dense parameters) or
    ``"sum"``. ``local_world_size`` defaults to ``LOCAL_WORLD_SIZE`` (torchrun's). ``shm_dir`` is the memory file
    system the host's copy is shared through.
    """

    def __init__(self, num_rows: int, dim: int, dtype: torch.dtype = torch.float32, optimizer: str = "adam",
                 options: Optional[dict] = None, *, reduction: str = "mean", local_world_size: Optional[int] = None,
                 shm_dir: str = "/dev/shm"):
        options = {k: float(v) for k, v in (options or {}).items()}
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("ShardedHostTable: call torch.distributed.init_process_group first")
        self.control_group = _control_group()
        if local_world_size is None:
            local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size()))
        self.table_id = self._check_same_everywhere(num_rows=num_rows, dim=dim, dtype=str(dtype),
                                                    optimizer=optimizer, options=sorted(options.items()),
                                                    reduction=reduction, local_world_size=local_world_size)
        if reduction not in ("mean", "sum"):
            raise ValueError(f"ShardedHostTable: reduction must be 'mean' or 'sum', got {reduction!r}")
        if num_rows < 1 or dim < 1:
            raise ValueError(f"ShardedHostTable: num_rows and dim must be >= 1, got {num_rows} x {dim}")
        PinnedEmbedding.state_width(optimizer, options, dim)  # a clear error for a bad optimizer name or option
        topology = HostTopology.of(None, local_world_size)
        host_group = None
        for host in range(topology.num_hosts):  # every rank creates every group, in the same order
            group = dist.new_group(topology.host_ranks(host), backend="gloo", timeout=control_group_timeout())
            if host == topology.host:
                host_group = group
        self.layout = RowLayout(num_rows, topology)
        start, end = self.layout.host_range(topology.host)
        shard = open_host_shard(topology, host_group, end - start, dim, dtype, optimizer, options, shm_dir)
        comm_device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" \
            else torch.device("cpu")
        self.sharding = RowSharding(self.layout, shard, host_group, comm_device, reduction, self.table_id,
                                    self.control_group)
        self.shard = shard
        self._num_rows = num_rows

    def _check_same_everywhere(self, **config) -> int:
        """Checks that every rank builds the same table and returns the table's number, agreed by every rank."""
        return agree_on_id(self.control_group, "ShardedHostTable: every rank must build the same table", **config)

    # --- what HostEmbedding uses -----------------------------------------------------------------------------------

    def num_rows(self) -> int:
        """Rows of the whole table (every host's)."""
        return self._num_rows

    def dim(self) -> int:
        """Width of a row."""
        return self.shard.dim()

    def optimizer(self) -> str:
        """The fused optimizer's canonical name."""
        return self.shard.optimizer()

    def optimizer_options(self) -> dict:
        """The optimizer's hyper-parameters, by name."""
        return self.shard.optimizer_options()

    def step_count(self) -> int:
        """Optimizer steps taken (the same on every rank)."""
        return self.shard.step_count()

    def set_step_count(self, step: int) -> None:
        """Sets the step count of this host's shard (a checkpoint's; every rank sets the same)."""
        self.shard.set_step_count(step)

    def mapping(self) -> str:
        """``"shared"``: the host's rows are shared memory that its ranks map."""
        return "shared"

    def nbytes(self) -> int:
        """Host bytes of this host's copy (rows and state), shared by its ranks."""
        return self.shard.nbytes()

    def table(self) -> torch.Tensor:
        """This host's rows (``host_range`` of the layout), shared memory."""
        return self.shard.table()

    def state(self) -> torch.Tensor:
        """This host's optimizer state (rows ``host_range`` of the layout), shared memory."""
        return self.shard.state()

    def gather(self, indices: torch.Tensor, device=None) -> torch.Tensor:
        """Rows for ``indices`` (any shape, ids of the whole table), shaped ``indices.shape + (dim,)``, on ``device``
        (default: the indices'). Rows on other hosts travel through collectives, so with several hosts every rank
        calls it; an id out of range raises IndexError (and, with several hosts, makes every rank raise)."""
        ids = indices.reshape(-1).to(torch.int64)
        device = ids.device if device is None else torch.device(device)
        refused, owner = None, f"ShardedHostTable (rank {self.layout.topology.rank})"
        try:  # the library's rule decides and words it, naming the place in the caller's indices (of their shape)
            check_indices(ids.view(indices.shape), self._num_rows, owner)
        except IndexError as error:
            refused = error
        if refused is not None:
            _, bad_id = _first_out_of_range(ids, self._num_rows)
            self.sharding.refuse_lookup(bad_id)  # with several hosts, every rank raises with this one
            raise refused
        return self.sharding.gather(ids, device).reshape(*indices.shape, self.dim())

    def apply_gradients(self, indices: torch.Tensor, grad: torch.Tensor) -> None:
        """One synchronous optimizer step of the whole table: every rank calls it once per step, with its own
        rows' gradients (or none), and it returns once the host's shared rows are all updated."""
        ids = indices.reshape(-1).to(torch.int64)
        self.sharding.apply_gradients(ids, grad.reshape(ids.numel(), self.dim()))

    def set_optimizer_options(self, options: dict) -> None:
        """Changes the hyper-parameters in place (an LR schedule): every rank calls it alike, as every rank steps
        its scheduler; each owner applies them to the rows it updates."""
        self.shard.set_optimizer_options(options)

    def set_optimizer(self, *args, **kwargs) -> None:
        """Raises: the optimizer is chosen at construction, on every rank alike."""
        raise RuntimeError("ShardedHostTable: the optimizer is chosen at construction, on every rank alike")

    # --- contents ----------------------------------------------------------------------------------------------------

    def rank_rows(self, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's block (``layout.rank_range``) of ``tensor`` (this host's rows or state), as a tensor with a
        storage of its own over the shared memory."""
        start, end = self.layout.rank_range(self.layout.topology.rank)
        offset = self.layout.host_range(self.layout.topology.host)[0]
        return _rows_with_own_storage(tensor, start - offset, end - offset)

    @torch.no_grad()
    def copy_(self, src: torch.Tensor) -> None:
        """Sets the whole table from ``src`` (``num_rows x dim``, the same on every rank): each rank writes its block."""
        if tuple(src.shape) != (self._num_rows, self.dim()):
            raise RuntimeError(f"ShardedHostTable.copy_: src must have shape {(self._num_rows, self.dim())}, got "
                               f"{tuple(src.shape)}")
        start, end = self.layout.rank_range(self.layout.topology.rank)
        self.rank_rows(self.table()).copy_(src[start:end])
        self.sharding.fence()

    @torch.no_grad()
    def normal_(self, mean: float, std: float, seed: Optional[int] = None) -> None:
        """N(mean, std^2) rows whose values depend only on ``seed`` and the row, not on the world size."""
        if seed is None:
            seed_list = [int(torch.randint(0, 2**62, ()))]
            dist.broadcast_object_list(seed_list, src=0, group=self.control_group)
            seed = seed_list[0]
        start, end = self.layout.rank_range(self.layout.topology.rank)
        mine = self.rank_rows(self.table())
        first = start // _INIT_BLOCK_ROWS
        for block in range(first, (end + _INIT_BLOCK_ROWS - 1) // _INIT_BLOCK_ROWS):
            lo, hi = max(block * _INIT_BLOCK_ROWS, start), min((block + 1) * _INIT_BLOCK_ROWS, end)
            generator = torch.Generator().manual_seed((seed * 0x9E3779B1 + block) % 2**63)
            values = torch.randn(_INIT_BLOCK_ROWS, self.dim(), generator=generator)[lo - block * _INIT_BLOCK_ROWS:
                                                                                      hi - block * _INIT_BLOCK_ROWS]
            mine[lo - start:hi - start].copy_(values.mul_(std).add_(mean))
        self.sharding.fence()

    def save(self, path: str) -> None:  # noqa: ARG002
        """Raises: a sharded table is saved with ``torch.distributed.checkpoint`` on every rank
        (docs/distributed.md)."""
        raise RuntimeError("ShardedHostTable.save: a sharded table is saved with torch.distributed.checkpoint: "
                           "dcp.save(module.state_dict(), checkpoint_id=folder) on every rank "
                           "(docs/distributed.md)")
