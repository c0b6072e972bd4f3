"""The Arrow IPC scanner: IPC files and streams, save_to_disk shards, and corrupt files."""

from __future__ import annotations

import math
from pathlib import Path

import pyarrow as pa
import pytest
from builders import ctx, data_file, source, write_arrow, write_save_to_disk
from literal_names import IDS, NAMES, write_with_decoy

from mds.errors import SourceDataError
from mds.planner.index.arrow import scan_arrow
from mds.planner.index.discover import discover

TOKENS = [[1, 2, 3], [], [7] * 33, [4]]
LANGS = ["en", "fr", None, "de"]


def _table(list_type: pa.DataType = pa.list_(pa.int32())) -> pa.Table:
    return pa.table(
        {
            "input_ids": pa.array(TOKENS, list_type),
            "lang": LANGS,
            "text": ["a b c", "", "long " * 10, "é"],
        }
    )


def _scan(path: Path, root: Path | None = None, **table):
    return scan_arrow(data_file(path, root), ctx(source(**table), "arrow"))


@pytest.mark.parametrize("stream", [False, True], ids=["ipc-file", "ipc-stream"])
@pytest.mark.parametrize("list_type", [pa.list_(pa.int32()), pa.large_list(pa.int64())], ids=str)
def test_token_lengths_exact(tmp_path: Path, stream: bool, list_type: pa.DataType) -> None:
    path = write_arrow(tmp_path / "a.arrow", _table(list_type), stream=stream)
    frame = _scan(path, tokens="input_ids", keep=["lang"])
    assert frame.columns == ["file_row", "n_tokens", "lang"]
    assert frame["n_tokens"].to_list() == [len(t) for t in TOKENS]
    assert frame["file_row"].to_list() == [0, 1, 2, 3]
    assert frame["lang"].to_list() == LANGS


def test_many_record_batches(tmp_path: Path) -> None:
    table = pa.concat_tables([_table()] * 5)
    path = tmp_path / "b.arrow"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        for batch in table.to_batches(max_chunksize=3):
            writer.write_batch(batch)
    frame = _scan(path, tokens="input_ids")
    assert frame["n_tokens"].to_list() == [len(t) for t in TOKENS] * 5


def test_sliced_batches_do_not_shift_lengths(tmp_path: Path) -> None:
    table = _table().slice(1, 3)
    path = write_arrow(tmp_path / "s.arrow", table)
    assert _scan(path, tokens="input_ids")["n_tokens"].to_list() == [0, 33, 1]


def test_count_and_estimate(tmp_path: Path) -> None:
    path = write_arrow(tmp_path / "c.arrow", {"n": [5, 0, 9], "text": ["ab", "", "abcdefghi"]})
    assert _scan(path, count="n")["n_tokens"].to_list() == [5, 0, 9]
    estimate = _scan(path, text="text", estimate="bytes/4")["n_tokens"].to_list()
    assert estimate == [math.ceil(n / 4) for n in (2, 0, 9)]


def test_save_to_disk_directory(tmp_path: Path) -> None:
    write_save_to_disk(tmp_path / "wiki", [_table(), _table().slice(0, 2)])
    files = discover(source(path="wiki", tokens="input_ids"), tmp_path)
    assert len(files) == 2
    frames = [scan_arrow(f, ctx(source(tokens="input_ids"), "arrow")) for f in files]
    assert frames[0]["n_tokens"].to_list() == [3, 0, 33, 1]
    assert frames[1]["n_tokens"].to_list() == [3, 0]


def test_null_list_names_the_row(tmp_path: Path) -> None:
    path = write_arrow(
        tmp_path / "n.arrow", {"ids": pa.array([[1], [2], None], pa.list_(pa.int32()))}
    )
    with pytest.raises(SourceDataError) as info:
        _scan(path, tokens="ids")
    assert str(info.value) == "n.arrow row 2: length is null"


def test_missing_column(tmp_path: Path) -> None:
    path = write_arrow(tmp_path / "m.arrow", _table())
    with pytest.raises(SourceDataError) as info:
        _scan(path, tokens="tokens")
    assert (
        str(info.value) == "m.arrow: column `tokens` not found; columns are input_ids, lang, text"
    )


def test_wrong_column_type(tmp_path: Path) -> None:
    path = write_arrow(tmp_path / "w.arrow", _table())
    with pytest.raises(
        SourceDataError, match="w.arrow: column `lang` has type String, expected a list"
    ):
        _scan(path, tokens="lang")


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda data: b"garbage!" * 16,
        lambda data: data[: len(data) // 2],
        lambda data: b"",
    ],
    ids=["garbage", "truncated", "empty"],
)
@pytest.mark.parametrize("stream", [False, True], ids=["ipc-file", "ipc-stream"])
def test_corrupt_file(tmp_path: Path, corrupt, stream: bool) -> None:
    good = write_arrow(tmp_path / "good.arrow", _table(), stream=stream).read_bytes()
    path = tmp_path / "bad.arrow"
    path.write_bytes(corrupt(good))
    with pytest.raises(SourceDataError) as info:
        _scan(path, tokens="input_ids")
    message = str(info.value)
    assert message.startswith("bad.arrow: cannot read Arrow IPC file ("), message
    assert "\n" not in message


@pytest.mark.parametrize(("stem", "decoy"), NAMES, ids=IDS)
def test_a_file_name_with_glob_characters_is_read_as_it_is(
    tmp_path: Path, stem: str, decoy: str | None
) -> None:
    def write(path: Path, n: int) -> None:
        write_arrow(path, pa.table({"ids": [[1] * n] * 2}))

    write_with_decoy(tmp_path, stem, decoy, ".arrow", write)
    (file,) = discover(source(path=f"{stem}.arrow", tokens="ids"), tmp_path)
    frame = scan_arrow(file, ctx(source(tokens="ids"), "arrow"))
    assert frame["n_tokens"].to_list() == [2, 2]


@pytest.mark.parametrize(
    ("ids", "list_type", "shown"),
    [
        ([[1], [2, 2**63]], pa.list_(pa.uint64()), "token id 9223372036854775808 is outside"),
        ([[1], [2, None]], pa.list_(pa.int32()), "token id null is not an integer"),
    ],
    ids=["uint64-2^63", "null"],
)
def test_token_ids_that_are_not_int64_integers_are_refused(
    tmp_path: Path, ids, list_type, shown
) -> None:
    path = write_arrow(tmp_path / "a.arrow", pa.table({"ids": pa.array(ids, list_type)}))
    with pytest.raises(SourceDataError, match=f"^a.arrow row 1: {shown}"):
        _scan(path, tokens="ids")
