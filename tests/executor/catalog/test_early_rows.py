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

    def fetch(self, file_rows, offsets=None, lengths=None, keep=True, pages=None, rent=False):
        if str(self.path).endswith(path) and row in np.asarray(file_rows).tolist():
            raise SourceDataError(f"{path} row {row}: unreadable")
        return real(self, file_rows, offsets, lengths, keep, pages, rent)

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
    """Bytes the kept payloads really hold: each array once (a view holds its whole base)."""
    arrays, rest = {}, 0
    for payload, *_ in ahead._kept.values():
        if isinstance(payload, np.ndarray):
            owner = payload.base if isinstance(payload.base, np.ndarray) else payload
            arrays[id(owner)] = owner.nbytes
            rest += lookahead_module._PAYLOAD_HEADER
        else:  # a line of text
            rest += lookahead_module._payload_bytes(payload)
    return sum(arrays.values()) + rest


def test_views_of_one_array_count_the_whole_array_until_the_last_is_let_go():
    """Rows read from Parquet pages are views of one array: this step's rows, the kept rows
    and any refused ones. What is kept is counted as what stays in memory."""
    header = lookahead_module._PAYLOAD_HEADER
    ahead = Lookahead(max_bytes=10_000)
    read = np.arange(1000, dtype=np.int32)  # 4000 bytes: 10 rows of 100 values
    rows = [read[k * 100 : (k + 1) * 100] for k in range(10)]
    own = np.arange(50, dtype=np.int64)  # a copy of its own: counted by itself
    ahead.keep([5, 6, 7, 8], [rows[2], rows[3], own, rows[9]])  # rows 0-1: this step's
    assert ahead.nbytes == _held(ahead) == 4000 + own.nbytes + 4 * header
    out: list = [None] * 2
    assert ahead.take(0, 5, 7, out).tolist() == [] and out[0] is rows[2]
    assert ahead.nbytes == _held(ahead) == 4000 + own.nbytes + 2 * header  # row 9 holds it all
    ahead.take(0, 7, 9, out)
    assert ahead.nbytes == _held(ahead) == 0 and not ahead._arrays
    # An array that does not fit is not kept, even for a row that alone would fit.
    small = Lookahead(max_bytes=3000)
    small.keep([0, 1], [rows[0], own])
    assert list(small._kept) == [] and small.nbytes == 0
    # Dropped rows (a seek, another worker's micro-batches) let the array go as well.
    ahead.keep([20, 21], [rows[0], rows[1]])
    ahead.take(0, 22, 23, [None])
    assert ahead.nbytes == 0 and not ahead._arrays and not ahead._kept


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


def test_rows_of_a_decode_are_copied_out_narrow_where_their_values_fit():
    from mds.executor.catalog.early_rows import narrowed

    decode = np.arange(1000, dtype=np.int32) * 60  # values up to 59,940: fit uint16
    wide = np.array([5, 70_000, 9, 11], dtype=np.int32)
    rows = [decode[10:20], decode[500:510], "text", wide[1:2], decode[900:901]]
    out = narrowed(rows)
    for got, want in zip(out, rows, strict=True):
        if isinstance(want, str):
            assert got is want
            continue
        assert np.array_equal(got.astype(np.int64), want.astype(np.int64))
    assert {out[k].dtype for k in (0, 1, 4)} == {np.dtype(np.uint16)}
    assert out[0].base is out[1].base is out[4].base  # one array of those rows alone
    assert out[0].base.nbytes == 21 * 2 and out[0].base is not decode
    # its value needs 4 bytes: the row is copied out at its width
    assert out[3].dtype == np.int32 and out[3].base is not wide
    whole = np.array([70_000, 2, 3], dtype=np.int32)
    assert narrowed([whole[0:3]])[0].base is whole  # no smaller than the decode: kept as is
