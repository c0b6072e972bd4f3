"""Freed memory handed back to the system (`give_back`): glibc's malloc keeps freed blocks in
each thread's arena, and holes between blocks that live on (rows read ahead) stay in the
process's RSS; `malloc_trim(0)` returns the free pages of every arena, holes included.
pyarrow's pool gives back what the calling thread's heap keeps (`release_unused`: pages
read from the calling thread are decompressed there).

A call costs about a millisecond on a ~120 MB heap and ~27 ms on a fragmented 1 GB one, and
glibc holds each arena's lock while it trims it, so callers space them out; a process whose
own heap is large (a trainer with big CPU-side state) may turn it off with MDS_GIVE_BACK=off,
read at each call."""

from __future__ import annotations

import ctypes
import os
import sys

from mds.errors import ConfigError

__all__ = ["ENV", "give_back"]

ENV = "MDS_GIVE_BACK"

_trim = None
if sys.platform.startswith("linux"):
    try:
        _trim = ctypes.CDLL(None).malloc_trim
        _trim.argtypes = [ctypes.c_size_t]
        _trim.restype = ctypes.c_int
    except (OSError, AttributeError):  # not glibc: its allocator keeps what it keeps
        _trim = None


def give_back() -> None:
    """Return this process's free malloc pages and pyarrow's unused pool memory (unless
    MDS_GIVE_BACK is `off`)."""
    value = os.environ.get(ENV, "on")
    if value not in ("on", "off"):
        raise ConfigError(f"{ENV}={value!r} must be on or off (hand freed memory back)")
    if value == "off":
        return
    if "pyarrow" in sys.modules:
        sys.modules["pyarrow"].default_memory_pool().release_unused()
    if _trim is not None:
        _trim(0)
