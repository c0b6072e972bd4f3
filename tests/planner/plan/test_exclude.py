"""--exclude: listed documents leave their sources' streams from K on; every other sample
keeps its order, the places are filled by the same sources, the per-step mix is the plain
re-plan's, and the lineage reports what matched."""

from __future__ import annotations

from collections import Counter

import numpy as np
import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from plan_builders import sample_index, sample_plan_config, step_ids

from mds.core.index_manifest import index_sources
from mds.core.planfile_reader import PlanReader
from mds.errors import ConfigError
from mds.planner.index.tables import read_manifest
from mds.planner.plan.build import build_plan, with_overrides
from mds.planner.plan.chunk import Planner
from mds.planner.plan.derive import parent_cursors
from mds.planner.plan.exclude import Exclusion, read_exclude_list, resolve_entries

STEPS = 40


@pytest.fixture(scope="module")
def parent(tmp_path_factory):
    index = sample_index(tmp_path_factory)
    config = with_overrides(sample_plan_config(index), steps=STEPS)
    out = tmp_path_factory.mktemp("exclude") / "parent.mds"
    build_plan(config, out)
    return config, out


def exclusion_of(path, config, missing="error") -> Exclusion:
    found = read_exclude_list(path)
    ids, given, _ = resolve_entries(found, read_manifest(config.index), missing)
    return Exclusion(ids, given, path.name, found.digest, found.entries)


def named(config, ids) -> list[tuple[str, int]]:
    """(source, row) of global ids."""
    sources = index_sources(read_manifest(config.index))
    out = []
    for gid in ids:
        s = next(s for s in sources if s["base"] <= gid < s["base"] + s["rows"])
        out.append((s["name"], int(gid - s["base"])))
    return out


def expected_after(config, old, at, counts: dict[str, int], left_out: set[int]) -> Counter:
    """What the re-plan from `at` must draw: each source's stream without exclusions, from its
    cursor in the old plan at `at`, with the left-out ids passed over, `counts[name]` draws."""
    planner = Planner(config)
    with PlanReader(old) as reader:
        cursors, _ = parent_cursors(reader, at)
    out: Counter = Counter()
    for pool, stream in zip(planner.pools, planner.streams, strict=True):
        want, start, got = counts.get(pool.name, 0), cursors[pool.name][0], []
        while len(got) < want:
            ids = pool.base + np.asarray(pool.rows[stream.positions(start, 64)], np.int64)
            got += [i for i in ids.tolist() if i not in left_out]
            start += 64
        out.update(got[:want])
    return out


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(at=st.integers(0, STEPS - 1), data=st.data())
def test_excluded_documents_never_appear_and_nothing_else_moves(parent, tmp_path_factory, at, data):
    config, old = parent
    total = sum(s["rows"] for s in index_sources(read_manifest(config.index)))
    left_out = data.draw(st.sets(st.integers(0, total - 1), min_size=1, max_size=60))
    work = tmp_path_factory.mktemp("ex")
    listed = work / "bad.csv"
    pl.DataFrame(named(config, sorted(left_out)), schema=["source", "row"], orient="row").write_csv(listed)
    out, plain = work / "child.mds", work / "plain.mds"
    build_plan(config, out, parent=old, at_step=at, exclusion=exclusion_of(listed, config))
    build_plan(config, plain, parent=old, at_step=at)
    drawn = [i for ids in step_ids(out, at, STEPS).values() for i in ids]
    assert not set(drawn) & left_out
    with PlanReader(out) as a, PlanReader(plain) as b:
        # the places are the same sources' at every step: the mix is the plain re-plan's
        assert np.array_equal(a.section("source_samples"), b.section("source_samples"))
        counts = dict(zip([s["name"] for s in a.footer["sources"]], a.section("source_samples").sum(axis=0).tolist(), strict=True))
        assert a.footer["lineage"]["exclude"]["matched"] == len(left_out)
        assert np.array_equal(a.section("excluded"), sorted(left_out))
    # each source continues its stream in order, passing over the excluded ids only
    assert Counter(drawn) == expected_after(config, old, at, counts, left_out)


def test_the_exclusion_holds_for_plans_derived_from_it(parent, tmp_path):
    config, old = parent
    bad = step_ids(old, 20, 24)
    left_out = {i for ids in bad.values() for i in ids}
    listed = tmp_path / "bad.jsonl"
    pl.DataFrame(named(config, sorted(left_out)), schema=["source", "row"], orient="row").write_ndjson(listed)
    mid = tmp_path / "mid.mds"
    summary = build_plan(config, mid, parent=old, at_step=10, exclusion=exclusion_of(listed, config))
    assert summary.exclude["trained_before"] == 0 and summary.exclude["entries"] == len(left_out)
    out = tmp_path / "next.mds"
    build_plan(config, out, parent=mid, at_step=15)
    assert not {i for ids in step_ids(out, 15, STEPS).values() for i in ids} & left_out
    with PlanReader(out) as reader:
        assert np.array_equal(reader.section("excluded"), sorted(left_out))


def test_documents_trained_before_k_are_counted(parent, tmp_path):
    config, old = parent
    seen = sorted({i for ids in step_ids(old, 0, 3).values() for i in ids})
    listed = tmp_path / "seen.parquet"
    pl.DataFrame(named(config, seen), schema=["source", "row"], orient="row").write_parquet(listed)
    summary = build_plan(config, tmp_path / "x.mds", parent=old, at_step=5, exclusion=exclusion_of(listed, config))
    assert summary.exclude["trained_before"] == len(seen)
    assert sum(s["given"] for s in summary.exclude["sources"].values()) == len(seen)


def test_file_entries_name_the_same_documents_as_source_rows(parent, tmp_path):
    """An export's (file, file_row) and (file, byte_offset) columns resolve to its rows."""
    from mds.planner.report.export import export_plan

    config, old = parent
    export_plan(old, tmp_path / "bad.parquet", steps=(10, 14))
    frame = pl.read_parquet(tmp_path / "bad.parquet")
    by_row = exclusion_of(tmp_path / "bad.parquet", config).ids
    frame.select("file", "file_row").write_csv(tmp_path / "rows.csv")
    ranges = frame.filter(pl.col("byte_offset").is_not_null()).select("file", "byte_offset")
    ranges.write_csv(tmp_path / "offsets.csv")
    assert np.array_equal(exclusion_of(tmp_path / "rows.csv", config).ids, by_row)
    offsets = exclusion_of(tmp_path / "offsets.csv", config).ids
    assert len(offsets) == ranges.unique().height and set(offsets) <= set(by_row)


def test_an_unknown_document_is_one_error_naming_the_list_row(parent, tmp_path):
    config, _old = parent
    listed = tmp_path / "bad.csv"
    listed.write_text("source,row\nweb,3\nnope,1\nweb,99999\n")
    with pytest.raises(ConfigError, match=r"bad.csv row 2: no source 'nope'"):
        exclusion_of(listed, config)
    kept = exclusion_of(listed, config, missing="ignore")
    assert len(kept.ids) == 1
    listed.write_text("file,file_row\nweb/missing.parquet,1\n")
    with pytest.raises(ConfigError, match=r"row 1: no file 'web/missing.parquet'"):
        exclusion_of(listed, config)
    listed.write_text("lang\nen\n")
    with pytest.raises(ConfigError, match="no column source, file or content_hash"):
        exclusion_of(listed, config)
    with pytest.raises(ConfigError, match="unknown list format"):
        read_exclude_list(tmp_path / "bad.txt")


def test_worker_processes_plan_the_same_bytes(parent, tmp_path):
    """Workers make their planner from the config, which carries the exclusions."""
    config, old = parent
    listed = tmp_path / "bad.csv"
    bad = sorted({i for ids in step_ids(old, 12, 14).values() for i in ids})
    pl.DataFrame(named(config, bad), schema=["source", "row"], orient="row").write_csv(listed)
    one, two = tmp_path / "one.mds", tmp_path / "two.mds"
    build_plan(config, one, parent=old, at_step=4, exclusion=exclusion_of(listed, config))
    build_plan(config, two, parent=old, at_step=4, exclusion=exclusion_of(listed, config), workers=2)
    assert one.read_bytes() == two.read_bytes()


@pytest.mark.slow
def test_spawned_workers_of_a_re_plan_load_the_index_once(parent, tmp_path, monkeypatch):
    """Where workers are spawned (no fork), a re-plan's are started once its parent has
    given the config its exclusions: each worker's Planner, made by the pool's initializer
    from that config, is the one every chunk is planned with (no second load per worker)."""
    from mds.planner.plan import build as plan_mod

    config, old = parent
    listed = tmp_path / "bad.csv"
    bad = sorted({i for ids in step_ids(old, 12, 14).values() for i in ids})
    pl.DataFrame(named(config, bad), schema=["source", "row"], orient="row").write_csv(listed)
    started: list[tuple] = []  # (run, config) each pool's workers load the index with
    runs: list[str] = []  # the run each planned chunk names
    real_open = plan_mod.open_engine

    def counting_open(*args, **kwargs):
        started.append(kwargs.get("initargs"))
        pool = real_open(*args, **kwargs)
        real_map = pool.map

        def map(fn, units, **kw):
            def noted():
                for unit in units:
                    runs.append(unit[0])
                    yield unit

            return real_map(fn, noted(), **kw)

        pool.map = map
        return pool

    monkeypatch.setattr(plan_mod, "fork_shares_memory", lambda: False)
    monkeypatch.setattr(plan_mod, "open_engine", counting_open)
    one, two = tmp_path / "one.mds", tmp_path / "two.mds"
    build_plan(config, one, parent=old, at_step=4, exclusion=exclusion_of(listed, config))
    assert started == [] and runs == []
    build_plan(config, two, parent=old, at_step=4, exclusion=exclusion_of(listed, config), workers=2)
    assert one.read_bytes() == two.read_bytes()
    ((run, given),) = started  # one pool ...
    assert given.excluded  # ... started with the exclusions ...
    assert runs and set(runs) == {run}  # ... whose run every chunk names: no worker reloads
