"""content_hashes: rows of a source hashed on demand, as trace hashes them in a plan."""

from __future__ import annotations

import pytest
from plan_builders import sample_index, sample_plan_config

from mds.cli.contents import content_hashes, trace_payloads
from mds.core.content_hash import content_hash
from mds.errors import ConfigError
from mds.planner.plan.build import build_plan
from mds.planner.report.trace import trace_plan


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    index = sample_index(tmp_path_factory)
    path = tmp_path_factory.mktemp("contents") / "plan.mds"
    build_plan(sample_plan_config(index), path)
    return path


def test_hashes_of_rows_are_the_traced_ones(plan, monkeypatch):
    """In batches of 3 rows (the index table read once), as trace hashes them."""
    from mds.cli import contents

    monkeypatch.setattr(contents, "_BATCH", 3)
    trace = trace_plan(plan, (20, 24))
    traced = [content_hash(p) for p in trace_payloads(trace)]
    frame = trace.frame.with_columns(content_hash=__import__("polars").Series(traced))
    for source in ("web", "books", "forum", "code", "wiki", "math"):
        part = frame.filter(frame["source"] == source)
        if part.height:
            rows = part["row"].to_list()
            assert content_hashes(plan, source, rows) == part["content_hash"].to_list(), source


def test_from_an_index_without_a_plan(plan, tmp_path_factory):
    """An index directory alone gives the same hashes (rows of sources any plan may draw)."""
    index = sample_index(tmp_path_factory)
    for source in ("forum", "web", "code", "wiki"):
        rows = [0, 5, 2, 5]
        assert content_hashes(index, source, rows) == content_hashes(plan, source, rows)
    with pytest.raises(ConfigError, match="'nope' is not in the index"):
        content_hashes(index, "nope", [0])


def test_unknown_source_and_row(plan):
    with pytest.raises(ConfigError, match="'nope' is not drawn from"):
        content_hashes(plan, "nope", [0])
    with pytest.raises(ConfigError, match="row 10000000 is outside"):
        content_hashes(plan, "web", [10_000_000])


def test_reading_contents_imports_no_torch(plan):
    """A planning box without torch traces and hashes: nothing on the way imports it."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from mds.cli.contents import trace_payloads\n"
        "from mds.planner.report.trace import trace_plan\n"
        f"trace_payloads(trace_plan({str(plan)!r}, (3, 4)))\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=300)
