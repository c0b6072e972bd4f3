"""The memory budget: the block cache and the reservations of decodes in flight never hold
more than its room together, the cache gives way to a reservation, and a reservation larger
than the room is refused at once."""

from __future__ import annotations

import random
import threading

import pytest

from mds.core.memory_budget import BudgetCache, MemoryBudget, TooLarge


def _budget(total: int, fixed: int = 0, cache: int | None = None):
    budget = MemoryBudget(total, fixed)
    return budget, BudgetCache(total if cache is None else cache, budget)


def test_a_reservation_larger_than_the_room_is_refused():
    budget, _ = _budget(100, fixed=30)
    with pytest.raises(TooLarge) as info:
        budget.reserve(71)
    assert (info.value.needed, info.value.room) == (71, 70)
    budget.reserve(70).release()


def test_the_cache_gives_way_to_a_reservation_least_recently_used_first():
    budget, cache = _budget(100)
    for k in range(4):
        cache.put(k, f"block {k}", 25)
    cache.get(0)  # now the most recently used
    with budget.reserve(40):
        assert [k for k in range(4) if k in cache] == [0, 3]
        assert budget.held() <= budget.room
    assert budget.reserved == 0


def test_a_kept_block_takes_over_its_reservation():
    budget, cache = _budget(100)
    res = budget.reserve(60)
    res.keep("g", "group", 60)
    assert budget.reserved == 0 and cache.nbytes == 60
    res.release()  # nothing left to release
    assert budget.reserved == 0 and "g" in cache


def test_a_put_beside_reservations_stays_within_the_room():
    budget, cache = _budget(100)
    with budget.reserve(70):
        cache.put("a", "x", 20)
        cache.put("b", "y", 20)
        assert budget.held() <= 100 and "b" in cache and "a" not in cache


def test_threads_never_hold_more_than_the_room():
    """Decodes on several threads (reserve, hold, keep or drop): the accounted bytes stay
    within the room, and a decode waits for the others rather than going over."""
    budget, cache = _budget(1000, fixed=200, cache=500)
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for i in range(300):
                res = budget.reserve(rng.randint(1, 700))
                assert budget.held() <= budget.room
                if rng.random() < 0.5:
                    res.keep((seed, i), i, rng.randint(1, res.nbytes))
                else:
                    res.release()
        except BaseException as exc:  # handed to the test thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert budget.reserved == 0
    assert 0 < budget.peak <= budget.room == 800
    assert cache.nbytes <= 500
