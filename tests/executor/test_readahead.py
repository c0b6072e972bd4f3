"""Read-ahead: steps built in a background thread give the batches of a run without it, read
each file once per step, keep errors at the step that reads the bad file, and follow seeks;
a loop that comes straight back has its steps built on its own thread, and one away again
gets them built ahead again."""

from __future__ import annotations

import threading
import time

import pytest
from executor_builders import batch_digest, open_executor, sample_plan, uninterrupted

import mds.executor.readahead as ahead_module
from mds.errors import ConfigError
from mds.executor import PlanExecutor
from mds.executor.catalog import SourceCatalog
from mds.executor.catalog.reads import SampleReads
from mds.executor.readahead import ReadAhead


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    return sample_plan(tmp_path_factory)[1]


@pytest.fixture(params=["adaptive", "always ahead"])
def mode(request, monkeypatch):
    """The executor tests run as a quick loop (steps soon built in line) and with every
    step built ahead by the thread."""
    if request.param == "always ahead":
        monkeypatch.setattr(ahead_module, "_SETTLE", 1 << 30)
    return request.param


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_every_depth_gives_the_same_batches(plan, depth, mode):
    for rank in range(4):
        with open_executor(plan, rank, read_ahead=depth) as ex:
            assert [batch_digest(b) for b in ex] == uninterrupted(plan, rank)


def test_a_seek_while_steps_are_built_ahead(plan, mode):
    expected = uninterrupted(plan, 1)
    with open_executor(plan, 1, read_ahead=2) as ex:
        it = iter(ex)
        got = [batch_digest(next(it)) for _ in range(5)]
        ex.seek(40, 1)
        got += [batch_digest(b) for b in it]
        ex.seek(3)
        again = [batch_digest(next(iter(ex))) for _ in range(3)]
    m = ex.micro_batches
    assert got == expected[:5] + expected[40 * m + 1 :]
    assert again == expected[3 * m : 3 * m + 3]


def test_a_step_reads_each_file_once(plan, monkeypatch, mode):
    """Built ahead, a step is one fetch, and its samples from one file one reader call (or
    none, when rows read ahead with an earlier step hold them all)."""
    fetches: list[list[tuple[int, int]]] = []  # per fetch call, the files it read
    real_fetch, real_read = SourceCatalog.fetch, SampleReads._read

    def fetch(self, block, lo, hi, step=None):
        fetches.append([])
        return real_fetch(self, block, lo, hi, step)

    def read(self, block, s, file_id, entry, now, later, pinned=None):
        fetches[-1].append((s.sid, file_id))
        return real_read(self, block, s, file_id, entry, now, later, pinned)

    monkeypatch.setattr(SourceCatalog, "fetch", fetch)
    monkeypatch.setattr(SampleReads, "_read", read)
    with open_executor(plan, 0, read_ahead=1) as ex:
        assert sum(1 for _ in ex) == ex.steps * ex.micro_batches
    assert len(fetches) == ex.steps
    assert fetches[0] and all(len(files) == len(set(files)) for files in fetches)


def test_read_ahead_must_be_a_count(plan):
    for bad in (-1, 1.5, True):
        with pytest.raises(ConfigError, match="read_ahead"):
            PlanExecutor(plan, 0, read_ahead=bad)


# --- which thread builds --------------------------------------------------------------------


class _Steps:
    """A build that takes `seconds`, records the thread each step was built on, and fails
    at the steps in `bad`."""

    def __init__(self, seconds: float, micro_batches: int = 1, bad: frozenset = frozenset()):
        self.seconds, self.micro_batches, self.bad = seconds, micro_batches, bad
        self.threads: dict[int, list[int]] = {}

    def __call__(self, step: int):
        self.threads.setdefault(step, []).append(threading.get_ident())
        time.sleep(self.seconds)
        if step in self.bad:
            raise ValueError(f"step {step} is bad")
        return [{"step": step, "micro": m} for m in range(self.micro_batches)]

    def in_line(self, steps) -> list[bool]:
        me = threading.get_ident()
        return [self.threads[s] == [me] for s in steps]


def _loop(ra: ReadAhead, steps, away: float, micro_batches: int = 1) -> list:
    got = []
    for step in steps:
        for m in range(micro_batches):
            got.append(ra.get(step, m))
            time.sleep(away)
    return got


def test_a_loop_that_comes_straight_back_gets_its_steps_built_on_its_thread():
    build = _Steps(0.01)
    ra = ReadAhead(build, 1, 100)
    try:
        got = _loop(ra, range(12), 0)
    finally:
        ra.stop()
    assert got == [{"step": s, "micro": 0} for s in range(12)]
    assert all(len(threads) == 1 for threads in build.threads.values())  # each built once
    # Steps 1-4 show a quick loop; step 4 was queued ahead with step 3, step 5 is not.
    assert build.in_line(range(12)) == [False] * 5 + [True] * 7


def test_a_thread_left_idle_by_steps_built_in_line_is_ended(monkeypatch):
    """Its buffers and arena are not kept while nothing uses them; freed memory is handed
    back once it has ended."""
    gave_back: list[bool] = []
    monkeypatch.setattr(
        ahead_module.freed_memory, "give_back", lambda: gave_back.append(_alive(build))
    )
    monkeypatch.setattr(ahead_module, "_QUICK", 1e6)  # every step quick, however loaded
    build = _Steps(0.01)
    ra = ReadAhead(build, 1, 100)
    try:
        _loop(ra, range(12), 0)
        assert ra.inline and ra._pool is None
        assert gave_back == [False]  # once, after the thread ended
        assert not _alive(build)
    finally:
        ra.stop()


def _alive(build: _Steps) -> bool:
    """Whether a thread other than this one that built a step still runs."""
    me = threading.get_ident()
    built = {t for threads in build.threads.values() for t in threads if t != me}
    assert built  # the first steps were built ahead
    return any(t.ident in built for t in threading.enumerate())


def test_a_loop_away_again_gets_its_steps_built_ahead_again():
    build = _Steps(0.01, micro_batches=2)
    ra = ReadAhead(build, 2, 100)
    try:
        got = _loop(ra, range(8), 0, 2)
        assert ra.inline
        got += _loop(ra, range(8, 16), 0.02, 2)  # away twice a build per micro-batch
    finally:
        ra.stop()
    assert got == [{"step": s, "micro": m} for s in range(16) for m in range(2)]
    assert all(len(threads) == 1 for threads in build.threads.values())
    assert not ra.inline
    # Steps 9-12 show the loop away; steps 8-11 are built in line, 12 on ahead.
    assert build.in_line(range(8, 16)) == [True] * 4 + [False] * 4


def test_a_step_built_in_line_keeps_its_error_at_its_step():
    build = _Steps(0.005, micro_batches=2, bad=frozenset({9}))
    ra = ReadAhead(build, 1, 100)
    try:
        got = _loop(ra, range(9), 0, 2)
        assert ra.inline
        for m in range(2):  # every micro-batch of the step raises, from one build
            with pytest.raises(ValueError, match="step 9 is bad"):
                ra.get(9, m)
        got += _loop(ra, range(10, 12), 0, 2)
    finally:
        ra.stop()
    assert got == [{"step": s, "micro": m} for s in [*range(9), 10, 11] for m in range(2)]
    assert build.threads[9] == [threading.get_ident()]
