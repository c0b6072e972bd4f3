"""Payloads into token ids: overlong samples cut as the plan truncated them, a sample of
another length than planned refused (exact lengths) or cut (estimated="fit"), and integer
arrays of the planned length used as they are."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from catalog_helpers import plan_of, two_columns

from mds.errors import SourceDataError
from mds.executor import PlanExecutor
from mds.executor.catalog.plan_sources import Source
from mds.executor.catalog.tokens import TokenIds


def test_overlong_samples_are_cut_as_the_plan_truncated_them(tmp_path):
    a, _ = two_columns(tmp_path)
    _, plan = plan_of(
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


def _source(exact: bool, fmt: str = "parquet") -> Source:
    facts = {"format": fmt, "payload": {"kind": "text"}, "length": {"exact": exact}}
    return Source(0, "s", 0, 10, facts, tokenize=lambda text: [ord(c) for c in text])


def test_a_sample_of_another_length_is_refused_or_cut_to_its_planned_length():
    entry = {"path": "d/s.jsonl"}
    ids = TokenIds(SimpleNamespace(sources=[], truncate_to=None))
    with pytest.raises(
        SourceDataError,
        match=r"^source 's' row 3 \(d/s\.jsonl line 5\): tokenize returned 4 tokens, "
        "the index says 3",
    ):
        ids.of_sample(_source(exact=True, fmt="jsonl"), entry, 3, 4, 3, "abcd")
    cut = ids.of_sample(_source(exact=False), entry, 3, 4, 3, "abcd")
    assert cut.tolist() == [97, 98, 99] and cut.dtype == np.int64
    shorter = TokenIds(SimpleNamespace(sources=[], truncate_to=2))
    assert shorter.of_sample(_source(exact=True), entry, 0, 0, 3, "abc").tolist() == [97, 98]
    with pytest.raises(SourceDataError, match=r"tokenize returned token id True, not an integer"):
        bad = Source(0, "s", 0, 10, _source(True).facts, tokenize=lambda text: [1, True])
        ids.of_sample(bad, entry, 0, 0, 2, "ab")
    as_read = np.arange(3, dtype=np.int32)
    assert ids.of_sample(_source(exact=True), entry, 0, 0, 3, as_read).dtype == np.int32
