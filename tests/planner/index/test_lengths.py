"""Tokenizer counts at index time come in bounded batches, each preceded by the scan's stop
check, so an interrupt is acted on within a batch however long the texts are."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer

from mds.planner.index import lengths
from mds.planner.index.lengths import token_counts
from mds.planner.index.scan import Stopped

TOKENIZER = "sample_data/tokenizer.json"


@pytest.fixture()
def tok(request) -> Tokenizer:
    return Tokenizer.from_file(str(request.config.rootpath / TOKENIZER))


def test_batches_are_bounded_by_texts_and_characters(tok, monkeypatch):
    monkeypatch.setattr(lengths, "TOKENIZE_BATCH", 4)
    monkeypatch.setattr(lengths, "TOKENIZE_CHARS", 100)
    texts = ["the " * 10, None, "a b c", *["word " * 30] * 3, "x"]
    sizes, fractions = [], []
    real = tok.encode_batch

    class Counting:
        def encode_batch(self, batch, add_special_tokens):
            sizes.append(len(batch))
            return real(batch, add_special_tokens=add_special_tokens)

    stops = []
    counts = token_counts(Counting(), texts, lambda: stops.append(1), fractions.append)
    expected = [len(tok.encode(t, add_special_tokens=False).ids) if t else None for t in texts]
    assert counts == expected
    # 4 texts at most, and a batch ends once it holds 100 characters or more
    assert sizes == [3, 1, 1, 1] and len(stops) == 4  # the first: 4 texts, None not sent
    assert fractions[-1] == 1.0 and fractions == sorted(fractions)


def test_a_stop_ends_the_count_between_batches(tok, monkeypatch):
    monkeypatch.setattr(lengths, "TOKENIZE_CHARS", 10)
    calls = []

    def stop() -> None:
        calls.append(1)
        if len(calls) == 3:
            raise Stopped()

    with pytest.raises(Stopped):
        token_counts(tok, ["some text here"] * 10, stop)
    assert len(calls) == 3
