"""The open files: a reader evicted while another thread reads it is closed only when that
read ends, and at most `max_open_files` readers stay open."""

from __future__ import annotations

import threading

from catalog_helpers import digests

import mds.executor.readers.parquet as parquet_reader
from mds.executor import PlanExecutor
from mds.executor.catalog.open_files import OpenFiles


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
    real_retire = OpenFiles._retire

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

    alone = digests(many_files, 0, read_threads=1, read_ahead=0)
    monkeypatch.setattr(parquet_reader.ParquetReader, "fetch", fetch)
    monkeypatch.setattr(parquet_reader.ParquetReader, "close", close)
    monkeypatch.setattr(parquet_reader.ParquetReader, "page_groups", lambda *a, **k: {})
    monkeypatch.setattr(OpenFiles, "_retire", retire)
    got = digests(many_files, 0, read_threads=2, read_ahead=0, max_open_files=1)
    assert got == alone
    assert retired_busy and not closed_while_read


def test_at_most_max_open_files_stay_open(many_files):
    with PlanExecutor(many_files, 0, max_open_files=3, read_ahead=0) as ex:
        for _ in ex:
            assert len(ex._catalog.files) <= 3
        assert len(ex._catalog.files) == 3
    assert len(ex._catalog.files) == 0  # closed with the executor
