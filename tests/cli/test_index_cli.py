"""`mds index` through the command line: output, JSON, one-line errors, the ad-hoc form."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from builders import config_file, multi_source, write_jsonl, write_parquet
from index_files import manifest_with_files
from typer.testing import CliRunner

from mds.cli.main import app
from mds.planner.index.tables import read_manifest


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    multi_source(tmp_path / "data")
    return tmp_path / "data"


def _assert_one_line_error(result, *fragments: str) -> str:
    assert result.exit_code == 1, result.output
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def test_success_prints_the_table(runner: CliRunner, root: Path, tmp_path: Path) -> None:
    out = tmp_path / "idx"
    result = runner.invoke(app, ["index", str(root / "mds.toml"), "-o", str(out), "-j", "2"])
    assert result.exit_code == 0, result.output
    for name, fmt in [
        ("web", "parquet"),
        ("forum", "jsonl"),
        ("code", "jsonl.zst"),
        ("wiki", "arrow"),
        ("math", "megatron"),
    ]:
        line = next(ln for ln in result.stdout.splitlines() if f" {name} " in ln)
        assert fmt in line
    assert "~21 (estimate)" in result.stdout  # the labelled estimate of `code`
    assert "73" in result.stdout  # web's exact token count
    assert "fingerprint" in result.stdout
    assert read_manifest(out).fingerprint in result.stdout.replace("\n", "")
    assert result.stderr == ""


def test_json_output(runner: CliRunner, root: Path, tmp_path: Path) -> None:
    out = tmp_path / "idx"
    result = runner.invoke(app, ["index", str(root / "mds.toml"), "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    manifest = read_manifest(out)
    assert data["index"] == str(out)
    assert data["fingerprint"] == manifest.fingerprint
    assert data["rows"] == sum(s["rows"] for s in manifest.sources) == 25
    assert data["tokens"] == sum(s["tokens"] for s in manifest.sources)
    assert [s["name"] for s in data["sources"]] == ["web", "forum", "code", "wiki", "math"]
    assert {s["name"]: s["exact"] for s in data["sources"]}["code"] is False
    assert data["files_scanned"] == data["files"] == 8
    # A second run scans nothing.
    again = json.loads(
        runner.invoke(app, ["index", str(root / "mds.toml"), "-o", str(out), "--json"]).stdout
    )
    assert again["files_scanned"] == 0
    assert again["fingerprint"] == data["fingerprint"]


def test_full_fingerprint_flag(runner: CliRunner, root: Path, tmp_path: Path) -> None:
    out = tmp_path / "idx"
    result = runner.invoke(
        app, ["index", str(root / "mds.toml"), "-o", str(out), "--full-fingerprint"]
    )
    assert result.exit_code == 0, result.output
    assert read_manifest(out).data["fingerprint_mode"] == "full"


def test_config_error_is_one_line(runner: CliRunner, tmp_path: Path) -> None:
    path = config_file(tmp_path, '[[source]]\nname = "web"\npath = "x"\ntokns = "t"\n')
    result = runner.invoke(app, ["index", str(path)])
    _assert_one_line_error(
        result, str(path), "[[source]] #1: unknown key `tokns`; did you mean `tokens`?"
    )


def test_config_error_text_is_not_taken_as_markup(runner: CliRunner, tmp_path: Path) -> None:
    write_parquet(tmp_path / "in/a.parquet", {"n": [1]})
    config_file(
        tmp_path,
        '[index]\nroot = "in"\n[[source]]\nname = "w"\npath = "../a.parquet"\ncount = "n"\n',
    )
    (tmp_path / "a.parquet").write_bytes((tmp_path / "in/a.parquet").read_bytes())
    result = runner.invoke(app, ["index", str(tmp_path / "mds.toml"), "-o", str(tmp_path / "o")])
    _assert_one_line_error(result, "is outside the data root", "set [index] `root`")


def test_missing_config_file(runner: CliRunner, tmp_path: Path) -> None:
    result = runner.invoke(app, ["index", str(tmp_path / "nope.toml")])
    _assert_one_line_error(result, "nope.toml: config file not found")


def test_source_data_error_is_one_line(runner: CliRunner, tmp_path: Path) -> None:
    write_jsonl(tmp_path / "d.jsonl", [{"n": 1}, "{broken", {"n": 2}])
    result = runner.invoke(
        app,
        ["index", "--path", str(tmp_path / "d.jsonl"), "--count", "n", "-o", str(tmp_path / "o")],
    )
    _assert_one_line_error(result, "d.jsonl line 2: malformed JSON")
    assert not (tmp_path / "o").exists()


def test_adhoc_source(runner: CliRunner, root: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(root)
    out = tmp_path / "adhoc"
    args = [
        "index",
        "--path",
        "web/*.parquet",
        "--tokens",
        "tokens",
        "--keep",
        "lang,quality",
        "-o",
        str(out),
    ]
    result = runner.invoke(app, [*args, "--name", "web", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["rows"] == 12
    assert data["tokens"] == 73
    entry = read_manifest(out).source("web")
    assert [f["path"] for f in entry["files"]] == [f"web/part-{i:05d}.parquet" for i in range(3)]
    assert entry["keep"] == {"lang": "String", "quality": "Float64"}


def test_adhoc_source_default_name_and_repeated_path(
    runner: CliRunner, root: Path, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.chdir(root)
    out = tmp_path / "adhoc"
    result = runner.invoke(
        app,
        [
            "index",
            "--path",
            "code/code-00000.jsonl.zst",
            "--path",
            "code/code-00001.jsonl.zst",
            "--text",
            "content",
            "--estimate",
            "bytes/4",
            "-o",
            str(out),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["sources"][0]["name"] == "data"
    assert data["sources"][0]["files"] == 2
    assert data["sources"][0]["exact"] is False


def test_adhoc_absolute_path_outside_the_working_directory(
    runner: CliRunner, root: Path, tmp_path: Path, monkeypatch
) -> None:
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    out = tmp_path / "adhoc"
    result = runner.invoke(
        app,
        [
            "index",
            "--path",
            str(root / "web" / "*.parquet"),
            "--tokens",
            "tokens",
            "-o",
            str(out),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["rows"] == 12


def test_adhoc_path_without_output(runner: CliRunner, root: Path, monkeypatch) -> None:
    monkeypatch.chdir(root)
    result = runner.invoke(app, ["index", "--path", "web/*.parquet", "--tokens", "tokens"])
    _assert_one_line_error(result, "--output is required with an ad-hoc --path source")


def test_adhoc_path_without_a_length(
    runner: CliRunner, root: Path, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.chdir(root)
    result = runner.invoke(app, ["index", "--path", "web/*.parquet", "-o", str(tmp_path / "o")])
    _assert_one_line_error(result, "source 'data': say how to measure length")


def test_config_and_path_together(runner: CliRunner, root: Path, tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["index", str(root / "mds.toml"), "--path", "web/*.parquet", "-o", str(tmp_path / "o")]
    )
    _assert_one_line_error(result, "give either a CONFIG file or --path")


def test_neither_config_nor_path(runner: CliRunner) -> None:
    _assert_one_line_error(runner.invoke(app, ["index"]), "give a CONFIG file, or --path")


def test_bad_workers_option(runner: CliRunner, root: Path) -> None:
    result = runner.invoke(app, ["index", str(root / "mds.toml"), "-j", "0"])
    assert result.exit_code == 2
    assert "Traceback" not in result.output


@pytest.mark.parametrize("args", [["--help"], ["index", "--help"], ["-h"]])
def test_help_has_examples(runner: CliRunner, args: list[str]) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 0
    assert "Example" in result.stdout
    assert "mds index" in result.stdout


def test_no_args_shows_help(runner: CliRunner) -> None:
    result = runner.invoke(app, [])
    assert "Usage" in result.output
    assert "index" in result.output


def test_version(runner: CliRunner) -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.stdout.startswith("mds ")


def test_startup_imports_neither_torch_nor_polars() -> None:
    code = "import mds.cli.main, sys; print('torch' in sys.modules, 'polars' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.strip() == "False False"


def _literal_corpus(root: Path) -> str:
    """Parquet, JSONL and Arrow files named like globs, each beside a decoy the glob would
    match (token id 5 where the named file holds 2); the config names them explicitly."""
    import pyarrow as pa
    from builders import write_arrow
    from literal_names import write_with_decoy

    sources = []
    for i, (ext, write) in enumerate(
        [
            (".parquet", lambda p, n: write_parquet(p, {"ids": [[n] * n] * 2})),
            (".jsonl", lambda p, n: write_jsonl(p, [{"ids": [n] * n}] * 2)),
            (".arrow", lambda p, n: write_arrow(p, pa.table({"ids": [[n] * n] * 2}))),
        ]
    ):
        write_with_decoy(root / "d", "p[1] ü ✓", "p1 ü ✓", ext, write)
        write_with_decoy(root / "d", "q*", "qz", ext, write)
        paths = [f"d/p[1] ü ✓{ext}", f"d/q*{ext}"]
        sources.append(
            f'[[source]]\nname = "s{i}"\npath = {json.dumps(paths)}\ntokens = "ids"\nweight = 1\n'
        )
    return "\n".join(sources)


def _file_rows(index: Path) -> dict[str, tuple[int, int]]:
    manifest = manifest_with_files(index)
    return {f["path"]: (f["rows"], f["tokens"]) for s in manifest["sources"] for f in s["files"]}


def test_file_names_with_glob_characters_are_indexed_and_replayed_as_they_are(
    tmp_path: Path, monkeypatch
) -> None:
    from cli_helpers import mds
    from s3_store import s3_server

    local = tmp_path / "data"
    sources = _literal_corpus(local)
    expected = {
        f"d/{stem}{ext}": (2, 4)
        for stem in ("p[1] ü ✓", "q*")
        for ext in (".parquet", ".jsonl", ".arrow")
    }
    plan = "[train]\nsteps = 2\ndp_size = 1\nmicro_batches = 1\nsamples_per_step = 3\n"
    plan += "max_tokens_per_micro_batch = 64\nseed = 1\n"
    config = config_file(tmp_path, f'[index]\nroot = "{local}"\n\n{sources}\n{plan}')
    result = mds("index", config, "-o", tmp_path / "idx")
    assert result.exit_code == 0, result.output
    assert _file_rows(tmp_path / "idx") == expected
    result = mds("plan", config, "-o", tmp_path / "p.mds", "--index", tmp_path / "idx")
    assert result.exit_code == 0, result.output
    from mds.executor import PlanExecutor

    with PlanExecutor(tmp_path / "p.mds", 0) as ex:
        ids = {int(t) for batch in ex for t in batch["input_ids"].flatten().tolist()}
    assert ids == {2}
    with s3_server(monkeypatch) as store:
        url = store.upload(local, "lit")
        config = config_file(tmp_path, f'[index]\nroot = "{url}"\n\n{sources}\n{plan}', "s3.toml")
        result = mds("index", config, "-o", tmp_path / "s3-idx")
        assert result.exit_code == 0, result.output
        assert _file_rows(tmp_path / "s3-idx") == expected


def test_a_token_id_that_is_not_an_integer_is_one_error_line(tmp_path: Path) -> None:
    from cli_helpers import mds, one_error_line

    data = tmp_path / "data"
    write_jsonl(data / "a.jsonl", [{"ids": [1, 2]}, {"ids": [3, True]}])
    config = config_file(
        data, '[[source]]\nname = "a"\npath = "a.jsonl"\ntokens = "ids"\nweight = 1\n'
    )
    one_error_line(mds("index", config, "-o", tmp_path / "idx"), "a.jsonl line 2: token id true")


@pytest.mark.parametrize("depth", [65, 200, 100_000])
def test_metadata_nested_too_deep_is_one_error_line(tmp_path: Path, depth: int) -> None:
    from cli_helpers import mds, one_error_line

    data = tmp_path / "data"
    data.mkdir()
    deep = "[" * depth + "]" * depth
    (data / "a.jsonl").write_text(f'{{"ids": [1, 2]}}\n{{"ids": [3], "meta": {deep}}}\n')
    config = config_file(
        data,
        '[[source]]\nname = "a"\npath = "a.jsonl"\ntokens = "ids"\nkeep = ["meta"]\nweight = 1\n',
    )
    one_error_line(mds("index", config, "-o", tmp_path / "idx"), "a.jsonl line 2: ")


def test_metadata_64_deep_is_kept(tmp_path: Path) -> None:
    from cli_helpers import mds

    data = tmp_path / "data"
    data.mkdir()
    deep = "[" * 64 + "]" * 64
    (data / "a.jsonl").write_text(f'{{"ids": [1, 2]}}\n{{"ids": [3], "meta": {deep}}}\n')
    config = config_file(
        data,
        '[[source]]\nname = "a"\npath = "a.jsonl"\ntokens = "ids"\nkeep = ["meta"]\nweight = 1\n',
    )
    assert mds("index", config, "-o", tmp_path / "idx").exit_code == 0
