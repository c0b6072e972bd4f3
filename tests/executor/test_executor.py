"""PlanExecutor: batches equal to the plan and the data, resume equality, and every refusal."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from executor_builders import (
    Oracle,
    batch_digest,
    open_executor,
    sample_plan,
    text_tokenizers,
    tokenize_fn,
    uninterrupted,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from plan_builders import REPO

import mds.executor.readers.parquet as parquet_reader
from mds.core.planfile_reader import PlanReader
from mds.errors import ConfigError, PlanError, SourceDataError
from mds.executor import DataChangedError, PlanExecutor

TEXT = text_tokenizers()  # forum brings its own tokenizer.json


@pytest.fixture(scope="module")
def sample(tmp_path_factory):
    return sample_plan(tmp_path_factory)


executor = open_executor


@pytest.fixture(scope="module")
def full_run(sample):
    """Every rank's digests of an uninterrupted run."""
    _, plan = sample
    return {rank: uninterrupted(plan, rank) for rank in range(4)}


@pytest.mark.parametrize("pages", ["default", "always", "never"])
def test_batches_hold_the_planned_samples_and_their_tokens(sample, pages, monkeypatch):
    """Against whole-file reads of the data; Parquet rows read from their pages wherever the
    policy allows, as the policy says, or never."""
    index, plan = sample
    oracle = Oracle(index)
    if pages == "always":
        monkeypatch.setattr(parquet_reader, "_SPARSE", 1)
        monkeypatch.setattr(parquet_reader, "_PAGED_READS", 1 << 30)
    elif pages == "never":
        monkeypatch.setattr(parquet_reader, "_SPARSE", 1 << 30)
    with PlanReader(plan) as reader:
        names = [s["name"] for s in reader.footer["index"]["sources"]]
        bases = [s["base"] for s in reader.footer["index"]["sources"]]
        cap = reader.footer["config"]["train"]["max_tokens_per_micro_batch"]
        for rank in range(reader.dp):
            with executor(plan, rank) as ex:
                assert ex.source_names == names
                seen = 0
                for batch in ex:
                    step, micro = batch["step"], batch["micro_batch"]
                    assert (step, micro) == divmod(seen, reader.micro)
                    seen += 1
                    block = reader.rank_chunk(reader.chunk_of(step), rank)
                    local = (step - block.step_start) * reader.micro + micro
                    start = int(block.counts.ravel()[:local].sum())
                    ids = block.ids[start : start + int(block.counts.ravel()[local])]
                    assert batch["sample_id"].tolist() == ids.tolist()
                    expected = [
                        oracle.tokens(names[s], r)
                        for s, r in zip(
                            batch["source"].tolist(), batch["row"].tolist(), strict=True
                        )
                    ]
                    assert [
                        bases[s] + r
                        for s, r in zip(
                            batch["source"].tolist(), batch["row"].tolist(), strict=True
                        )
                    ] == ids.tolist()
                    cu = batch["cu_seqlens"].numpy()
                    assert cu.dtype == np.int32 and cu[0] == 0
                    assert np.diff(cu).tolist() == [len(t) for t in expected]
                    joined = np.concatenate(expected) if expected else np.zeros(0, np.int64)
                    assert np.array_equal(batch["input_ids"].numpy(), joined)
                    pos = batch["position_ids"].numpy()
                    assert all(
                        (pos[a:b] == np.arange(b - a)).all()
                        for a, b in zip(cu[:-1], cu[1:], strict=True)
                    )
                    assert batch["max_seqlen"] == max(np.diff(cu), default=0)
                    assert len(joined) <= cap
                assert seen == reader.steps * reader.micro


def test_every_rank_reads_only_its_block(sample, monkeypatch):
    _, plan = sample
    asked = []
    original = PlanReader.rank_chunk
    monkeypatch.setattr(
        PlanReader, "rank_chunk", lambda self, c, r: asked.append(r) or original(self, c, r)
    )
    with executor(plan, 2) as ex:
        for _ in ex:
            pass
    assert set(asked) == {2}
    with PlanReader(plan) as reader:
        assert len(asked) == len(reader.chunks)  # one read per chunk, cached for its steps


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_resume_anywhere_gives_the_uninterrupted_batches(sample, full_run, data):
    _, plan = sample
    rank = data.draw(st.integers(0, 3), label="rank")
    total = len(full_run[rank])
    cut = data.draw(st.integers(0, total), label="cut")
    with executor(plan, rank) as ex:
        it = iter(ex)
        head = [batch_digest(next(it)) for _ in range(cut)]
        state = json.loads(json.dumps(ex.state_dict()))  # survives a JSON checkpoint
    assert head == full_run[rank][:cut]
    assert set(state) == {"format", "version", "plan_id", "step", "micro_batch"}
    with executor(plan, rank) as resumed:
        resumed.load_state_dict(state)
        assert [batch_digest(b) for b in resumed] == full_run[rank][cut:]


def test_seek_moves_a_running_iterator(sample, full_run):
    _, plan = sample
    with executor(plan, 1) as ex:
        it = iter(ex)
        next(it)
        ex.seek(40, 1)
        assert batch_digest(next(it)) == full_run[1][81]
        assert ex.position == (41, 0)
        ex.seek(ex.steps)  # the end: nothing more
        assert list(it) == []


def test_state_dicts_agree_across_ranks_and_resume_any_rank(sample, full_run):
    _, plan = sample
    with executor(plan, 0) as a, executor(plan, 3) as b:
        for _ in range(5):
            next(iter(a))
        b.load_state_dict(a.state_dict())
        assert [batch_digest(x) for x in b] == full_run[3][5:]


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ({"format": "x"}, "not an mds executor state"),
        ({"version": 2}, "executor state version 2 is not supported"),
        ({"plan_id": "0" * 32}, "the executor state is from plan 0000"),
        ({"step": 64, "micro_batch": 1}, "outside the plan's 64 steps x 2 micro-batches"),
        ({"step": -1}, "outside the plan's"),
        ({"micro_batch": 2}, "outside the plan's"),
        ({"step": "3"}, "step=.3. must be an integer, not str"),
    ],
)
def test_bad_states_are_refused(sample, state, message):
    _, plan = sample
    with executor(plan, 0) as ex:
        good = ex.state_dict()
        with pytest.raises(PlanError, match=message):
            ex.load_state_dict({**good, **state})
        assert ex.position == (0, 0)


def test_rank_and_size_that_do_not_match_the_plan_are_refused(sample):
    _, plan = sample
    with pytest.raises(ConfigError, match=r"dp_rank 4 is outside .* dp_size 4 \(valid: 0..3\)"):
        executor(plan, 4)
    with pytest.raises(ConfigError, match="this job has dp_size 2, but .* dp_size 4; re-plan"):
        executor(plan, 0, dp_size=2)
    with pytest.raises(ConfigError, match="verify='fast' must be one of stat, full, none"):
        executor(plan, 0, verify="fast")


def test_from_env_derives_the_dp_rank_and_gives_tp_peers_the_same_batches(sample, full_run):
    _, plan = sample
    env = {"WORLD_SIZE": "8"}
    for rank in range(8):
        with PlanExecutor.from_env(
            plan,
            tp=2,
            environ={**env, "RANK": str(rank)},
            estimated="fit",
            tokenize=TEXT,
        ) as ex:
            assert (ex.dp_rank, ex.dp_size) == (rank // 2, 4)
            first = batch_digest(next(iter(ex)))
            assert first == full_run[rank // 2][0]
    with pytest.raises(ConfigError, match="dp_size 2, but"):
        PlanExecutor.from_env(plan, tp=4, environ={"RANK": "0", "WORLD_SIZE": "8"})


def test_estimated_lengths_are_refused_unless_fit_is_asked_for(sample):
    _, plan = sample
    with pytest.raises(
        ConfigError, match=r"source 'code': the plan used estimated lengths \(bytes/4\)"
    ):
        executor(plan, 0, estimated="error")
    with pytest.raises(ConfigError, match="estimated='cut' must be one of error, fit"):
        executor(plan, 0, estimated="cut")


def test_text_without_a_tokenizer_is_refused_naming_the_source(sample):
    _, plan = sample
    with pytest.raises(ConfigError, match=r"source 'books' stores text \('text'\); pass tokenize="):
        executor(plan, 0, tokenize=None)
    with pytest.raises(
        ConfigError, match="tokenize has functions for web, which the plan does not"
    ):
        executor(plan, 0, tokenize={**TEXT, "web": tokenize_fn()})


def test_a_tokenizer_that_disagrees_with_the_index_stops_naming_source_and_row(sample):
    _, plan = sample
    tok = tokenize_fn()
    with executor(plan, 0, tokenize={**TEXT, "books": lambda s: [*tok(s), 7]}) as ex:
        with pytest.raises(
            SourceDataError,
            match=r"source 'books' row \d+ \(books/books.parquet row \d+\): tokenize returned \d+ tokens, the index says \d+",
        ):
            for _ in ex:
                pass


def test_one_tokenize_function_serves_every_text_source(sample, full_run):
    _, plan = sample
    with executor(plan, 0, tokenize=tokenize_fn()) as ex:
        assert [batch_digest(b) for b in ex] == full_run[0]


@pytest.fixture
def data_copy(tmp_path):
    """A private copy of the sample data, indexed and planned, that a test may damage."""
    from mds.planner.index.build import build_index
    from mds.planner.index.config import load_config
    from mds.planner.plan.build import build_plan
    from mds.planner.plan.config import load_plan_config

    shutil.copytree(REPO / "sample_data", tmp_path / "data")
    config = tmp_path / "data" / "mds.toml"
    build_index(load_config(config), tmp_path / "index", workers=1)
    from dataclasses import replace

    plan_config = replace(load_plan_config(config), index=tmp_path / "index")
    build_plan(plan_config, tmp_path / "plan.mds")
    return tmp_path


def test_changed_source_data_is_caught_before_it_is_used(data_copy):
    """A file changed after planning: the step that first reads it raises, naming it, before
    any of its samples is handed out; verify="none" reads on."""
    plan = data_copy / "plan.mds"
    with executor(plan) as ex:
        forum = ex.source_names.index("forum")
    target = data_copy / "data" / "forum" / "forum.jsonl"
    raw = bytearray(target.read_bytes())
    raw[len(raw) // 2] ^= 0x01  # same size, new mtime: the content check tells
    target.write_bytes(bytes(raw))
    handed = []
    with pytest.raises(
        DataChangedError, match=r"source 'forum': forum/forum.jsonl: content changed"
    ):
        with executor(plan) as ex:
            for batch in ex:
                handed.append(batch)
    assert not any((b["source"] == forum).any() for b in handed)
    with executor(plan, verify="none") as ex:
        next(iter(ex))


def test_full_verification_catches_a_same_size_rewrite(data_copy):
    plan = data_copy / "plan.mds"
    target = data_copy / "data" / "books" / "books.parquet"
    st_ = target.stat()
    raw = bytearray(target.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    target.write_bytes(bytes(raw))
    os.utime(target, ns=(st_.st_atime_ns, st_.st_mtime_ns))
    executor(plan).close()  # stat check: same size and mtime
    with pytest.raises(DataChangedError, match="books/books.parquet: content changed"):
        executor(plan, verify="full")


def test_the_executor_needs_no_index(data_copy, monkeypatch):
    """A rank replays from the plan and the data files alone: with the index deleted, and
    the manifest reader disabled, every rank's batches are the same."""
    plan = data_copy / "plan.mds"
    with PlanReader(plan) as reader:
        ranks = reader.dp
    before = {r: [batch_digest(b) for b in executor(plan, r)] for r in range(ranks)}
    shutil.rmtree(data_copy / "index")
    import mds.core.index_manifest as manifest_module

    def refuse(*args, **kwargs):
        raise AssertionError("the executor read an index manifest")

    monkeypatch.setattr(manifest_module, "read_manifest", refuse)
    after = {r: [batch_digest(b) for b in executor(plan, r, verify="full")] for r in range(ranks)}
    assert after == before and all(before.values())


def test_a_corrupt_block_is_an_error_not_wrong_data(data_copy):
    plan = data_copy / "plan.mds"
    with PlanReader(plan) as reader:
        offset = int(reader._directory(1)[0]["offset"])
    raw = bytearray(plan.read_bytes())
    raw[offset + 3] ^= 0x01
    plan.write_bytes(bytes(raw))
    with executor(plan) as ex:
        ex.seek(0)
        next(iter(ex))  # chunk 0 is intact
        ex.seek(16)
        with pytest.raises(PlanError, match="chunk 1 rank 0: checksum mismatch"):
            next(iter(ex))
    with pytest.raises(PlanError, match="chunk 1 rank 0: checksum mismatch"):
        executor(plan, verify="full")


def test_importing_the_executor_loads_neither_polars_nor_the_planner():
    code = (
        "import sys; from mds.executor import PlanExecutor, PlanLoader; "
        "bad = [m for m in sys.modules if m == 'polars' or m.startswith('mds.planner')]; "
        "print(bad)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    light = "import sys, mds.executor; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", light], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(
    ("returned", "shown"),
    [
        (lambda ids: [*ids[:-1], 1.5], "token id 1.5"),
        (lambda ids: [*ids[:-1], 1.0], "token id 1.0"),
        (lambda ids: [*ids[:-1], True], "token id True, not an integer"),
        (lambda ids: [*ids[:-1], np.True_], "token id np.True_, not an integer"),
        (lambda ids: [*ids[:-1], "7"], "token id '7'"),
        (lambda ids: [*ids[:-1], None], "token id None"),
        (lambda ids: np.array([*ids[:-1], 2**63], dtype=np.uint64), "9223372036854775808"),
    ],
    ids=["fraction", "whole-float", "bool", "numpy-bool", "string", "none", "uint64-2^63"],
)
def test_tokenize_output_that_is_not_int64_ids_is_refused(sample, returned, shown):
    _, plan = sample
    fn = TEXT["books"]
    bad = {"books": lambda text: returned(list(fn(text))), "code": TEXT["code"]}
    with pytest.raises(SourceDataError) as info, executor(plan, 0, tokenize=bad) as ex:
        for _ in ex:
            pass
    message = str(info.value)
    assert message.startswith("source 'books' row "), message
    assert shown in message, message
