"""MDS_PAGE_READS is read at each use: on (the default), off or check; any other value is
refused in one line that names the variable, the value and the settings allowed."""

from __future__ import annotations

import pytest

from mds.errors import ConfigError, SourceDataError
from mds.formats.parquet import page_reads


def test_on_by_default(monkeypatch):
    monkeypatch.delenv("MDS_PAGE_READS", raising=False)
    assert page_reads.mode() == "on"


@pytest.mark.parametrize("value", ["on", "off", "check"])
def test_each_setting(monkeypatch, value):
    monkeypatch.setenv("MDS_PAGE_READS", value)
    assert page_reads.mode() == value


@pytest.mark.parametrize("value", ["", "ON", "1", "true", " off", "checked"])
def test_any_other_value_is_refused_in_one_line(monkeypatch, value):
    monkeypatch.setenv("MDS_PAGE_READS", value)
    with pytest.raises(ConfigError) as err:
        page_reads.mode()
    message = str(err.value)
    assert (
        message == f"MDS_PAGE_READS={value!r} is not a page reads setting (allowed: on, off, check)"
    )


def test_a_mismatch_names_file_row_group_column_and_row():
    err = page_reads.mismatch("corpus/a.parquet", 3, "tokens", 1234, "token ids")
    assert isinstance(err, SourceDataError)
    assert str(err) == (
        "corpus/a.parquet: row group 3, column 'tokens', row 1234: the page reader's token ids "
        "differ from pyarrow's; set MDS_PAGE_READS=off to read this file with pyarrow only"
    )


def test_unreadable_names_file_row_group_column_and_the_first_line_of_the_cause():
    err = page_reads.unreadable("a.parquet", 0, "tokens", OSError("short read\nat 123"))
    assert isinstance(err, SourceDataError) and "\n" not in str(err)
    assert str(err).startswith(
        "a.parquet: row group 0, column 'tokens': pyarrow cannot read it (short read)"
    )
