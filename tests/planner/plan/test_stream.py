"""A source's stream: seeded permutation epochs, random access, token look-ups."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from plan_builders import make_pool

from mds.planner.plan.permutation import epoch_key, permute
from mds.planner.plan.stream import SourceStream


def stream(lengths, seed=3, name="src") -> SourceStream:
    return SourceStream(make_pool(name, lengths), seed)


def test_every_epoch_is_a_fresh_permutation():
    n = 37
    s = stream(np.arange(1, n + 1))
    pos = s.positions(0, 5 * n).reshape(5, n)
    for e in range(5):
        assert np.array_equal(np.sort(pos[e]), np.arange(n))  # no repeats inside an epoch
        assert np.array_equal(pos[e], permute(np.arange(n), n, epoch_key(3, "src", e)))
    assert len({tuple(row) for row in pos}) == 5
    assert [s.epoch_of(q) for q in (0, n - 1, n, 3 * n + 2)] == [0, 0, 1, 3]


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 60), start=st.integers(0, 500), count=st.integers(0, 300))
def test_any_stretch_equals_the_same_stretch_of_the_whole_stream(n, start, count):
    s = stream(np.ones(n, dtype=np.int64))
    whole = s.positions(0, start + count)
    assert np.array_equal(s.positions(start, count), whole[start:])
    # a fresh stream (empty key cache) agrees too
    assert np.array_equal(stream(np.ones(n, dtype=np.int64)).positions(start, count), whole[start:])


def test_seed_and_name_change_the_order():
    lengths = np.ones(200, dtype=np.int64)
    a = stream(lengths, seed=1).positions(0, 200)
    assert not np.array_equal(a, stream(lengths, seed=2).positions(0, 200))
    assert not np.array_equal(a, stream(lengths, seed=1, name="other").positions(0, 200))


def test_key_cache_eviction_keeps_results():
    s = stream(np.ones(3, dtype=np.int64))
    first = s.positions(0, 3 * 200)  # 200 epochs, the cache is cleared on the way
    assert np.array_equal(first, s.positions(0, 3 * 200))
    assert np.array_equal(first[-3:], s.positions(3 * 199, 3))


def test_tokens_between():
    lengths = np.array([5, 1, 7, 2, 9])
    s = stream(lengths)
    pos = s.positions(0, 12)
    assert s.tokens_between(0, 0) == 0
    assert s.tokens_between(3, 9) == int(lengths[pos[3:12]].sum())
    assert s.tokens_between(0, 5) == int(lengths.sum())


@settings(max_examples=30, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 50), min_size=1, max_size=30),
    start=st.integers(0, 100),
    already=st.integers(0, 1000),
    increments=st.lists(st.floats(0, 400, allow_nan=False), min_size=1, max_size=8),
)
def test_take_until_is_the_fewest_samples_reaching_each_target(lengths, start, already, increments):
    s = stream(np.array(lengths, dtype=np.int64))
    targets = already + np.cumsum(increments)
    counts = s.take_until(start, already, targets)
    assert counts.dtype == np.int64
    assert np.all(np.diff(counts) >= 0)
    for target, k in zip(targets, counts, strict=True):
        k = int(k)
        reached = already + s.tokens_between(start, k)
        assert reached >= target
        if k:
            assert already + s.tokens_between(start, k - 1) < target


def test_take_until_far_targets_on_a_tiny_source():
    # many epochs of a 2-sample source inside one call
    s = stream(np.array([3, 4]))
    (k,) = s.take_until(0, 0, np.array([7.0 * 1_000]))
    assert k == 2_000
    assert s.take_until(0, 100, np.array([50.0, 100.0])).tolist() == [0, 0]
    assert s.take_until(0, 0, np.array([], dtype=np.float64)).tolist() == []


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(2, 50),
    data=st.data(),
    epochs=st.integers(1, 4),
)
def test_an_excluded_stream_is_the_stream_without_those_samples(n, data, epochs):
    """Every epoch keeps the other samples in their order, each once, and never the
    excluded ones; cursors map between the two streams."""
    left_out = data.draw(st.sets(st.integers(0, n - 1), max_size=n - 1))
    full, kept = stream(np.ones(n)), stream(np.ones(n))
    kept.exclude(np.array(sorted(left_out), dtype=np.int64))
    m = n - len(left_out)
    assert kept.epoch_size == m
    drawn = kept.positions(0, epochs * m).reshape(epochs, m)
    for e in range(epochs):
        order = full.positions(e * n, n)
        assert np.array_equal(drawn[e], order[~np.isin(order, list(left_out))])
    for q in range(epochs * m):
        raw = kept.raw_position(q)
        assert full.positions(raw, 1)[0] == drawn.ravel()[q]
        assert kept.position_of_raw(raw) == q
    # a cursor of the full stream continues at the next kept draw
    start = data.draw(st.integers(0, epochs * n - 1))
    q = kept.position_of_raw(start)
    rest = full.positions(start, epochs * n - start)
    rest = rest[~np.isin(rest, list(left_out))]
    assert np.array_equal(kept.positions(q, len(rest)), rest)
