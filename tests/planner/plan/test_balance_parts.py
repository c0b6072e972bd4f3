"""Two-part balance: encoder and backbone costs, token and patch capacities."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mds.errors import PlanError
from mds.planner.plan.balance import balance
from mds.planner.plan.balance_parts import SUM_SLACK_BITS, balance_parts, part_bounds
from mds.planner.plan.bounds import naive_ranks


def check(assign, enc, bb, tokens, patches, valid, dp, micro, capacity, pcap):
    """Every invariant; returns per-step (encoder, backbone, sum) top-rank ratios to bounds."""
    T, N = enc.shape
    r, m = assign.rank, assign.micro
    assert np.all((r[valid] >= 0) & (r[valid] < dp)) and np.all(r[~valid] == -1)
    assert np.all((m[valid] >= 0) & (m[valid] < micro)) and np.all(m[~valid] == -1)
    used_t = np.zeros((T, dp, micro), np.int64)
    used_p = np.zeros((T, dp, micro), np.int64)
    loads = np.zeros((T, dp, 3), np.int64)
    for t, j in zip(*np.nonzero(valid), strict=True):
        used_t[t, r[t, j], m[t, j]] += tokens[t, j]
        used_p[t, r[t, j], m[t, j]] += patches[t, j]
        loads[t, r[t, j]] += (enc[t, j], bb[t, j], enc[t, j] + bb[t, j])
    assert (used_t <= capacity).all(), "a micro-batch is over its token capacity"
    if pcap is not None:
        assert (used_p <= pcap).all(), "a micro-batch is over its patch capacity"
    assert np.array_equal(assign.load, loads[:, :, 2])
    bounds = [part_bounds(x, valid, dp) for x in (enc, bb, enc + bb)]
    top = loads.max(axis=1)
    return np.stack([top[:, k] / np.maximum(bounds[k], 1) for k in range(3)], axis=1)


def profile(rng, T, N):
    """Image samples (encoder and backbone cost) mixed with text-only ones (backbone only)."""
    image = rng.random((T, N)) < 0.7
    patches = np.where(image, rng.integers(16, 400, (T, N)) ** rng.choice([1, 1, 1, 1.3], (T, N)), 0)
    patches = patches.astype(np.int64)
    tokens = rng.integers(4, 200, (T, N)) + np.where(image, patches // 4 + 2, rng.integers(0, 3000, (T, N)))
    enc = 50 * patches + patches * patches // 8
    bb = 120 * tokens + tokens * tokens // 20 + 1
    return enc, bb, tokens, patches


@st.composite
def cases(draw):
    T, N = draw(st.integers(1, 4)), draw(st.integers(0, 48))
    dp, micro = draw(st.integers(1, 6)), draw(st.integers(1, 3))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    enc, bb, tokens, patches = profile(rng, T, N)
    counts = rng.integers(0, N + 1, T) if N else np.zeros(T, int)
    valid = np.arange(N)[None, :] < counts[:, None]
    capacity = int(max(tokens.max(initial=1), 1) * draw(st.sampled_from([1, 2, 40])))
    pcap = draw(st.sampled_from([None, int(max(patches.max(initial=1), 1) * 3)]))
    return enc, bb, tokens, patches, valid, dp, micro, capacity, pcap


@settings(max_examples=60, deadline=None)
@given(cases())
def test_every_sample_placed_once_within_both_capacities(case):
    enc, bb, tokens, patches, valid, dp, micro, capacity, pcap = case
    steps = np.arange(len(enc))
    try:
        out = balance_parts(enc, bb, tokens, patches, valid, steps, dp, micro, capacity, pcap)
    except PlanError as exc:
        assert "fits no micro-batch" in str(exc) or "cannot pack" in str(exc)
        return
    check(out, enc, bb, tokens, patches, valid, dp, micro, capacity, pcap)
    again = balance_parts(enc, bb, tokens, patches, valid, steps, dp, micro, capacity, pcap)
    assert np.array_equal(out.rank, again.rank) and np.array_equal(out.micro, again.micro)


def test_the_sum_stays_near_its_bound_and_both_parts_beat_naive():
    rng = np.random.default_rng(7)
    T, dp, micro = 12, 8, 2
    enc, bb, tokens, patches = profile(rng, T, dp * 24)
    valid = np.ones_like(enc, dtype=bool)
    steps = np.arange(T)
    out = balance_parts(enc, bb, tokens, patches, valid, steps, dp, micro, 10**9, None)
    ratios = check(out, enc, bb, tokens, patches, valid, dp, micro, 10**9, None)
    scalar = balance(enc + bb, tokens, valid, steps, dp, micro, 10**9).load.max(axis=1)
    slack = 1 + 2.0**-SUM_SLACK_BITS
    bound = part_bounds(enc + bb, valid, dp)
    assert (out.load.max(axis=1) <= np.maximum(scalar, bound * slack) + 1).all()
    naive = naive_ranks(valid, dp, steps)
    for k, values in enumerate((enc, bb)):
        naive_top = np.array([np.bincount(naive[t], values[t], dp).max() for t in range(T)])
        assert (ratios[:, k] * part_bounds(values, valid, dp) <= naive_top).all()
        assert np.median(ratios[:, k]) < 1.05
    # balancing the sum alone leaves a part skewed; the parts' search evens both
    only_sum = balance(enc + bb, tokens, valid, steps, dp, micro, 10**9).rank
    skew = max(
        np.median([np.bincount(only_sum[t], v[t], dp).max() / part_bounds(v, valid, dp)[t] for t in range(T)])
        for v in (enc, bb)
    )
    assert max(np.median(ratios[:, 0]), np.median(ratios[:, 1])) <= skew


def test_patch_capacity_splits_large_images_across_micro_batches():
    enc = np.array([[900, 900, 900, 900, 10, 10, 10, 10]])
    bb = np.array([[100, 100, 100, 100, 500, 500, 500, 500]])
    patches = np.array([[300, 300, 300, 300, 0, 0, 0, 0]])
    tokens = np.array([[80, 80, 80, 80, 400, 400, 400, 400]])
    valid = np.ones_like(enc, dtype=bool)
    out = balance_parts(enc, bb, tokens, patches, valid, np.arange(1), 2, 2, 1000, 300)
    check(out, enc, bb, tokens, patches, valid, 2, 2, 1000, 300)
    big = out.rank[0, :4] * 2 + out.micro[0, :4]
    assert len(set(big.tolist())) == 4  # one large image per micro-batch


def test_a_sample_that_fits_no_micro_batch_names_the_step():
    one = np.array([[5]])
    with pytest.raises(PlanError, match="step 41: a sample of 10 tokens and 500 patches fits no"):
        balance_parts(one, one, np.array([[10]]), np.array([[500]]), one > 0, np.array([41]), 2, 1, 100, 400)
