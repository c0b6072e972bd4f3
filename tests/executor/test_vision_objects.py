"""Image-text data in object storage end to end, against a real S3-protocol server on
127.0.0.1 (moto): the sample data's WebDataset shards and Parquet image column, indexed
from the store, planned and replayed by two ranks with resume, give the batches the same
files on disk give, pixels included; and the local plan pointed at the store does too."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from executor_builders import batch_digest
from s3_store import s3_server
from store_corpus import assert_replays_as_local, index_and_plan

from mds.core.storage import DATA_ROOT_ENV
from mds.executor import PlanExecutor

SAMPLE = Path(__file__).resolve().parents[2] / "sample_data"

pytest.importorskip("PIL")
pytest.importorskip("tokenizers")


def _config(root: str) -> str:
    text = (SAMPLE / "vlm.toml").read_text()
    tokenizer = (SAMPLE / "tokenizer.json").as_posix()
    text = text.replace('output = "../build/vlm-index"', f'root = "{root}"')
    return text.replace('tokenizer = "tokenizer.json"', f'tokenizer = "{tokenizer}"')


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    top = tmp_path_factory.mktemp("vlm-objects")
    shutil.copytree(SAMPLE / "vlm", top / "local" / "vlm")
    with pytest.MonkeyPatch.context() as patch, s3_server(patch) as store:
        patch.delenv(DATA_ROOT_ENV, raising=False)
        url = store.upload(top / "local", "corpus")
        for name, root in (("s3", url), ("local", str(top / "local"))):
            index_and_plan(top, name, _config(root))
        yield top, url


def test_objects_replay_as_the_files_do(world):
    top, url = world
    assert_replays_as_local(top / "local.mds", top / "s3.mds", url)


def test_resume_mid_plan_from_objects(world):
    top, _ = world
    with PlanExecutor(top / "local.mds", 1) as ex:
        expected = [batch_digest(b) for b in ex]
    with PlanExecutor(top / "s3.mds", 1) as ex:
        it = iter(ex)
        for _ in range(5):
            next(it)
        state = ex.state_dict()
    with PlanExecutor(top / "s3.mds", 1) as ex:
        ex.load_state_dict(state)
        batches = list(ex)
    assert [batch_digest(b) for b in batches] == expected[5:]
    assert any(b["pixel_values"].shape[0] for b in batches)
