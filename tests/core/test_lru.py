"""The LRU cache: recency order, count and byte bounds, on_evict, oversize entries."""

from __future__ import annotations

import threading

import pytest

from mds.core.lru import LRU, LockedLRU


def _recording(**bounds) -> tuple[LRU, list]:
    evicted: list = []
    return LRU(**bounds, on_evict=lambda k, v: evicted.append((k, v))), evicted


def test_get_absent_is_none_and_put_get_round_trips():
    cache = LRU()
    assert cache.get("a") is None and "a" not in cache and len(cache) == 0
    cache.put("a", 1)
    assert cache.get("a") == 1 and "a" in cache and len(cache) == 1


def test_count_bound_evicts_least_recently_used():
    cache, evicted = _recording(max_items=2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # "b" is now the least recently used
    cache.put("c", 3)
    assert evicted == [("b", 2)]
    assert "a" in cache and "c" in cache and "b" not in cache


def test_byte_bound_evicts_until_within():
    cache, evicted = _recording(max_bytes=100)
    cache.put("a", "A", nbytes=40)
    cache.put("b", "B", nbytes=40)
    cache.put("c", "C", nbytes=50)
    assert evicted == [("a", "A")]
    assert cache.nbytes == 90
    cache.put("d", "D", nbytes=100)
    assert evicted == [("a", "A"), ("b", "B"), ("c", "C")]
    assert cache.nbytes == 100 and len(cache) == 1


def test_both_bounds_apply():
    cache, evicted = _recording(max_items=3, max_bytes=10)
    for i in range(3):
        cache.put(i, i, nbytes=1)
    cache.put(3, 3, nbytes=1)
    assert evicted == [(0, 0)]
    cache.put(4, 4, nbytes=9)
    assert [k for k, _ in evicted] == [0, 1, 2]
    assert len(cache) == 2 and cache.nbytes == 10


def test_oversize_entry_is_not_stored_and_is_handed_to_on_evict():
    cache, evicted = _recording(max_bytes=10)
    cache.put("small", 1, nbytes=5)
    cache.put("big", 2, nbytes=11)
    assert evicted == [("big", 2)]
    assert "big" not in cache and cache.get("small") == 1 and cache.nbytes == 5
    assert not cache.fits(11) and cache.fits(10)


def test_oversize_replacement_drops_the_old_entry_too():
    cache, evicted = _recording(max_bytes=10)
    cache.put("k", "old", nbytes=5)
    cache.put("k", "new", nbytes=50)
    assert evicted == [("k", "old"), ("k", "new")]
    assert "k" not in cache and cache.nbytes == 0


def test_replacing_a_key_updates_bytes_and_evicts_the_old_value():
    cache, evicted = _recording(max_bytes=100)
    cache.put("k", "old", nbytes=30)
    cache.put("k", "new", nbytes=20)
    assert evicted == [("k", "old")] and cache.get("k") == "new" and cache.nbytes == 20
    cache.put("k", "new", nbytes=25)  # the same object again: nothing to let go of
    assert evicted == [("k", "old")] and cache.nbytes == 25


def test_pop_removes_without_on_evict():
    cache, evicted = _recording(max_items=5)
    cache.put("a", 1, nbytes=7)
    assert cache.pop("a") == 1 and cache.pop("a") is None
    assert evicted == [] and cache.nbytes == 0 and len(cache) == 0


def test_clear_calls_on_evict_for_each_in_lru_order():
    cache, evicted = _recording()
    for key in "abc":
        cache.put(key, key.upper(), nbytes=1)
    cache.get("a")
    cache.clear()
    assert evicted == [("b", "B"), ("c", "C"), ("a", "A")]
    assert len(cache) == 0 and cache.nbytes == 0


def test_zero_bound_stores_nothing():
    cache, evicted = _recording(max_items=0)
    cache.put("a", 1)
    assert evicted == [("a", 1)] and len(cache) == 0


def test_unbounded_keeps_everything():
    cache = LRU()
    for i in range(1000):
        cache.put(i, i, nbytes=1 << 20)
    assert len(cache) == 1000 and cache.nbytes == 1000 << 20


def test_open_file_use_closes_evicted_files(tmp_path):
    cache = LRU(max_items=2, on_evict=lambda _k, f: f.close())
    files = []
    for i in range(3):
        path = tmp_path / f"f{i}"
        path.write_bytes(b"x")
        files.append(open(path, "rb"))  # noqa: SIM115 - closed by the cache
        cache.put(path, files[-1])
    assert [f.closed for f in files] == [True, False, False]
    cache.clear()
    assert all(f.closed for f in files)


@pytest.mark.parametrize("bounds", [{"max_items": -1}, {"max_bytes": -5}])
def test_negative_bounds_are_refused(bounds):
    with pytest.raises(ValueError):
        LRU(**bounds)


def test_resize_evicts_to_the_new_bound():
    cache, evicted = _recording(max_bytes=100)
    for key in "abc":
        cache.put(key, key.upper(), nbytes=30)
    cache.resize(50)
    assert evicted == [("a", "A"), ("b", "B")] and cache.nbytes == 30 and cache.max_bytes == 50
    cache.resize(None)
    cache.put("d", "D", nbytes=1000)
    assert "d" in cache
    with pytest.raises(ValueError):
        cache.resize(-1)


def test_locked_lru_stays_within_its_bound_under_threads():
    cache = LockedLRU(max_bytes=1000)

    def work(t: int) -> None:
        for i in range(2000):
            cache.put((t, i % 50), i, 10 + i % 7)
            cache.get((t, (i * 7) % 50))
            if i % 13 == 0:
                cache.pop((t, i % 50))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    held = sum(size for _value, size in cache._entries.values())
    assert cache.nbytes == held <= 1000
