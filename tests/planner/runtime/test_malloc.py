"""src/mds/planner/runtime/malloc.py: freed blocks stay in the process, so reusing them faults no pages in.

mallopt changes the whole process, so every check runs in a process of its own.
"""

from __future__ import annotations

import platform
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from mds.planner.runtime.engine import EngineSpec, open_engine
from mds.planner.runtime.malloc import keep_freed_memory

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
    reason="the settings are glibc's",
)

_CYCLES, _ARRAYS, _BYTES = 10, 8, 4 << 20  # as planning a chunk: 32 MiB taken, then freed
_PAGES = _ARRAYS * _BYTES // resource.getpagesize()  # one cycle's pages


def _faults_of_reuse(tune: bool) -> int:
    """Minor page faults of `_CYCLES` rounds of allocating and filling `_ARRAYS` arrays of
    `_BYTES`, then freeing them all (after one warm-up round), in this process, tuned first
    if `tune`."""
    import numpy as np

    if tune:
        assert keep_freed_memory()

    def cycle() -> None:
        arrays = [np.ones(_BYTES // 4, dtype=np.float32) for _ in range(_ARRAYS)]
        del arrays

    cycle()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(_CYCLES):
        cycle()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def _in_a_process(tune: bool) -> int:
    code = (
        "import sys; sys.path.insert(0, sys.argv[2]); import test_malloc; "
        "print(test_malloc._faults_of_reuse(sys.argv[1] == '1'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, "1" if tune else "0", str(Path(__file__).parent)],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout)


def test_freed_blocks_are_reused_without_page_faults():
    # By default glibc gives the freed memory back (the heap's top is trimmed), and every
    # round faults its pages in again; tuned, the first round's pages serve all the others.
    assert _in_a_process(tune=False) >= _CYCLES * _PAGES // 4
    assert _in_a_process(tune=True) < _PAGES


def test_forked_planning_workers_are_tuned():
    with open_engine(
        EngineSpec("local"), 2, processes=True, fork=True, initializer=keep_freed_memory
    ) as pool:
        faults = list(pool.map(_faults_of_reuse, [(False,), (False,)]))
    assert all(f < _PAGES for f in faults), faults
