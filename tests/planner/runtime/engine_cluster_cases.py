"""Cases of `mds index` and `mds plan` on a Ray cluster of several nodes on this machine, run
by test_engine.py in a pytest process of their own (as engine_cases.py, for the same reason).

The cluster (ray.cluster_utils.Cluster) has a head and a second node, one CPU and a small
object store each, every node its own raylet, object store and workers; a third node joins
to be removed mid-run. An S3 server (tests/s3_store.py) runs from the start, so that the
workers get its address in their environment, as a real cluster's would. A path that only
the driver sees is a tmpfs mounted in a mount namespace of the driver's own (unshare -m):
the nodes, started before, cannot see into it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import threading
import time
from functools import partial
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from ray_clusters import unadvertise
from s3_store import ENV, s3_server

from mds.planner.index import build as build_mod
from mds.planner.index.build import build_index
from mds.planner.index.config import load_config
from mds.planner.plan.build import build_plan
from mds.planner.plan.config import load_plan_config
from mds.planner.runtime import engine as engine_mod
from mds.planner.runtime.engine import EngineSpec

ray = pytest.importorskip("ray")
RAY = EngineSpec("ray")
STORE = 100 << 20  # object store bytes per node
PLAN = (
    "[train]\nsteps = 8\ndp_size = 2\nmicro_batches = 1\nsamples_per_step = 8\n"
    "max_tokens_per_micro_batch = 4096\nseed = 1\n\n[plan]\nchunk_steps = 2\n"
)


@pytest.fixture(scope="module")
def s3():
    with pytest.MonkeyPatch.context() as monkeypatch, s3_server(monkeypatch) as store:
        yield store


@pytest.fixture(scope="module")
def cluster(s3):
    """Head and one more node, one CPU each; this process is the driver. This file's helpers
    travel to the workers by value."""
    from ray.cluster_utils import Cluster

    assert not ray.is_initialized()
    nodes = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "object_store_memory": STORE, "resources": {"head": 1}},
    )
    unadvertise(nodes)
    try:
        nodes.add_node(num_cpus=1, object_store_memory=STORE, resources={"second": 1})
        nodes.wait_for_nodes()
        env = {k: os.environ[k] for k in (*ENV, "AWS_ENDPOINT_URL")}
        ray.init(
            address=nodes.address,
            log_to_driver=False,
            logging_level="WARNING",
            runtime_env={"env_vars": env},
        )
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
        yield nodes
    finally:
        ray.cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
        ray.shutdown()
        nodes.shutdown()


def tree(path: Path) -> dict[str, bytes]:
    return {
        p.relative_to(path).as_posix(): p.read_bytes()
        for p in sorted(path.rglob("*"))
        if p.is_file() and not p.name.endswith(".lock")
    }


def tiny_corpus(root: Path, files: int = 24) -> Path:
    """`files` tiny Parquet files and a small JSONL source under `root`; its config path."""
    rng = np.random.default_rng(7)
    (root / "p").mkdir(parents=True)
    for i in range(files):
        n = rng.integers(16, 512, 8)
        pq.write_table(pa.table({"n": n, "lang": ["en", "de"] * 4}), root / f"p/f{i:03d}.parquet")
    (root / "j").mkdir()
    for i in range(3):
        lines = "".join(f'{{"n": {int(v)}}}\n' for v in rng.integers(16, 512, 5))
        (root / f"j/{i}.jsonl").write_text(lines)
    sources = (
        '[[source]]\nname = "p"\npath = "p/*.parquet"\ncount = "n"\nkeep = ["lang"]\n'
        "weight = 0.7\n\n"
        '[[source]]\nname = "j"\npath = "j/*.jsonl"\ncount = "n"\nweight = 0.3\n\n'
    )
    (root / "mds.toml").write_text(sources + PLAN)
    return root / "mds.toml"


def _on_node(record: str, hold_on: str | None, module: str, name: str, *args):
    """module.name(*args) on a Ray worker, leaving a file named for its node under `record`;
    on the node `hold_on` it waits to be removed (the node's end ends it)."""
    import importlib

    node = ray.get_runtime_context().get_node_id()
    Path(record, f"{node}-{os.getpid()}-{time.monotonic_ns()}").touch()
    if node == hold_on:
        time.sleep(300)
    time.sleep(0.1)  # a queue builds up, so that tasks spill to every node
    return getattr(importlib.import_module(module), name)(*args)


def _nodes_seen(record: Path) -> set[str]:
    return {p.name.split("-")[0] for p in record.iterdir()}


# --- local paths every node sees, and s3:// ------------------------------------------------


def test_index_and_plan_on_two_nodes_are_byte_identical_to_local(cluster, tmp_path, monkeypatch):
    config_path = tiny_corpus(tmp_path / "data")
    config = load_config(config_path)
    build_index(config, tmp_path / "local", workers=2)
    record = tmp_path / "record"
    record.mkdir()
    spy = partial(_on_node, str(record), None, "mds.planner.index.source_table", "scan_task")
    monkeypatch.setattr(build_mod, "scan_task", spy)
    build_index(config, tmp_path / "ray", engine=RAY)
    assert tree(tmp_path / "ray") == tree(tmp_path / "local")
    assert len(_nodes_seen(record)) == 2  # the scans ran on both nodes
    plan_config = load_plan_config(config_path)
    from mds.planner.plan.build import with_overrides

    plan_config = with_overrides(plan_config, index=tmp_path / "local")
    build_plan(plan_config, tmp_path / "local.mds", workers=1)
    build_plan(plan_config, tmp_path / "ray.mds", engine=RAY)
    assert (tmp_path / "ray.mds").read_bytes() == (tmp_path / "local.mds").read_bytes()


def test_grouped_tasks_give_the_bytes_of_one_task_per_file(cluster, tmp_path, monkeypatch):
    config = load_config(tiny_corpus(tmp_path / "data", files=40))
    build_index(config, tmp_path / "grouped", engine=RAY)
    monkeypatch.setattr(engine_mod, "GROUP_ITEMS", 1)
    build_index(config, tmp_path / "alone", engine=RAY)
    assert tree(tmp_path / "grouped") == tree(tmp_path / "alone")


def test_index_from_s3_on_two_nodes_is_byte_identical_to_local(cluster, s3, tmp_path):
    local = tmp_path / "data"
    config_path = tiny_corpus(local)
    url = s3.upload(local, "cluster")
    remote = tmp_path / "s3.toml"
    remote.write_text(f'[index]\nroot = "{url}"\n\n' + config_path.read_text())
    build_index(load_config(config_path), tmp_path / "local", workers=2)
    build_index(load_config(remote), tmp_path / "ray", engine=RAY)
    build_index(load_config(remote), tmp_path / "s3-local", workers=2)
    assert tree(tmp_path / "ray") == tree(tmp_path / "s3-local")
    # the same rows as from the local copy (the manifest names another root, and the file
    # lists record the objects' modification times, not the local files')

    def tables(index: Path) -> dict[str, bytes]:
        return {
            k: v for k, v in tree(index).items() if k.startswith("sources/") and "-files-" not in k
        }

    assert tables(tmp_path / "ray") == tables(tmp_path / "local")


# --- a path only the driver sees -----------------------------------------------------------


def _private_driver(private: Path, copy: Path, *command: str) -> subprocess.CompletedProcess:
    """`mds COMMAND...` in a mount namespace of its own, where `copy` is copied to a tmpfs at
    `private`: only that process sees the files there."""
    mds = Path(sys.executable).with_name("mds")
    script = 'mount -t tmpfs tmpfs "$1" && cp -r "$2"/. "$1" && shift 2 && exec "$@"'
    return subprocess.run(
        ["unshare", "-m", "sh", "-c", script, "sh", str(private), str(copy), str(mds), *command],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "RAY_ADDRESS": ""},
    )


def _can_unshare() -> bool:
    try:
        return subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not _can_unshare(), reason="needs unshare -m (root or user namespaces)")
def test_a_data_root_only_the_driver_sees_fails_before_any_work(cluster, tmp_path):
    config_path = tiny_corpus(tmp_path / "data")
    private = tmp_path / "private"
    private.mkdir()
    out = _private_driver(
        private,
        config_path.parent,
        "index",
        str(private / "mds.toml"),
        "-o",
        str(tmp_path / "idx"),
        "--engine",
        "ray",
        "--address",
        cluster.address,
    )
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    # The root itself is there (the empty mount point); its files are not.
    assert re.fullmatch(
        rf"error: p/f000\.parquet: not visible on Ray node \S+ \(\w{{8}}\): "
        rf"{re.escape(str(private))}/p/f000\.parquet is missing there; mount it at the same "
        r"path on every node, or use an s3:// root",
        lines[0],
    ), lines[0]
    assert not (tmp_path / "idx").exists()


@pytest.mark.skipif(not _can_unshare(), reason="needs unshare -m (root or user namespaces)")
def test_an_index_only_the_driver_sees_fails_before_any_work(cluster, tmp_path):
    config_path = tiny_corpus(tmp_path / "data")
    build_index(load_config(config_path), tmp_path / "shared/index", workers=2)
    private = tmp_path / "private"
    private.mkdir()
    out = _private_driver(
        private,
        tmp_path / "shared",
        "plan",
        str(config_path),
        "--index",
        str(private / "index"),
        "-o",
        str(tmp_path / "p.mds"),
        "--engine",
        "ray",
        "--address",
        cluster.address,
    )
    assert out.returncode == 1, out.stdout + out.stderr
    # Ray's own processes may log to the same stderr (e.g. task_manager.cc); mds says one line
    lines = [line for line in out.stderr.strip().splitlines() if line.startswith("error:")]
    assert len(lines) == 1, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    assert lines[0].startswith(f"error: index {private / 'index'}: not visible on Ray node"), lines
    assert not (tmp_path / "p.mds").exists()


# --- a node removed mid-run ----------------------------------------------------------------


def test_a_node_removed_mid_run_has_its_tasks_retried_with_the_same_bytes(
    cluster, tmp_path, monkeypatch
):
    config = load_config(tiny_corpus(tmp_path / "data", files=40))
    build_index(config, tmp_path / "local", workers=2)
    doomed = cluster.add_node(num_cpus=1, object_store_memory=STORE, resources={"doomed": 1})
    cluster.wait_for_nodes()
    record = tmp_path / "record"
    record.mkdir()
    hold = doomed.node_id
    spy = partial(_on_node, str(record), hold, "mds.planner.index.source_table", "scan_task")
    monkeypatch.setattr(build_mod, "scan_task", spy)
    removed = threading.Event()

    def remove_when_busy() -> None:
        deadline = time.monotonic() + 120
        while hold not in _nodes_seen(record) and time.monotonic() < deadline:
            time.sleep(0.05)
        cluster.remove_node(doomed, allow_graceful=False)
        removed.set()

    remover = threading.Thread(target=remove_when_busy, daemon=True)
    remover.start()
    try:
        build_index(config, tmp_path / "ray", engine=RAY)
    finally:
        remover.join(timeout=150)
    assert removed.is_set() and hold in _nodes_seen(record)  # a task did run there
    assert tree(tmp_path / "ray") == tree(tmp_path / "local")
    shutil.rmtree(record)
