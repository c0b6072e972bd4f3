"""src/mds/core/commit.py: temporary names, signals held across a commit, and the record of
what this process put in place."""

from __future__ import annotations

import os
import signal

import pytest

from mds.core import commit
from mds.errors import Interrupted


def test_a_temporary_is_a_hidden_unique_sibling_tagged_with_pid_and_host():
    a, b = commit.temp_name("plan.mds"), commit.temp_name("plan.mds")
    assert a != b
    assert a.startswith(f".plan.mds{commit.TMP_MARK}{os.getpid()}-{commit.host_tag()}-")
    assert commit.is_temp_name(a) and commit.is_temp_name(f"sources/{a}")
    assert not commit.is_temp_name("plan.mds")
    assert not commit.is_temp_name("plan.tmp-1-abcdef-01234567")  # not hidden: data
    url = commit.temp_url("s3://bucket/dir/plan.mds")
    assert url.startswith("s3://bucket/dir/.plan.mds.tmp-") and commit.is_temp_name(url)


def test_replace_local_puts_the_file_in_place_and_records_it(tmp_path):
    tmp, path = tmp_path / commit.temp_name("out"), tmp_path / "out"
    tmp.write_bytes(b"new")
    commit.replace_local(tmp, path)
    assert path.read_bytes() == b"new" and not tmp.exists()
    assert commit.written()[-1] == os.fspath(path)


def test_a_signal_inside_the_block_is_held_then_delivered():
    with pytest.raises(KeyboardInterrupt) as info:
        with commit.signals_held() as held:
            signal.raise_signal(signal.SIGINT)
            assert held == [signal.SIGINT]  # held, not acted on
        commit.deliver_held(held, None)
    assert not isinstance(info.value, Interrupted)


def test_an_interrupt_after_a_commit_says_what_was_written():
    with pytest.raises(Interrupted, match="the plan was written"):
        with commit.signals_held() as held:
            signal.raise_signal(signal.SIGINT)
        commit.deliver_held(held, "the plan was written")
    commit.deliver_held([], "nothing held: no effect")
