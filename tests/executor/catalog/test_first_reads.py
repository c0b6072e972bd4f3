"""The first steps' files made ready ahead of their reads: the batches are those of a run
without it, from the start and resumed at any step; it asks the kernel for at most its
window of bytes ahead of the reads and holds none of the memory budget; a run starts it
once, and a seek again."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from catalog_helpers import digests
from executor_builders import batch_digest

from mds.core import metacache
from mds.errors import ConfigError
from mds.executor import PlanExecutor
from mds.executor.catalog import first_reads as first_reads_module
from mds.executor.catalog.first_reads import FirstReads


@pytest.fixture(scope="module")
def many_sources(tmp_path_factory) -> Path:
    """Forty one-file Parquet sources and a plan of 4 samples a step: a step reads a few of
    them, the next steps others."""
    from catalog_helpers import plan_of

    root = tmp_path_factory.mktemp("forty")
    rng = np.random.default_rng(12)
    (root / "d").mkdir()
    sources = []
    for f in range(40):
        rows = [rng.integers(0, 1000, int(n)).tolist() for n in rng.integers(2, 40, 30)]
        pq.write_table(pa.table({"t": rows}), root / "d" / f"f{f:02d}.parquet")
        sources.append({"name": f"s{f:02d}", "path": f"d/f{f:02d}.parquet", "tokens": "t"})
        sources[-1]["weight"] = 1
    return plan_of(root, sources, dp_size=1, micro_batches=1, steps=40, samples_per_step=4)[1]


@pytest.mark.parametrize("read_ahead", [0, 1])
def test_batches_and_resumes_are_the_same_with_and_without_first_reads(
    many_files, many_sources, read_ahead
):
    for plan, rank in ((many_files, 0), (many_files, 1), (many_sources, 0)):
        plain = digests(plan, rank, read_ahead=read_ahead, first_reads=0)
        with PlanExecutor(plan, rank, read_ahead=read_ahead, first_reads=16) as ex:
            assert [batch_digest(b) for b in ex] == plain
        if plan == many_sources:
            assert ex._catalog.first.asked > 0  # footers parsed, chunks asked for
        for step in range(0, ex.steps, 3 if plan == many_sources else 1):
            for first_reads in (0, 16):
                with PlanExecutor(
                    plan, rank, read_ahead=read_ahead, first_reads=first_reads
                ) as ex:
                    ex.seek(step)
                    resumed = [batch_digest(b) for b in ex]
                assert resumed == plain[step * ex.micro_batches :], (rank, step, first_reads)


def test_the_window_bounds_the_bytes_asked_ahead_and_no_budget_is_held(
    many_sources, monkeypatch
):
    """Bytes asked of the kernel and not yet read never exceed the window; the memory
    budget accounts the same bytes at its peak as without first reads (it holds none)."""
    seen: list[tuple[int, int]] = []
    real_wait = FirstReads._wait

    def wait(self, run, nbytes):
        ok = real_wait(self, run, nbytes)
        if ok:
            seen.append((self.ahead + nbytes, self.window))
        return ok

    monkeypatch.setattr(FirstReads, "_wait", wait)
    peaks = []
    for first_reads in (0, 16):
        with PlanExecutor(
            many_sources, 0, read_ahead=0, read_threads=1, first_reads=first_reads
        ) as ex:
            if first_reads:
                ex._catalog.first.window = 3000  # two or three of these files' chunks
            for _batch in ex:
                pass
            budget = ex._catalog.files.blocks.budget
            peaks.append(budget.peak)
            assert budget.peak <= budget.total
    assert seen and all(ahead <= window for ahead, window in seen)
    assert peaks[0] == peaks[1]


def test_a_run_starts_first_reads_once_and_a_seek_again(many_files, monkeypatch):
    starts: list[int] = []
    real_start = FirstReads.start

    def start(self, block, lo, hi):
        starts.append(block.step_start)
        return real_start(self, block, lo, hi)

    monkeypatch.setattr(FirstReads, "start", start)
    with PlanExecutor(many_files, 0, read_ahead=0, first_reads=16) as ex:
        for _batch in ex:
            pass
        assert len(starts) == 1
        ex.seek(5)
        next(iter(ex))
        assert len(starts) == 2


def test_a_full_window_gives_up_when_the_reads_stop(many_files, monkeypatch):
    """A run left alone (its window full, no read coming) does not keep its threads: they
    give up, so a process can end without closing the executor."""
    monkeypatch.setattr(first_reads_module, "_PATIENCE", 0.05)
    with PlanExecutor(many_files, 0, read_ahead=0, first_reads=16) as ex:
        first = ex._catalog.first
        first.ahead = first.window  # as if every byte of the window were asked and unread
        assert not first._wait(first._run, 1)


def test_first_reads_are_off_by_default_for_local_files(many_files):
    with PlanExecutor(many_files, 0) as ex:
        assert ex._catalog.first.steps == 0


@pytest.mark.parametrize("value", [-1, 1.5, True])
def test_first_reads_must_be_a_count_of_steps(many_files, value):
    with pytest.raises(ConfigError, match="first_reads="):
        PlanExecutor(many_files, 0, first_reads=value)


@pytest.mark.slow
def test_objects_footers_are_fetched_ahead_and_the_batches_are_the_same(
    many_sources, monkeypatch
):
    """Of objects in a store (moto's S3 server), the footers of the first steps' files are
    fetched ahead (no chunk is asked of any kernel), and the batches and a resume are those
    of a run without it."""
    from s3_store import s3_server

    with s3_server(monkeypatch) as store:
        store.upload(many_sources.parent / "d", "forty/d")
        kwargs = dict(data_root=store.url("forty"), read_ahead=0)
        plain = digests(many_sources, 0, first_reads=0, **kwargs)
        metacache.clear()
        with PlanExecutor(many_sources, 0, **kwargs) as ex:  # on by default for objects
            assert ex._catalog.first.steps == 16
            assert [batch_digest(b) for b in ex] == plain
        first = ex._catalog.first
        assert first.footers > 0 and first.asked == 0
        metacache.clear()
        with PlanExecutor(many_sources, 0, first_reads=16, **kwargs) as ex:
            ex.seek(7)
            assert [batch_digest(b) for b in ex] == plain[7:]


def test_a_worker_building_every_other_micro_batch_starts_first_reads_once(
    many_sources, monkeypatch
):
    """A DataLoader worker's fetches skip the micro-batches the others build: that is going
    on, not a seek, so its first reads start once, not at every fetch."""
    starts: list[int] = []
    real_start = FirstReads.start

    def start(self, block, lo, hi):
        starts.append(lo)
        return real_start(self, block, lo, hi)

    monkeypatch.setattr(FirstReads, "start", start)
    with PlanExecutor(many_sources, 0, read_ahead=0, first_reads=16) as ex:
        ex.build_every(2)
        for pos in range(1, ex.total, 2):
            ex.compact_at(pos)
    assert len(starts) == 1
