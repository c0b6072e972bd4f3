"""Context parallelism: each CP rank's slice of a micro-batch, cut by the plan's layout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from executor_builders import batch_digest, open_executor, sample_plan, text_tokenizers
from plan_builders import sample_index, sample_plan_config

from mds.core.cp_layout import SPLIT, cp_layout, rank_work
from mds.core.planfile_reader import PlanReader
from mds.errors import ConfigError
from mds.executor import PlanExecutor
from mds.executor.cp import cp_slice, split_token_mask

TORCHRUN = shutil.which("torchrun", path=str(Path(sys.executable).parent))
WORKER = Path(__file__).with_name("cp_worker.py")

_PLANS: dict[str, Path] = {}

# (cp_size, cp_split_from, other [train] overrides): a mixed layout at cp 2; an odd cp
# with samples truncated to the micro-batch capacity
PLANS = {
    "cp2": (2, 512, {"steps": 8, "dp_size": 2}),
    "cp3": (
        3,
        256,
        {
            "steps": 6,
            "dp_size": 2,
            "samples_per_step": 12,
            "max_tokens_per_micro_batch": 1024,
            "overlong": "truncate",
        },
    ),
    "cp2-dp1": (2, 512, {"steps": 4, "dp_size": 1, "samples_per_step": 12}),
}


def cp_plan(tmp_path_factory, name: str) -> Path:
    """The sample data planned with `PLANS[name]`, once per session."""
    from mds.planner.plan.build import build_plan
    from mds.planner.plan.config import with_cp_linear

    if name not in _PLANS:
        cp, split_from, train = PLANS[name]
        config = sample_plan_config(sample_index(tmp_path_factory))
        spec = replace(config.train, cp_size=cp, cp_split_from=split_from, **train)
        config = replace(config, train=with_cp_linear(spec, config.cost, config.vision, ""))
        out = tmp_path_factory.mktemp(f"plan-{name}") / "plan.mds"
        build_plan(config, out)
        _PLANS[name] = out
    return _PLANS[name]


def _settings(plan: Path) -> tuple[int, int, int, int | None]:
    train = PlanReader(plan).footer["config"]["train"]
    cap = train["max_tokens_per_micro_batch"] if train.get("overlong") == "truncate" else None
    return train["cp_size"], train["cp_split_from"], train["cp_linear"], cap


def _whole(plan: Path, rank: int) -> list[dict]:
    with open_executor(plan, rank) as ex:
        return list(ex)


def _reassemble(batch: dict, pieces: list[dict]) -> None:
    """Every CP rank's piece of `batch`, put back together, is `batch`: each sample's real
    tokens once (ids, positions, shifted labels), padding only on split samples."""
    cp = batch["cp_size"]
    ids, cu = batch["input_ids"].numpy(), batch["cu_seqlens"].numpy()
    lay = batch["cp_layout"].numpy()
    n = len(cu) - 1
    want_labels = np.full(len(ids), -100)
    want_labels[:-1] = ids[1:]
    want_labels[cu[1:][np.diff(cu) > 0] - 1] = -100
    seen: dict[int, list[tuple[int, int, int, int]]] = {k: [] for k in range(n)}
    for r, piece in enumerate(pieces):
        assert piece["cp_rank"] == r
        for key in ("sample_id", "source", "row", "cp_layout"):
            assert torch.equal(piece[key], batch[key])
        assert piece["seqlens"].tolist() == np.diff(cu).tolist()
        pcu = piece["cu_seqlens"].numpy()
        assert piece["max_seqlen"] == int(np.diff(pcu).max(initial=0))
        for seg, k in enumerate(piece["cp_samples"].tolist()):
            lo, hi = pcu[seg], pcu[seg + 1]
            assert lay[k] in (SPLIT, r)
            for j in range(lo, hi):
                seen[k].append(
                    (
                        int(piece["position_ids"][j]),
                        int(piece["input_ids"][j]),
                        int(piece["shift_labels"][j]),
                        r,
                    )
                )
    for k in range(n):
        length = int(cu[k + 1] - cu[k])
        got = sorted(seen[k])
        if lay[k] == SPLIT:
            padded = -(-length // (2 * cp)) * 2 * cp
            assert [g[0] for g in got] == list(range(padded))
            assert all(g[1:3] == (0, -100) for g in got[length:])
        else:
            assert [g[0] for g in got] == list(range(length))
            assert {g[3] for g in got} <= {int(lay[k])}
        real = got[:length]
        assert [g[1] for g in real] == ids[cu[k] : cu[k + 1]].tolist()
        assert [g[2] for g in real] == want_labels[cu[k] : cu[k + 1]].tolist()


@pytest.mark.parametrize("name", ["cp2", "cp3"])
def test_cp_slices_reassemble_the_micro_batch(tmp_path_factory, name):
    plan = cp_plan(tmp_path_factory, name)
    cp, split_from, linear, cap = _settings(plan)
    reader = PlanReader(plan)
    splits = wholes = 0
    for rank in range(reader.dp):
        whole = _whole(plan, rank)
        slices = [open_executor(plan, rank, cp_rank=r, cp_size=cp) for r in range(cp)]
        by_rank = [list(ex) for ex in slices]
        for m, batch in enumerate(whole):
            pieces = [by_rank[r][m] for r in range(cp)]
            # the executor's slices are `cp_slice` of the whole micro-batch
            for r in range(cp):
                assert batch_digest(pieces[r]) == batch_digest(cp_slice(batch, r))
            _reassemble(batch, pieces)
            # the layout is cp_layout of the planned lengths (fetch tokens, capped)
            step, micro = batch["step"], batch["micro_batch"]
            block = reader.rank_chunk(reader.chunk_of(step), rank)
            flat = block.counts.reshape(-1)
            at = (step - block.step_start) * reader.micro + micro
            lo = int(flat[:at].sum())
            planned = block.fetch.tokens[lo : lo + int(flat[at])].astype(np.int64)
            if cap is not None:
                planned = np.minimum(planned, cap)
            assert batch["cp_layout"].tolist() == cp_layout(
                planned.tolist(), cp, split_from, linear
            )
            lengths = batch["cu_seqlens"].diff().tolist()
            # the work each CP rank does on its slice (tokens, padding included, and causal
            # query-key pairs within each sample) is the layout's rank_work
            work = []
            for p in pieces:
                pos = p["position_ids"].numpy()
                work.append(linear * len(pos) + 2 * int((pos + 1).sum()))
            assert work == rank_work(lengths, batch["cp_layout"].tolist(), cp, linear)
            splits += int((batch["cp_layout"] == SPLIT).sum())
            wholes += int((batch["cp_layout"] != SPLIT).sum())
            # split samples' tokens are TE's THD shard of the split samples alone
            for p in pieces:
                mask = split_token_mask(p)
                assert int(mask.sum()) * cp == int(p["cu_seqlens_split_padded"][-1])
        for ex in slices:
            ex.close()
    assert splits and (wholes or name != "cp2")  # at cp 2, both kinds occur
    if cap is not None:
        assert max(max(b["cu_seqlens"].diff().tolist(), default=0) for b in whole) <= cap


def test_resuming_anywhere_gives_the_same_slices(tmp_path_factory):
    plan = cp_plan(tmp_path_factory, "cp2")
    with open_executor(plan, 1, cp_rank=1, cp_size=2) as ex:
        want = [batch_digest(b) for b in ex]
    rng = np.random.default_rng(3)
    with open_executor(plan, 1, cp_rank=1, cp_size=2) as ex:
        total = ex.total
        for pos in rng.permutation(total)[:6].tolist():
            step, micro = divmod(pos, ex.micro_batches)
            ex.seek(step, micro)
            got = [batch_digest(b) for b in ex]
            assert got == want[pos:]
        state = {**ex.state_dict(), "step": 3, "micro_batch": 1}
    with open_executor(plan, 1, cp_rank=1, cp_size=2) as ex:
        ex.load_state_dict(state)
        assert batch_digest(ex.micro_batch_at(7)) == want[7]
        assert [batch_digest(b) for b in ex] == want[7:]
    with open_executor(plan, 1, cp_rank=1, cp_size=2) as ex:
        ex.load_state_dict(state)
        got = [batch_digest(b) for b in ex.dataloader(num_workers=1)]
        assert got == want[7:]


def test_from_env_gives_each_cp_rank_its_slice(tmp_path_factory):
    plan = cp_plan(tmp_path_factory, "cp2")
    # tp 2, cp 2 and dp 2: global rank 6 is tp 0, cp 1, dp 1
    env = {"RANK": "6", "WORLD_SIZE": "8"}
    with PlanExecutor.from_env(
        plan, tp=2, cp=2, environ=env, estimated="fit", tokenize=text_tokenizers()
    ) as ex:
        assert (ex.dp_rank, ex.cp_rank) == (1, 1)
        got = [batch_digest(b) for b in ex]
    with open_executor(plan, 1, cp_rank=1, cp_size=2) as ex:
        assert got == [batch_digest(b) for b in ex]


def test_a_cp_size_that_is_not_the_plans_is_refused(tmp_path_factory):
    plan = cp_plan(tmp_path_factory, "cp2")
    _, plain = sample_plan(tmp_path_factory)
    env = {"RANK": "0", "WORLD_SIZE": "8"}
    with pytest.raises(ConfigError, match="planned for cp_size 2"):
        PlanExecutor.from_env(plan, cp=4, environ=env)
    with pytest.raises(ConfigError, match="planned for cp_size 2"):
        PlanExecutor.from_env(plan, cp=1, tp=4, environ=env)
    with pytest.raises(ConfigError, match="planned without context parallelism"):
        PlanExecutor.from_env(plain, cp=2, environ=env)
    with pytest.raises(ConfigError, match="outside"):
        PlanExecutor(plan, 0, cp_rank=2, cp_size=2)
    with pytest.raises(ConfigError, match="needs cp_rank"):
        PlanExecutor(plan, 0, cp_size=2)
    # without cp_rank, the whole micro-batch and its layout
    with open_executor(plan, 0, read_ahead=0) as ex:
        batch = ex.micro_batch_at(0)
        assert batch["cp_size"] == 2 and len(batch["cp_layout"]) == len(batch["sample_id"])


def test_an_empty_micro_batch_slices_to_nothing():
    batch = {
        "input_ids": torch.zeros(0, dtype=torch.int64),
        "position_ids": torch.zeros(0, dtype=torch.int64),
        "cu_seqlens": torch.zeros(1, dtype=torch.int32),
        "max_seqlen": 0,
        "cp_layout": torch.zeros(0, dtype=torch.int32),
        "cp_size": 2,
        "sample_id": torch.zeros(0, dtype=torch.int64),
    }
    piece = cp_slice(batch, 1)
    assert piece["input_ids"].numel() == 0 and piece["cu_seqlens"].tolist() == [0]
    assert piece["cu_seqlens_split"].tolist() == [0] and piece["max_seqlen"] == 0


def _megatron_utils(monkeypatch):
    """megatron.core.utils, with its process-group size and rank read from a stand-in group
    (it asks torch.distributed otherwise); None where megatron-core does not import."""
    try:
        from megatron.core import utils
    except Exception:  # noqa: BLE001 - megatron-core absent or broken on this machine
        return None
    monkeypatch.setattr(utils, "get_pg_size", lambda group=None: group.size())
    monkeypatch.setattr(utils, "get_pg_rank", lambda group=None: group.rank())
    return utils


class _Group:
    def __init__(self, rank: int, size: int):
        self._rank, self._size = rank, size

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size


@pytest.mark.parametrize("cp", [2, 3, 4])
def test_split_samples_are_cut_as_megatron_core_cuts_them(monkeypatch, cp):
    """Megatron-core's `get_batch_on_this_cp_rank` (the rule TE's THD partition applies to
    each sequence of a packed batch: chunks i and 2cp-1-i) on each padded split sample
    gives this executor's tokens, positions and labels."""
    utils = _megatron_utils(monkeypatch)
    rng = np.random.default_rng(cp)
    lengths = [1, 5, 2 * cp, 97, 300, 1]
    ids = rng.integers(1, 1000, sum(lengths))
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    batch = {
        "input_ids": torch.from_numpy(ids),
        "position_ids": torch.from_numpy(np.concatenate([np.arange(n) for n in lengths])),
        "cu_seqlens": torch.from_numpy(cu),
        "max_seqlen": max(lengths),
        "cp_layout": torch.full((len(lengths),), SPLIT, dtype=torch.int32),
        "cp_size": cp,
    }
    for r in range(cp):
        piece = cp_slice(batch, r)
        want_ids, want_pos, want_labels = [], [], []
        for k, n in enumerate(lengths):
            padded = -(-n // (2 * cp)) * 2 * cp
            x = torch.zeros(padded, dtype=torch.int64)
            x[:n] = batch["input_ids"][cu[k] : cu[k + 1]]
            lab = torch.full((padded,), -100, dtype=torch.int64)
            lab[: n - 1] = x[1:n]
            full = {
                "tokens": x[None],
                "position_ids": torch.arange(padded)[None],
                "labels": lab[None],
            }
            if utils is not None:
                got = utils.get_batch_on_this_cp_rank(full, cp_group=_Group(r, cp))
            else:  # the published rule
                c = padded // (2 * cp)
                keep = torch.cat(
                    [
                        torch.arange(r * c, (r + 1) * c),
                        torch.arange((2 * cp - 1 - r) * c, (2 * cp - r) * c),
                    ]
                )
                got = {key: v[:, keep] for key, v in full.items()}
            want_ids.append(got["tokens"][0])
            want_pos.append(got["position_ids"][0])
            want_labels.append(got["labels"][0])
        assert torch.equal(piece["input_ids"], torch.cat(want_ids))
        assert torch.equal(piece["position_ids"], torch.cat(want_pos))
        assert torch.equal(piece["shift_labels"], torch.cat(want_labels))
        padded = [-(-n // (2 * cp)) * 2 * cp for n in lengths]
        assert piece["cu_seqlens_split"].tolist() == cu.tolist()
        assert (
            piece["cu_seqlens_split_padded"].tolist()
            == np.concatenate([[0], np.cumsum(padded)]).tolist()
        )
        assert (
            piece["cu_seqlens"].tolist()
            == (np.concatenate([[0], np.cumsum(padded)]) // cp).tolist()
        )


@pytest.mark.skipif(TORCHRUN is None, reason="torchrun is not installed beside this Python")
def test_ring_attention_over_cp_slices_equals_unsplit_attention(tmp_path_factory, tmp_path):
    """Two CP ranks under torchrun (gloo, CPU): causal attention of each rank's queries over
    the K/V of both ranks, masked by sample and global position, is the unsplit attention."""
    plan = cp_plan(tmp_path_factory, "cp2-dp1")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(
        [TORCHRUN, "--standalone", "--nproc_per_node=2", str(WORKER), str(plan), str(tmp_path)],
        check=True,
        env=env,
        timeout=300,
    )
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for got in ranks:
        assert got["micro_batches"] == 8
        assert got["max_error"] < 1e-5, got
        assert got["tokens"] > 0


# --- selective fan-out ------------------------------------------------------------------


def test_each_peer_part_holds_what_its_stage_uses(tmp_path_factory):
    from mds.executor.broadcast import fanout_bytes, peer_part

    plan = cp_plan(tmp_path_factory, "cp2")
    for whole in _whole(plan, 0)[:4]:
        for c in range(2):
            piece = cp_slice(whole, c)
            assert batch_digest(peer_part(whole, cp_rank=c)) == batch_digest(piece)
            first, middle, last = (peer_part(whole, cp_rank=c, stage=s, pp=3) for s in range(3))
            assert torch.equal(first["input_ids"], piece["input_ids"])
            assert torch.equal(first["position_ids"], piece["position_ids"])
            assert "shift_labels" not in first and "num_tokens" not in first
            assert not {"input_ids", "position_ids", "shift_labels"} & set(middle)
            assert middle["num_tokens"] == len(piece["input_ids"])
            assert torch.equal(last["shift_labels"], piece["shift_labels"])
            assert "input_ids" not in last
            for part in (first, middle, last):
                assert torch.equal(part["cu_seqlens"], piece["cu_seqlens"])
                assert torch.equal(part["cu_seqlens_split"], piece["cu_seqlens_split"])
        sent = fanout_bytes(whole, tp=2, cp=2, pp=4)
        assert sent["selective"] < sent["broadcast"] / 4
    # a plan without CP: the last stage's labels are the next tokens
    _, plain = sample_plan(tmp_path_factory)
    with open_executor(plain, 0, read_ahead=0) as ex:
        whole = ex.micro_batch_at(0)
    last = peer_part(whole, cp_rank=None, stage=1, pp=2)
    ids, cu = whole["input_ids"], whole["cu_seqlens"].long()
    assert torch.equal(last["shift_labels"][:-1][cu[1:-1] - 1], torch.full((len(cu) - 2,), -100))
    keep = torch.ones(len(ids), dtype=torch.bool)
    keep[cu[1:] - 1] = False
    assert torch.equal(last["shift_labels"][keep], ids[1:][keep[:-1]])


def _fanout_run(plan: Path, out: Path, tp: int, cp: int, pp: int, selective: bool) -> list[dict]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    n = tp * cp * pp
    subprocess.run(
        [
            TORCHRUN,
            "--standalone",
            f"--nproc_per_node={n}",
            str(Path(__file__).with_name("fanout_worker.py")),
            str(plan),
            str(out),
            str(tp),
            str(cp),
            str(pp),
            "1" if selective else "0",
        ],
        check=True,
        env=env,
        timeout=300,
    )
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(n)]


@pytest.mark.skipif(TORCHRUN is None, reason="torchrun is not installed beside this Python")
@pytest.mark.parametrize(
    "mesh",
    [
        (1, 2, 1, True),
        (1, 2, 1, False),
        (1, 2, 2, True),
    ],
)
def test_shared_sends_each_peer_its_part(tmp_path_factory, tmp_path, mesh):
    """The reading peer sends each CP rank its slice (and, with PP, each stage its part);
    with selective=False every peer gets the whole micro-batch and cuts its slice itself."""
    from mds.executor.broadcast import fanout_bytes, peer_part

    tp, cp, pp, selective = mesh
    plan = cp_plan(tmp_path_factory, "cp2-dp1")
    ranks = _fanout_run(plan, tmp_path, tp, cp, pp, selective)
    wholes = _whole(plan, 0)[3:]  # the workers seek to step 1, micro-batch 1
    for got in ranks:
        c, stage = got["coords"]["cp"], got["coords"]["pp"]
        want = [
            batch_digest(peer_part(w, cp_rank=c, stage=stage, pp=pp if selective else 1))
            for w in wholes
        ]
        assert got["digests"] == want, got["coords"]
        assert (got["state"]["step"], got["state"]["micro_batch"]) == (4, 0)
    if selective:  # the bytes the peers received are what fanout_bytes counts
        want = sum(fanout_bytes(w, tp=tp, cp=cp, pp=pp)["selective"] for w in wholes)
        assert sum(got["bytes"] for got in ranks) == want


def test_megatron_batch_of_a_cp_slice():
    pytest.importorskip("megatron.core")
    from mds.executor.integrations.megatron_lm import megatron_batch

    lengths = [5, 9]
    ids = torch.arange(1, 15)
    cu = torch.tensor([0, 5, 14], dtype=torch.int32)
    batch = {
        "input_ids": ids,
        "position_ids": torch.cat([torch.arange(n) for n in lengths]),
        "cu_seqlens": cu,
        "max_seqlen": 9,
        "cp_layout": torch.tensor([-1, -1], dtype=torch.int32),
        "cp_size": 2,
    }
    piece = cp_slice(batch, 1)
    got = megatron_batch(piece)
    params = got["packed_seq_params"]
    assert params.cu_seqlens_q.tolist() == [0, 5, 14]
    assert params.cu_seqlens_q_padded.tolist() == [0, 8, 20]
    assert torch.equal(got["tokens"][0], piece["input_ids"])
    assert torch.equal(got["loss_mask"][0], (piece["shift_labels"] != -100).float())
    batch["cp_layout"] = torch.tensor([0, -1], dtype=torch.int32)
    # every CP rank refuses, and names the fix
    for r in range(2):
        with pytest.raises(ConfigError, match=r"whole on one CP rank.*cp_split_from = 1"):
            megatron_batch(cp_slice(batch, r))
    # an empty sample (on no CP rank) kept "whole" is no whole sample
    batch["cu_seqlens"] = torch.tensor([0, 5, 5, 14], dtype=torch.int32)
    batch["cp_layout"] = torch.tensor([-1, 0, -1], dtype=torch.int32)
    assert megatron_batch(cp_slice(batch, 0))["packed_seq_params"].cu_seqlens_q.tolist() == [
        0,
        5,
        14,
    ]
