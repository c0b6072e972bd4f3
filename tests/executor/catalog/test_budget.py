"""How memory_bytes and cache_bytes share a process's budget, and what each refuses."""

from __future__ import annotations

import pytest

from mds.errors import ConfigError
from mds.executor.catalog.budget import DEFAULT_MEMORY, PAGE_BUFFER, budget

MiB = 1 << 20


def test_existing_callers_keep_their_cache():
    assert (budget(None, None, 2).total, budget(None, None, 2).cache) == (DEFAULT_MEMORY, 256 * MiB)
    b = budget(None, 64 * MiB, 2)
    assert (b.total, b.cache) == (DEFAULT_MEMORY, 64 * MiB)
    b = budget(None, 1024 * MiB, 2)
    assert (b.total, b.cache) == (2048 * MiB, 1024 * MiB)


def test_the_shares_add_up_to_the_budget():
    for total in (1 * MiB, 16 * MiB, 64 * MiB, 256 * MiB):
        b = budget(total, None, 2)
        assert b.cache == total // 2 and b.ahead == b.cache // 4
        assert b.whole_chunk == min(PAGE_BUFFER, total // 16)
        assert b.fixed == b.ahead + 2 * b.whole_chunk
        memory = b.memory()
        assert memory.room == total - b.fixed > 0 and memory.buffer == b.whole_chunk


@pytest.mark.parametrize(
    ("memory", "cache", "message"),
    [
        (-1, None, "memory_bytes=-1 must be an integer >= 0"),
        (1.5, None, "memory_bytes=1.5 must be an integer >= 0"),
        (True, None, "memory_bytes=True must be an integer >= 0"),
        (None, -1, "cache_bytes=-1 must be an integer >= 0"),
        (MiB, 2 * MiB, "cache_bytes=2097152 is more than memory_bytes=1048576"),
    ],
)
def test_bad_values_are_refused_naming_them(memory, cache, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        budget(memory, cache, 2)
