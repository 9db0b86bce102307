"""Hashed n-gram row ids (the lookup of DeepSeek's Engram, arXiv 2601.07372): :func:`ngram_hash` over the
``speedtorch::ngram_hash`` op, the helpers that make a documented, deterministic configuration for it
(:func:`hash_multipliers`, :func:`prime_bucket_sizes`), and :class:`NgramHash`, a module holding one configuration.

Each position's n-grams (the token there and the 1 .. N-1 tokens before it) are hashed by several heads into rows of
one table: column ``(n - 2) * heads + h`` of the output is the row of order ``n``, head ``h``. docs/engram.md states
the hash; ``csrc/core/ngram_hash_math.h`` is its code.
"""

from __future__ import annotations

from typing import Optional, Sequence, Union

import torch

__all__ = ["ngram_hash", "hash_multipliers", "prime_bucket_sizes", "NgramHash"]

_MASK64 = (1 << 64) - 1
_INT64_MAX = (1 << 63) - 1


def ngram_hash(tokens: torch.Tensor, multipliers: torch.Tensor, bucket_sizes: torch.Tensor, pad_id: int,
               document_starts: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Row ids ``(batch, seq, (max_order - 1) * heads)`` int64 of every position's n-grams.

    ``tokens``: ``(batch, seq)`` int32/int64 ids >= 0, with ``seq >= max_order``. ``multipliers``: ``(heads,
    max_order)`` int64. ``bucket_sizes``: ``(max_order - 1, heads)`` int64 >= 1 (the rows of each order's head; the
    columns' ranges follow each other in one table of ``bucket_sizes.sum()`` rows). ``document_starts``: ``(batch,
    seq)`` bool, set where a document begins: tokens before it are not part of later n-grams (they hash as
    ``pad_id``, as the positions before a sequence do). All on one device; runs there."""
    return torch.ops.speedtorch.ngram_hash(tokens, multipliers, bucket_sizes, int(pad_id), document_starts)


def _splitmix64(x: int) -> int:
    """SplitMix64's output function (Steele, Lea and Flood 2014) on a 64-bit value: a fixed, portable mixer."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def hash_multipliers(vocab_size: int, heads: int, max_order: int, *, layer: int = 0, seed: int = 0) -> torch.Tensor:
    """The ``(heads, max_order)`` int64 multipliers of one layer's hash, a pure function of its arguments.

    Entry ``[h, k]`` is ``2 * (s % half) + 1`` with ``s = splitmix64(splitmix64(splitmix64(seed) ^ layer) ^ (h * 256 +
    k))`` (SplitMix64's mixer on 64-bit values) and ``half = max(1, (2**63 - 1) // vocab_size // 2)``: odd, and small
    enough that ``token * multiplier`` stays below ``2**63`` for every token below ``vocab_size`` (the paper's bound),
    so the hash never wraps. Each layer and head gets its own, so heads hash independently even before their prime
    moduli differ. To reproduce a checkpoint hashed with other multipliers (e.g. the paper's numpy draws, one row
    shared by every head), pass those instead: ``NgramHash(..., multipliers=...)``."""
    if vocab_size < 1 or heads < 1 or max_order < 2:
        raise ValueError(f"hash_multipliers: need vocab_size >= 1, heads >= 1, max_order >= 2; got {vocab_size}, "
                         f"{heads}, {max_order}")
    half = max(1, _INT64_MAX // vocab_size // 2)
    layer_state = _splitmix64(_splitmix64(seed & _MASK64) ^ (layer & _MASK64))
    values = [[2 * (_splitmix64(layer_state ^ (h * 256 + k)) % half) + 1 for k in range(max_order)]
              for h in range(heads)]
    return torch.tensor(values, dtype=torch.int64)


def _is_prime(n: int) -> bool:
    """Deterministic Miller-Rabin (these bases decide every n below 3.3e24)."""
    if n < 2:
        return False
    bases = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)
    for p in bases:
        if n % p == 0:
            return n == p
    d, r = n - 1, 0
    while d % 2 == 0:
        d, r = d // 2, r + 1
    for a in bases:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def prime_bucket_sizes(rows_per_head: Union[int, Sequence[int]], heads: int, max_order: int,
                       taken: Optional[set] = None) -> torch.Tensor:
    """``(max_order - 1, heads)`` bucket sizes as the paper lays them out: for each order (2 .. max_order), the
    ``heads`` smallest primes of at least ``rows_per_head`` (one value, or one per order) not used before. Pass one
    ``taken`` set to the calls of every layer so that no two columns of a model share a modulus; it is updated."""
    orders = max_order - 1
    per_order = [int(rows_per_head)] * orders if isinstance(rows_per_head, int) else [int(r) for r in rows_per_head]
    if len(per_order) != orders or min(per_order) < 1:
        raise ValueError(f"prime_bucket_sizes: rows_per_head must be >= 1, one value or one per order 2..{max_order} "
                         f"({orders}), got {rows_per_head!r}")
    taken = set() if taken is None else taken
    sizes = []
    for rows in per_order:
        row, candidate = [], rows
        while len(row) < heads:
            if candidate not in taken and _is_prime(candidate):
                taken.add(candidate)
                row.append(candidate)
            candidate += 1
        sizes.append(row)
    return torch.tensor(sizes, dtype=torch.int64)


class NgramHash(torch.nn.Module):
    """One layer's n-gram hash: ``forward(tokens, document_starts=None)`` returns the row ids of :func:`ngram_hash`.

    Args:
        vocab_size: token ids are below it (it bounds the default multipliers; larger ids still hash, wrapping).
        rows_per_head: rows of each (order, head) column, before rounding up to distinct primes; one value or one
            per order. Ignored when ``bucket_sizes`` is given.
        heads: hash heads per order. max_order: the longest n-gram (orders 2 .. max_order).
        pad_id: the id hashed for positions before a sequence or document.
        layer, seed: select the default multipliers (:func:`hash_multipliers`).
        multipliers, bucket_sizes: explicit configuration (int64 ``(heads, max_order)`` and ``(max_order - 1,
            heads)``), e.g. a checkpoint's.
        taken: a set of moduli already used by other layers (see :func:`prime_bucket_sizes`).

    The configuration lives in buffers: ``.to(device)`` moves it, ``state_dict`` saves it, and the module scripts
    (``torch.jit.script``) and exports (``torch.export``) with the op inside.
    """

    def __init__(self, vocab_size: int, rows_per_head: Union[int, Sequence[int]] = 1 << 16, *, heads: int = 8,
                 max_order: int = 3, pad_id: int = 0, layer: int = 0, seed: int = 0,
                 multipliers: Optional[torch.Tensor] = None, bucket_sizes: Optional[torch.Tensor] = None,
                 taken: Optional[set] = None):
        super().__init__()
        if multipliers is None:
            multipliers = hash_multipliers(vocab_size, heads, max_order, layer=layer, seed=seed)
        if bucket_sizes is None:
            bucket_sizes = prime_bucket_sizes(rows_per_head, heads, max_order, taken)
        multipliers = torch.as_tensor(multipliers, dtype=torch.int64)
        bucket_sizes = torch.as_tensor(bucket_sizes, dtype=torch.int64)
        if multipliers.dim() != 2 or tuple(bucket_sizes.shape) != (multipliers.shape[1] - 1, multipliers.shape[0]):
            raise ValueError(f"NgramHash: multipliers must be (heads, max_order) and bucket_sizes (max_order - 1, "
                             f"heads); got {tuple(multipliers.shape)} and {tuple(bucket_sizes.shape)}")
        if int(bucket_sizes.min()) < 1:
            raise ValueError(f"NgramHash: every bucket size must be >= 1, got {bucket_sizes.tolist()}")
        self.vocab_size = int(vocab_size)
        self.pad_id = int(pad_id)
        self.heads = int(multipliers.shape[0])
        self.max_order = int(multipliers.shape[1])
        self.columns = (self.max_order - 1) * self.heads
        #: Rows of the table the ids index: the sum of the bucket sizes.
        self.num_rows = int(bucket_sizes.sum())
        self.register_buffer("multipliers", multipliers.clone())
        self.register_buffer("bucket_sizes", bucket_sizes.clone())

    def extra_repr(self) -> str:
        """The module's repr line: vocabulary size, heads, maximum order, table rows, padding id."""
        return (f"vocab_size={self.vocab_size}, heads={self.heads}, max_order={self.max_order}, "
                f"num_rows={self.num_rows}, pad_id={self.pad_id}")

    def forward(self, tokens: torch.Tensor, document_starts: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Row ids ``(batch, seq, (max_order - 1) * heads)`` of the tokens' n-grams (:func:`ngram_hash`), each column's
        offset into the one table; ``document_starts`` (bool, like ``tokens``) marks where packed documents begin."""
        return torch.ops.speedtorch.ngram_hash(tokens, self.multipliers, self.bucket_sizes, self.pad_id,
                                               document_starts)
