"""Start-up file checks follow the rank's slice, not the corpus: a rank checks the files its
first step reads (not every file of every used source, nor of its chunk), and the files of
each later step when that step is built, before any of its samples is used.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from many_sources import token_plan, token_sources

import mds.executor.catalog.recheck as recheck_module
from mds.executor import DataChangedError, PlanExecutor

STEPS, SAMPLES_PER_STEP, DP, CHUNK_STEPS = 8, 8, 2, 4


@pytest.fixture(scope="module")
def roots(tmp_path_factory) -> dict[int, Path]:
    out = {}
    for files in (10, 2000):
        root = tmp_path_factory.mktemp(f"files-{files}")
        index = token_sources(root, 1, 2 * files, seed=3, mean_len=8, files_per_source=files)
        token_plan(root, index, STEPS, SAMPLES_PER_STEP, dp_size=DP, chunk_steps=CHUNK_STEPS)
        out[files] = root
    return out


def checks_at_start(monkeypatch, plan: Path) -> int:
    calls = []
    real = recheck_module.file_problem

    def counting(*args, **kwargs):
        calls.append(args[1]["path"])
        return real(*args, **kwargs)

    monkeypatch.setattr(recheck_module, "file_problem", counting)
    PlanExecutor(plan, 0).close()
    return len(calls)


def test_files_checked_at_start_do_not_grow_with_the_corpus(roots, monkeypatch):
    few = checks_at_start(monkeypatch, roots[10] / "plan.mds")
    many = checks_at_start(monkeypatch, roots[2000] / "plan.mds")
    step = SAMPLES_PER_STEP // DP  # samples of one rank in one step
    assert few <= step and many <= step, (few, many)


def files_of(ex: PlanExecutor, step_range: range) -> set[str]:
    """The file paths (relative to the root) rank `ex` reads in `step_range`."""
    out = set()
    for step in step_range:
        for micro in range(ex.micro_batches):
            block, lo, hi = ex._slice(step, micro)
            for f in block.fetch.file[lo:hi].tolist():
                out.add(block.fetch.files[f][2]["path"])
    return out


def later_only_file(root: Path) -> str:
    with PlanExecutor(root / "plan.mds", 0, verify="none") as ex:
        later = files_of(ex, range(CHUNK_STEPS, STEPS)) - files_of(ex, range(CHUNK_STEPS))
    assert later, "the fixture's second chunk reads no file the first does not"
    return sorted(later)[0]


@pytest.mark.parametrize("respawn", [False, True])
def test_a_file_changed_in_a_later_chunk_is_caught_before_its_samples(roots, respawn):
    root = roots[2000]
    rel = later_only_file(root)
    path = root / rel
    st = path.stat()
    original = path.read_bytes()
    path.write_bytes(bytes([original[0] ^ 1]) + original[1:])  # same size, new mtime
    try:
        ex = PlanExecutor(root / "plan.mds", 0)  # the first chunk does not read it
        if respawn:  # what a spawned DataLoader worker gets: the checks must go on
            rebuild, args, state = ex.__reduce__()
            ex = rebuild(*args)
            ex.__setstate__(state)  # as unpickling does
        steps = []
        with pytest.raises(DataChangedError, match=f"^source 's00000': {rel}: content changed"):
            for batch in ex:
                steps.append(batch["step"])
        # Raised at the first step that reads the file: every step before it was handed out.
        first_use = next(s for s in range(STEPS) if rel in files_of(ex, range(s, s + 1)))
        assert first_use >= CHUNK_STEPS and steps == sorted(steps)
        assert steps[-1] == first_use - 1 and steps.count(steps[-1]) == ex.micro_batches
        ex.close()
    finally:
        path.write_bytes(original)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
