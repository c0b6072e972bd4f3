"""The online executor: a run across segments planned in the background from the signals it
reports; resume at any step replays exactly; the log rebuilds every segment; a policy
error stops at the window boundary; two gloo ranks reduce their signals."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist
from executor_builders import tiny_data
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from online_builders import STEPS, WINDOW, online_config, plan_first_segment, train

from mds.core.segments import segment_path, signals_path
from mds.core.signal_log import SignalLog
from mds.errors import ConfigError, PlanError
from mds.executor.online import OnlineExecutor

pytestmark = pytest.mark.slow  # each run plans two segments in `mds plan` subprocesses

WORKER = Path(__file__).resolve().parent / "online_worker.py"
MESH_WORKER = Path(__file__).resolve().parent / "online_mesh_worker.py"
needs_gloo = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()),
    reason="torch.distributed with the gloo backend is not available in this torch build",
)


def torchrun(nproc: int, *args: str, timeout: float = 120) -> None:
    """`torchrun --standalone --nproc_per_node=nproc ARGS` through this interpreter."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={nproc}", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    assert done.returncode == 0, f"{cmd} failed:\n{done.stdout}\n{done.stderr}"


def new_run(root: Path, policy: str = "doremi", **overrides) -> tuple[Path, Path]:
    data_root = root / "data"
    data_root.mkdir(parents=True)
    steps = 20 if overrides else STEPS  # the config's; `overrides` give the run's
    data = online_config(tiny_data(data_root), policy, steps=steps)
    return plan_first_segment(data_root, data, **overrides), data_root / "config.toml"


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A whole run (rank 0 of dp_size 2, alone), its records and its directory. Its first
    segment was planned with `--steps 12` over the config's 20: the segments planned
    during the run keep that."""
    root = tmp_path_factory.mktemp("online")
    plan, config = new_run(root, steps=STEPS)
    with OnlineExecutor(plan, 0, config=config) as ex:
        records = train(ex)
        state = ex.state_dict()
    return plan, config, records, state


def copy_of(finished, dst: Path) -> tuple[Path, Path]:
    """A copy of the finished run's directory (data, index, segments, log; mtimes kept, so
    the executor's file checks pass): its plan and config."""
    plan = finished[0]
    shutil.copytree(plan.parent.parent, dst / "data", symlinks=True)
    return dst / "data" / "run" / "plan.mds", dst / "data" / "config.toml"


def state_at(plan, config, steps: int, **kwargs):
    """The state after `steps` reported steps of a run whose segments are all on disk."""
    with OnlineExecutor(plan, 0, config=config, **kwargs) as ex:
        train(ex, stop_after=steps)
        return json.loads(json.dumps(ex.state_dict()))


def ids_of(records):
    return [(r["step"], r["micro_batch"], r["ids"]) for r in records]


def test_a_run_walks_every_segment_and_logs_every_window(finished):
    plan, _config, records, state = finished
    assert [(r["step"], r["micro_batch"]) for r in records] == [
        (s, m) for s in range(STEPS) for m in range(2)
    ]
    log = SignalLog.read(signals_path(plan))
    assert len(log.windows) == STEPS // WINDOW
    assert SignalLog.from_json(state["signals"]).encode() == log.encode()
    # the log holds what was reported, summed per window
    for w, window in enumerate(log.windows):
        reported = [r["reported"] for r in records if "reported" in r
                    and w * WINDOW <= r["step"] < (w + 1) * WINDOW]
        for i, name in enumerate(log.sources):
            assert window.count[i] == sum(c.get(name, 0) for _s, c in reported)
            assert window.loss_sum[i] == pytest.approx(sum(s.get(name, 0) for s, _c in reported))
    assert all(segment_path(plan, k).exists() for k in range(3))


def test_the_log_alone_rebuilds_every_segment_byte_for_byte(finished, tmp_path):
    plan, config, _records, _state = finished
    from mds.planner.plan.build import with_overrides
    from mds.planner.plan.config import load_plan_config
    from mds.planner.plan.segment import replay_segments

    audit = plan.parent.parent / "audit" / "plan.mds"  # placed as the run is, beside the index
    config = with_overrides(load_plan_config(config), steps=STEPS)  # as segment 0 was planned
    replay_segments(config, audit, SignalLog.read(signals_path(plan)))
    for k in range(3):
        assert segment_path(audit, k).read_bytes() == segment_path(plan, k).read_bytes()
    shutil.rmtree(audit.parent)


@settings(max_examples=6, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stop=st.integers(0, STEPS - 1), more=st.integers(0, 1))
def test_resume_at_any_step_replays_exactly(finished, stop, more):
    """Stop after `stop` steps and `more` micro-batches of the next (a state inside a step),
    resume in a new executor: the same micro-batches as the uninterrupted run."""
    plan, config, records, _state = finished
    with OnlineExecutor(plan, 0, config=config) as ex:
        head = train(ex, stop_after=stop) if stop else []
        if more:
            batch = next(iter(ex))
            head.append({"step": batch["step"], "micro_batch": batch["micro_batch"],
                         "ids": batch["sample_id"].tolist()})
        state = json.loads(json.dumps(ex.state_dict()))  # what a checkpoint keeps
    with OnlineExecutor(plan, 0, config=config) as again:
        again.load_state_dict(state)
        tail = train(again)
    assert ids_of(head + tail) == ids_of(records)


def test_a_resume_re_plans_the_segments_a_crash_lost(finished, tmp_path):
    """Stop in window 1 with only the state: the log on disk and segment 2 are gone. The
    resumed run plans segment 2 from the state's log and replays as the finished run did."""
    _plan, _config, records, _state = finished
    plan, config = copy_of(finished, tmp_path)
    before = facts(segment_path(plan, 2))
    state = state_at(plan, config, 6)
    signals_path(plan).unlink()
    segment_path(plan, 2).unlink()
    with OnlineExecutor(plan, 0, config=config) as again:
        again.load_state_dict(state)
        tail = train(again)
    assert ids_of(tail) == ids_of(records)[2 * 6 :]
    assert facts(segment_path(plan, 2)) == before  # window 2's weights, from the same signals


def facts(path):
    from mds.core.planfile_reader import PlanReader
    from mds.core.segments import online_facts

    with PlanReader(path) as reader:
        return online_facts(reader.footer, path)


def test_a_ready_segment_is_entered_while_a_later_one_is_planned(finished, tmp_path):
    """Window 1's segment is on disk; segment 2's planner (a stand-in that waits for a flag
    file) is still running when window 1's first micro-batch is handed out."""
    plan, config = copy_of(finished, tmp_path)
    segment_path(plan, 2).unlink()
    flag = tmp_path / "go"
    code = (
        "import pathlib, sys, time\n"
        f"for _ in range(1200):\n    if pathlib.Path({str(flag)!r}).exists(): sys.exit(1)\n"
        "    time.sleep(0.05)\nsys.exit(1)\n"
    )
    ex = OnlineExecutor(plan, 0, config=config, command=[sys.executable, "-c", code])
    try:
        batches = iter(ex)
        for batch in batches:
            if batch["step"] == WINDOW:
                break
            if batch["micro_batch"] == 1:
                ex.report(batch["step"], {"web": 1.0}, {"web": 1})
        assert ex.planning_window == 2
    finally:
        flag.touch()
        ex.close()


def test_a_policy_error_stops_at_the_window_boundary(tmp_path, monkeypatch):
    (tmp_path / "failing_policy.py").write_text(
        "def weights(window, history):\n    raise RuntimeError('reference model missing')\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    plan, config = new_run(tmp_path, policy="failing_policy:weights")
    from mds.planner.plan.config import load_plan_config
    from mds.planner.plan.segment import plan_segment

    plan_segment(load_plan_config(config), plan, 1)  # the run plans only the failing one
    ex = OnlineExecutor(plan, 0, config=config)
    seen = []
    with pytest.raises(PlanError) as err:
        seen.extend(train(ex))
    ex.close()
    assert "planning window 2" in str(err.value)
    assert "raised RuntimeError: reference model missing" in str(err.value)
    assert "\n" not in str(err.value)
    assert ex.position == (2 * WINDOW, 0)  # every step of windows 0 and 1 was handed out
    assert not segment_path(plan, 2).exists() and segment_path(plan, 1).exists()


def test_report_checks_its_arguments(finished):
    plan, config, _records, _state = finished
    with OnlineExecutor(plan, 0, config=config) as ex:
        with pytest.raises(ConfigError, match="'nope' is not a source"):
            ex.report(0, {"nope": 1.0}, {})
        with pytest.raises(ConfigError, match="must be finite and >= 0"):
            ex.report(0, {}, {"web": -1})
        with pytest.raises(ConfigError, match="a step of the run, 0 to 11"):
            ex.report(12, {}, {})
        train(ex, stop_after=WINDOW)
        ex.report(WINDOW - 1, {"web": 1.0}, {"web": 1})  # window 0 is still open
        next(iter(ex))  # into window 1: window 0 is reduced
        with pytest.raises(ConfigError, match="window 0 .steps 0 to 3. was reduced"):
            ex.report(WINDOW - 1, {"web": 1.0}, {"web": 1})


def test_a_fixed_plan_is_not_an_online_run(finished, tmp_path):
    plan, config, _records, _state = finished
    from dataclasses import replace

    from mds.planner.plan.build import build_plan
    from mds.planner.plan.config import load_plan_config

    fixed = tmp_path / "fixed.mds"
    build_plan(replace(load_plan_config(config), online=None), fixed)
    with pytest.raises(PlanError, match="not the first segment of an online run"):
        OnlineExecutor(fixed, 0, config=config)


def test_an_online_plan_is_not_replayed_as_a_fixed_one(finished):
    plan, _config, _records, _state = finished
    from mds.executor.executor import PlanExecutor

    for window in (0, 1):
        with pytest.raises(PlanError, match=f"window {window} of an online-mixed run.*OnlineExecutor"):
            PlanExecutor(segment_path(plan, window), 0)


@needs_gloo
def test_two_gloo_ranks_reduce_their_signals_and_share_the_segments(tmp_path):
    plan, config = new_run(tmp_path)
    out = tmp_path / "rank"
    torchrun(2, str(WORKER), str(plan), str(config), str(out), timeout=300)
    ranks = [json.loads(Path(f"{out}.{r}.json").read_text()) for r in range(2)]
    log = SignalLog.read(signals_path(plan))
    assert len(log.windows) == STEPS // WINDOW
    assert [r["told"] for r in ranks] == [["planning window 2 failed: é", None]] * 2
    for r in ranks:  # every rank holds the same reduced log
        assert SignalLog.from_json(r["state"]["signals"]).encode() == log.encode()
        assert [(x["step"], x["micro_batch"]) for x in r["records"]] == [
            (s, m) for s in range(STEPS) for m in range(2)
        ]
    for w, window in enumerate(log.windows):
        for i, name in enumerate(log.sources):
            reported = [x["reported"] for r in ranks for x in r["records"] if "reported" in x
                        and w * WINDOW <= x["step"] < (w + 1) * WINDOW]
            assert window.count[i] == sum(c.get(name, 0) for _s, c in reported)
            assert window.loss_sum[i] == pytest.approx(sum(s.get(name, 0) for s, _c in reported))
    # together the ranks trained on exactly what the segments planned, each sample once a step
    from mds.core.planfile_reader import PlanReader

    for step in range(STEPS):
        with PlanReader(segment_path(plan, step // WINDOW)) as reader:
            chunk = reader.chunk_of(step)
            planned = sorted(
                int(i) for rank in range(2) for i in _step_ids(reader.rank_chunk(chunk, rank), step)
            )
        trained = sorted(i for r in ranks for x in r["records"] if x["step"] == step
                         for i in x["ids"])
        assert trained == planned


def _step_ids(block, step):
    per_step = block.counts.reshape(-1, block.counts.shape[-1]).sum(axis=1)
    start = int(per_step[: step - block.step_start].sum())
    return block.ids[start : start + int(per_step[step - block.step_start])]


def test_a_run_resumed_on_more_ranks_at_a_window_start_re_plans_from_there(finished, tmp_path):
    plan, config = copy_of(finished, tmp_path)
    state = state_at(plan, config, 2 * WINDOW)  # segment 2 is on disk, planned for 2 ranks
    mid = state_at(plan, config, 2 * WINDOW + 1)
    with OnlineExecutor(plan, 0, dp_size=4, config=config) as ex:
        with pytest.raises(PlanError, match="resume from a checkpoint saved at step 8"):
            ex.load_state_dict(mid)
    with OnlineExecutor(plan, 1, dp_size=4, config=config) as ex:
        ex.load_state_dict(state)
        tail = train(ex)
    assert [(r["step"], r["micro_batch"]) for r in tail] == [
        (s, m) for s in range(2 * WINDOW, STEPS) for m in range(2)
    ]
    from mds.core.planfile_reader import PlanReader

    with PlanReader(segment_path(plan, 1)) as one, PlanReader(segment_path(plan, 2)) as two:
        assert (one.dp, two.dp) == (2, 4)
        assert two.footer["lineage"]["parent"] == one.plan_id
    log = SignalLog.read(signals_path(plan))
    assert log.geometry == [(2, 4)]
    # from the log alone: window 2 planned again beside segments 0 and 1 is the run's
    from mds.planner.plan.build import with_overrides
    from mds.planner.plan.config import load_plan_config
    from mds.planner.plan.segment import plan_segment

    audit = plan.parent.parent / "audit" / "plan.mds"
    audit.parent.mkdir()
    for k in range(2):
        shutil.copy(segment_path(plan, k), segment_path(audit, k))
    plan_segment(with_overrides(load_plan_config(config), steps=STEPS), audit, 2, log)
    assert segment_path(audit, 2).read_bytes() == segment_path(plan, 2).read_bytes()


def test_a_run_whose_segments_are_objects(finished, tmp_path, monkeypatch):
    """Segments 0 and 1 uploaded to S3 (a real S3-protocol server); the run plans the next
    beside them in the store and trains on the samples of the run on local files."""
    from s3_store import s3_server

    from mds.core.planfile_reader import PlanReader
    from mds.core.segments import online_facts

    _plan, _config, records, _state = finished
    local, config = copy_of(finished, tmp_path)
    with s3_server(monkeypatch) as store:
        for k in range(2):
            store.put(f"run/{segment_path(local, k).name}", segment_path(local, k).read_bytes())
        url = store.url("run/plan.mds")
        # the uploaded segments record the data root relative to themselves: name it
        with OnlineExecutor(url, 0, config=config, signals=tmp_path / "log.json",
                            data_root=local.parent.parent) as ex:
            got = train(ex)
        assert ids_of(got) == ids_of(records)
        with PlanReader(url.replace("plan.mds", "plan.w00002.mds")) as reader:
            assert online_facts(reader.footer, url) == facts(segment_path(local, 2))
        assert len(SignalLog.read(tmp_path / "log.json").windows) == STEPS // WINDOW


class Through:
    """The executor, iterated through another of its iterators (its loader, shared())."""

    def __init__(self, ex, batches):
        self.ex, self.batches = ex, batches

    def __getattr__(self, name):
        return getattr(self.ex, name)

    def __iter__(self):
        return iter(self.batches)


def test_past_state_windows_the_state_keeps_the_logs_digest_and_last_windows(finished, tmp_path):
    """A state taken in a new process (nothing kept of the one that trained) resumes from
    the log on disk; a log that lost its last windows is completed from the state's; one
    that lost more, or differs, is refused."""
    _plan, _config, records, _state = finished
    plan, config = copy_of(finished, tmp_path)
    state = state_at(plan, config, 9, state_windows=2)
    ref = state["signals"]
    assert ref["format"] == "mds-signals-ref" and ref["windows"] == 3
    assert [w["window"] for w in ref["tail"]] == [1, 2]
    assert state_at(plan, config, 9)["signals"]["format"] == "mds-signals"  # 3 <= 8 windows
    full = SignalLog.read(signals_path(plan))

    def resume():
        with OnlineExecutor(plan, 0, config=config, state_windows=2) as again:
            again.load_state_dict(state)
            return train(again)

    assert ids_of(resume()) == ids_of(records)[2 * 9 :]
    short = SignalLog(full.plan_id, full.sources, full.window_steps, full.windows[:1])
    short.write(signals_path(plan))  # the last write of the log was lost
    assert ids_of(resume()) == ids_of(records)[2 * 9 :]
    assert SignalLog.read(signals_path(plan)).encode() == full.encode()
    signals_path(plan).unlink()
    with pytest.raises(PlanError, match="holds 0 windows of the signal log, the state 3"):
        resume()
    from dataclasses import replace

    other = replace(full.windows[0], loss_sum=tuple(x + 1 for x in full.windows[0].loss_sum))
    SignalLog(full.plan_id, full.sources, full.window_steps, [other, *full.windows[1:]]).write(
        signals_path(plan))
    with pytest.raises(PlanError, match="differ before its last windows"):
        resume()


def test_the_log_beside_a_plan_in_an_object_store_resumes_on_another_node(
    finished, tmp_path, monkeypatch
):
    """No local file of the run: segments and log are objects; a new executor (another
    node) resumes from a small state and the log in the store, and replays exactly."""
    from s3_store import s3_server

    _plan, _config, records, _state = finished
    local, config = copy_of(finished, tmp_path)
    with s3_server(monkeypatch) as store:
        for k in range(2):
            store.put(f"run/{segment_path(local, k).name}", segment_path(local, k).read_bytes())
        url = store.url("run/plan.mds")
        args = dict(config=config, data_root=local.parent.parent, state_windows=1)
        with OnlineExecutor(url, 0, **args) as ex:
            head = train(ex, stop_after=9)
            state = json.loads(json.dumps(ex.state_dict()))
        assert state["signals"]["format"] == "mds-signals-ref"
        assert len(SignalLog.read(signals_path(url)).windows) == 2
        assert not any(p.name.startswith(".") for p in local.parent.iterdir())
        with OnlineExecutor(url, 0, **args) as again:
            again.load_state_dict(state)
            tail = train(again)
        assert ids_of(head + tail) == ids_of(records)
        assert SignalLog.read(signals_path(url)).encode() == SignalLog.read(
            signals_path(local)).encode()
        listed = store.client.list_objects_v2(Bucket="mds-test", Prefix="run/")["Contents"]
        assert sorted(x["Key"] for x in listed if not x["Key"].endswith("/")) == [
            "run/plan.mds", "run/plan.signals.json", "run/plan.w00001.mds", "run/plan.w00002.mds"
        ]  # no temporary left
        from mds.core.planfile_reader import PlanReader
        from mds.planner.report.online import online_report

        with PlanReader(url) as reader:  # mds inspect's online view finds the log in the store
            report = online_report(reader)
        assert report["signals"] == signals_path(url) and report["signal_windows"] == 3


def test_the_loader_with_workers_walks_the_segments_and_resumes_exactly(finished, tmp_path):
    _plan, _config, records, _state = finished
    plan, config = copy_of(finished, tmp_path)
    with OnlineExecutor(plan, 0, config=config) as ex:
        loader = ex.dataloader(num_workers=2)
        head = train(Through(ex, loader), stop_after=6)
        state = json.loads(json.dumps(loader.state_dict()))
    with OnlineExecutor(plan, 0, config=config) as again:
        loader = again.dataloader(num_workers=2)
        loader.load_state_dict(state)
        tail = train(Through(again, loader))
    assert ids_of(head + tail) == ids_of(records)
    with pytest.raises(ConfigError, match="sets DataLoader's 'batch_size' itself"):
        OnlineExecutor(plan, 0, config=config).dataloader(batch_size=4)


def test_peers_need_a_group_spanning_the_mesh(finished):
    plan, config, _records, _state = finished
    with pytest.raises(ConfigError, match="every one of the mesh's 4 processes in `group`"):
        OnlineExecutor.from_env(plan, config=config, tp=2,
                                environ={"RANK": "1", "WORLD_SIZE": "4"})


@needs_gloo
def test_tp_peers_get_the_same_batches_and_count_once(finished, tmp_path):
    """Two DP ranks of two TP peers each (torchrun, gloo), iterating shared() with a resume
    in window 1: the peers of a DP rank get the same micro-batches, and each window's
    signal sums the reports of TP rank 0 alone."""
    plan, config = copy_of(finished, tmp_path)
    signals_path(plan).unlink()  # the windows' signals are this run's
    out = tmp_path / "rank"
    torchrun(4, str(MESH_WORKER), str(plan), str(config), str(out), timeout=300)
    ranks = [json.loads(Path(f"{out}.{r}.json").read_text()) for r in range(4)]
    assert [(r["dp"], r["tp"]) for r in ranks] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for dp in range(2):
        a, b = (r for r in ranks if r["dp"] == dp)
        assert ids_of(a["records"]) == ids_of(b["records"])
        assert [(x["step"], x["micro_batch"]) for x in a["records"]] == [
            (s, m) for s in range(STEPS) for m in range(2)
        ]
    log = SignalLog.read(signals_path(plan))
    assert len(log.windows) == STEPS // WINDOW
    for w, window in enumerate(log.windows):
        for i, name in enumerate(log.sources):
            reported = [x["reported"] for r in ranks if r["tp"] == 0 for x in r["records"]
                        if "reported" in x and w * WINDOW <= x["step"] < (w + 1) * WINDOW]
            assert window.count[i] == sum(c.get(name, 0) for _s, c in reported)
            assert window.loss_sum[i] == pytest.approx(sum(s.get(name, 0) for s, _c in reported))
