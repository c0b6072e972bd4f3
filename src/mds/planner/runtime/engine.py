"""Where the parallel work of `mds index` and `mds plan` runs: a local pool (threads or
processes, the default, needing nothing) or tasks on a Ray cluster.

Both engines map the same module-level function over the same units of work (a group of
files to scan, a chunk of steps to plan) and hand the results back in order, so the driver
writes the same bytes whichever scheduled them. Ray is imported only when asked for.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Executor, Future, wait
from dataclasses import dataclass
from typing import Any

from mds.errors import ConfigError, MdsError, install_hint

__all__ = [
    "ENGINES",
    "Engine",
    "EngineSpec",
    "GROUP_BYTES",
    "GROUP_ITEMS",
    "LOCAL_GROUP_BYTES",
    "LocalEngine",
    "Merge",
    "RayEngine",
    "check_address",
    "check_engine",
    "fork_shares_memory",
    "groups",
    "open_engine",
]

ENGINES = ("local", "ray")
RAY_INSTALL = install_hint("ray")
# Seconds a TCP connect to the Ray head may take before the address counts as unreachable;
# ray.init itself retries for minutes and ignores Ctrl-C meanwhile.
# How often the local pool's wait wakes the main thread, so that a signal is acted on.
WAKE_SECONDS = 0.2
RAY_CONNECT_TIMEOUT = 5.0
RAY_CONNECT_TIMEOUT_ENV = "MDS_RAY_CONNECT_TIMEOUT"
RAY_CLIENT_PORT = 10001  # Ray's default for a ray:// address without a port
# Times Ray re-runs a task whose worker died (killed, out of memory, node lost). A task that
# raises is never retried: bad input fails the same way every time.
RAY_RETRIES = 3
RAY_WINDOW = 16  # tasks in flight per worker, unless the caller bounds them
# Where a caller gives the units' sizes, consecutive small units share one task: up to
# GROUP_ITEMS units and the engine's bytes of input (a larger unit goes alone), and never
# fewer than GROUP_SPREAD tasks per worker when the units are counted. On Ray a task costs
# milliseconds, which GROUP_BYTES spreads over many units. A local task costs microseconds:
# there units share a task only so that its results are merged (a few parts to assemble
# instead of one per tiny file), up to LOCAL_GROUP_BYTES, past which a unit's own work
# dwarfs what its result costs the driver (a batch of small JSONL files, already one
# result, mostly goes alone).
GROUP_BYTES = 32 << 20
LOCAL_GROUP_BYTES = 4 << 20
GROUP_ITEMS = 64
GROUP_SPREAD = 4

# merge(items, results) -> results: what a task of several items hands back instead of their
# results, one per item, in the same order. A caller folds runs of results into the first of
# each (the others left empty) so that a task hands back a few large objects, not one per
# item; the caller must take either form, as a map without sizes is never grouped nor merged.
Merge = Callable[[list[tuple], list[Any]], list[Any]]


def check_engine(value: Any, where: str) -> str:
    """`value` as an engine name; `where` names the key or option in the error."""
    if value not in ENGINES:
        raise ConfigError(f"{where} must be one of {', '.join(ENGINES)}, got {value!r}")
    return value


def check_address(value: Any, where: str) -> str:
    """A Ray address: auto (a running cluster), local (start one here), ray://host:port
    (Ray client) or host:port (a head node's GCS)."""
    ok = isinstance(value, str) and (
        value in ("auto", "local")
        or (value.startswith("ray://") and len(value) > len("ray://"))
        or (":" in value and value.rsplit(":", 1)[1].isdigit())
    )
    if not ok:
        raise ConfigError(
            f"{where} must be auto, local, ray://host:port or host:port, got {value!r}"
        )
    return value


@dataclass(frozen=True)
class EngineSpec:
    """Which engine runs a command's parallel work (from the config, overridden by options)."""

    kind: str = "local"
    # Ray only; None: Ray's default (RAY_ADDRESS, else the `ray start` cluster on this
    # machine, else a new local one)
    address: str | None = None

    def override(self, kind: str | None, address: str | None) -> EngineSpec:
        """The spec with command-line options applied; an --address alone implies Ray."""
        kind = check_engine(kind, "--engine") if kind is not None else None
        if address is not None:
            check_address(address, "--address")
            if kind is None:
                kind = "ray"
        kind = kind or self.kind
        if kind != "ray" and address is not None:
            raise ConfigError("--address applies to --engine ray only")
        return EngineSpec(kind, address if address is not None else self.address)


class Engine:
    """Runs fn(*item) for each item with at most `window` tasks in flight (or done and not
    yet handed out), yielding the results in item order or as they complete. The first task
    to fail ends the map with its error and stops the others (see each engine's _cancel)."""

    name = "engine"
    workers = 1
    # Tasks run in this process and may share its objects (an Event, a progress callback).
    in_process = False

    def map(
        self,
        fn: Callable[..., Any],
        items: Iterable[tuple],
        window: int | None = None,
        size: Callable[[tuple], int] | None = None,
        merge: Merge | None = None,
    ) -> Iterator[Any]:
        """fn(*item) per item, the results in item order. `size`: an item's input bytes; given,
        consecutive small items run in one task (see groups and group_bytes). `merge`: see
        Merge; applied to such a task's results where it runs."""
        for _, result in self._grouped(fn, items, window, size, ordered=True, merge=merge):
            yield result

    def map_unordered(
        self,
        fn: Callable[..., Any],
        items: Iterable[tuple],
        window: int | None = None,
        size: Callable[[tuple], int] | None = None,
        merge: Merge | None = None,
    ) -> Iterator[tuple[int, Any]]:
        """(position of the item, result) as tasks complete: a slow task does not hold the
        others back. `size` and `merge` as for map."""
        return self._grouped(fn, items, window, size, ordered=False, merge=merge)

    def _grouped(
        self,
        fn: Callable[..., Any],
        items: Iterable[tuple],
        window: int | None,
        size: Callable[[tuple], int] | None,
        ordered: bool,
        merge: Merge | None = None,
    ) -> Iterator[tuple[int, Any]]:
        """_run over groups of items (see groups), their results handed out item by item."""
        budget = None if size is None else self.group_bytes()
        if budget is None:
            yield from self._run(fn, items, window, ordered)
            return
        count = len(items) if isinstance(items, list | tuple) else None
        firsts: list[int] = []  # each group's first item position
        tasks = (
            (fn, firsts.append(first) or group, merge)
            for first, group in groups(items, size, self.workers, count, budget)
        )
        for g, results in self._run(_call_each, tasks, window, ordered):
            for k, result in enumerate(results):
                yield firsts[g] + k, result

    def group_bytes(self) -> int | None:
        """The input bytes a task of several sized units may hold; None: a unit a task."""
        return None

    def check_visible(self, paths: list[tuple[str, str]]) -> None:
        """Raise when a worker cannot open one of `paths` ((name for the error, path) pairs)
        that this process sees. Local workers share this process's view: nothing to check."""

    def default_window(self) -> int:
        return 4 * self.workers

    def _run(
        self, fn: Callable[..., Any], items: Iterable[tuple], window: int | None, ordered: bool
    ) -> Iterator[tuple[int, Any]]:
        window = max(1, window or self.default_window())
        source = enumerate(items)
        pending: dict[Any, int] = {}  # handle -> position, for tasks not yet complete
        self._pending = pending  # for close() after a failure outside the map
        done: dict[int, Any] = {}  # position -> result, complete but not yet handed out
        head = 0  # the next position handed out, when ordered
        try:
            while True:
                while len(pending) + len(done) < window:
                    nxt = next(source, None)
                    if nxt is None:
                        break
                    pending[self._submit(fn, nxt[1])] = nxt[0]
                if ordered and head in done:
                    yield head, done.pop(head)
                    head += 1
                    continue
                if not pending:
                    return
                for handle, value in self._wait(list(pending)):
                    i = pending.pop(handle)
                    if ordered:
                        done[i] = value
                    else:
                        yield i, value
        finally:
            if pending:
                self._cancel(list(pending))
                pending.clear()

    def _submit(self, fn: Callable[..., Any], item: tuple) -> Any:
        raise NotImplementedError

    def _wait(self, handles: list) -> list[tuple[Any, Any]]:
        """Block until one or more of `handles` is done; their (handle, result) pairs. A
        failed task raises its error here."""
        raise NotImplementedError

    def _cancel(self, handles: list) -> None:
        raise NotImplementedError

    _pending: dict[Any, int] = {}

    def close(self, wait: bool = True) -> None:
        """Release the workers; `wait`: let running tasks finish (False after a failure,
        which cancels the tasks of a map the caller left unfinished)."""
        if not wait and self._pending:
            self._cancel(list(self._pending))
            self._pending = {}

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.close(wait=exc_type is None)


class LocalEngine(Engine):
    """The embedded pool: a concurrent.futures executor (threads for scans, which release
    the GIL; spawned processes for planning)."""

    name = "local"

    def __init__(self, executor: Executor, workers: int, in_process: bool):
        self.executor = executor
        self.workers = workers
        self.in_process = in_process

    def group_bytes(self) -> int | None:
        return LOCAL_GROUP_BYTES

    def _submit(self, fn: Callable[..., Any], item: tuple) -> Future:
        return self.executor.submit(fn, *item)

    def _wait(self, handles: list[Future]) -> list[tuple[Future, Any]]:
        # In short waits: Ctrl-C reaches the process on whichever thread the kernel picks (a
        # scanning one, often), and Python raises KeyboardInterrupt only once the main thread
        # runs again; an unbounded wait would hold it until a task completes.
        while True:
            done, _ = wait(handles, timeout=WAKE_SECONDS, return_when=FIRST_COMPLETED)
            if done:
                return [(f, f.result()) for f in done]

    def _cancel(self, handles: list[Future]) -> None:
        for f in handles:
            f.cancel()

    def close(self, wait: bool = True) -> None:
        super().close(wait)
        # Processes are always joined (none is left behind); threads of a failed run are
        # not waited for: their scans stop at the next chunk.
        self.executor.shutdown(wait=wait or not self.in_process, cancel_futures=True)


def groups(
    items: Iterable[tuple],
    size: Callable[[tuple], int],
    workers: int,
    count: int | None = None,
    budget: int | None = None,
) -> Iterator[tuple[int, list[tuple]]]:
    """(first position, items) of each task when consecutive items share tasks: a group ends
    before an item that would take it past `budget` bytes (default GROUP_BYTES) or
    GROUP_ITEMS items; with `count` (the number of items) known, also at count /
    (GROUP_SPREAD x workers) items, so that every worker gets several tasks and a slow one
    can be balanced."""
    budget = GROUP_BYTES if budget is None else budget
    cap = GROUP_ITEMS
    if count is not None:
        cap = max(1, min(cap, -(-count // (GROUP_SPREAD * max(workers, 1)))))
    group: list[tuple] = []
    first = nbytes = 0
    for i, item in enumerate(items):
        n = size(item)
        if group and (len(group) >= cap or nbytes + n > budget):
            yield first, group
            group = []
        if not group:
            first, nbytes = i, 0
        group.append(item)
        nbytes += n
    if group:
        yield first, group


def _call(fn: Callable[..., Any], args: tuple) -> Any:
    """What a Ray task runs: the unit of work, exactly as the local pool calls it."""
    return fn(*args)


def _call_each(fn: Callable[..., Any], items: list[tuple], merge: Merge | None) -> list[Any]:
    """A task of several units: each run as it would run alone, the results in order
    (merged, if the caller asked, before they leave the task)."""
    results = [fn(*item) for item in items]
    if merge is None:
        return results
    merged = merge(items, results)
    assert len(merged) == len(items), "a merge hands back one result per item"
    return merged


def _missing(paths: list[tuple[str, str]]) -> tuple[str, list[str]]:
    """(this node's address, the names of `paths` it cannot see): the probe check_visible
    runs on every node."""
    import ray

    node = ray.util.get_node_ip_address()
    return node, [name for name, path in paths if not os.path.exists(path)]


class RayEngine(Engine):
    """Tasks on a Ray cluster. Connects on creation (or uses the connection this process
    already has); a task whose worker dies is retried, one that raises is not."""

    name = "ray"

    def __init__(
        self,
        address: str | None = None,
        workers: int | None = None,
        connect_timeout: float | None = None,
    ):
        try:
            import ray
        except ImportError:
            raise MdsError(
                f"--engine ray needs Ray, which is not installed: {RAY_INSTALL}"
            ) from None
        self.ray = ray
        self.started = False
        if not ray.is_initialized():
            target = address if address is not None else os.environ.get("RAY_ADDRESS") or None
            if target is not None and target.startswith("ray://"):
                _check_ray_client(target)
            where = target or "the default address"
            probe_ray_address(target, where, connect_timeout)
            try:
                # Workers' output and Ray's INFO lines stay in Ray's logs, off the terminal.
                ray.init(
                    address=address,
                    log_to_driver=False,
                    include_dashboard=False,
                    logging_level=logging.WARNING,
                )
            except (ConnectionError, RuntimeError, ValueError) as exc:
                line = (str(exc).strip() or type(exc).__name__).splitlines()[0]
                raise MdsError(f"cannot reach the Ray cluster at {where} ({line})") from None
            self.started = True
        cpus = int(ray.cluster_resources().get("CPU", 1))
        self.workers = max(1, workers or cpus)
        self.remote = ray.remote(max_retries=RAY_RETRIES)(_call)
        self.probe = ray.remote(num_cpus=0, max_retries=RAY_RETRIES)(_missing)

    def check_visible(self, paths: list[tuple[str, str]]) -> None:
        """One probe per node that runs tasks (it has CPUs), pinned there: the first path a
        node cannot open fails the command before any work is handed out."""
        if not paths:
            return
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        nodes = [
            n["NodeID"]
            for n in self.ray.nodes()
            if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0
        ]
        refs = [
            self.probe.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)
            ).remote(paths)
            for node in nodes
        ]
        for node, ref in zip(nodes, refs, strict=True):
            try:
                address, missing = self.ray.get(ref)
            except self.ray.exceptions.RayError:
                continue  # the node left meanwhile: it runs no task of this command
            if missing:
                name = missing[0]
                path = dict(paths)[name]
                raise MdsError(
                    f"{name}: not visible on Ray node {address} ({node[:8]}): {path} is "
                    "missing there; mount it at the same path on every node, or use an "
                    "s3:// root"
                )

    def default_window(self) -> int:
        # A round trip to the cluster costs milliseconds: keep more tasks queued than CPUs.
        return RAY_WINDOW * self.workers

    def group_bytes(self) -> int | None:
        return GROUP_BYTES

    def _submit(self, fn: Callable[..., Any], item: tuple) -> Any:
        return self.remote.remote(fn, item)

    def _wait(self, handles: list) -> list[tuple[Any, Any]]:
        ready, rest = self.ray.wait(handles, num_returns=1)
        if rest:  # and every other one already done, at no extra wait
            ready += self.ray.wait(rest, num_returns=len(rest), timeout=0)[0]
        return list(zip(ready, self._get(ready), strict=True))

    def _get(self, refs: list) -> list:
        """The results of `refs`, all ready: one ray.get for them all."""
        exceptions = self.ray.exceptions
        try:
            return self.ray.get(refs)
        except exceptions.RayTaskError as exc:
            # The task's own error, unwrapped: the same one line as a local run.
            cause = getattr(exc, "cause", None)
            if isinstance(cause, MdsError | KeyboardInterrupt):
                raise cause from None
            raise
        except exceptions.RayError as exc:
            line = (str(exc).strip() or type(exc).__name__).splitlines()[0]
            raise MdsError(f"a Ray task failed after {RAY_RETRIES} retries ({line})") from None

    def _cancel(self, handles: list) -> None:
        """Nothing, on purpose: ray.cancel is unsafe. In Ray 2.60 a cancel that meets a task
        whose result is arriving fails an internal check and ends this process with no
        message (the submitter fails the task, then the reply completes it). Tasks on a
        connection this engine opened end when close() shuts it down: Ray stops the tasks of
        a job whose driver left. On the caller's own connection they run to their end (at
        most the map's window) and their results are dropped."""

    def close(self, wait: bool = True) -> None:
        super().close(wait)
        if self.started:
            self.ray.shutdown()
            self.started = False


def _check_ray_client(address: str) -> None:
    """A ray:// address goes through the Ray client, which needs grpcio (Ray's `client`
    extra); say which package to install rather than that the cluster is unreachable."""
    try:
        import ray.util.client.worker  # noqa: F401  (imports grpc)
    except ImportError:
        raise MdsError(
            f"--address {address} uses the Ray client, which needs Ray's `client` extra "
            f"(grpcio), not installed: pip install 'ray[client]', or {RAY_INSTALL}"
        ) from None


def connect_timeout(value: float | None = None) -> float:
    """Seconds to wait for the Ray head to accept a connection: `value`, else
    $MDS_RAY_CONNECT_TIMEOUT, else RAY_CONNECT_TIMEOUT."""
    if value is None:
        raw = os.environ.get(RAY_CONNECT_TIMEOUT_ENV)
        if not raw:
            return RAY_CONNECT_TIMEOUT
        try:
            value = float(raw)
        except ValueError:
            value = -1.0
        if not value > 0:
            raise ConfigError(
                f"{RAY_CONNECT_TIMEOUT_ENV} must be a number of seconds > 0, got {raw!r}"
            )
    return value


def ray_endpoint(target: str | None) -> tuple[str, int] | None:
    """The (host, port) that connecting to Ray at `target` opens first: the head's GCS, or
    the Ray client server for ray://. None when there is nothing to probe (`local`, or no
    cluster this machine knows of: ray.init then starts one)."""
    if target == "local":
        return None
    if target is None or target == "auto":
        try:
            from ray._private.services import canonicalize_bootstrap_address

            target = canonicalize_bootstrap_address(target)
        except Exception:  # noqa: BLE001 - Ray's own lookup; ray.init reports its failure
            return None
        if target is None:
            return None
    default = None
    if target.startswith("ray://"):
        target, default = target[len("ray://") :].split("/", 1)[0], RAY_CLIENT_PORT
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit():
        if default is None:
            return None
        host, port = target, str(default)
    host = host.strip("[]")  # an IPv6 literal
    return (host, int(port)) if host else None


def probe_ray_address(target: str | None, where: str, timeout: float | None = None) -> None:
    """Connect to the Ray head's port with a bounded timeout: an address with nothing behind
    it fails here in seconds, with one line, instead of ray.init waiting without bound."""
    endpoint = ray_endpoint(target)
    if endpoint is None:
        return
    seconds = connect_timeout(timeout)
    try:
        with socket.create_connection(endpoint, timeout=seconds):
            pass
    except TimeoutError:
        raise MdsError(
            f"cannot reach the Ray cluster at {where} (no answer within {seconds:g} s; "
            f"{RAY_CONNECT_TIMEOUT_ENV} sets the wait)"
        ) from None
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise MdsError(f"cannot reach the Ray cluster at {where} ({reason})") from None


def fork_shares_memory() -> bool:
    """Whether local worker processes can be forked from this one and so share its loaded
    memory (copy-on-write pages): on Linux. Elsewhere fork is unsafe (macOS) or missing."""
    import sys
    from multiprocessing import get_all_start_methods

    return sys.platform.startswith("linux") and "fork" in get_all_start_methods()


def open_engine(
    spec: EngineSpec,
    workers: int | None,
    *,
    processes: bool = False,
    initializer: Callable[..., None] | None = None,
    initargs: tuple = (),
    fork: bool = False,
) -> Engine:
    """The engine `spec` names. Locally: `workers` threads, or spawned processes (each set
    up by `initializer`), or with `fork` processes forked here at once, which share what
    this process has loaded (`initializer`, if any, then only tunes the process). On Ray
    `workers` bounds the tasks in flight (None: the cluster's CPUs); there a task sets
    itself up on first use, as Ray has no per-worker initializer."""
    if spec.kind == "ray":
        return RayEngine(spec.address, workers)
    workers = workers or 1
    if processes:
        from concurrent.futures import ProcessPoolExecutor
        from multiprocessing import get_context

        if fork:
            pool = _forked_pool(workers, initializer, initargs)
            return LocalEngine(pool, workers, in_process=False)
        pool: Executor = ProcessPoolExecutor(
            workers, mp_context=get_context("spawn"), initializer=initializer, initargs=initargs
        )
        return LocalEngine(pool, workers, in_process=False)
    from concurrent.futures import ThreadPoolExecutor

    return LocalEngine(ThreadPoolExecutor(max_workers=workers), workers, in_process=True)


def _forked_pool(
    workers: int, initializer: Callable[..., None] | None, initargs: tuple
) -> Executor:
    """A process pool whose workers are forked now, from the calling thread. The objects
    alive here are frozen out of the garbage collector first, so the children's
    collections do not write to (and so copy) the pages they share with this process."""
    import gc
    import sys
    import warnings
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    pool = ProcessPoolExecutor(
        workers, mp_context=get_context("fork"), initializer=initializer, initargs=initargs
    )
    # A child flushes the standard streams it inherits when it ends: empty them first, or
    # what this process had buffered would be written once more per worker.
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    gc.freeze()
    try:
        with warnings.catch_warnings():
            # Python 3.12+ warns when a process with threads forks (a lock another thread
            # holds stays locked in the child). The workers run numpy code only, and take
            # no lock that this process's threads (Polars' pool, a progress bar) use.
            warnings.filterwarnings("ignore", r".*multi-threaded.*fork", DeprecationWarning)
            pool.submit(int).result()  # with fork, the first task starts every worker
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    finally:
        gc.unfreeze()
    return pool
