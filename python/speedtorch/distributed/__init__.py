"""speedtorch.distributed: one embedding table trained by every rank of a ``torch.distributed`` job (torchrun), one
copy per host in shared memory, rows sharded over hosts; docs/distributed.md.

- :class:`DistributedHostEmbedding`: the module (a :class:`speedtorch.nn.HostEmbedding` whose table is sharded);
- :class:`DistributedHostEmbeddingBagCollection`: the table collection (``HostEmbeddingBagCollection``) over such
  tables, every group's rows and gradients in one exchange per lookup and per step (row_exchange.py);
- :class:`ShardedHostTable`: the table it trains (row_exchange.py holds the three stages rows and gradients go through);
- :class:`HostTopology`: which ranks share a host (``LOCAL_WORLD_SIZE``);
- :func:`share_rows`: one copy per host of a serving table (quantized rows) for every local rank.
"""

import atexit
import gc

import torch

# A table of this package holds process groups, and its modules reference cycles: one left to the interpreter's
# last collection is freed after torch's own teardown has begun, and Gloo aborted the process there ("terminate
# called without an active exception", 8 runs in 24 of bench/dlrm_distributed.py). Collected before that instead.
atexit.register(gc.collect)

# Its checkpoints are DTensors of the public torch.distributed.tensor API, which came in torch 2.5.
if torch.__version__ < (2, 5):
    raise ImportError(f"speedtorch.distributed needs torch >= 2.5 (torch.distributed.tensor.DTensor); this is torch "
                      f"{torch.__version__}")

from .collection import DistributedHostEmbeddingBagCollection  # noqa: E402
from .embedding import DistributedHostEmbedding  # noqa: E402
from .host_shard import share_rows  # noqa: E402
from .row_sharding import RowLayout  # noqa: E402
from .sharded_table import ShardedHostTable  # noqa: E402
from .topology import HostTopology  # noqa: E402

__all__ = ["DistributedHostEmbedding", "DistributedHostEmbeddingBagCollection", "HostTopology", "RowLayout",
           "ShardedHostTable", "share_rows"]
