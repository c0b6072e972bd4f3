"""How a process's executor memory budget (`memory_bytes`) is shared, and how it relates to
`cache_bytes`: the cache's share, rows read ahead, the reading threads' buffers, and the
room that the block cache and the decodes in flight share (`memory_budget.MemoryBudget`).
"""

from __future__ import annotations

from dataclasses import dataclass

from mds.core.memory_budget import MemoryBudget
from mds.errors import ConfigError

__all__ = ["DEFAULT_MEMORY", "PAGE_BUFFER", "Budget", "budget"]

DEFAULT_MEMORY = 512 << 20  # memory_bytes when neither it nor cache_bytes is given
PAGE_BUFFER = 4 << 20  # most a reading thread keeps to read a Parquet column chunk at once


@dataclass(frozen=True)
class Budget:
    """How a process's `memory_bytes` is shared: `cache` bytes at most kept between steps
    (`ahead` of them rows read ahead, the rest decoded blocks), `whole_chunk` bytes a
    reading thread's buffer of a Parquet column chunk read at once; the decodes in flight
    and the block cache share what the rows ahead and the buffers leave (`fixed`)."""

    total: int
    cache: int
    ahead: int
    whole_chunk: int
    fixed: int

    def memory(self) -> MemoryBudget:
        """A MemoryBudget of these shares (one per process: the budget is per process)."""
        return MemoryBudget(self.total, self.fixed, buffer=self.whole_chunk)


def budget(memory_bytes: int | None, cache_bytes: int | None, read_threads: int) -> Budget:
    """The Budget of an executor's `memory_bytes` and `cache_bytes` (either may be None:
    memory_bytes then is max(DEFAULT_MEMORY, 2 x cache_bytes), cache_bytes half of
    memory_bytes); ConfigError for a value that is not an integer >= 0, or a cache_bytes
    above memory_bytes."""
    for name, value in (("memory_bytes", memory_bytes), ("cache_bytes", cache_bytes)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 0
        ):
            raise ConfigError(f"{name}={value!r} must be an integer >= 0")
    if memory_bytes is None:
        memory_bytes = DEFAULT_MEMORY
        if cache_bytes is not None:
            memory_bytes = max(DEFAULT_MEMORY, 2 * cache_bytes)
    if cache_bytes is None:
        cache_bytes = memory_bytes // 2
    if cache_bytes > memory_bytes:
        raise ConfigError(
            f"cache_bytes={cache_bytes} is more than memory_bytes={memory_bytes}: the cache "
            "is a share of the memory budget; raise memory_bytes or lower cache_bytes"
        )
    ahead = cache_bytes // 4
    whole = min(PAGE_BUFFER, memory_bytes // 16)
    fixed = min(memory_bytes, ahead + read_threads * whole)
    return Budget(memory_bytes, cache_bytes, ahead, whole, fixed)
