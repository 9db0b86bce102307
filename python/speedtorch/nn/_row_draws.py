"""The new rows of a growing table (:class:`speedtorch.nn.DynamicHostEmbedding`), handed out in admission order.

:class:`RowDraws` owns the table's row generator, the blocks of rows it has drawn ahead, and their checkpoint: the
generator's state before the first block not fully taken, and how many of that block's rows were taken.
"""

from __future__ import annotations

import collections
import threading

import torch

__all__ = ["RowDraws", "block_rows"]

_BLOCK_ROWS = 4096
_BLOCK_VALUES = 1 << 20  # wide rows: fewer of them a block (4 MiB of float32)


def block_rows(dim: int) -> int:
    """Rows of a block for rows of ``dim`` values: 4,096, fewer for rows wider than 256 (about 2^20 values)."""
    return max(1, min(_BLOCK_ROWS, _BLOCK_VALUES // dim))


class RowDraws:
    """Rows drawn from N(0, ``std``^2) by ``generator``, handed out in order: the k-th row is row ``k % B`` of block
    ``k // B``, each block ``torch.randn(B, dim, generator=generator) * std`` (``B = block_rows(dim)``). A row
    depends on k and the generator's seed alone, not on how :meth:`take` calls split the rows, so blocks can be drawn
    ahead (:meth:`ensure`, on a prefetch thread) without changing any row.

    ``pin``: draw new blocks into pinned memory (for a GPU module, whose copies of a slice then need no staging
    copy). :meth:`ensure` and :meth:`take` may be called from different threads (a lock orders them)."""

    def __init__(self, dim: int, std: float, generator: torch.Generator):
        self.dim, self.std, self.generator = int(dim), float(std), generator
        self.rows_per_block = block_rows(self.dim)
        self._lock = threading.Lock()
        # Drawn blocks not fully taken: (the generator's state before the block, its rows).
        self._blocks: collections.deque = collections.deque()
        # Rows of the first block (drawn, or the next one drawn when none is) already taken.
        self._taken = 0

    def ensure(self, n: int, pin: bool = False) -> None:
        """Draws blocks until at least ``n`` rows are ready, taking none."""
        with self._lock:
            self._ensure(n, pin)

    def take(self, n: int, pin: bool = False) -> torch.Tensor:
        """The next ``n`` rows, ``(n, dim)`` float32 on the CPU: a slice of a block (pinned when it was drawn with
        ``pin``), or across blocks a new tensor (pinned when ``pin``). Each row is handed out once: the caller may
        modify it."""
        if n <= 0:
            return torch.empty(0, self.dim)
        with self._lock:
            self._ensure(n, pin)
            parts = []
            while n > 0:
                block = self._blocks[0][1]
                part = block[self._taken:self._taken + n]
                parts.append(part)
                n -= part.shape[0]
                self._taken += part.shape[0]
                if self._taken == self.rows_per_block:
                    self._blocks.popleft()
                    self._taken = 0
        if len(parts) == 1:
            return parts[0]
        return torch.cat(parts, out=torch.empty(sum(p.shape[0] for p in parts), self.dim, pin_memory=pin))

    def _ensure(self, n: int, pin: bool) -> None:
        ready = len(self._blocks) * self.rows_per_block - self._taken
        while ready < n:
            state = self.generator.get_state()
            block = torch.empty(self.rows_per_block, self.dim, pin_memory=pin)
            torch.randn(self.rows_per_block, self.dim, generator=self.generator, out=block).mul_(self.std)
            self._blocks.append((state, block))
            ready += self.rows_per_block

    def rescale(self, std: float) -> None:
        """Rows not yet handed out are drawn with ``std`` (blocks drawn ahead are dropped and drawn again)."""
        with self._lock:
            if self._blocks:
                self.generator.set_state(self._blocks[0][0])
                self._blocks.clear()
            self.std = float(std)

    def state(self) -> tuple[torch.Tensor, int]:
        """``(generator_state, taken)``: the generator's state before the first block not fully taken, and how many
        of its rows were taken. :meth:`load` of it hands out the same rows from here on."""
        with self._lock:
            state = self._blocks[0][0].clone() if self._blocks else self.generator.get_state()
            return state, self._taken

    def load(self, generator_state: torch.Tensor, taken: int) -> None:
        """Continues from :meth:`state`'s ``(generator_state, taken)``: drops the blocks drawn; the next block is
        drawn from ``generator_state`` and its first ``taken`` rows skipped."""
        check_taken(taken, self.rows_per_block)
        with self._lock:
            self.generator.set_state(generator_state)
            self._blocks.clear()
            self._taken = int(taken)


def check_taken(taken: int, rows_per_block: int) -> None:
    """Refuses a taken count that is not a row of a block."""
    if not 0 <= int(taken) < rows_per_block:
        raise ValueError(f"the rows taken of the row generator's block must be in [0, {rows_per_block}), got "
                         f"{int(taken)}")
