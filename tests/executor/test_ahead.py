"""Read-ahead: steps built in a background thread give the batches of a run without it, read
each file once per step, keep errors at the step that reads the bad file, and follow seeks."""

from __future__ import annotations

import pytest
from executor_builders import batch_digest, open_executor, sample_plan, uninterrupted

import mds.executor.sources as sources_module
from mds.executor import PlanExecutor
from mds.executor.errors import ConfigError


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    return sample_plan(tmp_path_factory)[1]


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_every_depth_gives_the_same_batches(plan, depth):
    for rank in range(4):
        with open_executor(plan, rank, read_ahead=depth) as ex:
            assert [batch_digest(b) for b in ex] == uninterrupted(plan, rank)


def test_a_seek_while_steps_are_built_ahead(plan):
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


def test_a_step_reads_each_file_once(plan, monkeypatch):
    """Built ahead, a step is one fetch, and its samples from one file one reader call (or
    none, when rows read ahead with an earlier step hold them all)."""
    fetches: list[list[tuple[int, int]]] = []  # per fetch call, the files it read
    real_fetch, real_read = (
        sources_module.SourceCatalog.fetch,
        sources_module.SourceCatalog._read,
    )

    def fetch(self, block, lo, hi):
        fetches.append([])
        return real_fetch(self, block, lo, hi)

    def read(self, block, s, file_id, entry, now, later):
        fetches[-1].append((s.sid, file_id))
        return real_read(self, block, s, file_id, entry, now, later)

    monkeypatch.setattr(sources_module.SourceCatalog, "fetch", fetch)
    monkeypatch.setattr(sources_module.SourceCatalog, "_read", read)
    with open_executor(plan, 0, read_ahead=1) as ex:
        assert sum(1 for _ in ex) == ex.steps * ex.micro_batches
    assert len(fetches) == ex.steps
    assert fetches[0] and all(len(files) == len(set(files)) for files in fetches)


def test_read_ahead_must_be_a_count(plan):
    for bad in (-1, 1.5, True):
        with pytest.raises(ConfigError, match="read_ahead"):
            PlanExecutor(plan, 0, read_ahead=bad)
