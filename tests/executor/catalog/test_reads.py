"""Reading a fetch's samples: threads give the batches of one thread, a step of more files
than may be open opens each once, and the first bad file of a step is the error whichever
thread read it."""

from __future__ import annotations

import pytest
from catalog_helpers import digests
from executor_builders import batch_digest

import mds.executor.catalog.open_files as open_files_module
import mds.executor.catalog.reads as reads_module
import mds.executor.readers.parquet as parquet_reader
from mds.errors import SourceDataError
from mds.executor import PlanExecutor
from mds.executor.catalog.reads import SampleReads


@pytest.mark.parametrize("read_threads", [2, 3])
@pytest.mark.parametrize(("max_open_files", "cache_bytes"), [(1, 0), (2, 1 << 20), (64, 256 << 20)])
def test_read_threads_give_the_batches_of_one_thread(
    many_files, read_threads, max_open_files, cache_bytes
):
    for rank in range(2):
        alone = digests(many_files, rank, read_threads=1, cache_bytes=cache_bytes)
        kwargs = dict(max_open_files=max_open_files, cache_bytes=cache_bytes)
        assert digests(many_files, rank, read_threads=read_threads, **kwargs) == alone
        assert digests(many_files, rank, read_threads=read_threads, read_ahead=0, **kwargs) == alone


@pytest.mark.parametrize("read_threads", [1, 2])
def test_a_step_of_more_files_than_may_be_open_opens_each_once(
    many_files, monkeypatch, read_threads
):
    """Page-read files are opened before any is read, a window of `max_open_files` at a
    time: opened all at once, a step's first files were evicted before their reads, which
    opened them again."""
    opens, reads = [0], [0]
    real_open, real_read = open_files_module.open_reader, SampleReads._read

    def open_reader(*args, **kwargs):
        opens[0] += 1
        return real_open(*args, **kwargs)

    def read(self, *args, **kwargs):
        reads[0] += 1
        return real_read(self, *args, **kwargs)

    alone = digests(many_files, 0, read_ahead=0)
    monkeypatch.setattr(open_files_module, "open_reader", open_reader)
    monkeypatch.setattr(SampleReads, "_read", read)
    got = digests(
        many_files, 0, read_threads=read_threads, read_ahead=0, max_open_files=3, cache_bytes=0
    )
    assert got == alone
    assert reads[0] > 12 and opens[0] <= reads[0]


@pytest.mark.parametrize("read_ahead", [0, 1])
def test_with_threads_the_first_bad_file_of_a_step_is_the_error_and_at_its_step(
    many_files, monkeypatch, read_ahead
):
    real = parquet_reader.ParquetReader.fetch
    bad = {"d/f03.parquet", "d/f07.parquet"}

    def fetch(self, file_rows, offsets=None, lengths=None, keep=True, pages=None, rent=False, **kw):
        if any(str(self.path).endswith(b) for b in bad):
            raise SourceDataError(f"{self.display}: unreadable")
        return real(self, file_rows, offsets, lengths, keep, pages, rent, **kw)

    monkeypatch.setattr(parquet_reader.ParquetReader, "fetch", fetch)
    outcomes = []
    for threads in (1, 2, 3):
        got = []
        with PlanExecutor(many_files, 1, read_threads=threads, read_ahead=read_ahead) as ex:
            with pytest.raises(SourceDataError) as err:
                for batch in ex:
                    got.append(batch_digest(batch))
            outcomes.append((got, ex.position, str(err.value)))
    assert outcomes[0] == outcomes[1] == outcomes[2]


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory):
    """Eight one-group sources of 2,000 token lists, one or two samples of each a step: a
    step reads a few rows of every group, from its pages, with later rows read ahead."""
    from many_sources import token_plan, token_sources

    root = tmp_path_factory.mktemp("small-corpus")
    index = token_sources(root, 8, 16_000, seed=5, mean_len=32)
    return token_plan(root, index, 300, 16, dp_size=2, micro_batches=2)


def _old_behaviour(monkeypatch) -> None:
    """Reads that take later rows decode a group whole and cache it after two page reads,
    as before `_rent`."""
    monkeypatch.setattr(reads_module, "_rent", lambda later: False)


@pytest.mark.parametrize("read_ahead", [0, 1])
def test_rows_read_ahead_from_pages_give_the_batches_of_cached_groups(
    small_corpus, monkeypatch, read_ahead
):
    """Renting pages (rows read ahead, no whole group cached) yields the batches of the
    decode-whole-and-cache reads, from the start and resumed mid-plan, and holds no block."""
    monkeypatch.setenv("MDS_PAGE_READS", "on")  # what this compares: reads from pages
    for rank in range(2):
        with PlanExecutor(small_corpus, rank, read_ahead=read_ahead) as ex:
            rented = [batch_digest(b) for b in ex]
            assert ex._catalog.files.blocks.nbytes == 0
        with PlanExecutor(small_corpus, rank, read_ahead=read_ahead) as ex:
            ex.seek(137)
            resumed = [batch_digest(b) for b in ex]
        assert resumed == rented[137 * 2 :]
        with monkeypatch.context() as m:
            _old_behaviour(m)
            with PlanExecutor(small_corpus, rank, read_ahead=read_ahead) as ex:
                assert [batch_digest(b) for b in ex] == rented
                assert ex._catalog.files.blocks.nbytes > 0  # the old reads cached groups
