"""src/mds/planner/runtime/lock_record.py: a lock's name, the record it holds and the error
naming its holder (lock files and lock objects alike)."""

from __future__ import annotations

import json
import os
import socket

from mds.planner.runtime.lock_record import (
    LOCK_NAME_MAX,
    held_by,
    lock_name,
    lock_record,
    parse_record,
)


def test_a_lock_is_a_hidden_sibling_with_a_bounded_name() -> None:
    assert lock_name("plan.mds") == ".plan.mds.lock"
    long = lock_name("p" * 250)
    assert long.startswith(".ppp") and long.endswith(".lock") and len(long) <= LOCK_NAME_MAX
    assert long != lock_name("p" * 249 + "q")


def test_the_record_names_this_writer_and_parses_back() -> None:
    record = lock_record(token="t")
    assert record["pid"] == os.getpid() and record["host"] == socket.gethostname()
    assert record["token"] == "t" and "since" in record and "machine" in record
    assert parse_record(json.dumps(record).encode()) == record


def test_a_damaged_record_names_no_holder() -> None:
    for data in (b"", b"\xff", b"[1]", b'{"pid": "12"}', b'{"host": "h"}'):
        assert parse_record(data) == {}


def test_the_error_names_the_holder_and_the_lock() -> None:
    holder = {"pid": 12, "host": "h", "since": "2024-01-01T00:00:00+0000"}
    message = str(held_by("out", holder, ".out.lock", "; more"))
    assert message == (
        "out is being written by pid 12 on host h since 2024-01-01T00:00:00+0000; wait for "
        "it, or remove .out.lock if that process is gone; more"
    )
