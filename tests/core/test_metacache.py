"""The metadata cache: byte bound, eviction, spill to the block cache, configure and clear."""

from __future__ import annotations

import pytest

from mds.core import metacache
from mds.core.lru import LRU


@pytest.fixture(autouse=True)
def fresh():
    before = metacache.max_bytes()
    metacache.clear()
    yield
    metacache.configure(before)
    metacache.clear()


def test_put_get_and_byte_bound_evicts_least_recent():
    metacache.configure(100)
    assert metacache.put("a", "A", 40) and metacache.put("b", "B", 40)
    assert metacache.get("a") == "A"  # "b" is now the least recently used
    assert metacache.put("c", "C", 40)
    assert metacache.get("b") is None and metacache.get("a") == "A" and metacache.get("c") == "C"
    assert metacache.nbytes() == 80 <= metacache.max_bytes()


def test_an_entry_larger_than_the_bound_is_not_kept():
    metacache.configure(10)
    assert not metacache.put("big", "X", 11)
    assert metacache.get("big") is None and metacache.nbytes() == 0


def test_keep_spills_what_does_not_fit_to_the_given_cache():
    metacache.configure(10)
    blocks = LRU(max_bytes=100)
    metacache.keep("small", "s", 5, blocks)
    metacache.keep("large", "L", 50, blocks)
    assert metacache.get("small") == "s" and "small" not in blocks
    assert metacache.get("large") is None and blocks.get("large") == "L"
    assert metacache.lookup("large", blocks) == "L" and metacache.lookup("small", blocks) == "s"
    assert metacache.lookup("none", blocks) is None


def test_configure_shrinks_and_refuses_bad_bounds():
    metacache.configure(100)
    for key in "abc":
        metacache.put(key, key, 30)
    metacache.configure(40)
    assert metacache.get("c") == "c" and metacache.get("a") is None and metacache.nbytes() == 30
    metacache.configure(0)
    assert metacache.nbytes() == 0
    for bad in (-1, 1.5, True, "10"):
        with pytest.raises(ValueError):
            metacache.configure(bad)


def test_clear_drops_everything():
    metacache.put("a", "A", 1)
    metacache.clear()
    assert metacache.get("a") is None and metacache.nbytes() == 0
