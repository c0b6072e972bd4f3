"""Cases of the engine tests, run by test_engine.py in a pytest process of their own (see
there): index and plan on Ray give the same bytes and the same one-line errors, retry a
killed worker and stop on failure.

One Ray cluster (2 CPUs, no dashboard) serves the whole module.
"""

from __future__ import annotations

import importlib
import os
import socket
import subprocess
import sys
import threading
import time
import tomllib
from functools import partial
from pathlib import Path

import pytest
from cli_helpers import mds, one_error_line
from plan_builders import SAMPLE_CONFIG, sample_index, sample_plan_config

from mds.errors import ConfigError, MdsError, SourceDataError, install_hint
from mds.planner.index import build as build_mod
from mds.planner.index.build import build_index
from mds.planner.index.config import load_config, parse_config
from mds.planner.index.reuse import fingerprint_batch
from mds.planner.plan.build import build_plan
from mds.planner.plan.config import plan_config_from_dict
from mds.planner.runtime import engine as engine_mod
from mds.planner.runtime.engine import EngineSpec, LocalEngine, RayEngine, open_engine

ray = pytest.importorskip("ray")
RAY = EngineSpec("ray")


@pytest.fixture(scope="module")
def cluster():
    """A local Ray cluster for this module; this file's helpers travel to it by value."""
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    yield
    ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
    if started:
        ray.shutdown()


def tree(path: Path) -> dict[str, bytes]:
    """Every file under `path` (relative name -> bytes), the lock file aside."""
    return {
        p.relative_to(path).as_posix(): p.read_bytes()
        for p in sorted(path.rglob("*"))
        if p.is_file() and not p.name.endswith(".lock")
    }


_DRIVER = os.getpid()  # travels by value to the workers with this module's functions


def _dies_once(marker: str, module: str, name: str, *args):
    """The first call anywhere kills its worker process; later calls (Ray's retry) run
    module.name. On a Ray worker the module is the real one, not the driver's patch. Never
    kills the test process itself: a call there is a failure, not a worker to retry."""
    if os.getpid() == _DRIVER:
        raise AssertionError(f"{module}.{name} ran in the driver, not on a Ray worker")
    if not os.path.exists(marker):
        Path(marker).touch()
        os._exit(1)
    return getattr(importlib.import_module(module), name)(*args)


def _square(i: int) -> int:
    return i * i


# --- index and plan on Ray: the same bytes --------------------------------------------------


def test_ray_index_is_byte_identical_to_local(cluster, tmp_path):
    config = load_config(SAMPLE_CONFIG)
    build_index(config, tmp_path / "local", workers=2)
    build_index(config, tmp_path / "ray", engine=RAY)
    assert tree(tmp_path / "ray") == tree(tmp_path / "local")


def test_ray_plan_is_byte_identical_to_local(cluster, tmp_path_factory, tmp_path):
    config = sample_plan_config(sample_index(tmp_path_factory))
    assert -(-config.train.steps // config.chunk_steps) > 2  # several chunks in flight
    local = build_plan(config, tmp_path / "local.mds", workers=1)
    remote = build_plan(config, tmp_path / "ray.mds", engine=RAY)
    assert (tmp_path / "ray.mds").read_bytes() == (tmp_path / "local.mds").read_bytes()
    assert remote.plan_id == local.plan_id


def test_progress_is_fed_by_completed_ray_tasks(cluster, tmp_path_factory, tmp_path):
    config = sample_plan_config(sample_index(tmp_path_factory))

    class Steps:
        total = done = 0

        def start(self, total):
            self.total = total

        def advance(self, n):
            self.done += n

    steps = Steps()
    build_plan(config, tmp_path / "p.mds", engine=RAY, progress=steps)
    assert steps.done == steps.total == config.train.steps


# --- faults ----------------------------------------------------------------------------------


def _bad_jsonl(root: Path) -> Path:
    (root / "d").mkdir(parents=True)
    (root / "d/a.jsonl").write_text('{"n": 1}\n{"n": 2}\n')
    (root / "d/x.jsonl").write_text('{"n": 1}\n{oops\n{"n": 2}\n')
    (root / "mds.toml").write_text('[[source]]\nname = "d"\npath = "d/*.jsonl"\ncount = "n"\n')
    return root / "mds.toml"


def test_a_bad_file_fails_with_the_same_error_line(cluster, tmp_path):
    config = load_config(_bad_jsonl(tmp_path / "data"))
    with pytest.raises(SourceDataError) as local:
        build_index(config, tmp_path / "local", workers=2)
    with pytest.raises(SourceDataError) as remote:
        build_index(config, tmp_path / "ray", engine=RAY)
    assert str(remote.value) == str(local.value)
    assert str(remote.value).startswith("d/x.jsonl line 2: malformed JSON")
    assert not (tmp_path / "ray").exists()  # nothing committed


def test_a_failed_ray_task_leaves_the_previous_index_untouched(cluster, tmp_path):
    config_path = _bad_jsonl(tmp_path / "data")
    good = tmp_path / "data/d/x.jsonl"
    bad = good.read_text()
    good.write_text('{"n": 1}\n')
    build_index(load_config(config_path), tmp_path / "index", workers=1)
    before = tree(tmp_path / "index")
    good.write_text(bad)
    with pytest.raises(SourceDataError, match="d/x.jsonl line 2"):
        build_index(load_config(config_path), tmp_path / "index", engine=RAY)
    assert tree(tmp_path / "index") == before


def test_a_killed_index_worker_is_retried_with_the_same_bytes(cluster, tmp_path, monkeypatch):
    config = load_config(SAMPLE_CONFIG)
    build_index(config, tmp_path / "local", workers=2)
    marker = tmp_path / "killed"
    flaky = partial(_dies_once, str(marker), "mds.planner.index.source_table", "scan_task")
    monkeypatch.setattr(build_mod, "scan_task", flaky)
    build_index(config, tmp_path / "ray", engine=RAY)
    assert marker.exists()  # a worker did die
    assert tree(tmp_path / "ray") == tree(tmp_path / "local")


def test_a_killed_plan_worker_is_retried_with_the_same_bytes(
    cluster, tmp_path_factory, tmp_path, monkeypatch
):
    from mds.planner.plan import build as plan_mod

    config = sample_plan_config(sample_index(tmp_path_factory))
    build_plan(config, tmp_path / "local.mds", workers=1)
    marker = tmp_path / "killed"
    flaky = partial(_dies_once, str(marker), "mds.planner.plan.build", "_run_chunk")
    monkeypatch.setattr(plan_mod, "_run_chunk", flaky)
    build_plan(config, tmp_path / "ray.mds", engine=RAY)
    assert marker.exists()
    assert (tmp_path / "ray.mds").read_bytes() == (tmp_path / "local.mds").read_bytes()


def test_a_node_that_cannot_see_a_file_names_it(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d/a.jsonl").write_text('{"n": 1}\n')
    (files,) = [fs for _, fs in _discovered(tmp_path)]
    (tmp_path / "d/a.jsonl").unlink()  # as on a node without the data root mounted
    with pytest.raises(SourceDataError) as info:
        fingerprint_batch(files, "sampled", "the-driver-host")
    assert str(info.value).startswith("d/a.jsonl: not visible on Ray node ")
    assert "mount the data root at the same path on every node" in str(info.value)
    # On the driver's own host a missing file is the usual error.
    with pytest.raises(SourceDataError, match="cannot stat file"):
        fingerprint_batch(files, "sampled", socket.gethostname())


def _discovered(root: Path):
    from mds.planner.index.discover import discover

    (root / "mds.toml").write_text('[[source]]\nname = "d"\npath = "d/*.jsonl"\ncount = "n"\n')
    config = load_config(root / "mds.toml")
    return [(spec, discover(spec, config.root)) for spec in config.sources]


def _fails_or_waits(i: int, gate: str) -> int:
    """Item 0 fails at once; the others wait for the file `gate` (at most 10 minutes)."""
    if i == 0:
        raise SourceDataError("x.jsonl line 3: injected")
    deadline = time.monotonic() + 600
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.05)
    return i


def test_a_failure_on_the_callers_connection_leaves_its_tasks_to_finish(
    cluster, tmp_path, monkeypatch
):
    # ray.cancel can end this process (Ray 2.60: a cancel meeting a completing task fails an
    # internal check), so the engine never calls it.
    cancels = []
    monkeypatch.setattr(ray, "cancel", lambda *args, **kwargs: cancels.append(args))
    gate = tmp_path / "gate"
    engine = RayEngine()
    submitted = []
    submit = engine._submit

    def recording(fn, item):
        submitted.append(submit(fn, item))
        return submitted[-1]

    engine._submit = recording
    with pytest.raises(SourceDataError, match="^x.jsonl line 3: injected$"), engine:
        list(engine.map(_fails_or_waits, [(i, str(gate)) for i in range(4)], window=4))
    assert ray.is_initialized()  # the caller's connection stays open
    # The map did not wait for the others, and they were not stopped: they finish normally.
    rest = submitted[1:]
    assert len(rest) == 3 and ray.wait(rest, num_returns=3, timeout=0)[0] == []
    gate.touch()
    assert ray.get(rest, timeout=120) == [1, 2, 3]
    assert cancels == []


# A driver of its own: RayEngine connects to the cluster at argv[1] (so the connection is
# the engine's), then a task fails (argv[3] == "task") or the caller is interrupted.
_OWN_CONNECTION = """
import os, signal, sys, threading, time
from mds.errors import SourceDataError
from mds.planner.runtime.engine import RayEngine

def fails_or_waits(i, gate):
    if i == 0:
        raise SourceDataError("x.jsonl line 3: injected")
    while not os.path.exists(gate):
        time.sleep(0.05)

address, gate, failure = sys.argv[1:]
with RayEngine(address) as engine:
    if failure == "task":
        try:
            list(engine.map(fails_or_waits, [(i, gate) for i in range(4)], window=4))
        except SourceDataError as exc:
            print(exc)
    else:
        threading.Timer(3, signal.raise_signal, (signal.SIGINT,)).start()
        list(engine.map(fails_or_waits, [(i, gate) for i in range(1, 4)], window=4))
"""


@pytest.mark.parametrize("failure", ["task", "interrupt"])
def test_a_failure_on_a_connection_the_engine_opened_ends_its_tasks(cluster, tmp_path, failure):
    """When such a driver leaves after a failure, Ray stops its tasks, which would otherwise
    wait for their gate and hold both of this cluster's CPUs."""
    gate = tmp_path / "gate"  # never created
    address = ray.get_runtime_context().gcs_address
    out = subprocess.run(
        [sys.executable, "-c", _OWN_CONNECTION, address, str(gate), failure],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if failure == "task":
        assert (out.returncode, out.stdout) == (0, "x.jsonl line 3: injected\n"), out.stderr
    else:
        assert out.returncode != 0 and "KeyboardInterrupt" in out.stderr, out.stderr[-2000:]
    deadline = time.monotonic() + 120
    while ray.available_resources().get("CPU", 0) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU", 0) == 2


def test_ray_map_gives_results_in_item_order(cluster):
    with RayEngine(workers=2) as engine:
        assert list(engine.map(_square, [(i,) for i in range(20)], window=3)) == [
            i * i for i in range(20)
        ]
    assert ray.is_initialized()  # a connection it did not make is left open


# --- the CLI ---------------------------------------------------------------------------------


def test_cli_index_and_plan_on_ray(cluster, tmp_path):
    assert mds("index", SAMPLE_CONFIG, "-o", tmp_path / "local", "-j", "2").exit_code == 0
    result = mds("index", SAMPLE_CONFIG, "-o", tmp_path / "ray", "--engine", "ray", "--json")
    assert result.exit_code == 0, result.output
    assert tree(tmp_path / "ray") == tree(tmp_path / "local")
    plans = {}
    for name, extra in (("local", ()), ("ray", ("--engine", "ray", "--address", "auto"))):
        out = tmp_path / f"{name}.mds"
        result = mds("plan", SAMPLE_CONFIG, "--index", tmp_path / "local", "-o", out, *extra)
        assert result.exit_code == 0, result.output
        plans[name] = out.read_bytes()
    assert plans["ray"] == plans["local"]


def test_cli_bad_file_on_ray_is_one_error_line(cluster, tmp_path):
    config = _bad_jsonl(tmp_path / "data")
    local = mds("index", config, "-o", tmp_path / "local")
    remote = mds("index", config, "-o", tmp_path / "ray", "--engine", "ray")
    line = one_error_line(remote, "d/x.jsonl line 2")
    assert line == one_error_line(local)


# --- options and config keys (no cluster needed) ---------------------------------------------


def test_engine_options_are_checked():
    with pytest.raises(ConfigError, match="--engine must be one of local, ray, got 'spark'"):
        EngineSpec().override("spark", None)
    with pytest.raises(ConfigError, match="--address must be auto, local, ray://host:port"):
        EngineSpec().override("ray", "nowhere")
    with pytest.raises(ConfigError, match="--address applies to --engine ray only"):
        EngineSpec().override("local", "auto")
    assert EngineSpec().override(None, "ray://head:10001") == EngineSpec("ray", "ray://head:10001")
    assert EngineSpec("ray", "auto").override("local", None).kind == "local"


def test_engine_config_keys():
    source = [{"name": "d", "path": "d/*.jsonl", "count": "n"}]
    config = parse_config({"index": {"engine": "ray", "address": "auto"}, "source": source})
    assert (config.engine, config.address) == ("ray", "auto")
    with pytest.raises(ConfigError, match=r"\[index\]: `engine` must be one of local, ray"):
        parse_config({"index": {"engine": "spark"}, "source": source})
    with pytest.raises(ConfigError, match=r"\[index\]: `address` must be auto, local"):
        parse_config({"index": {"engine": "ray", "address": 5}, "source": source})
    data = tomllib.loads(SAMPLE_CONFIG.read_text())
    data["plan"].update(engine="ray", address="ray://head:10001")
    plan = plan_config_from_dict(data, SAMPLE_CONFIG.parent)
    assert (plan.engine, plan.address) == ("ray", "ray://head:10001")
    del data["plan"]["engine"]
    with pytest.raises(ConfigError, match=r'\[plan\]: `address` applies to engine = "ray" only'):
        plan_config_from_dict(data, SAMPLE_CONFIG.parent)


def test_local_engine_is_the_default_and_ray_is_not_imported():
    code = (
        "import sys\n"
        "import mds.cli.main, mds.planner.plan.build, mds.planner.index.build, mds.planner.runtime.engine\n"
        "assert 'ray' not in sys.modules, 'ray imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    with open_engine(EngineSpec(), 2) as engine:
        assert isinstance(engine, LocalEngine) and engine.in_process


def test_missing_ray_is_one_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(MdsError) as info:
        RayEngine()
    assert str(info.value) == (
        f"--engine ray needs Ray, which is not installed: {engine_mod.RAY_INSTALL}"
    )
    assert engine_mod.RAY_INSTALL == install_hint("ray")


def test_unordered_map_is_not_held_back_by_a_slow_first_task():
    release = threading.Event()

    def task(i: int) -> int:
        if i == 0:  # the first task finishes only once a later result has been handed out
            assert release.wait(60)
        return i

    with open_engine(EngineSpec(), 2) as engine:
        seen = []
        for i, result in engine.map_unordered(task, [(i,) for i in range(6)], window=3):
            assert result == i
            seen.append(i)
            release.set()
        assert seen[0] != 0 and sorted(seen) == list(range(6))
        release.clear()
        assert list(engine.map(_square, [(i,) for i in range(9)], window=2)) == [
            i * i for i in range(9)
        ]
