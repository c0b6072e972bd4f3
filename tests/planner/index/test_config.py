"""Config validation: every branch of parse_config / parse_source / load_config / resolve_format."""

from __future__ import annotations

from pathlib import Path

import pytest
from builders import config_file

from mds.errors import ConfigError
from mds.planner.index.config import (
    Estimate,
    LengthSpec,
    load_config,
    parse_config,
    parse_source,
    resolve_format,
)

SOURCE = '[[source]]\nname = "web"\npath = "web/*.parquet"\ntokens = "tokens"\n'


def _load_error(tmp_path: Path, text: str) -> str:
    path = config_file(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert str(path) in message, message
    return message


def _source_error(**table) -> str:
    with pytest.raises(ConfigError) as info:
        parse_source(table, "cfg.toml: [[source]] #1: ")
    message = str(info.value)
    assert message.startswith("cfg.toml: [[source]] #1"), message
    return message


# --- happy paths ------------------------------------------------------------------------------


def test_paths_resolve_against_the_config_files_directory(tmp_path: Path, monkeypatch) -> None:
    conf_dir = tmp_path / "conf"
    path = config_file(
        conf_dir,
        '[index]\nroot = "../data"\noutput = "out/index"\nworkers = 3\nfingerprint = "full"\n'
        + SOURCE,
    )
    monkeypatch.chdir(tmp_path)  # the working directory must not matter
    cfg = load_config(path)
    assert cfg.root == (tmp_path / "data").resolve()
    assert cfg.output == (conf_dir / "out" / "index").resolve()
    assert cfg.workers == 3
    assert cfg.fingerprint == "full"
    assert cfg.path == path
    (spec,) = cfg.sources
    assert spec.name == "web"
    assert spec.paths == ("web/*.parquet",)
    assert spec.length == LengthSpec("tokens", column="tokens")
    assert spec.payload == {"kind": "token_ids", "column": "tokens"}


def test_defaults_root_is_the_config_directory(tmp_path: Path) -> None:
    cfg = load_config(config_file(tmp_path / "c", SOURCE))
    assert cfg.root == (tmp_path / "c").resolve()
    assert cfg.output is None
    assert cfg.workers is None
    assert cfg.fingerprint == "sampled"


def test_parse_config_without_a_file_uses_base(tmp_path: Path) -> None:
    cfg = parse_config({"source": [{"name": "a", "path": "x", "count": "n"}]}, base=tmp_path)
    assert cfg.root == tmp_path.resolve()
    assert cfg.path is None


def test_every_length_kind_and_keep() -> None:
    spec = parse_source(
        {"name": "b", "path": ["a", "b"], "count": "n", "text": "t", "keep": "lang"}, "x: "
    )
    assert spec.paths == ("a", "b")
    assert spec.keep == ("lang",)  # a single string is a one-item list
    assert spec.length == LengthSpec("count", column="n")
    assert spec.payload == {"kind": "text", "column": "t"}
    assert spec.columns() == ("n", "t", "lang")

    spec = parse_source({"name": "t", "path": "a", "text": "t", "tokenizer": "tok.json"}, "x: ")
    assert spec.length == LengthSpec("tokenizer", column="t", tokenizer="tok.json")
    assert spec.length.exact

    spec = parse_source({"name": "e", "path": "a", "text": "t", "estimate": " chars / 3.5 "}, "x: ")
    assert spec.length == LengthSpec("estimate", column="t", estimate=Estimate("chars", 3.5))
    assert not spec.length.exact
    assert spec.length.describe() == {
        "kind": "estimate",
        "exact": False,
        "column": "t",
        "rule": "chars/3.5",
    }

    spec = parse_source({"name": "m", "path": "a", "format": "megatron"}, "x: ")
    assert spec.length == LengthSpec("megatron")
    assert spec.payload == {"kind": "token_ids", "column": ""}


def test_plan_keys_are_accepted_and_kept_aside() -> None:
    spec = parse_source({"name": "a", "path": "x", "count": "n", "weight": 2.0}, "x: ")
    assert spec.plan == {"weight": 2.0}
    cfg = parse_config(
        {"train": {"steps": 1}, "cost": {}, "plan": {}, "source": [{"name": "a", "path": "x"}]}
    )
    assert cfg.sources[0].length.kind == "auto"


# --- top level and [index] -------------------------------------------------------------------


def test_unknown_top_level_key(tmp_path: Path) -> None:
    message = _load_error(tmp_path, "[indx]\n" + SOURCE)
    assert "unknown key `indx`" in message
    assert "did you mean `index`?" in message


def test_unknown_top_level_key_without_a_close_match(tmp_path: Path) -> None:
    message = _load_error(tmp_path, "[zzzzzz]\n" + SOURCE)
    assert "unknown key `zzzzzz`; expected one of index, source, train, cost, plan" in message


def test_unknown_index_key(tmp_path: Path) -> None:
    message = _load_error(tmp_path, '[index]\noutptu = "x"\n' + SOURCE)
    assert "[index]: unknown key `outptu`; did you mean `output`?" in message


def test_index_must_be_a_table(tmp_path: Path) -> None:
    assert "`index` must be a table" in _load_error(tmp_path, 'index = "x"\n' + SOURCE)


@pytest.mark.parametrize("workers", ["0", "-2", '"4"', "true", "1.5"])
def test_bad_workers(tmp_path: Path, workers: str) -> None:
    message = _load_error(tmp_path, f"[index]\nworkers = {workers}\n" + SOURCE)
    assert "[index]: `workers` must be a positive integer" in message


def test_bad_fingerprint(tmp_path: Path) -> None:
    message = _load_error(tmp_path, '[index]\nfingerprint = "md5"\n' + SOURCE)
    assert "[index]: `fingerprint` must be one of sampled, full, got 'md5'" in message


def test_non_string_index_value(tmp_path: Path) -> None:
    message = _load_error(tmp_path, "[index]\nroot = 3\n" + SOURCE)
    assert "[index]: `root` must be a non-empty string, got 3" in message


@pytest.mark.parametrize("text", ["", "[index]\n", 'source = "x"\n', "source = []\n"])
def test_no_sources(tmp_path: Path, text: str) -> None:
    assert "no sources: add at least one [[source]] table" in _load_error(tmp_path, text)


def test_invalid_toml(tmp_path: Path) -> None:
    message = _load_error(tmp_path, "[[source]\nname = \n")
    assert "invalid TOML" in message


def test_undecodable_config(tmp_path: Path) -> None:
    path = tmp_path / "mds.toml"
    path.write_bytes(b'[[source]]\nname = "\xff"\n')
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(path)


def test_missing_config_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == f"{path}: config file not found"


def test_config_that_is_a_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path)


# --- [[source]] ------------------------------------------------------------------------------


def test_unknown_source_key_with_did_you_mean(tmp_path: Path) -> None:
    message = _load_error(tmp_path, SOURCE + 'kepe = ["lang"]\n')
    assert "[[source]] #1: unknown key `kepe`; did you mean `keep`?" in message


def test_unknown_source_key_is_found_before_other_problems() -> None:
    message = _source_error(name="a", path="x", tokns="ids")
    assert "unknown key `tokns`; did you mean `tokens`?" in message


def test_source_must_be_a_table() -> None:
    with pytest.raises(ConfigError, match=r"x: \[\[source\]\] #1: must be a table"):
        parse_config({"source": ["web"]}, path=Path("x"))


def test_missing_name() -> None:
    assert "`name` is required" in _source_error(path="x", tokens="t")


@pytest.mark.parametrize("name", ["", "has space", "-dash", "a/b", "x" * 65, "ünï"])
def test_bad_name(name: str) -> None:
    message = _source_error(name=name, path="x", tokens="t")
    assert "`name` must" in message


def test_name_that_is_not_a_string() -> None:
    assert "`name` must be a non-empty string, got 7" in _source_error(name=7, path="x")


def test_missing_path_names_the_source() -> None:
    message = _source_error(name="web", tokens="t")
    assert message.startswith("cfg.toml: [[source]] #1 ('web'): `path` is required")


@pytest.mark.parametrize("path", [[], "", ["a", ""], ["a", 3], 5])
def test_bad_path(path) -> None:
    message = _source_error(name="web", path=path, tokens="t")
    assert "`path`" in message


def test_duplicate_names(tmp_path: Path) -> None:
    message = _load_error(tmp_path, SOURCE + SOURCE.replace("tokens =", "count ="))
    assert "[[source]] #2: duplicate source name 'web'" in message


def test_bad_format() -> None:
    message = _source_error(name="a", path="x", tokens="t", format="csv")
    assert (
        "`format` must be one of parquet, jsonl, jsonl.zst, arrow, megatron, webdataset, got 'csv'"
        in (message)
    )


def test_two_length_keys() -> None:
    message = _source_error(name="a", path="x", tokens="t", count="n")
    assert "set only one of `tokens`, `count`, `tokenizer`, `estimate`; got tokens, count" in (
        message
    )


def test_no_length_key_is_settled_by_the_format() -> None:
    spec = parse_source({"name": "a", "path": "x"}, "x: ")
    assert spec.length.kind == "auto"
    with pytest.raises(ConfigError) as info:
        resolve_format(spec, "parquet")
    assert str(info.value).startswith("source 'a': say how to measure length: set `tokens`")
    assert resolve_format(spec, "megatron").length == LengthSpec("megatron")


@pytest.mark.parametrize("key", ["tokenizer", "estimate"])
def test_tokenizer_or_estimate_without_text(key: str) -> None:
    value = "tok.json" if key == "tokenizer" else "bytes/4"
    message = _source_error(name="a", path="x", **{key: value})
    assert f"`{key}` needs `text`" in message


@pytest.mark.parametrize("value", ["bytes/0", "bytes/0.0", "tokens/4", "bytes", "bytes/-1", "/4"])
def test_bad_estimate(value: str) -> None:
    message = _source_error(name="a", path="x", text="t", estimate=value)
    assert '`estimate` must look like "bytes/4" or "chars/3.5"' in message
    assert repr(value) in message


@pytest.mark.parametrize("column", ["file_id", "file_row", "offset", "length", "n_tokens", "row"])
def test_reserved_keep_names(column: str) -> None:
    message = _source_error(name="a", path="x", tokens="t", keep=["lang", column])
    assert f"`keep` cannot include {column!r}" in message


@pytest.mark.parametrize("key", ["tokens", "count", "estimate", "tokenizer"])
def test_megatron_rejects_length_keys(key: str) -> None:
    message = _source_error(name="m", path="x", format="megatron", text="t", **{key: "v"})
    assert f'`{key}` does not apply to format "megatron"' in message


@pytest.mark.parametrize("key", ["keep", "text"])
def test_megatron_rejects_columns(key: str) -> None:
    message = _source_error(name="m", path="x", format="megatron", **{key: "lang"})
    assert f'`{key}` does not apply to format "megatron": it has no columns' in message


def test_detected_megatron_rejects_length_and_columns() -> None:
    spec = parse_source({"name": "m", "path": "x", "tokens": "t"}, "x: ")
    with pytest.raises(
        ConfigError, match=r'source \'m\': `tokens` does not apply to format "megatron"'
    ):
        resolve_format(spec, "megatron")
    spec = parse_source({"name": "m", "path": "x", "keep": ["lang"]}, "x: ")
    with pytest.raises(ConfigError, match='`keep` does not apply to format "megatron"'):
        resolve_format(spec, "megatron")


def test_config_error_names_the_file_and_the_source(tmp_path: Path) -> None:
    message = _load_error(tmp_path, SOURCE + SOURCE.replace('"web"', '"books"') + "count = 'n'\n")
    assert "[[source]] #2 ('books'): set only one of" in message


def test_config_with_a_utf8_byte_order_mark(tmp_path: Path) -> None:
    # Some editors start UTF-8 files with a BOM; TOML itself rejects it, mds accepts it.
    path = tmp_path / "mds.toml"
    path.write_bytes(b"\xef\xbb\xbf" + SOURCE.encode())
    assert [s.name for s in load_config(path).sources] == ["web"]


# --- image-text sources (docs/vision.md) ------------------------------------------------------

IMAGE_SOURCE = '[[source]]\nname = "caps"\npath = "a.tar"\nimages = "jpg;png"\ntext = "txt"\n'


def test_image_source_and_vision_marker(tmp_path: Path) -> None:
    path = config_file(
        tmp_path,
        IMAGE_SOURCE
        + 'estimate = "bytes/4"\non_bad_image = "drop"\n\n[vision]\nmarker = "<img>"\npatch_size = 16\n',
    )
    spec = load_config(path).sources[0]
    assert spec.images is not None
    assert (spec.images.field, spec.images.on_bad, spec.images.marker) == (
        "jpg;png",
        "drop",
        "<img>",
    )
    assert spec.images.extensions == ("jpg", "png")
    spec = resolve_format(spec, "webdataset")
    assert spec.payload == {
        "kind": "image_text",
        "layout": "webdataset",
        "text": "txt",
        "images": "jpg;png",
    }
    assert resolve_format(spec, "jsonl.zst").payload["layout"] == "jsonl"  # type: ignore[index]
    default = parse_source(
        {"name": "c", "path": "x", "images": "img", "text": "t", "count": "n"}, "x: "
    )
    assert default.images is not None and default.images.marker == "<image>"


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"on_bad_image": "drop", "tokens": "t"}, "`on_bad_image` applies to image-text sources"),
        (
            {"images": "jpg", "on_bad_image": "skip", "text": "t", "estimate": "bytes/4"},
            "`on_bad_image` must be one of error, drop, got 'skip'",
        ),
        ({"images": "jpg", "estimate": "bytes/4"}, "`images` needs `text`"),
        (
            {"images": "jpg", "text": "t", "tokens": "ids"},
            "`tokens` does not apply to an image-text source",
        ),
        (
            {"images": "jpg", "text": "t", "format": "arrow", "estimate": "bytes/4"},
            "`images` does not apply to format 'arrow'",
        ),
        (
            {"images": "jpg;;png", "text": "txt", "format": "webdataset", "estimate": "bytes/4"},
            "`images` must be member extensions",
        ),
        (
            {"images": "jpg", "text": "json:", "format": "webdataset", "estimate": "bytes/4"},
            '"json:KEY"',
        ),
        (
            {"images": "jpg;txt", "text": "txt", "format": "webdataset", "estimate": "bytes/4"},
            "also one of the image extensions",
        ),
        (
            {
                "images": "jpg",
                "text": "txt",
                "format": "webdataset",
                "estimate": "bytes/4",
                "keep": ["a"],
            },
            '`keep` does not apply to format "webdataset"',
        ),
        ({"images": "", "text": "t"}, "`images` must be a non-empty string"),
    ],
)
def test_image_source_errors(table, message) -> None:
    assert message in _source_error(name="a", path="x", **table)


def test_image_errors_settled_with_the_format() -> None:
    spec = parse_source(
        {"name": "c", "path": "x", "images": "jpg", "text": "t", "count": "n"}, "x: "
    )
    with pytest.raises(ConfigError, match='`count` does not apply to format "webdataset"'):
        resolve_format(spec, "webdataset")
    with pytest.raises(ConfigError, match="`images` does not apply to format 'megatron'"):
        resolve_format(spec, "megatron")
    with pytest.raises(ConfigError, match='format "webdataset" needs `images`'):
        resolve_format(parse_source({"name": "c", "path": "x", "count": "n"}, "x: "), "webdataset")


def test_vision_table_errors(tmp_path: Path) -> None:
    message = _load_error(tmp_path, SOURCE + '[vision]\nmarker = ""\n')
    assert "[vision]: `marker` must be a non-empty string" in message
    message = _load_error(tmp_path, "vision = 3\n" + SOURCE)
    assert "`vision` must be a table" in message


@pytest.mark.parametrize(
    ("root", "recorded"),
    [
        (".", "tok/tokenizer.json"),  # under the data root: recorded relative to it
        ("data", None),  # beside the data: recorded absolute
        ("s3://bucket/corpus", None),  # the data in a store, the tokenizer local
        ("gs://bucket/corpus", None),
    ],
)
def test_a_relative_tokenizer_is_relative_to_the_config(tmp_path: Path, root, recorded) -> None:
    """As every relative path of a config, whatever the data root is."""
    table = {"name": "t", "path": "a.jsonl", "text": "t", "tokenizer": "tok/tokenizer.json"}
    config = parse_config({"index": {"root": root}, "source": [table]}, path=tmp_path / "c.toml")
    (spec,) = config.sources
    want = recorded or str(tmp_path.resolve() / "tok" / "tokenizer.json")
    assert spec.length.tokenizer == want
    if recorded is not None:
        assert Path(config.root) / spec.length.tokenizer == tmp_path.resolve() / want
    from mds.planner.index.reuse import resolve_tokenizer

    (tmp_path / "tok").mkdir()
    (tmp_path / "tok" / "tokenizer.json").write_text("{}")
    found = resolve_tokenizer(spec, config.root)
    assert found == (tmp_path / "tok" / "tokenizer.json").resolve()
