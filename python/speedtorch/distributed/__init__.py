"""speedtorch.distributed: one embedding table trained by every rank of a ``torch.distributed`` job (torchrun), one
copy per host in shared memory, rows sharded over hosts; docs/distributed.md.

- :class:`DistributedHostEmbedding`: the module (a :class:`speedtorch.nn.HostEmbedding` whose table is sharded);
- :class:`ShardedHostTable`: the table it trains (row_sharding.py holds the three stages rows and gradients go through);
- :class:`HostTopology`: which ranks share a host (``LOCAL_WORLD_SIZE``).
"""

from .embedding import DistributedHostEmbedding
from .row_sharding import RowLayout
from .sharded_table import ShardedHostTable
from .topology import HostTopology

__all__ = ["DistributedHostEmbedding", "HostTopology", "RowLayout", "ShardedHostTable"]
