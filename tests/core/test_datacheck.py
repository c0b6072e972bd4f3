"""Paths a plan names: kept inside the data root whether or not a part of them is a link."""

from __future__ import annotations

import os

import pytest

from mds.core.datacheck import safe_path


def test_a_linked_directory_leading_out_of_the_root_is_refused(tmp_path):
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (outside / "a.parquet").write_bytes(b"x")
    (root / "sub").symlink_to(outside)
    with pytest.raises(ValueError, match="leads outside the index root"):
        safe_path(root, "sub/a.parquet", "web files[0]")


def test_links_that_stay_inside_the_root_are_followed(tmp_path):
    root = tmp_path / "root"
    (root / "data").mkdir(parents=True)
    (root / "data" / "a.parquet").write_bytes(b"x")
    (root / "alias").symlink_to(root / "data")
    (root / "data" / "b.parquet").symlink_to(root / "data" / "a.parquet")
    assert safe_path(root, "alias/a.parquet", "w") == root / "alias" / "a.parquet"
    assert safe_path(root, "data/b.parquet", "w") == root / "data" / "b.parquet"


def test_a_root_reached_through_a_link_is_no_escape(tmp_path):
    (tmp_path / "real" / "d").mkdir(parents=True)
    (tmp_path / "real" / "d" / "a.parquet").write_bytes(b"x")
    (tmp_path / "root").symlink_to(tmp_path / "real")
    assert safe_path(tmp_path / "root", "d/a.parquet", "w") == tmp_path / "root" / "d" / "a.parquet"


def test_a_missing_file_is_left_to_the_readers(tmp_path):
    assert safe_path(tmp_path, "no/such.parquet", "w") == tmp_path / "no" / "such.parquet"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_only_regular_files_are_read(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "d").mkdir()
    for rel in ("pipe", "d"):
        with pytest.raises(ValueError, match="not a regular file"):
            safe_path(tmp_path, rel, "w")
    (tmp_path / "link").symlink_to(tmp_path / "pipe")
    with pytest.raises(ValueError, match="not a regular file"):
        safe_path(tmp_path, "link", "w")


def test_a_nul_byte_is_refused(tmp_path):
    with pytest.raises(ValueError, match="cannot be resolved"):
        safe_path(tmp_path, "a\0b", "w")


def test_directories_found_to_be_no_links_are_checked_once(tmp_path, monkeypatch):
    root = tmp_path / "root"
    (root / "web" / "2024").mkdir(parents=True)
    for name in ("a", "b"):
        (root / "web" / "2024" / f"{name}.parquet").write_bytes(b"x")
    (root / "linked").symlink_to(tmp_path)
    seen: list[str] = []
    real = os.lstat

    def counted(path, *args, **kwargs):
        if str(path).startswith(str(root)):
            seen.append(os.path.relpath(path, root))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "lstat", counted)
    dirs: set[str] = set()
    for name in ("a", "b"):
        safe_path(root, f"web/2024/{name}.parquet", "w", dirs)
    assert seen == ["web", "web/2024", "web/2024/a.parquet", "web/2024/b.parquet"]
    # a link is never remembered as a directory: it is resolved every time
    with pytest.raises(ValueError, match="leads outside the index root"):
        safe_path(root, "linked/x", "w", dirs)
    assert not any(d.endswith("linked") for d in dirs)
