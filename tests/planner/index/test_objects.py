"""Discovery of a source's objects under an s3:// root, from one listing of its keys."""

from __future__ import annotations

import pytest
from builders import source
from literal_names import IDS, NAMES

from mds.errors import ConfigError
from mds.planner.index.objects import discover_objects

ROOT = "s3://bucket/corpus"
KEYS = (
    "forum/a.jsonl",
    "forum/b.jsonl",
    "forum/notes.txt",
    "web/2024/part-0.parquet",
    "web/part-1.parquet",
    "web/part-2.parquet",
)


def _found(path, **kwargs) -> list[str]:
    spec = source(name="s", path=path, tokens="tokens", **kwargs)
    return [f.rel for f in discover_objects(spec, ROOT, KEYS)]


def test_globs_keys_and_prefixes():
    assert _found("web/*.parquet") == ["web/part-1.parquet", "web/part-2.parquet"]
    assert _found("web/**/*.parquet") == [
        "web/2024/part-0.parquet",
        "web/part-1.parquet",
        "web/part-2.parquet",
    ]
    assert _found("forum/a.jsonl") == ["forum/a.jsonl"]
    assert _found("forum") == ["forum/a.jsonl", "forum/b.jsonl"]  # data objects only
    spec = source(name="s", path="web/part-1.parquet", tokens="tokens")
    (file,) = discover_objects(spec, ROOT, KEYS)
    assert file.path == f"{ROOT}/web/part-1.parquet" and file.format == "parquet"


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("books/*.parquet", "matches no objects under s3://bucket/corpus"),
        ("../other/x.parquet", "must be relative to the data root"),
        ("forum/notes.txt", "cannot tell the format"),
        (["web/*.parquet", "forum/*.jsonl"], "several formats"),
    ],
)
def test_refusals_name_the_pattern(path, message):
    with pytest.raises(ConfigError, match=message):
        _found(path)


@pytest.mark.parametrize(("stem", "decoy"), NAMES, ids=IDS)
def test_an_existing_key_is_that_object_even_with_glob_characters(stem, decoy):
    keys = tuple(sorted({f"d/{stem}.parquet", f"d/{decoy or stem}.parquet"}))
    spec = source(name="s", path=f"d/{stem}.parquet", tokens="tokens")
    assert [f.rel for f in discover_objects(spec, ROOT, keys)] == [f"d/{stem}.parquet"]


def test_a_key_that_does_not_exist_is_a_pattern_as_glob_reads_it():
    keys = ("p1.parquet", "p2.parquet", "p3.parquet", "p[12].txt", "q/p1.parquet")
    assert [
        f.rel for f in discover_objects(source(path="p[12].parquet", tokens="t"), ROOT, keys)
    ] == [
        "p1.parquet",
        "p2.parquet",
    ]
    for pattern, found in [
        ("p[!1].parquet", ["p2.parquet", "p3.parquet"]),
        ("p[1-2].parquet", ["p1.parquet", "p2.parquet"]),
        ("*[/]p1.parquet", []),
    ]:
        spec = source(path=pattern, tokens="t")
        if found:
            assert [f.rel for f in discover_objects(spec, ROOT, keys)] == found
        else:
            with pytest.raises(ConfigError, match="matches no objects"):
                discover_objects(spec, ROOT, keys)
