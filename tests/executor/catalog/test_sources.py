"""SourceCatalog on small synthetic indexes: payload columns, truncation, and its limits."""

from __future__ import annotations

import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from executor_builders import batch_digest
from plan_builders import index_data, plan_config, train_table

import mds.executor.readers.parquet as parquet_reader
from mds.errors import ConfigError, SourceDataError
from mds.executor import PlanExecutor
from mds.executor.catalog.sources import SourceCatalog
from mds.planner.plan.build import build_plan


def _two_columns(root, rows: int = 40):
    """One Parquet file whose columns `a` and `b` hold different ids of the same lengths."""
    rng = np.random.default_rng(3)
    lengths = rng.integers(2, 30, rows)
    a = [list(range(i, i + n)) for i, n in enumerate(lengths)]
    b = [[t + 1000 for t in seq] for seq in a]
    (root / "d").mkdir()
    pq.write_table(pa.table({"a": a, "b": b}), root / "d" / "data.parquet", row_group_size=16)
    return a, b


def _plan(root, sources, **train):
    data = {"index": {"output": "index"}, "source": sources, "train": train_table(**train)}
    index = index_data(root, data)
    out = root / "plan.mds"
    build_plan(plan_config(root, data, **train), out)
    return index, out


def test_two_sources_on_one_file_get_their_own_columns(tmp_path):
    a, b = _two_columns(tmp_path)
    _, plan = _plan(
        tmp_path,
        [
            {"name": "A", "path": "d/data.parquet", "tokens": "a", "weight": 1},
            {"name": "B", "path": "d/data.parquet", "tokens": "b", "weight": 1},
        ],
        dp_size=1,
        micro_batches=1,
        steps=6,
    )
    seen = 0
    with PlanExecutor(plan, 0) as ex:
        for batch in ex:
            cu = batch["cu_seqlens"].tolist()
            for i, (s, r) in enumerate(
                zip(batch["source"].tolist(), batch["row"].tolist(), strict=True)
            ):
                want = (a if ex.source_names[s] == "A" else b)[r]
                assert batch["input_ids"][cu[i] : cu[i + 1]].tolist() == want
                seen += 1
    assert seen == 6 * 8


def test_overlong_samples_are_cut_as_the_plan_truncated_them(tmp_path):
    a, _ = _two_columns(tmp_path)
    _, plan = _plan(
        tmp_path,
        [{"name": "A", "path": "d/data.parquet", "tokens": "a", "weight": 1}],
        dp_size=1,
        micro_batches=4,
        steps=4,
        samples_per_step=2,
        max_tokens_per_micro_batch=10,
        overlong="truncate",
    )
    with PlanExecutor(plan, 0) as ex:
        batches = list(ex)
    lengths = [n for b in batches for n in b["cu_seqlens"].diff().tolist()]
    rows = [r for b in batches for r in b["row"].tolist()]
    assert lengths == [min(len(a[r]), 10) for r in rows]
    assert any(len(a[r]) > 10 for r in rows)
    assert all(len(b["input_ids"]) <= 10 for b in batches)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_open_files": 0}, "max_open_files=0 must be an integer >= 1"),
        ({"cache_bytes": -1}, "cache_bytes=-1 must be an integer >= 0"),
        ({"read_threads": 0}, "read_threads=0 must be an integer >= 1"),
        ({"read_threads": 1.5}, "read_threads=1.5 must be an integer"),
    ],
)
def test_bad_limits_are_refused(tmp_path, kwargs, message):
    _two_columns(tmp_path)
    _, plan = _plan(
        tmp_path,
        [{"name": "A", "path": "d/data.parquet", "tokens": "a", "weight": 1}],
        dp_size=1,
    )
    with pytest.raises(ConfigError, match=message):
        PlanExecutor(plan, 0, **kwargs)


@pytest.fixture(scope="module")
def many_files(tmp_path_factory):
    """Twelve one-file Parquet sources (two row groups each) and a plan of 16 samples a
    step, so each step reads most of the files."""
    root = tmp_path_factory.mktemp("many")
    rng = np.random.default_rng(11)
    (root / "d").mkdir()
    sources = []
    for f in range(12):
        rows = [rng.integers(0, 1000, int(n)).tolist() for n in rng.integers(2, 40, 30)]
        pq.write_table(pa.table({"t": rows}), root / "d" / f"f{f:02d}.parquet", row_group_size=15)
        sources.append({"name": f"s{f:02d}", "path": f"d/f{f:02d}.parquet", "tokens": "t"})
        sources[-1]["weight"] = 1
    return _plan(root, sources, dp_size=2, micro_batches=2, steps=12, samples_per_step=16)[1]


def _digests(plan, rank, **kwargs):
    with PlanExecutor(plan, rank, **kwargs) as ex:
        return [batch_digest(b) for b in ex]


@pytest.mark.parametrize("read_threads", [2, 3])
@pytest.mark.parametrize(("max_open_files", "cache_bytes"), [(1, 0), (2, 1 << 20), (64, 256 << 20)])
def test_read_threads_give_the_batches_of_one_thread(
    many_files, read_threads, max_open_files, cache_bytes
):
    for rank in range(2):
        alone = _digests(many_files, rank, read_threads=1, cache_bytes=cache_bytes)
        kwargs = dict(max_open_files=max_open_files, cache_bytes=cache_bytes)
        assert _digests(many_files, rank, read_threads=read_threads, **kwargs) == alone
        assert (
            _digests(many_files, rank, read_threads=read_threads, read_ahead=0, **kwargs) == alone
        )


@pytest.mark.parametrize("read_threads", [1, 2])
def test_a_step_of_more_files_than_may_be_open_opens_each_once(
    many_files, monkeypatch, read_threads
):
    """Page-read files are opened before any is read, a window of `max_open_files` at a
    time: opened all at once, a step's first files were evicted before their reads, which
    opened them again."""
    import mds.executor.catalog.sources as sources_module

    opens, reads = [0], [0]
    real_open, real_read = sources_module.open_reader, SourceCatalog._read

    def open_reader(*args, **kwargs):
        opens[0] += 1
        return real_open(*args, **kwargs)

    def read(self, *args, **kwargs):
        reads[0] += 1
        return real_read(self, *args, **kwargs)

    alone = _digests(many_files, 0, read_ahead=0)
    monkeypatch.setattr(sources_module, "open_reader", open_reader)
    monkeypatch.setattr(SourceCatalog, "_read", read)
    got = _digests(
        many_files, 0, read_threads=read_threads, read_ahead=0, max_open_files=3, cache_bytes=0
    )
    assert got == alone
    assert reads[0] > 12 and opens[0] <= reads[0]


def test_a_reader_evicted_while_another_thread_reads_it_is_closed_when_that_read_ends(
    many_files, monkeypatch
):
    """One open file at most and two threads: the first two reads wait inside `fetch` for
    each other, so the second thread's open evicts the reader the first one is reading; that
    reader is closed only when its read ends. (Reads from pages would all run on the calling
    thread: here they are shared as whole decodes are.)"""
    barrier = threading.Barrier(2, timeout=10)
    lock = threading.Lock()
    reading: set[int] = set()
    calls: list[int] = []
    closed_while_read: list[str] = []
    retired_busy: list[str] = []
    real_fetch, real_close = parquet_reader.ParquetReader.fetch, parquet_reader.ParquetReader.close
    real_retire = SourceCatalog._retire

    def fetch(self, *args, **kwargs):
        with lock:
            reading.add(id(self))
            calls.append(id(self))
            first_two = len(calls) <= 2
        try:
            if first_two:
                barrier.wait()
            return real_fetch(self, *args, **kwargs)
        finally:
            with lock:
                reading.discard(id(self))

    def close(self):
        with lock:
            if id(self) in reading:
                closed_while_read.append(str(self.path))
        real_close(self)

    def retire(self, key, reader):
        if reader in self._busy:
            retired_busy.append(str(reader.path))
        real_retire(self, key, reader)

    alone = _digests(many_files, 0, read_threads=1, read_ahead=0)
    monkeypatch.setattr(parquet_reader.ParquetReader, "fetch", fetch)
    monkeypatch.setattr(parquet_reader.ParquetReader, "close", close)
    monkeypatch.setattr(parquet_reader.ParquetReader, "page_groups", lambda *a, **k: {})
    monkeypatch.setattr(SourceCatalog, "_retire", retire)
    got = _digests(many_files, 0, read_threads=2, read_ahead=0, max_open_files=1)
    assert got == alone
    assert retired_busy and not closed_while_read


@pytest.mark.parametrize("read_ahead", [0, 1])
def test_with_threads_the_first_bad_file_of_a_step_is_the_error_and_at_its_step(
    many_files, monkeypatch, read_ahead
):
    real = parquet_reader.ParquetReader.fetch
    bad = {"d/f03.parquet", "d/f07.parquet"}

    def fetch(self, file_rows, offsets=None, lengths=None, keep=True, pages=None):
        if any(str(self.path).endswith(b) for b in bad):
            raise SourceDataError(f"{self.display}: unreadable")
        return real(self, file_rows, offsets, lengths, keep, pages)

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
