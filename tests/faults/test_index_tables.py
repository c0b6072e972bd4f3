"""Fault matrix: damaged index tables (the per-source Parquet files under <index>/tables/).

Every reader of an index table checks it against the manifest's `table_checksum` first, so a
damaged table is refused with one line naming it instead of feeding altered lengths into a
plan, an export or a later index. Re-indexing rebuilds a damaged table from its sources.

The damaged table is always web's; DAMAGED below is the error's fixed part:
`<index>/tables/web-....parquet: checksum blake2b:... differs from the manifest's blake2b:...;
the index is damaged: re-run `mds index` to rebuild the table from its sources, or delete the
index`.

| row | how | expected outcome |
|---|---|---|
| **damage** (each against every reader below) | | |
| data-page-flipped | one byte in the first data page (Parquet still readable) | DAMAGED |
| footer-flipped | bytes of the Thrift footer scrambled (unreadable) | DAMAGED |
| truncated | table cut to half its size | DAMAGED |
| replaced | table rewritten as a valid table of web with n_tokens + 1 | DAMAGED |
| deleted | table removed | plan, export, inspect: `index table of source 'web' is missing`; verify: `cannot read index table`; executor: replays every batch (it reads no table) |
| **readers** | | |
| plan | `mds plan` | exit 1, DAMAGED, no plan written |
| export | `mds export plan.mds -o x.parquet` | exit 1, DAMAGED, no output file |
| inspect-index | `mds inspect <index>` | exit 1, DAMAGED |
| inspect-plan-step | `mds inspect plan.mds --step 2` | exit 1, DAMAGED (the plan's summary without --step reads no table) |
| verify | `mds verify plan.mds` | exit 1, DAMAGED in the one error line |
| verify-full | `mds verify plan.mds --full` | exit 1, DAMAGED in the one error line |
| replan | `mds plan --from plan.mds --at-step 2` | exit 1, DAMAGED, no plan written |
| executor | PlanExecutor, every batch | replays the plan: the plan carries its samples' locations and token counts, so no table is read |
| reindex | `mds index` over the damaged index | exit 0; the table is rebuilt from the sources (byte-identical to the original), then plan works |
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from cli_helpers import mds, one_error_line
from fault_builders import flip_byte, names, truncate, word_ids

from mds.planner.runtime.atomic import is_temp

FIX = "the index is damaged: re-run `mds index` to rebuild the table from its sources"


def web_table(root: Path) -> Path:
    manifest = json.loads((root / "index/manifest.json").read_text())
    entry = next(s for s in manifest["sources"] if s["name"] == "web")
    return root / "index" / entry["table"]


def flip_data_page(path: Path) -> None:
    """Flip the first byte of the data pages whose flip leaves Parquet readable but changes
    values (pages are zstd-compressed, so most flips make them unreadable instead)."""
    before = pl.read_parquet(path)
    data = path.read_bytes()
    footer = len(data) - 8 - int.from_bytes(data[-8:-4], "little")
    for offset in range(4, footer):
        flip_byte(path, offset)
        try:
            if not pl.read_parquet(path).equals(before):
                return
        except Exception:  # noqa: BLE001 - unreadable: try the next byte
            pass
        flip_byte(path, offset)
    raise AssertionError("no readable single-byte flip found")


def flip_footer(path: Path) -> None:
    data = bytearray(path.read_bytes())
    footer_len = int.from_bytes(data[-8:-4], "little")
    for i in range(len(data) - 8 - footer_len, len(data) - 8, 3):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))


def cut_half(path: Path) -> None:
    truncate(path, path.stat().st_size // 2)


def replace_values(path: Path) -> None:
    frame = pl.read_parquet(path)
    frame.with_columns(pl.col("n_tokens") + 1).write_parquet(path)


DAMAGE = {
    "data-page-flipped": flip_data_page,
    "footer-flipped": flip_footer,
    "truncated": cut_half,
    "replaced": replace_values,
}


@pytest.fixture(params=sorted(DAMAGE))
def damaged(request, root: Path) -> tuple[Path, Path]:
    """(root, table) with web's index table damaged in one of the DAMAGE ways."""
    table = web_table(root)
    DAMAGE[request.param](table)
    return root, table


def assert_damaged(line: str, table: Path) -> None:
    assert f"{table}: checksum blake2b:" in line, line
    assert "differs from the manifest's blake2b:" in line, line
    assert FIX in line, line


def no_temporaries(directory: Path) -> None:
    assert [p for p in directory.rglob("*") if is_temp(p)] == []


def test_data_page_flip_keeps_the_table_readable(root: Path) -> None:
    # The row's point: the damage is silent to Parquet itself, only the checksum sees it.
    table = web_table(root)
    before = pl.read_parquet(table)
    flip_data_page(table)
    assert pl.read_parquet(table).height == before.height


def test_plan(damaged) -> None:
    root, table = damaged
    plan = root / "plan.mds"
    before = plan.read_bytes()
    assert_damaged(one_error_line(mds("plan", root / "mds.toml", "-o", plan)), table)
    assert plan.read_bytes() == before
    no_temporaries(root)


def test_export(damaged) -> None:
    root, table = damaged
    out = root / "plan.parquet"
    assert_damaged(one_error_line(mds("export", root / "plan.mds", "-o", out)), table)
    assert not out.exists()
    no_temporaries(root)


def test_inspect_index(damaged) -> None:
    root, table = damaged
    assert_damaged(one_error_line(mds("inspect", root / "index")), table)


@pytest.mark.parametrize("full", [False, True])
def test_verify(damaged, full: bool) -> None:
    root, table = damaged
    result = mds("verify", root / "plan.mds", *(["--full"] if full else []))
    assert result.exit_code == 1, result.output
    assert f"{table}: checksum blake2b:" in result.output
    assert FIX in " ".join(result.output.split())


def test_replan(damaged) -> None:
    root, table = damaged
    out = root / "plan-b.mds"
    result = mds("plan", root / "mds.toml", "-o", out, "--from", root / "plan.mds", "--at-step", 2)
    assert_damaged(one_error_line(result), table)
    assert not out.exists()
    no_temporaries(root)


def replay_all(plan: Path) -> int:
    from mds.executor import PlanExecutor

    with PlanExecutor(plan, 0, tokenize=word_ids) as ex:
        return sum(len(batch["sample_id"]) for batch in ex)


def test_executor_reads_no_table(damaged) -> None:
    root, _table = damaged
    assert replay_all(root / "plan.mds") > 0


def test_reindex_rebuilds_the_damaged_table(damaged) -> None:
    root, table = damaged
    original_manifest = (root / "index/manifest.json").read_bytes()
    result = mds("index", root / "mds.toml")
    assert result.exit_code == 0, result.output
    # Rebuilt from the sources: the same bytes as the table the manifest recorded.
    assert (root / "index/manifest.json").read_bytes() == original_manifest
    rebuilt = web_table(root)
    assert rebuilt.is_file()
    assert mds("verify", root / "plan.mds", "--full").exit_code == 0
    assert mds("plan", root / "mds.toml", "-o", root / "plan-c.mds").exit_code == 0
    assert (root / "plan-c.mds").read_bytes() == (root / "plan.mds").read_bytes()
    no_temporaries(root)
    assert not any(is_temp(Path(n)) for n in names(root / "index"))


def test_deleted_table(root: Path) -> None:
    table = web_table(root)
    table.unlink()
    missing = f"{table}: index table of source 'web' is missing"
    one_error_line(mds("plan", root / "mds.toml", "-o", root / "p2.mds"), missing)
    one_error_line(mds("export", root / "plan.mds", "-o", root / "x.parquet"), missing)
    one_error_line(mds("inspect", root / "index"), missing)
    result = mds("verify", root / "plan.mds")
    assert result.exit_code == 1 and f"{table}: cannot read index table" in result.output
    assert replay_all(root / "plan.mds") > 0


def test_inspect_plan(damaged) -> None:
    # A step's report locates its samples in the index tables; the plan's summary reads none.
    root, table = damaged
    result = mds("inspect", root / "plan.mds", "--step", 2)
    assert_damaged(one_error_line(result), table)
