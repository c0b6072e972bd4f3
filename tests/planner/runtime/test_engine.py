"""The engine's cases (tests/planner/runtime/engine_cases.py) run in a pytest process of their own.

They start a local Ray cluster, and a Ray driver whose raylet dies (a loaded machine can
miss its health checks) is ended by Ray on the spot: in the suite's own process that would
end the whole run without a report. Apart, it is one failed test with the cases' output.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

CASES = Path(__file__).with_name("engine_cases.py")
# Index and plan on a cluster of several nodes on this machine (ray.cluster_utils.Cluster).
CLUSTER_CASES = Path(__file__).with_name("engine_cluster_cases.py")


@pytest.mark.slow
@pytest.mark.parametrize("cases", [CASES, CLUSTER_CASES], ids=lambda p: p.stem)
def test_engine_cases_pass_in_a_process_of_their_own(tmp_path, cases):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            str(cases),
            "--basetemp",
            str(tmp_path / "cases"),
        ],
        cwd=CASES.parents[3],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:] + _ray_fatal_lines()


def _ray_fatal_lines() -> str:
    """Ray's fatal log lines of the latest session: why a driver ended without a report."""
    logs = Path(tempfile.gettempdir(), "ray", "session_latest", "logs")
    lines = [
        line[:400]
        for log in sorted(logs.glob("python-core-driver-*.log"))
        for line in log.read_text(errors="replace").splitlines()
        if " C " in line[:40]
    ]
    return "\nRay fatal lines:\n" + "\n".join(lines) if lines else ""


def _closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("command", ["index", "plan"])
def test_unreachable_ray_address_is_one_line_within_seconds(tmp_path, command):
    import os
    import time

    port = _closed_port()
    sample = CASES.parents[3] / "sample_data" / "mds.toml"
    args = [sample, "-o", tmp_path / "out"]
    if command == "plan":
        args += ["--index", tmp_path / "none"]
    args += ["--engine", "ray", "--address", f"127.0.0.1:{port}"]
    mds_bin = Path(sys.executable).with_name("mds")
    began = time.monotonic()
    out = subprocess.run(
        [mds_bin, command, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "RAY_ADDRESS": ""},
    )
    took = time.monotonic() - began
    assert out.returncode == 1, out.stderr
    assert out.stderr.strip() == (
        f"error: cannot reach the Ray cluster at 127.0.0.1:{port} (Connection refused)"
    )
    assert took < 15, took


def test_unreachable_ray_client_address_is_one_line(monkeypatch):
    from mds.errors import MdsError
    from mds.planner.runtime.engine import RayEngine

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    port = _closed_port()
    with pytest.raises(MdsError) as info:
        RayEngine(f"ray://127.0.0.1:{port}")
    assert str(info.value) == (
        f"cannot reach the Ray cluster at ray://127.0.0.1:{port} (Connection refused)"
    )


def test_connect_timeout_is_configurable(monkeypatch):
    from mds.errors import ConfigError
    from mds.planner.runtime import engine

    monkeypatch.delenv(engine.RAY_CONNECT_TIMEOUT_ENV, raising=False)
    assert engine.connect_timeout() == engine.RAY_CONNECT_TIMEOUT
    assert engine.connect_timeout(0.5) == 0.5
    monkeypatch.setenv(engine.RAY_CONNECT_TIMEOUT_ENV, "1.5")
    assert engine.connect_timeout() == 1.5
    monkeypatch.setenv(engine.RAY_CONNECT_TIMEOUT_ENV, "soon")
    with pytest.raises(ConfigError, match="MDS_RAY_CONNECT_TIMEOUT must be a number"):
        engine.connect_timeout()


def test_ray_endpoints():
    from mds.planner.runtime.engine import RAY_CLIENT_PORT, ray_endpoint

    assert ray_endpoint("10.0.0.1:6379") == ("10.0.0.1", 6379)
    assert ray_endpoint("ray://head:10002") == ("head", 10002)
    assert ray_endpoint("ray://head") == ("head", RAY_CLIENT_PORT)
    assert ray_endpoint("[::1]:6379") == ("::1", 6379)
    assert ray_endpoint("local") is None


def test_missing_ray_client_names_the_package_not_the_cluster(monkeypatch):
    from mds.errors import MdsError
    from mds.planner.runtime.engine import RAY_INSTALL, RayEngine

    # `import ray.util.client.worker` raises ImportError, as it does without grpcio
    monkeypatch.setitem(sys.modules, "ray.util.client.worker", None)
    monkeypatch.setitem(sys.modules, "grpc", None)
    port = _closed_port()
    with pytest.raises(MdsError) as info:
        RayEngine(f"ray://127.0.0.1:{port}")
    message = str(info.value)
    assert "cannot reach" not in message
    assert RAY_INSTALL in message and "ray[client]" in message
    assert message.startswith(f"--address ray://127.0.0.1:{port} uses the Ray client, which needs")


def test_a_head_that_does_not_answer_fails_after_the_connect_timeout(monkeypatch):
    """A listener whose accept queue is full drops new connections unanswered, as a
    firewalled or hung head does: the probe gives up after MDS_RAY_CONNECT_TIMEOUT."""
    import socket
    import time

    from mds.errors import MdsError
    from mds.planner.runtime.engine import RayEngine

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("MDS_RAY_CONNECT_TIMEOUT", "0.5")
    with socket.socket() as server, socket.socket() as queued:
        server.bind(("127.0.0.1", 0))
        server.listen(0)
        port = server.getsockname()[1]
        queued.connect(("127.0.0.1", port))  # fills the queue; never accepted
        began = time.monotonic()
        with pytest.raises(MdsError) as info:
            RayEngine(f"127.0.0.1:{port}")
        took = time.monotonic() - began
    assert str(info.value) == (
        f"cannot reach the Ray cluster at 127.0.0.1:{port} (no answer within 0.5 s; "
        "MDS_RAY_CONNECT_TIMEOUT sets the wait)"
    )
    assert took < 3, took


def _sized(sizes):
    return [(i, n) for i, n in enumerate(sizes)]


def test_groups_pack_consecutive_units_by_bytes_and_count(monkeypatch):
    from mds.planner.runtime import engine

    monkeypatch.setattr(engine, "GROUP_BYTES", 100)
    monkeypatch.setattr(engine, "GROUP_ITEMS", 3)

    def packed(sizes, workers=1, count=None):
        return [
            (first, [i for i, _ in group])
            for first, group in engine.groups(_sized(sizes), lambda u: u[1], workers, count)
        ]

    # at most 3 units, at most 100 bytes; a unit over the budget goes alone
    assert packed([1, 1, 1, 1, 1]) == [(0, [0, 1, 2]), (3, [3, 4])]
    assert packed([60, 30, 20, 500, 10]) == [(0, [0, 1]), (2, [2]), (3, [3]), (4, [4])]
    # counted units: at least GROUP_SPREAD tasks per worker
    assert packed([1] * 8, workers=1, count=8) == [
        (0, [0, 1]),
        (2, [2, 3]),
        (4, [4, 5]),
        (6, [6, 7]),
    ]
    assert packed([]) == []


def test_a_grouped_map_hands_out_every_result_in_place(monkeypatch):
    """With `size` given, the local pool runs consecutive small units in one task, as Ray does."""
    from mds.planner.runtime import engine
    from mds.planner.runtime.engine import EngineSpec, open_engine

    monkeypatch.setattr(engine, "GROUP_ITEMS", 4)
    items = [(i,) for i in range(23)]
    with open_engine(EngineSpec(), 2) as pool:
        submitted = []
        submit = pool._submit
        monkeypatch.setattr(
            pool, "_submit", lambda fn, item: submitted.append(1) or submit(fn, item)
        )
        twice = [2 * i for i in range(23)]
        assert list(pool.map(_twice, iter(items), window=2, size=lambda _: 1)) == twice
        assert len(submitted) == 6  # 23 units in tasks of at most 4
        # 23 counted units on 2 workers: tasks of at most 23 / (4 x 2), rounded up
        got = dict(pool.map_unordered(_twice, items, size=lambda _: 1))
        assert got == dict(enumerate(twice)) and len(submitted) == 6 + 8


def _twice(i: int) -> int:
    return 2 * i


def _fold(items, results):
    """A merge: each task's results summed into its first item's, the others 0."""
    return [sum(results)] + [0] * (len(results) - 1)


def test_a_grouped_map_hands_out_what_the_merge_made_of_each_task(monkeypatch):
    from mds.planner.runtime import engine
    from mds.planner.runtime.engine import EngineSpec, open_engine

    monkeypatch.setattr(engine, "GROUP_ITEMS", 4)
    items = [(i,) for i in range(10)]
    with open_engine(EngineSpec(), 2) as pool:
        # without sizes, a unit a task: no task is merged
        assert list(pool.map(_twice, items, merge=_fold)) == [2 * i for i in range(10)]
        got = list(pool.map(_twice, iter(items), size=lambda _: 1, merge=_fold))
    # tasks of items 0-3, 4-7, 8-9
    assert got == [12, 0, 0, 0, 44, 0, 0, 0, 34, 0]


def _group_sizes(items, results):
    """A merge: each task's size in items, at its first item (the others 0)."""
    return [len(items)] + [0] * (len(items) - 1)


def test_the_local_pool_groups_units_only_up_to_its_byte_budget(monkeypatch):
    """A local task costs microseconds: units share one only up to LOCAL_GROUP_BYTES (so that
    their results are merged), not up to Ray's GROUP_BYTES; a larger unit goes alone."""
    from mds.planner.runtime import engine
    from mds.planner.runtime.engine import EngineSpec, open_engine

    budget = engine.LOCAL_GROUP_BYTES
    assert budget < engine.GROUP_BYTES
    sizes = [1, 1, budget, budget // 2, budget // 2, 1, budget + 1, 1]
    items = [(i, n) for i, n in enumerate(sizes)]
    with open_engine(EngineSpec(), 1) as pool:
        got = list(pool.map(_first, iter(items), size=lambda item: item[1], merge=_group_sizes))
    # {0, 1}, {2} (the budget whole), {3, 4} (halves fill it), {5} (one byte more would pass
    # it), {6} (over it alone), {7}
    assert got == [2, 0, 1, 2, 0, 1, 1, 1]


def _first(i: int, n: int) -> int:
    return i
