"""`mds index sample_data/vlm.toml` through the command line: the image-text sample data
(WebDataset shards and a Parquet image column) indexes, and a bad image is one error line."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from mds.cli.main import app
from mds.planner.index.tables import read_manifest, source_frame

SAMPLE = Path(__file__).resolve().parents[2] / "sample_data"

pytest.importorskip("tokenizers")


def test_index_the_vlm_sample_data(tmp_path: Path) -> None:
    out = tmp_path / "vlm-index"
    result = CliRunner().invoke(app, ["index", str(SAMPLE / "vlm.toml"), "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert {s["name"]: s["rows"] for s in summary["sources"]} == {"captions": 48, "charts": 20}
    manifest = read_manifest(out)
    captions = manifest.source("captions")
    assert captions["format"] == "webdataset"
    assert captions["payload"]["kind"] == "image_text"
    assert captions["dropped_bad_images"] == 0
    table = source_frame(manifest, "captions").collect()
    assert set(table["n_images"].to_list()) == {0, 1, 2}
    widths = table["image_width"].explode().drop_nulls()
    assert widths.min() == 32 and widths.max() >= 1024
    charts = source_frame(manifest, "charts").collect()
    assert charts.columns[-1] == "lang"
    assert (charts["n_images"] == charts["image_width"].list.len()).all()


def test_a_bad_image_is_one_error_line(tmp_path: Path) -> None:
    data = tmp_path / "data"
    shutil.copytree(SAMPLE / "vlm", data / "vlm")
    shutil.copy(SAMPLE / "tokenizer.json", data / "tokenizer.json")
    shutil.copy(SAMPLE / "vlm.toml", data / "vlm.toml")
    shard = data / "vlm" / "captions" / "captions-00000.tar"
    raw = bytearray(shard.read_bytes())
    at = raw.index(b"\xff\xd8\xff")  # the first JPEG's header: damage its markers
    raw[at : at + 8] = b"\xff\xd8\xff\xd9\x00\x00\x00\x00"
    shard.write_bytes(bytes(raw))
    result = CliRunner().invoke(app, ["index", str(data / "vlm.toml"), "-o", str(tmp_path / "o")])
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "vlm/captions/captions-00000.tar sample 'cap" in lines[0]
    assert "JPEG" in lines[0]
