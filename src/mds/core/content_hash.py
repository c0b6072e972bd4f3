"""A sample's content hash: one stable digest of what the executor reads for it, so a
sample traced in a plan, exported, or named in an exclude list is the same document
whichever file, format or integer width holds it.

BLAKE2b with a 16-byte digest, hex, over a kind tag then the content:
- token ids: b"mds-tokens\\0" + the ids as little-endian int64 (so int32 and int64
  files of the same ids give the same hash);
- text: b"mds-text\\0" + the UTF-8 text, before tokenization;
- text with images: b"mds-image-text\\0" + the text's UTF-8 length (u64 LE) and bytes, then
  per image, in the sample's order, its length (u64 LE) and encoded bytes.
The tags keep the kinds apart (a text is never its own token ids). docs/plan-format.md,
"Content hash", is the spec; tests/core/test_content_hash.py pins vectors of it.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

__all__ = ["DIGEST_SIZE", "content_hash", "hash_image_text", "hash_text", "hash_tokens"]

DIGEST_SIZE = 16
_U64 = struct.Struct("<Q")


def _blake(tag: bytes) -> Any:
    h = hashlib.blake2b(digest_size=DIGEST_SIZE)
    h.update(tag)
    return h


def hash_tokens(ids: Sequence[int] | np.ndarray) -> str:
    """The hash of token ids, whatever integer type holds them."""
    array = np.asarray(ids)
    if array.size and array.dtype.kind not in "iu":
        raise TypeError(f"token ids must be integers, got {array.dtype}")
    h = _blake(b"mds-tokens\0")
    h.update(np.ascontiguousarray(array.reshape(-1), dtype="<i8").tobytes())
    return h.hexdigest()


def hash_text(text: str) -> str:
    """The hash of a text sample (UTF-8, before tokenization)."""
    h = _blake(b"mds-text\0")
    h.update(text.encode("utf-8"))
    return h.hexdigest()


def hash_image_text(text: str, images: Iterable[bytes]) -> str:
    """The hash of a sample of text with images: the text, then each image's bytes."""
    h = _blake(b"mds-image-text\0")
    data = text.encode("utf-8")
    h.update(_U64.pack(len(data)))
    h.update(data)
    for image in images:
        h.update(_U64.pack(len(image)))
        h.update(image)
    return h.hexdigest()


def content_hash(payload: Any) -> str:
    """The hash of a payload as the executor's readers give it: token ids (an integer
    array), a text (str), or text with images (an object with `text` and `images`)."""
    if isinstance(payload, str):
        return hash_text(payload)
    if hasattr(payload, "text") and hasattr(payload, "images"):
        return hash_image_text(payload.text, payload.images)
    return hash_tokens(payload)
