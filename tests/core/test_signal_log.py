"""The signal log: one canonical encoding, a digest per prefix, atomic writes, and logs of
one run merged only when one extends the other."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mds.core.signal_log import SignalLog, canonical_bytes, window_signal
from mds.errors import PlanError

finite = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e12, max_value=1e12)


def make_log(windows):
    log = SignalLog("p" * 32, ("web", "code"), 4)
    for k, (loss, count) in enumerate(windows):
        log.append(window_signal(k, 4 * k, 4 * k + 4, loss, count))
    return log


@given(st.lists(st.tuples(st.tuples(finite, finite), st.tuples(st.integers(0, 2**40),
                                                                st.integers(0, 2**40))),
                max_size=6))
def test_the_encoding_round_trips_byte_for_byte(windows):
    log = make_log(windows)
    again = SignalLog.from_json(json.loads(log.encode()))
    assert again.encode() == log.encode()
    assert again.digest() == log.digest()
    assert again.windows == log.windows


def test_the_digest_covers_a_prefix_and_every_value():
    log = make_log([((1.0, 2.0), (3, 4)), ((1.5, 2.5), (3, 4))])
    assert log.digest(1) == make_log([((1.0, 2.0), (3, 4))]).digest()
    assert log.digest(0) != log.digest(1) != log.digest(2)
    other = make_log([((1.0, 2.0000000000000004), (3, 4))])
    assert other.digest(1) != log.digest(1)  # one ulp apart


def test_canonical_bytes_are_sorted_and_refuse_nan():
    assert canonical_bytes({"b": 1, "a": 0.1}) == b'{"a":0.1,"b":1}'
    with pytest.raises(ValueError):
        canonical_bytes({"a": float("nan")})


def test_windows_come_in_order_and_finite():
    log = make_log([])
    with pytest.raises(PlanError, match="window 1 given after 0 windows"):
        log.append(window_signal(1, 4, 8, [1, 1], [1, 1]))
    with pytest.raises(PlanError, match="non-finite"):
        log.append(window_signal(0, 0, 4, [float("inf"), 1], [1, 1]))


def test_write_is_atomic_and_read_checks_the_format(tmp_path):
    log = make_log([((1.0, 2.0), (3, 4))])
    path = tmp_path / "plan.signals.json"
    log.write(path)
    assert SignalLog.read(path).encode() == log.encode()
    assert [p.name for p in tmp_path.iterdir()] == ["plan.signals.json"]
    path.write_text('{"format": "other"}')
    with pytest.raises(PlanError, match="not an mds signal log"):
        SignalLog.read(path)
    path.write_text('{"format": "mds-signals", "version": 1, "plan_id": "x"}')
    with pytest.raises(PlanError, match="damaged signal log"):
        SignalLog.read(path)


def test_merge_keeps_the_longer_log_and_refuses_a_divergent_one():
    short = make_log([((1.0, 2.0), (3, 4))])
    long = make_log([((1.0, 2.0), (3, 4)), ((5.0, 6.0), (3, 4))])
    assert short.merged(long).windows == long.windows
    assert long.merged(short).windows == long.windows
    other = make_log([((9.0, 2.0), (3, 4))])
    with pytest.raises(PlanError, match="differ at window 0"):
        other.merged(long)


def test_a_log_in_an_object_store_is_written_whole_and_read_back(monkeypatch):
    """Written to an object (moto's S3 server) as to a file: replaced whole, no temporary
    left beside it; a missing object is one error naming it."""
    from s3_store import BUCKET, s3_server

    with s3_server(monkeypatch) as store:
        url = store.url("run/plan.signals.json")
        with pytest.raises(PlanError, match="run/plan.signals.json"):
            SignalLog.read(url)
        make_log([((1.0, 2.0), (3, 4))]).write(url)
        longer = make_log([((1.0, 2.0), (3, 4)), ((0.5, 0.25), (1, 2))])
        longer.write(url)
        assert SignalLog.read(url).encode() == longer.encode() == store.get("run/plan.signals.json")
        keys = [x["Key"] for x in store.client.list_objects_v2(Bucket=BUCKET)["Contents"]]
        assert [k for k in keys if not k.endswith("/")] == ["run/plan.signals.json"]
