"""Temporaries beside an output: hidden, unique, within the file system's name limit, and
removed when their writer died."""

from __future__ import annotations

import os
from pathlib import Path

from mds.planner.runtime.atomic import atomic_write_bytes, clean_stale_temps, is_temp, temp_sibling


def test_a_temporary_is_hidden_beside_its_output(tmp_path: Path) -> None:
    tmp = temp_sibling(tmp_path / "plan.mds")
    assert tmp.parent == tmp_path and tmp.name.startswith(".plan.mds.tmp-") and is_temp(tmp)
    assert tmp != temp_sibling(tmp_path / "plan.mds")


def test_a_long_name_keeps_its_temporary_within_255_bytes(tmp_path: Path) -> None:
    """`.NAME.tmp-...` of a 250-byte NAME would pass NAME_MAX: its start and a hash stand in
    for it, still unique to the output and still found as its temporary."""
    out, other = tmp_path / ("p" * 250), tmp_path / ("p" * 249 + "q")
    tmp = temp_sibling(out)
    assert len(os.fsencode(tmp.name)) <= 255 and tmp.name.startswith(".ppp") and is_temp(tmp)
    assert tmp.name.split(".tmp-")[0] != temp_sibling(other).name.split(".tmp-")[0]
    atomic_write_bytes(out, b"x")
    assert out.read_bytes() == b"x" and os.listdir(tmp_path) == [out.name]
    dead = tmp.with_name(tmp.name.replace(f"-{os.getpid()}-", "-4194303-", 1))
    dead.write_bytes(b"left by a killed writer")
    assert clean_stale_temps(out) == [dead] and not dead.exists()


def test_a_plan_named_with_250_characters(tmp_path: Path) -> None:
    """Through the CLI: planned, with neither its lock nor its temporary passing NAME_MAX."""
    from fault_builders import index_world, plan_world, write_world

    root = tmp_path / "w"
    write_world(root)
    index_world(root)
    plan = plan_world(root, tmp_path / ("p" * 246 + ".mds"))
    assert plan.stat().st_size > 0 and sorted(os.listdir(tmp_path)) == sorted(["w", plan.name])
