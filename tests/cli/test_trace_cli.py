"""`mds trace` from the command line: the same samples as `mds export` of those steps, the
content hashes and --show of sample_data, JSONL byte ranges that hold the record shown,
a re-planned plan, `mds export --hash`, and the errors."""

from __future__ import annotations

import json

import polars as pl
import pytest
from cli_helpers import json_error, mds, one_error_line
from plan_builders import REPO, SAMPLE_CONFIG, sample_index

from mds.cli.trace import TRACE_KEYS
from mds.core.content_hash import hash_text, hash_tokens


@pytest.fixture(scope="module")
def plan(tmp_path_factory):
    index = sample_index(tmp_path_factory)
    path = tmp_path_factory.mktemp("trace-cli") / "plan.mds"
    result = mds("plan", SAMPLE_CONFIG, "--index", index, "-o", path)
    assert result.exit_code == 0, result.output
    return path


def _export(plan, tmp_path, *args) -> pl.DataFrame:
    out = tmp_path / "export.parquet"
    result = mds("export", plan, "-o", out, *args)
    assert result.exit_code == 0, result.output
    return pl.read_parquet(out)


def _trace(plan, *args) -> list[dict]:
    result = mds("trace", plan, *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.mark.parametrize("selection", [("--step", "17"), ("--steps", "14:18"), ("--steps", "60:")])
def test_same_samples_as_export(plan, tmp_path, selection):
    """Every key but the hash equals the export's row of the same sample, in the same
    order, whatever chunks the steps lie in (chunk_steps 16: 14:18 spans two)."""
    steps = selection[1] if selection[0] == "--steps" else "17:18"
    rows = _trace(plan, *selection)
    exported = _export(plan, tmp_path, "--steps", steps)
    assert all(sorted(r) == sorted(TRACE_KEYS) for r in rows)
    keys = [k for k in TRACE_KEYS if k != "content_hash"]
    assert [{k: r[k] for k in keys} for r in rows] == exported.select(keys).to_dicts()
    assert len({r["source"] for r in rows}) > 2
    assert all(len(r["content_hash"]) == 32 for r in rows)


def test_rank_and_micro_batch(plan, tmp_path):
    rows = _trace(plan, "--steps", "4:8", "--rank", "1", "--rank", "3", "--micro-batch", "1")
    exported = _export(plan, tmp_path, "--steps", "4:8", "--rank", "1", "--rank", "3")
    exported = exported.filter(pl.col("micro_batch") == 1)
    assert [r["sample_id"] for r in rows] == exported["sample_id"].to_list()
    assert {(r["rank"], r["micro_batch"]) for r in rows} == {(1, 1), (3, 1)}


def test_hashes_and_show_of_sample_data(plan):
    """A token source's hash is that of its ids; a text source's, of the text --show prints,
    and a JSONL sample's byte range holds exactly that record."""
    rows = _trace(plan, "--steps", "0:8", "--show")
    by_source = {}
    for row in rows:
        by_source.setdefault(row["source"], row)
        if "text" in row and row["source"] in ("books", "forum", "code"):
            assert row["content_hash"] == hash_text(row["text"])
        if "tokens" in row:
            assert row["content_hash"] == hash_tokens(row["tokens"])
            assert len(row["tokens"]) == row["n_tokens"]
    assert {"web", "books", "forum", "code"} <= set(by_source)
    assert "tokens" in by_source["web"]
    forum = [r for r in rows if r["source"] == "forum"]
    assert forum and all(r["byte_offset"] is not None for r in forum)
    data = (REPO / "sample_data" / forum[0]["file"]).read_bytes()
    for row in forum:
        line = data[row["byte_offset"] : row["byte_offset"] + row["byte_length"]]
        assert json.loads(line)["text"] == row["text"]
    assert all(r["byte_offset"] is None for r in rows if r["source"] in ("web", "math"))


def test_table_output(plan):
    result = mds("trace", plan, "--step", "3", "--rank", "0", "--show")
    assert result.exit_code == 0, result.output
    assert "content hash" in result.stdout
    assert result.stdout.rstrip().endswith("samples")


def test_replanned_plan(plan, tmp_path):
    """A plan re-planned from step 32 traces its own steps, as its export gives them."""
    index = sample_index.__globals__["_SAMPLE_INDEX"]["index"]
    new = tmp_path / "new.mds"
    args = ("--from", plan, "--at-step", "32", "--index", index, "-o", new)
    result = mds("plan", REPO / "sample_data" / "new-mix.toml", *args)
    assert result.exit_code == 0, result.output
    rows = _trace(new, "--steps", "40:42")
    exported = _export(new, tmp_path, "--steps", "40:42")
    keys = [k for k in TRACE_KEYS if k != "content_hash"]
    assert [{k: r[k] for k in keys} for r in rows] == exported.select(keys).to_dicts()
    one_error_line(mds("trace", new, "--step", "3"), "--step 3 is not inside the plan's steps 32:64")


def test_export_hash(plan, tmp_path):
    """`mds export --hash` adds the hashes trace gives the same samples."""
    frame = _export(plan, tmp_path, "--steps", "14:18", "--hash")
    assert frame.columns[-1] == "content_hash"
    rows = _trace(plan, "--steps", "14:18")
    assert frame["content_hash"].to_list() == [r["content_hash"] for r in rows]
    assert "content_hash" not in _export(plan, tmp_path, "--steps", "14:18").columns


def test_errors(plan, tmp_path):
    one_error_line(mds("trace", plan), "--step N or --steps A:B")
    one_error_line(mds("trace", plan, "--step", "64"), "--step 64 is not inside the plan's steps 0:64")
    one_error_line(mds("trace", plan, "--steps", "60:70"), "--steps 60:70 is not inside")
    json_error(mds("trace", plan, "--step", "1", "--rank", "4", "--json"), "--rank 4")
    one_error_line(mds("trace", plan, "--step", "1", "--micro-batch", "2"), "--micro-batch 2")
    one_error_line(
        mds("trace", plan, "--step", "1", "--data-root", tmp_path), "none of the indexed files"
    )


def test_plan_in_object_storage(plan, monkeypatch):
    """A plan in S3 is traced by range reads, its data from --data-root, as a local one."""
    from s3_store import s3_server

    local = _trace(plan, "--step", "9", "--rank", "2")
    with s3_server(monkeypatch) as store:
        store.put("plans/plan.mds", plan.read_bytes())
        url = store.url("plans/plan.mds")
        assert _trace(url, "--step", "9", "--rank", "2", "--data-root", REPO / "sample_data") == local


def test_cost_expr_and_vision_plans(tmp_path):
    """Plans whose cost needs the index (a cost expr, a [vision] plan's image parts) trace
    export's rows too; an image-text sample's hash covers its text and image bytes."""
    from mds.core.content_hash import hash_image_text

    config = tmp_path / "data" / "mds.toml"
    import shutil

    shutil.copytree(REPO / "sample_data", tmp_path / "data")
    text = config.read_text().replace(
        "model = { layers = 12, hidden = 768, vocab = 2011 }", 'expr = "n_tokens * 2 + 1"'
    )
    config.write_text(text)
    vlm = tmp_path / "data" / "vlm.toml"
    for name, cfg in (("expr", config), ("vlm", vlm)):
        index, plan = tmp_path / f"{name}-index", tmp_path / f"{name}.mds"
        assert mds("index", cfg, "-o", index).exit_code == 0
        result = mds("plan", cfg, "--index", index, "-o", plan)
        assert result.exit_code == 0, result.output
        rows = _trace(plan, "--steps", "2:4", "--show")
        exported = _export(plan, tmp_path, "--steps", "2:4")
        keys = [k for k in TRACE_KEYS if k != "content_hash"]
        assert [{k: r[k] for k in keys} for r in rows] == exported.select(keys).to_dicts()
    with_images = [
        r for r in rows
        if "text" in r and r["content_hash"] not in (hash_text(r["text"]), hash_image_text(r["text"], []))
    ]  # fmt: skip
    assert with_images  # image-text samples: their images' bytes are hashed too


def test_show_decodes_ids_with_the_index_tokenizer(tmp_path):
    """Token ids of a source the index counted with a tokenizer.json are shown as text; of
    one whose tokenizer is gone, as ids."""
    from types import SimpleNamespace

    import numpy as np
    from tokenizers import Tokenizer

    from mds.cli.trace import _shown

    data = REPO / "sample_data"
    tok = Tokenizer.from_file(str(data / "tokenizer.json"))
    ids = np.array(tok.encode("kate guda kobu ri", add_special_tokens=False).ids, dtype=np.int32)
    facts = {"format": "parquet", "length": {"kind": "tokenizer", "tokenizer": "tokenizer.json"}}
    missing = {**facts, "length": {"kind": "tokenizer", "tokenizer": "gone.json"}}
    footer = {"fetch": {"root": str(data), "sources": {"s": facts, "t": missing}}}
    trace = SimpleNamespace(footer=footer, plan=tmp_path / "plan.mds")
    shown = _shown(ids, "s", trace, None, {})
    assert shown == {"text": "kate guda kobu ri"}
    assert _shown(ids, "t", trace, None, {}) == {"tokens": ids.tolist()}


def test_moved_plan_names_data_root(plan, tmp_path):
    """A plan copied away from its data says to pass --data-root; with it, the plan alone
    is traced (no index: where samples lie is in the plan)."""
    import shutil

    moved = tmp_path / "a" / "b" / "c" / "plan.mds"
    moved.parent.mkdir(parents=True)
    shutil.copy(plan, moved)
    one_error_line(mds("trace", moved, "--step", "2"), "--data-root")
    rows = _trace(moved, "--step", "2", "--data-root", REPO / "sample_data")
    assert rows == _trace(plan, "--step", "2")


def test_plan_and_data_in_gcs(plan, monkeypatch):
    """A plan and its data in GCS: blocks and samples read by range requests, the same rows
    and hashes as from files."""
    from gcs_store import gcs_server

    local = _trace(plan, "--step", "6", "--rank", "0", "--show")
    with gcs_server(monkeypatch) as store:
        data = store.upload(REPO / "sample_data", "data")
        store.put("plans/plan.mds", plan.read_bytes())
        remote = _trace(store.url("plans/plan.mds"), "--step", "6", "--rank", "0", "--show",
                        "--data-root", data)  # fmt: skip
    assert remote == local
