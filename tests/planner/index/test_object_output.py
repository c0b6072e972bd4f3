"""src/mds/planner/index/object_output.py: an index prefix that is or holds the data root is
refused, and an interrupt's message says what it left (the uploads themselves run against
S3 and GCS servers in tests/core/test_storage_outputs.py and tests/faults/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mds.errors import ConfigError
from mds.planner.index.config import parse_config
from mds.planner.index.object_output import TABLE_NAME, check_object_output, index_left, tables_left


def _config(root: str):
    data = {"index": {"root": root}, "source": [{"name": "s", "path": "*.jsonl", "count": "n"}]}
    return parse_config(data, path=Path("/cfg/mds.toml"))


def test_a_prefix_that_is_or_holds_the_data_root_is_refused():
    config = _config("s3://bucket/data")
    check_object_output(config, "s3://bucket/index")
    with pytest.raises(ConfigError, match="is the data root"):
        check_object_output(config, "s3://bucket/data")
    with pytest.raises(ConfigError, match="holds the data root"):
        check_object_output(config, "s3://bucket")
    check_object_output(_config("/local/data"), "s3://bucket")  # a local root: nothing shared


def test_what_an_interrupt_left_is_said_in_one_line():
    url = "s3://b/idx"
    assert tables_left(url, True, set()) == "the previous index at s3://b/idx is intact"
    assert tables_left(url, False, {"sources/a-0123456789abcdef.parquet"}) == (
        "no index was written at s3://b/idx (no manifest.json); 1 new table object was left "
        "under s3://b/idx/sources/"
    )
    assert tables_left(url, True, {"x", "y"}).endswith(
        "; 2 new table objects it does not name were left under s3://b/idx/sources/"
    )
    assert index_left(url, 0) == "the new index was written whole at s3://b/idx"
    assert index_left(url, 3).endswith(
        "; 3 table objects it no longer names were left under s3://b/idx/sources/"
    )


def test_only_tables_named_as_mds_names_them_are_ever_removed():
    assert TABLE_NAME.fullmatch("sources/web-0123456789abcdef.parquet")
    assert not TABLE_NAME.fullmatch("sources/web.parquet")
    assert not TABLE_NAME.fullmatch("other/web-0123456789abcdef.parquet")
