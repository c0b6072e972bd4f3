"""Rows read ahead: the batches of a run that reads each step alone, each row group decoded
once while the budget holds the rank's rows, a later row's problem raised at its own step,
memory within the budget, and worker strides that keep only their own rows."""

from __future__ import annotations

import os
from collections import Counter

import numpy as np
import pytest
from executor_builders import batch_digest, open_executor, sample_plan, uninterrupted

import mds.executor.catalog.early_rows as lookahead_module
import mds.executor.readers.parquet as parquet_reader
import mds.formats.parquet.pages as parquet_pages
from mds.core.lru import LRU
from mds.core.planfile_reader import PlanReader
from mds.core.row_slices import RowSlices
from mds.errors import SourceDataError
from mds.executor.catalog.early_rows import FIRST_LATER, MAX_LATER, Lookahead


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    return sample_plan(tmp_path_factory)[1]


def digests(plan, rank: int, **kwargs) -> list[str]:
    with open_executor(plan, rank, **kwargs) as ex:
        return [batch_digest(b) for b in ex]


@pytest.mark.parametrize("cache_bytes", [0, 4096, 1 << 20])
@pytest.mark.parametrize("read_ahead", [0, 1])
def test_any_budget_gives_the_batches_of_the_default(plan, cache_bytes, read_ahead):
    """cache_bytes=0 reads each step alone; a tiny budget keeps only some later rows."""
    for rank in range(4):
        got = digests(plan, rank, cache_bytes=cache_bytes, read_ahead=read_ahead)
        assert got == uninterrupted(plan, rank)


def _decodes(plan, monkeypatch, **kwargs) -> list[tuple[str, int]]:
    """(file, row group) of every Parquet decode of rank 0's run, whole or from pages, with
    no block cache, so only rows read ahead can spare a decode."""
    calls: list[tuple[str, int]] = []
    real = parquet_reader.ParquetReader._read
    real_pages = parquet_pages.read_rows

    def counted(self, i, need, whole, row, own=True):
        calls.append((os.path.realpath(self.path), i))
        return real(self, i, need, whole, row, own)

    def counted_pages(fd, lay, i, offsets, lengths, *most):
        got = real_pages(fd, lay, i, offsets, lengths, *most)
        if got is not None:
            calls.append((os.readlink(f"/proc/self/fd/{fd}"), i))
        return got

    with monkeypatch.context() as m:
        m.setattr(parquet_reader.ParquetReader, "_read", counted)
        m.setattr(parquet_pages, "read_rows", counted_pages)
        m.setattr(parquet_reader.ParquetReader, "_room", lambda self, i: False)
        m.setattr(LRU, "put", lambda self, key, value, nbytes=0: None)
        assert digests(plan, 0, **kwargs) == uninterrupted(plan, 0)
    return calls


def test_a_row_group_is_decoded_a_few_times_per_run_across_chunks(plan, monkeypatch):
    """The sample plan has four chunks and the budget holds all of rank 0's rows: a row
    group is decoded again only after the 256 later rows taken with it are used, against
    once per step that reads it without reading ahead."""
    with PlanReader(plan) as reader:
        assert len(reader.chunks) > 1
        assert reader.steps == 64
    ahead = _decodes(plan, monkeypatch, cache_bytes=64 << 20)
    alone = _decodes(plan, monkeypatch, cache_bytes=0)
    assert ahead and set(alone) == set(ahead)
    assert max(Counter(ahead).values()) <= 2
    assert len(alone) > 2 * len(ahead)


def _bad_row_at_a_later_step(plan) -> tuple[int, str, int]:
    """(step, file, row) of rank 0's last Parquet sample of 'web' whose file was read by an
    earlier step too, so reading ahead meets it early."""
    with open_executor(plan, 0) as ex:
        web = ex.source_names.index("web")
        seen: dict[str, int] = {}
        last = None
        with PlanReader(plan) as reader:
            for chunk in range(len(reader.chunks)):
                block = reader.rank_chunk(chunk, 0)
                rec = block.fetch
                steps = np.repeat(np.arange(block.counts.shape[0]), block.counts.sum(axis=1))
                for j in range(len(block.ids)):
                    sid, _fid, entry = rec.files[int(rec.file[j])]
                    step = block.step_start + int(steps[j])
                    if sid == web:
                        path = entry["path"]
                        if path in seen and seen[path] < step:
                            last = (step, path, int(rec.row[j]))
                        seen.setdefault(path, step)
    assert last is not None
    return last


@pytest.mark.parametrize("read_ahead", [0, 1])
def test_a_later_rows_problem_is_raised_at_its_own_step(plan, monkeypatch, read_ahead):
    step, path, row = _bad_row_at_a_later_step(plan)
    real = parquet_reader.ParquetReader.fetch

    def fetch(self, file_rows, offsets=None, lengths=None, keep=True, pages=None, rent=False, **kw):
        if str(self.path).endswith(path) and row in np.asarray(file_rows).tolist():
            raise SourceDataError(f"{path} row {row}: unreadable")
        return real(self, file_rows, offsets, lengths, keep, pages, rent, **kw)

    monkeypatch.setattr(parquet_reader.ParquetReader, "fetch", fetch)
    expected = uninterrupted(plan, 0)
    got = []
    with open_executor(plan, 0, read_ahead=read_ahead) as ex:
        with pytest.raises(SourceDataError, match=f"row {row}: unreadable"):
            for batch in ex:
                got.append(batch_digest(batch))
        assert ex.position[0] == step
    assert got == expected[: len(got)] and len(got) >= step * ex.micro_batches


def test_rows_kept_stay_within_the_budget(plan, monkeypatch):
    peaks = []
    real = Lookahead.keep

    def keep(self, index, payloads):
        real(self, index, payloads)
        assert 0 <= self.nbytes <= self.max_bytes
        assert self.nbytes == _held(self)
        peaks.append(self.nbytes)

    monkeypatch.setattr(Lookahead, "keep", keep)
    for cache_bytes in (16 << 10, 256 << 10):
        assert digests(plan, 1, cache_bytes=cache_bytes) == uninterrupted(plan, 1)
    assert peaks and max(peaks) > 0


def _held(ahead: Lookahead) -> int:
    """Bytes the kept payloads really hold: each read's RowSlices once, with a dict entry a
    row kept of it; an array or a line of text by itself."""
    slices, rest = {}, 0
    for kept in ahead._kept.values():
        if type(kept) is int:
            values = ahead._slices[kept >> 2 * lookahead_module._BOUND][0]
            slices[id(values)] = values.nbytes + lookahead_module._SLICES_HEADER
            rest += lookahead_module._SLICE_ROW
        else:
            payload = kept[0]
            assert not isinstance(payload, np.ndarray) or payload.base is None
            rest += lookahead_module._payload_bytes(payload)
    return sum(slices.values()) + rest


def test_rows_of_one_read_count_its_array_until_the_last_is_let_go():
    """Rows read from Parquet pages come as one RowSlices: this step's rows, the kept rows
    and any refused ones. What is kept is counted as what stays in memory."""
    row, whole = lookahead_module._SLICE_ROW, lookahead_module._SLICES_HEADER
    ahead = Lookahead(max_bytes=10_000)
    read = RowSlices.of_lengths(np.arange(1000, dtype=np.int32), np.full(10, 100))
    later = read[2:5]  # rows 0-1: this step's
    size = read.values.nbytes + whole  # 4000 bytes of values
    own = np.arange(50, dtype=np.int64)  # an array of its own: counted by itself
    ahead.keep([5, 6, 8], later)
    ahead.keep([7], [own])
    assert ahead.nbytes == _held(ahead) == size + own.nbytes + 112 + 3 * row
    out: list = [None] * 2
    assert ahead.take(0, 5, 7, out).tolist() == []
    assert np.array_equal(out[0], np.arange(200, 300)) and out[0].base is read.values
    assert ahead.nbytes == _held(ahead) == size + own.nbytes + 112 + row  # row 8 holds it
    ahead.take(0, 7, 9, out)
    assert out[0] is own and np.array_equal(out[1], np.arange(400, 500))
    assert ahead.nbytes == _held(ahead) == 0 and not ahead._slices
    # An array that does not fit is not kept, even for a row that alone would fit; a view
    # kept is copied, not to hold the array it is a view of.
    small = Lookahead(max_bytes=3000)
    small.keep([0], read[0:1])
    assert list(small._kept) == [] and small.nbytes == 0
    small.keep([1], [read.values[:10]])
    assert small._kept[1][0].base is None and small.nbytes == _held(small) == 40 + 112
    # Rows kept past the budget's end are refused, the first ones kept.
    five = read[0:5]
    tight = Lookahead(max_bytes=size + 3 * row)
    tight.keep([0, 1, 2, 3, 4], five)
    assert sorted(tight._kept) == [0, 1, 2] and tight.nbytes == _held(tight) == tight.max_bytes
    # Dropped rows (a seek, another worker's micro-batches) let the array go as well.
    ahead.keep([20, 21], read[0:2])
    ahead.take(0, 22, 23, [None])
    assert ahead.nbytes == 0 and not ahead._slices and not ahead._kept


@pytest.mark.parametrize("stride", [2, 3])
def test_a_worker_keeps_only_rows_of_its_own_micro_batches(plan, stride):
    with PlanReader(plan) as reader:
        block = reader.rank_chunk(0, 2)
        ahead = Lookahead(1 << 30, stride, lambda b: None)
        base = ahead.bind(block)
        assert len(ahead.take(base, 0, int(block.counts.ravel()[0]), [None] * 64))
        micro = np.repeat(np.arange(block.counts.size), block.counts.ravel())
        lo, hi = 0, int(block.counts.ravel()[0])
        rec = block.fetch
        for f in range(len(rec.files)):
            sid, fid, entry = rec.files[f]
            later = ahead.later((sid, fid), entry, base, lo, hi)
            assert np.all(later.index >= hi)
            assert np.all(micro[later.index] % stride == 0)
            every = np.flatnonzero(rec.file == f)
            mine = every[(every >= hi) & (micro[every] % stride == 0)][:FIRST_LATER]
            assert later.index.tolist() == mine.tolist()


def test_the_window_reaches_only_as_far_as_the_budget(plan, monkeypatch):
    monkeypatch.setattr(lookahead_module, "FIRST_LATER", MAX_LATER)
    with PlanReader(plan) as reader:
        blocks = [reader.rank_chunk(c, 0) for c in range(len(reader.chunks))]
    follow = {b.step_start: n for b, n in zip(blocks, blocks[1:] + [None], strict=True)}
    tokens = np.concatenate([b.fetch.tokens for b in blocks]).astype(np.int64)
    h = len(blocks[0].ids) // 2
    for budget in (0, 4096, 64 << 10, 1 << 30):
        ahead = Lookahead(budget, 1, lambda b: follow[b.step_start])
        base = ahead.bind(blocks[0])
        ahead.take(base, 0, h, [None] * h)
        reach = h
        for sid, fid, entry in blocks[0].fetch.files:
            later = ahead.later((sid, fid), entry, base, 0, h)
            if len(later):
                assert later.index.min() >= h
                reach = max(reach, int(later.index.max()))
        assert 4 * int(tokens[h:reach].sum()) <= budget
        if budget >= 4 * int(tokens.sum()):
            assert reach >= len(blocks[0].ids)  # past the first chunk


def test_the_first_fetch_takes_few_rows_ahead_and_the_cap_doubles(plan):
    """The time to the first batch stays what it is without reading ahead."""
    with PlanReader(plan) as reader:
        block = reader.rank_chunk(0, 0)
    ahead = Lookahead(1 << 30, 1, lambda b: None)
    base = ahead.bind(block)
    rec = block.fetch
    caps = []
    for k in range(6):
        ahead.take(base, k, k + 1, [None])
        f = int(rec.file[k])
        sid, fid, entry = rec.files[f]
        later = ahead.later((sid, fid), entry, base, k, k + 1)
        every = np.flatnonzero(rec.file == f)
        caps.append(min(len(later), len(every[every > k])))
        assert len(later) <= min(MAX_LATER, FIRST_LATER << k)
    assert caps[0] <= FIRST_LATER
