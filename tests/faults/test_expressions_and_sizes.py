"""Fault matrix: SQL expression arithmetic, plannable sizes, plan header flags and sections,
and the executor's integer arguments.

Each row starts from the world of tests/fault_builders.py (web, books, forum, code; books
lengths 7, 30, 12, 5, 21, 9, 16, 3; 6 steps x 2 ranks x 2 micro-batches, 8 samples a step).

| row | how | expected outcome |
|---|---|---|
| **expressions: integers are signed 64-bit** (`mds plan`) | | |
| filter-subtract | books `filter = "n_tokens - 10 > 0"` | the same samples as `n_tokens > 10` (not every row: UInt32 would wrap) |
| filter-multiply | books `filter = "n_tokens * 1073741824 > 8589934592"` | the same samples as `n_tokens > 8` |
| filter-columns | books `filter = "n_tokens - row > 8"` | the same samples as computed in Python with signed ints |
| filter-cast-divide | books `filter = "CAST(n_tokens - 20 AS DOUBLE) / 2 > 0"` | the same samples as `n_tokens > 20` |
| filter-null | books `filter = "NULLIF(n_tokens, 7) > 0"` | the null row (7 tokens) is not selected, as SQL's WHERE |
| cost-subtract | `[cost] expr = "n_tokens - 10"` | exit 1, `[cost] `expr` (source 'web'): gives -9.0 for index row 0; costs must be finite and >= 0`, plan byte-identical |
| cost-multiply | `[cost] expr = "(n_tokens - 5) * 1000"` | exit 1, `gives -4000.0 for index row 0`, plan byte-identical |
| cost-null | `[cost] expr = "NULLIF(n_tokens, 1)"` | exit 1, `[cost] `expr` (source 'web'): gives null for index row 0`, plan byte-identical |
| cost-nan | `[cost] expr = "CAST('nan' AS DOUBLE)"` | exit 1, `gives nan for index row 0` |
| export-int64 | `mds export` | every integer column Int64 (n_tokens was UInt32: sums wrapped at 2^32) |
| **sizes** (`mds plan`, plan byte-identical, no temporaries) | | |
| steps-absurd | `steps = 10**15` | exit 1, `[train]: steps = 1e+15 steps to plan; the limit is 134217728 (2^27` |
| samples-absurd | `steps = 10**8`, `samples_per_step = 2**20` | exit 1, `steps = 100000000 x samples_per_step = 1048576 = 1.05e+14 samples to plan; the limit is 1099511627776 (2^40` |
| bins-absurd | `dp_size = 10**8`, `samples_per_step = 10**8` | exit 1, `dp_size = 100000000 x micro_batches = 2 = 2e+08 micro-batches per step; the limit is 1048576 (2^20` |
| chunk-absurd | `samples_per_step = 10**7` | exit 1, `[plan]: chunk_steps = 2 x samples_per_step = 10000000 = 2e+07 items in a chunk's arrays` |
| dp-size-float | `dp_size = 1e8` | exit 1, `[train]: `dp_size` must be an integer >= 1, got 100000000.0` |
| steps-cli-absurd | `mds plan --steps 1000000000000000` | exit 1, `--steps/--dp-size: steps = 1e+15 steps to plan` |
| **tokens_per_step** | | |
| tokens-per-step-below-sample | `tokens_per_step = 20` (books has 30 and 21) | exit 1, `[train] `tokens_per_step` (20) is smaller than source 'books' row 1 (30 tokens, after filter and overlong)` |
| **plan file** | | |
| header-flags | header u32 flags = 1 (bytes 12..16) | PlanError `unknown plan header flags 0x1`; inspect, export, executor exit 1 / raise |
| section-corrupt-export | a flipped byte in each section | `mds export` exit 1, `section '<name>': checksum mismatch (corrupt file)`, no output |
| section-corrupt-replan | a flipped byte in each section | `mds plan --from --at-step 2` exit 1, same line, no output |
| **executor integers** | | |
| rank-bool | `PlanExecutor(plan, True)` | ConfigError `dp_rank=True must be an integer, not bool` |
| rank-float / str | `1.0`, `np.float64(1)`, `"1"` | ConfigError `dp_rank=... must be an integer` |
| rank-numpy | `np.int64(1)` | accepted, dp_rank == 1 (a Python int) |
| seek-bool / float | `seek(True)`, `seek(1.0)`, `seek(1, np.float32(0))` | PlanError `step=True must be an integer, not bool` |
| state-bool | `load_state_dict({..., "step": True})` | PlanError naming `step` |
| from-env-bool | `from_env(tp=True)` | ConfigError `tp=True must be an integer, not bool` |
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from cli_helpers import mds, one_error_line
from fault_builders import BOOK_LENGTHS, names, plan_layout, word_ids, world_toml

from mds.core.planfile_reader import PlanReader
from mds.errors import ConfigError, PlanError
from mds.executor import PlanExecutor
from mds.planner.report.export import plan_frame


def no_temporaries(directory: Path) -> None:
    left = [p for p in directory.rglob("*") if ".tmp" in p.name or p.name.startswith(".")]
    assert left == [], left


def _books(root: Path, filt: str, out: str) -> set[int]:
    text = world_toml(books_extra=f'filter = "{filt}"')
    (root / "mds.toml").write_text(text, encoding="utf-8")
    result = mds("plan", root / "mds.toml", "-o", root / out)
    assert result.exit_code == 0, result.output
    frame = plan_frame(root / out)
    return set(frame.filter(pl.col("source") == "books")["row"].to_list())


def _eligible(keep) -> set[int]:
    return {r for r, n in enumerate(BOOK_LENGTHS) if keep(r, n)}


@pytest.mark.parametrize(
    ("filt", "keep"),
    [
        ("n_tokens - 10 > 0", lambda r, n: n > 10),
        ("n_tokens * 1073741824 > 8589934592", lambda r, n: n > 8),
        ("n_tokens - row > 8", lambda r, n: n - r > 8),
        ("CAST(n_tokens - 20 AS DOUBLE) / 2 > 0", lambda r, n: n > 20),
        ("NULLIF(n_tokens, 7) > 0", lambda r, n: n != 7),
    ],
    ids=["subtract", "multiply", "columns", "cast-divide", "null"],
)
def test_filter_signed(root: Path, filt: str, keep) -> None:
    got = _books(root, filt, "f.mds")
    want = _eligible(keep)
    assert got and got <= want
    # every eligible books row is drawn over 6 steps x 8 samples at weight 0.2 when few are
    assert got == want or len(got) >= 4


COST_ROWS = {
    "subtract": ("n_tokens - 10", "gives -9.0 for index row 0; costs must be finite and >= 0"),
    "multiply": ("(n_tokens - 5) * 1000", "gives -4000.0 for index row 0"),
    "null": ("NULLIF(n_tokens, 1)", "gives null for index row 0; costs must be finite and >= 0"),
    "nan": ("CAST('nan' AS DOUBLE)", "gives nan for index row 0"),
}


@pytest.mark.parametrize("row", list(COST_ROWS))
def test_cost_expr_refused(root: Path, row: str) -> None:
    expr, tail = COST_ROWS[row]
    (root / "mds.toml").write_text(
        world_toml(extra=f'\n[cost]\nexpr = "{expr}"\n'), encoding="utf-8"
    )
    plan, top = (root / "plan.mds").read_bytes(), names(root)
    one_error_line(
        mds("plan", root / "mds.toml", "-o", root / "plan.mds"),
        "[cost] `expr` (source 'web'): ",
        tail,
    )
    assert (root / "plan.mds").read_bytes() == plan
    assert names(root) == top
    no_temporaries(root)


def test_export_integers_are_int64(root: Path) -> None:
    result = mds("export", root / "plan.mds", "-o", root / "e.parquet")
    assert result.exit_code == 0, result.output
    schema = pl.read_parquet_schema(root / "e.parquet")
    ints = {k: v for k, v in schema.items() if v.is_integer()}
    assert "n_tokens" in ints and "file_id" in ints
    assert set(ints.values()) == {pl.Int64}, ints


SIZE_ROWS = {
    "steps-absurd": (
        {"steps = 6": "steps = 1000000000000000"},
        "[train]: steps = 1e+15 steps to plan; the limit is 134217728 (2^27",
    ),
    "samples-absurd": (
        {"steps = 6": "steps = 100000000", "samples_per_step = 8": "samples_per_step = 1048576"},
        "steps = 100000000 x samples_per_step = 1048576 = 1.05e+14 samples to plan; "
        "the limit is 1099511627776 (2^40",
    ),
    "bins-absurd": (
        {
            "dp_size = 2": "dp_size = 100000000",
            "samples_per_step = 8": "samples_per_step = 100000000",
        },
        "dp_size = 100000000 x micro_batches = 2 = 2e+08 micro-batches per step; the limit is 1048576 (2^20",
    ),
    "chunk-absurd": (
        {"samples_per_step = 8": "samples_per_step = 10000000"},
        "[plan]: chunk_steps = 2 x samples_per_step = 10000000 = 2e+07 items in a chunk's arrays; "
        "the limit is 16777216 (2^24",
    ),
    "dp-size-float": (
        {"dp_size = 2": "dp_size = 1e8"},
        "[train]: `dp_size` must be an integer >= 1, got 100000000.0",
    ),
    "tokens-per-step-below-sample": (
        {"samples_per_step = 8": "tokens_per_step = 20"},
        "[train] `tokens_per_step` (20) is smaller than source 'books' row 1 "
        "(30 tokens, after filter and overlong)",
    ),
}


@pytest.mark.parametrize("row", list(SIZE_ROWS))
def test_size_refused(root: Path, row: str) -> None:
    edits, needle = SIZE_ROWS[row]
    text = world_toml()
    for old, new in edits.items():
        assert old in text
        text = text.replace(old, new)
    (root / "mds.toml").write_text(text, encoding="utf-8")
    plan, top = (root / "plan.mds").read_bytes(), names(root)
    one_error_line(mds("plan", root / "mds.toml", "-o", root / "plan.mds"), needle)
    assert (root / "plan.mds").read_bytes() == plan
    assert names(root) == top
    no_temporaries(root)


def test_steps_cli_absurd(root: Path) -> None:
    plan = (root / "plan.mds").read_bytes()
    result = mds("plan", root / "mds.toml", "-o", root / "plan.mds", "--steps", 10**15)
    one_error_line(result, "--steps/--dp-size: steps = 1e+15 steps to plan")
    assert (root / "plan.mds").read_bytes() == plan


def test_header_flags(root: Path) -> None:
    plan = root / "plan.mds"
    data = bytearray(plan.read_bytes())
    struct.pack_into("<I", data, 12, 1)
    plan.write_bytes(bytes(data))
    want = "unknown plan header flags 0x1"
    with pytest.raises(PlanError, match=want):
        PlanReader(plan)
    one_error_line(mds("inspect", plan), want)
    one_error_line(mds("export", plan, "-o", root / "e.parquet"), want)
    assert not (root / "e.parquet").exists()
    with pytest.raises(PlanError, match=want):
        PlanExecutor(plan, 0, tokenize=word_ids)


def _flip_sections(root: Path):
    plan = root / "plan.mds"
    good = plan.read_bytes()
    for name, meta in sorted(plan_layout(plan)["sections"].items()):
        data = bytearray(good)
        data[meta["offset"]] ^= 0x01
        plan.write_bytes(bytes(data))
        yield name
    plan.write_bytes(good)


def test_section_corrupt_export(root: Path) -> None:
    for name in _flip_sections(root):
        result = mds("export", root / "plan.mds", "-o", root / "e.parquet")
        one_error_line(result, f"section '{name}': checksum mismatch (corrupt file)")
        assert not (root / "e.parquet").exists()
        no_temporaries(root)


def test_section_corrupt_replan(root: Path) -> None:
    for name in _flip_sections(root):
        result = mds(
            "plan",
            root / "mds.toml",
            "--from",
            root / "plan.mds",
            "--at-step",
            2,
            "-o",
            root / "p2.mds",
        )
        one_error_line(result, f"section '{name}': checksum mismatch (corrupt file)")
        assert not (root / "p2.mds").exists()
        no_temporaries(root)


@pytest.mark.parametrize("rank", [True, False, 1.0, np.float64(1), "1", np.bool_(True)], ids=repr)
def test_executor_rank_not_integer(root: Path, rank) -> None:
    with pytest.raises(ConfigError, match=r"^dp_rank=.* must be an integer, not "):
        PlanExecutor(root / "plan.mds", rank, tokenize=word_ids)


def test_executor_numpy_rank(root: Path) -> None:
    with PlanExecutor(root / "plan.mds", np.int64(1), dp_size=np.int32(2), tokenize=word_ids) as ex:
        assert ex.dp_rank == 1 and type(ex.dp_rank) is int
        ex.seek(np.int64(2), np.int64(1))
        assert ex.position == (2, 1)


@pytest.mark.parametrize(
    ("step", "micro", "name"),
    [
        (True, 0, "step"),
        (1.0, 0, "step"),
        (1, np.float32(0), "micro_batch"),
        ("1", 0, "step"),
        (1, False, "micro_batch"),
    ],
    ids=repr,
)
def test_executor_seek_not_integer(root: Path, step, micro, name) -> None:
    with PlanExecutor(root / "plan.mds", 0, tokenize=word_ids) as ex:
        with pytest.raises(PlanError, match=rf"^{name}=.* must be an integer, not "):
            ex.seek(step, micro)
        state = ex.state_dict()
        with pytest.raises(PlanError, match=rf"^{name}=.* must be an integer"):
            ex.load_state_dict({**state, "step": step, "micro_batch": micro})
        assert ex.position == (0, 0)


def test_executor_from_env_bool(root: Path) -> None:
    env = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0"}
    with pytest.raises(ConfigError, match=r"^tp=True must be an integer, not bool"):
        PlanExecutor.from_env(root / "plan.mds", tp=True, environ=env, tokenize=word_ids)


def test_plan_json_unchanged_by_widening(root: Path) -> None:
    """Widening the columns does not change a plan without expressions (the golden test pins the rest)."""
    before = (root / "plan.mds").read_bytes()
    result = mds("plan", root / "mds.toml", "-o", root / "again.mds")
    assert result.exit_code == 0, result.output
    assert (root / "again.mds").read_bytes() == before
