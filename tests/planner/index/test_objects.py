"""Discovery of a source's objects under an s3:// root, from one listing of its keys."""

from __future__ import annotations

import pytest
from builders import source

from mds.executor.errors import ConfigError
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
