"""The content hash: pinned values (a change to the definition fails here, never in
silence), the same hash for any integer width, and kinds kept apart."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mds.core.content_hash import content_hash, hash_image_text, hash_text, hash_tokens

# Computed once from the definition in docs/plan-format.md ("Content hash").
VECTORS = [
    (lambda: hash_tokens([1, 2, 3]), "deae6bdfc19cdd9c8324822c28172f2f"),
    (lambda: hash_tokens([]), "a1c0ab77f065514f02c64c90492ffd31"),
    (lambda: hash_text("hello"), "82202b1be937a028a886d6371eee542b"),
    (lambda: hash_text(""), "0fbf8b4ec74e09576b7bf65c2220e69c"),
    (lambda: hash_text("héllo"), "6ce9ac90c3bd5f8b4227861f30c4e9db"),
    (lambda: hash_image_text("a<image>b", [b"\x89PNG", b"xy"]), "bf34a11ce53e3fc89455dcbc4fae74ab"),
]


@pytest.mark.parametrize(("make", "expected"), VECTORS)
def test_pinned_vectors(make, expected):
    assert make() == expected


def test_definition_spelled_out():
    """The bytes hashed are the documented ones."""
    ids = np.array([7, 2**40, 0], dtype="<i8")
    expected = hashlib.blake2b(b"mds-tokens\0" + ids.tobytes(), digest_size=16).hexdigest()
    assert hash_tokens(ids) == expected
    text = "ünï"
    body = b"mds-text\0" + text.encode()
    assert hash_text(text) == hashlib.blake2b(body, digest_size=16).hexdigest()


@given(st.lists(st.integers(0, 2**31 - 1), max_size=50))
def test_width_and_container_do_not_matter(ids):
    want = hash_tokens(ids)
    for dtype in ("<i4", ">i4", "<i8", "<u4", "<u8"):
        assert hash_tokens(np.array(ids, dtype=dtype)) == want


def test_kinds_kept_apart():
    assert hash_text("\x01\x00\x00\x00\x00\x00\x00\x00") != hash_tokens([1])
    assert hash_image_text("x", []) != hash_text("x")
    assert hash_image_text("ab", [b"c"]) != hash_image_text("a", [b"bc"])


def test_content_hash_dispatch():
    assert content_hash(np.array([1, 2, 3], dtype=np.int32)) == VECTORS[0][1]
    assert content_hash("hello") == VECTORS[2][1]
    sample = SimpleNamespace(text="a<image>b", images=[b"\x89PNG", b"xy"])
    assert content_hash(sample) == VECTORS[5][1]
    with pytest.raises(TypeError):
        hash_tokens(np.array([1.5]))
