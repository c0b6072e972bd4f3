"""The fault matrix: every way input, plan files or the machine can fail, and what mds does.

This file holds the first rows; tests/faults/ holds one file per further class of fault,
each with its own table in the same form. The `root` fixture is in tests/conftest.py.

Each row asserts the exact outcome: the error class (library) or exit code (CLI: 1 for a user
error, 130 for an interrupt), one `error:` line naming the culprit, and nothing half-written:
the previous index or plan byte-identical and no temporary left next to it.

The data root (tests/fault_builders.py `write_world`) has four sources: web (2 Parquet files
of token lists, keep lang), books (Parquet, count `n` + text), forum (JSONL of token lists),
code (.jsonl.zst in 2 frames, count `n` + text); 6 steps x 2 ranks x 2 micro-batches, chunks
of 2 steps. Every row starts from a finished index and plan of it.

| row | how | expected outcome |
|---|---|---|
| **index: source data** (`mds index`, previous index byte-identical, no temporaries) | | |
| parquet-corrupt-footer | scramble web/part-1's Thrift footer | exit 1, `web/part-1.parquet: cannot read Parquet file (` |
| parquet-truncated | cut books.parquet in half | exit 1, `books/books.parquet: cannot read Parquet file (` |
| jsonl-truncated-last-line | forum's last line cut mid-JSON | exit 1, `forum/forum.jsonl line 12: malformed JSON (` |
| jsonl-invalid-utf8 | bytes ff fe inside forum line 3 | exit 1, `forum/forum.jsonl line 3: invalid UTF-8 at byte` |
| jsonl-malformed | `{"ids": [1, 2}` on forum line 4 | exit 1, `forum/forum.jsonl line 4: malformed JSON (` |
| zstd-truncated | last 10 bytes of code.jsonl.zst cut | exit 1, `code/code.jsonl.zst: truncated zstd frame` |
| drift-kept-column | web/part-1 `lang` is int, part-0 string | exit 1, `web/part-1.parquet: column `lang` has type Int64 but String in web/part-0.parquet (schema drift inside source 'web')` |
| drift-length-column | web/part-1 `tokens` is list<string> | exit 1, `web/part-1.parquet: column `tokens` has type List(String), expected a list of integer token ids` |
| missing-length-column | books has no `n` | exit 1, `books/books.parquet: column `n` not found; columns are text` |
| tokens-of-strings | web/part-1 `tokens` is a string column | exit 1, `web/part-1.parquet: column `tokens` has type String, expected a list of integer token ids` |
| count-of-strings | books `n` is a string column | exit 1, `books/books.parquet: column `n` has type String, expected an integer token count` |
| count-null | books `n` null in row 3 | exit 1, `books/books.parquet row 3: length is null` |
| count-negative | books `n` = -4 in row 2 | exit 1, `books/books.parquet row 2: length is negative (-4)` |
| count-negative-zstd | code `n` = -1 on line 5 | exit 1, `code/code.jsonl.zst line 5: length is negative (-1)` |
| empty-source | books.parquet with zero rows | exit 1, `source 'books': no samples in its 1 file(s): books/books.parquet` |
| glob-matches-nothing | web/*.parquet deleted | exit 1, `source 'web': `path` 'web/*.parquet' matches no files under <root>` |
| index-newer-version | manifest `version` 2 | exit 1, `index format version 2 is newer than this mds supports (1); upgrade mds` (mds index, mds plan, executor: IndexFormatError) |
| **plan: config** (`mds plan`, previous plan byte-identical, no temporaries) | | |
| unknown-source | config mixes `math`, the index lacks it | exit 1, `source 'math' is in the mix but not in the index <index> (it has web, books, forum, code); re-run `mds index`` |
| schedule-out-of-order | books weight [[10, 0.5], [5, 1.0]] | exit 1, `[[source]] #2 ('books'): `weight`[1]: steps must be strictly increasing, got 5 after 10` |
| stages-out-of-order | books stages [[0, .5], [9, 1], [4, .1]] | exit 1, `('books'): `weight`.stages[2]: steps must be strictly increasing, got 4 after 9` |
| all-zero-weights | every weight 0 | exit 1, `all source weights are 0 at step 0; at least one must be > 0` |
| overlong-error | capacity 20, books rows 1 and 4 have 30 and 21 tokens | exit 1, `source 'books' row 1: 30 tokens exceed max_tokens_per_micro_batch = 20 (2 such samples)` |
| max-epochs-exceeded | books max_epochs = 1, needs 1.25 | exit 1, `source 'books' runs out at step 5: it would need more than max_epochs = 1 passes over its 8 samples` |
| **executor and verify: data after planning** | | |
| source-changed | web/part-1 rewritten (12 rows) | DataChangedError `source 'web': web/part-1.parquet: size changed`; mds verify exit 1 naming it |
| source-touched | web/part-1 mtime + 1 s | DataChangedError `web/part-1.parquet: modified (mtime_ns` |
| source-content-same-stat | forum byte changed, size and mtime kept | verify="stat" starts; verify="full" DataChangedError `forum/forum.jsonl: content changed (sampled fingerprint`; mds verify --full exit 1 |
| source-deleted | web/part-0 deleted | DataChangedError `source 'web': web/part-0.parquet: missing`; mds verify exit 1 |
| **plan files** | | |
| plan-chunk-byte-flipped | one byte of chunk 1, rank 0 | mds verify exit 1 `chunk 1 rank 0: checksum mismatch`; executor rank 0 yields chunk 0 then PlanError naming chunk 1 rank 0; verify="full" PlanError at start; rank 1 unaffected; mds export exit 1, no output file; mds inspect --step 2 --rank 0 exit 1 |
| plan-truncated (half / 20 bytes) | file cut | mds inspect, verify, export exit 1 and executor PlanError: `truncated or corrupt plan (no trailer)` / `not an mds plan (file too short; truncated?)` |
| plan-newer-version | header version 2 | mds inspect, verify exit 1 and executor PlanError: `plan format version 2 is newer than this mds supports (1); upgrade mds` |
| state-from-another-plan | load_state_dict of a 4-step plan's state | PlanError `the executor state is from plan <other id>, but <plan> is plan <id>`; position unchanged |
| **the machine** | | |
| disk-full-index-table | ENOSPC (polars' error) writing books' table, web's new table already in place | exit 1, `<index>: cannot write the table of source 'books' (No space left on device (os error 28))`; web's new table removed |
| disk-full-index-manifest | ENOSPC after 100 bytes of manifest.json | exit 1, `<index>: cannot write manifest.json (No space left on device)` |
| disk-full-fresh-index | ENOSPC, `-o` a new directory | exit 1, same line; the directory is not created |
| disk-full-plan (at close / mid-chunk) | ENOSPC after 0 / 100 bytes (64-byte buffer) | exit 1, `<plan>: cannot write the plan (No space left on device)` |
| interrupt-index (SIGINT, SIGTERM) | real `mds index` parked before manifest.json, new web table on disk | exit 130, stderr `interrupted: nothing was written`; new table removed |
| interrupt-plan (SIGINT, SIGTERM) | real `mds plan` parked after 2 of 3 chunks, temporary on disk | exit 130, stderr `interrupted: nothing was written`; temporary removed |
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from builders import jsonl_bytes, write_parquet, write_zst
from cli_helpers import mds, one_error_line
from fault_builders import (
    BOOK_LENGTHS,
    CODE,
    FORUM,
    NO_SPACE,
    block_span,
    flip_byte,
    full_disk_open,
    full_disk_write_parquet,
    interrupt_mds,
    names,
    plan_world,
    set_plan_version,
    tree,
    truncate,
    web_columns,
    word_ids,
    words,
    world_toml,
)

from mds.core import planfile_writer as planfile_writer_mod
from mds.executor import DataChangedError, PlanError
from mds.planner.index import tables as index_manifest_mod
from mds.planner.runtime.atomic import is_temp


def no_temporaries(directory: Path) -> None:
    left = [p for p in directory.rglob("*") if is_temp(p)]
    assert left == [], left


def executor(plan: Path, rank: int = 0, **kwargs):
    from mds.executor import PlanExecutor

    kwargs.setdefault("tokenize", word_ids)
    return PlanExecutor(plan, rank, **kwargs)


# --- index: source data ------------------------------------------------------------------------


def corrupt_parquet_footer(root: Path) -> None:
    path = root / "web/part-1.parquet"
    data = bytearray(path.read_bytes())
    footer_len = int.from_bytes(data[-8:-4], "little")
    start = len(data) - 8 - footer_len
    for i in range(start, start + footer_len, 3):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))


def truncated_parquet(root: Path) -> None:
    path = root / "books/books.parquet"
    truncate(path, path.stat().st_size // 2)


def jsonl_truncated_last_line(root: Path) -> None:
    data = jsonl_bytes(FORUM, trailing_newline=False)
    (root / "forum/forum.jsonl").write_bytes(data[:-4])  # `{"ids": [0, 1, 2, 3, 4` of line 12


def jsonl_invalid_utf8(root: Path) -> None:
    lines = jsonl_bytes(FORUM).split(b"\n")
    lines[2] = b'{"ids": [1], "note": "\xff\xfe"}'
    (root / "forum/forum.jsonl").write_bytes(b"\n".join(lines))


def jsonl_malformed(root: Path) -> None:
    lines = jsonl_bytes(FORUM).split(b"\n")
    lines[3] = b'{"ids": [1, 2}'
    (root / "forum/forum.jsonl").write_bytes(b"\n".join(lines))


def zstd_truncated(root: Path) -> None:
    path = root / "code/code.jsonl.zst"
    truncate(path, path.stat().st_size - 10)


def drift_kept_column(root: Path) -> None:
    cols = web_columns(1)
    cols["lang"] = list(range(len(cols["lang"])))
    write_parquet(root / "web/part-1.parquet", cols)


def drift_length_column(root: Path) -> None:
    cols = web_columns(1)
    cols["tokens"] = pa.array([[str(t) for t in row] for row in cols["tokens"].to_pylist()])
    write_parquet(root / "web/part-1.parquet", cols)


def missing_length_column(root: Path) -> None:
    write_parquet(root / "books/books.parquet", {"text": [words(n) for n in BOOK_LENGTHS]})


def tokens_of_strings(root: Path) -> None:
    cols = web_columns(1)
    cols["tokens"] = [" ".join(map(str, row)) for row in cols["tokens"].to_pylist()]
    write_parquet(root / "web/part-1.parquet", cols)


def books_with(root: Path, n: pa.Array) -> None:
    write_parquet(
        root / "books/books.parquet", {"n": n, "text": [words(k) for k in BOOK_LENGTHS][: len(n)]}
    )


def count_of_strings(root: Path) -> None:
    books_with(root, pa.array([str(n) for n in BOOK_LENGTHS]))


def count_null(root: Path) -> None:
    books_with(root, pa.array([None if i == 3 else n for i, n in enumerate(BOOK_LENGTHS)]))


def count_negative(root: Path) -> None:
    books_with(root, pa.array([-4 if i == 2 else n for i, n in enumerate(BOOK_LENGTHS)]))


def count_negative_zstd(root: Path) -> None:
    records = [dict(r) for r in CODE]
    records[4]["n"] = -1
    write_zst(root / "code/code.jsonl.zst", jsonl_bytes(records), frames=2)


def empty_source(root: Path) -> None:
    books_with(root, pa.array([], pa.int64()))


def glob_matches_nothing(root: Path) -> None:
    for path in (root / "web").glob("*.parquet"):
        path.unlink()


INDEX_ROWS = [
    (corrupt_parquet_footer, ["web/part-1.parquet: cannot read Parquet file ("]),
    (truncated_parquet, ["books/books.parquet: cannot read Parquet file ("]),
    (jsonl_truncated_last_line, ["forum/forum.jsonl line 12: malformed JSON ("]),
    (jsonl_invalid_utf8, ["forum/forum.jsonl line 3: invalid UTF-8 at byte"]),
    (jsonl_malformed, ["forum/forum.jsonl line 4: malformed JSON ("]),
    (zstd_truncated, ["code/code.jsonl.zst: truncated zstd frame"]),
    (
        drift_kept_column,
        [
            "web/part-1.parquet: column `lang` has type Int64 but String in web/part-0.parquet "
            "(schema drift inside source 'web')"
        ],
    ),
    (
        drift_length_column,
        [
            "web/part-1.parquet: column `tokens` has type List(String), "
            "expected a list of integer token ids"
        ],
    ),
    (missing_length_column, ["books/books.parquet: column `n` not found; columns are text"]),
    (
        tokens_of_strings,
        ["web/part-1.parquet: column `tokens` has type String, expected a list of integer token"],
    ),
    (
        count_of_strings,
        ["books/books.parquet: column `n` has type String, expected an integer token count"],
    ),
    (count_null, ["books/books.parquet row 3: length is null"]),
    (count_negative, ["books/books.parquet row 2: length is negative (-4)"]),
    (count_negative_zstd, ["code/code.jsonl.zst line 5: length is negative (-1)"]),
    (empty_source, ["source 'books': no samples in its 1 file(s): books/books.parquet"]),
    (glob_matches_nothing, ["source 'web': `path` 'web/*.parquet' matches no files under "]),
]


@pytest.mark.parametrize(
    ("fault", "needles"), INDEX_ROWS, ids=[f.__name__.replace("_", "-") for f, _ in INDEX_ROWS]
)
def test_index_source_fault(root: Path, fault: Callable[[Path], None], needles: list[str]) -> None:
    before, top = tree(root / "index"), names(root)
    fault(root)
    line = one_error_line(mds("index", root / "mds.toml"), *needles)
    if fault is glob_matches_nothing:
        assert line.endswith(str(root.resolve())), line
    assert tree(root / "index") == before
    assert names(root) == top
    no_temporaries(root)


def test_index_newer_version(root: Path) -> None:
    manifest = root / "index/manifest.json"
    data = json.loads(manifest.read_text())
    data["version"] = 3
    manifest.write_text(json.dumps(data))
    before, plan = tree(root / "index"), (root / "plan.mds").read_bytes()
    want = f"{manifest}: index format version 3 is newer than this mds supports (2); upgrade mds"
    one_error_line(mds("index", root / "mds.toml"), want)
    one_error_line(mds("plan", root / "mds.toml", "-o", root / "plan.mds"), want)
    with executor(root / "plan.mds") as ex:  # the executor reads the plan, not the index
        next(iter(ex))
    assert tree(root / "index") == before
    assert (root / "plan.mds").read_bytes() == plan
    no_temporaries(root)


# --- plan: config ------------------------------------------------------------------------------

PLAN_ROWS = {
    "unknown-source": (
        {"extra": '[[source]]\nname = "math"\npath = "math/*.bin"\nweight = 0.1\n'},
        [
            "source 'math' is in the mix but not in the index {index} "
            "(it has web, books, forum, code); re-run `mds index`"
        ],
    ),
    "schedule-out-of-order": (
        {"books_weight": "[[10, 0.5], [5, 1.0]]"},
        [
            "mds.toml: [[source]] #2 ('books'): `weight`[1]: steps must be strictly "
            "increasing, got 5 after 10"
        ],
    ),
    "stages-out-of-order": (
        {"books_weight": "{ stages = [[0, 0.5], [9, 1.0], [4, 0.1]] }"},
        ["('books'): `weight`.stages[2]: steps must be strictly increasing, got 4 after 9"],
    ),
    "all-zero-weights": (
        {"books_weight": 0},  # and the others: see the test
        ["all source weights are 0 at step 0; at least one must be > 0"],
    ),
    "overlong-error": (
        {"capacity": 20},
        [
            "source 'books' row 1: 30 tokens exceed max_tokens_per_micro_batch = 20 "
            '(2 such samples); set [train] overlong = "drop" or "truncate"'
        ],
    ),
    "max-epochs-exceeded": (
        {"books_extra": "max_epochs = 1"},
        [
            "source 'books' runs out at step 5: it would need more than max_epochs = 1 "
            "passes over its 8 samples"
        ],
    ),
}


@pytest.mark.parametrize("row", list(PLAN_ROWS))
def test_plan_config_fault(root: Path, row: str) -> None:
    toml, needles = PLAN_ROWS[row]
    text = world_toml(**toml)
    if row == "all-zero-weights":
        text = text.replace("weight = 0.4", "weight = 0").replace("weight = 0.2", "weight = 0.0")
    (root / "mds.toml").write_text(text, encoding="utf-8")
    plan, top = (root / "plan.mds").read_bytes(), names(root)
    needles = [n.format(index=root / "index") for n in needles]
    one_error_line(mds("plan", root / "mds.toml", "-o", root / "plan.mds"), *needles)
    assert (root / "plan.mds").read_bytes() == plan
    assert names(root) == top
    no_temporaries(root)


# --- executor and verify: the data changed after planning --------------------------------------

CHANGED = "; the data changed since it was indexed (re-index and re-plan, or restore the file)"


def test_source_changed_after_planning(root: Path) -> None:
    old = (root / "web/part-1.parquet").stat().st_size
    write_parquet(root / "web/part-1.parquet", web_columns(1, rows=12))
    new = (root / "web/part-1.parquet").stat().st_size
    with pytest.raises(DataChangedError) as info:
        executor(root / "plan.mds")
    assert str(info.value) == (
        f"source 'web': web/part-1.parquet: size changed ({old} -> {new} bytes){CHANGED}"
    )
    one_error_line(mds("verify", root / "plan.mds"), "web/part-1.parquet: size changed", "plan.mds")


def test_source_touched_after_planning(root: Path) -> None:
    """Only the mtime differs: the content fingerprint decides; a changed content fails."""
    path = root / "web/part-1.parquet"
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    executor(root / "plan.mds").close()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(
        DataChangedError, match=r"^source 'web': web/part-1\.parquet: content changed"
    ):
        executor(root / "plan.mds")


def test_source_content_changed_with_the_same_size_and_mtime(root: Path) -> None:
    path = root / "forum/forum.jsonl"
    st = path.stat()
    data = path.read_bytes()
    path.write_bytes(data.replace(b"[0, 1]", b"[0, 7]", 1))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    with executor(root / "plan.mds"):  # the stat check cannot see it ...
        pass
    with pytest.raises(DataChangedError) as info:  # ... the content fingerprint does,
        with executor(root / "plan.mds", verify="full") as ex:  # when a chunk reads the file
            for _ in ex:
                pass
    assert str(info.value).startswith(
        "source 'forum': forum/forum.jsonl: content changed (sampled fingerprint sampled:"
    )
    one_error_line(mds("verify", root / "plan.mds", "--full"), "forum/forum.jsonl: content changed")


def test_source_deleted_after_planning(root: Path) -> None:
    (root / "web/part-0.parquet").unlink()
    with pytest.raises(DataChangedError) as info:
        executor(root / "plan.mds")
    assert str(info.value) == f"source 'web': web/part-0.parquet: missing{CHANGED}"
    one_error_line(mds("verify", root / "plan.mds"), "web/part-0.parquet: missing")


# --- plan files --------------------------------------------------------------------------------


def test_flipped_byte_in_a_plan_chunk(root: Path) -> None:
    plan = root / "plan.mds"
    offset, size = block_span(plan, 1, 0)
    flip_byte(plan, offset + size - 1)
    bad = f"{plan}: chunk 1 rank 0: checksum mismatch (corrupt file)"
    one_error_line(mds("verify", plan), f"{plan}: rank blocks: chunk 1 rank 0: checksum mismatch")
    one_error_line(mds("inspect", plan, "--step", "2", "--rank", "0"), bad)
    one_error_line(mds("export", plan, "-o", root / "plan.parquet"), bad)
    assert not (root / "plan.parquet").exists()
    with executor(plan) as ex:  # chunk 0 (steps 0-1, 2 micro-batches each) is intact
        it = iter(ex)
        assert [(b["step"], b["micro_batch"]) for b in (next(it) for _ in range(4))] == [
            (0, 0),
            (0, 1),
            (1, 0),
            (1, 1),
        ]
        with pytest.raises(PlanError) as info:
            next(it)
        assert str(info.value) == bad
    with pytest.raises(PlanError) as info:
        executor(plan, verify="full")
    assert str(info.value) == bad
    with executor(plan, 1) as ex:  # only rank 0's block is damaged
        assert sum(1 for _ in ex) == 12
    no_temporaries(root)


@pytest.mark.parametrize(
    ("keep", "why"),
    [
        (0.5, "truncated or corrupt plan (no trailer)"),
        (20, "not an mds plan (file too short; truncated?)"),
    ],
    ids=["half", "20-bytes"],
)
def test_truncated_plan(root: Path, keep: float, why: str) -> None:
    plan = root / "plan.mds"
    truncate(plan, int(plan.stat().st_size * keep) if keep < 1 else int(keep))
    one_error_line(mds("inspect", plan), f"{plan}: {why}")
    one_error_line(mds("verify", plan), f"{plan}: plan file: {why}")
    one_error_line(mds("export", plan, "-o", root / "plan.parquet"), f"{plan}: {why}")
    assert not (root / "plan.parquet").exists()
    with pytest.raises(PlanError) as info:
        executor(plan)
    assert str(info.value) == f"{plan}: {why}"


def test_plan_from_a_newer_format_version(root: Path) -> None:
    plan = root / "plan.mds"
    set_plan_version(plan, 5)
    why = "plan format version 5 is newer than this mds supports (4); upgrade mds"
    one_error_line(mds("inspect", plan), f"{plan}: {why}")
    one_error_line(mds("verify", plan), f"{plan}: plan file: {why}")
    with pytest.raises(PlanError) as info:
        executor(plan)
    assert str(info.value) == f"{plan}: {why}"


def test_executor_state_from_another_plan(root: Path) -> None:
    other = plan_world(root, root / "other.mds", "--steps", "4")
    with executor(other) as ex:
        next(iter(ex))
        state = ex.state_dict()
    with executor(root / "plan.mds") as ex:
        next(iter(ex))
        mine = ex.state_dict()
        assert state["plan_id"] != mine["plan_id"]
        with pytest.raises(PlanError) as info:
            ex.load_state_dict(state)
        assert str(info.value) == (
            f"the executor state is from plan {state['plan_id']}, but {root / 'plan.mds'} is "
            f"plan {mine['plan_id']}; resume with the plan the run started with"
        )
        assert ex.state_dict() == mine


# --- the machine: a full disk --------------------------------------------------------------------


def test_disk_full_while_writing_an_index_table(root: Path, monkeypatch) -> None:
    """web's new table is renamed into place, then books' write hits ENOSPC: both go."""
    write_parquet(root / "web/part-1.parquet", web_columns(1, rows=12))
    books_with(root, pa.array([n + 1 for n in BOOK_LENGTHS]))
    before, top = tree(root / "index"), names(root)
    real = pl.DataFrame.write_parquet
    fake = full_disk_write_parquet(real, 50)
    written: list[str] = []

    def write_parquet_(self, file, *args, **kwargs):
        written.append(Path(file).name)
        if ".books.parquet" in Path(file).name:
            return fake(self, file, *args, **kwargs)
        return real(self, file, *args, **kwargs)

    monkeypatch.setattr(pl.DataFrame, "write_parquet", write_parquet_)
    one_error_line(
        mds("index", root / "mds.toml"),
        f"{root / 'index'}: cannot write the table of source 'books' ({NO_SPACE} (os error 28))",
    )
    assert [n.split(".")[1] for n in written] == ["web", "books"]
    assert tree(root / "index") == before
    assert names(root) == top
    no_temporaries(root)


def _manifest_on_full_disk(monkeypatch, budget: int) -> None:
    monkeypatch.setattr(index_manifest_mod, "open", full_disk_open(budget), raising=False)


def test_disk_full_while_writing_the_manifest(root: Path, monkeypatch) -> None:
    write_parquet(root / "web/part-1.parquet", web_columns(1, rows=12))
    before, top = tree(root / "index"), names(root)
    _manifest_on_full_disk(monkeypatch, 100)
    one_error_line(
        mds("index", root / "mds.toml"),
        f"{root / 'index'}: cannot write manifest.json ({NO_SPACE})",
    )
    assert tree(root / "index") == before
    assert names(root) == top
    no_temporaries(root)


def test_disk_full_while_writing_a_fresh_index(root: Path, tmp_path: Path, monkeypatch) -> None:
    _manifest_on_full_disk(monkeypatch, 0)
    fresh = tmp_path / "fresh"
    one_error_line(
        mds("index", root / "mds.toml", "-o", fresh), f"{fresh}: cannot write manifest.json"
    )
    assert not fresh.exists()
    assert names(tmp_path) == {"data"}


@pytest.mark.parametrize(
    ("budget", "buffer"), [(0, 8192), (100, 64)], ids=["at-close", "mid-chunk"]
)
def test_disk_full_while_writing_a_plan(root: Path, monkeypatch, budget: int, buffer: int) -> None:
    plan = root / "plan.mds"
    before, top = plan.read_bytes(), names(root)
    monkeypatch.setattr(planfile_writer_mod, "open", full_disk_open(budget, buffer), raising=False)
    one_error_line(
        mds("plan", root / "mds.toml", "-o", plan, "--steps", "5"),
        f"{plan}: cannot write the plan ({NO_SPACE})",
    )
    assert plan.read_bytes() == before
    assert names(root) == top
    no_temporaries(root)


# --- the machine: interrupts of a real process ---------------------------------------------------

INTERRUPTED = "interrupted: nothing was written"


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupt_during_index(root: Path, tmp_path: Path, sig: signal.Signals) -> None:
    write_parquet(root / "web/part-1.parquet", web_columns(1, rows=12))  # a new web table
    before = tree(root / "index")
    done, parked = interrupt_mds(
        tmp_path,
        "index-manifest",
        sig,
        "index",
        root / "mds.toml",
        parked=lambda: set(tree(root / "index")),
    )
    assert (done.returncode, done.stderr.strip()) == (130, INTERRUPTED), done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    # on disk at the commit point: the new table and file list, and the copy of the
    # manifest it replaces
    new = sorted(parked - set(before))
    assert len(new) == 3 and new[0].startswith("history/"), parked
    assert all(n.startswith("sources/web-") for n in new[1:]), parked
    assert sum(n.startswith("sources/web-files-") for n in new[1:]) == 1, parked
    assert tree(root / "index") == before
    no_temporaries(root)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_interrupt_during_plan(root: Path, tmp_path: Path, sig: signal.Signals) -> None:
    plan = root / "plan.mds"
    before, top = plan.read_bytes(), names(root)
    done, parked = interrupt_mds(
        tmp_path,
        "plan-chunk",
        sig,
        "plan",
        root / "mds.toml",
        "-o",
        plan,
        "--steps",
        "5",
        parked=lambda: [(p.name, p.stat().st_size) for p in root.iterdir() if is_temp(p)],
    )
    assert (done.returncode, done.stderr.strip()) == (130, INTERRUPTED), done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert len(parked) == 1 and parked[0][0].startswith(".plan.mds.tmp-"), parked
    assert parked[0][1] > 16  # header and two chunks were in the temporary file
    assert plan.read_bytes() == before
    assert names(root) == top
    no_temporaries(root)
