"""OnlineExecutor: replay an online-mixed run (docs/online-mixing.md) segment after segment,
take per-source signals from training, and have the next segments planned while the
current window trains.

Each segment is an ordinary plan replayed by a PlanExecutor; a segment is re-planned from
the one before at its first step, so the hand-over between them is the one of
handover.py. A window's reported sums are reduced over the DP ranks when iteration crosses
its end, the one point every rank passes alike. Planning runs in a subprocess
(`python -m mds plan ... --segment K`, online_segments.py) started by DP rank 0, so this
module imports neither polars nor the planner, and training never waits on planning unless
a segment is late. The log lives beside the plan (a file or an
object), so ranks on several nodes need no shared disk. The state is the position in the
current segment, the log (past `state_windows` windows: its length, digest and last
windows, checked against the log on resume) and this rank's sums of the unfinished window.

TP, CP and PP peers of a DP rank (`from_env`) each hold one: all take part in the
collective steps, `shared()` has one peer read for all, `dataloader()` builds in worker
processes, and a window's sums count TP peers once (see `counts_reports`).
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mds.core import storage
from mds.core.planfile_reader import PlanReader
from mds.core.segments import OnlineFacts, online_facts, segment_path, signals_path
from mds.core.signal_log import SignalLog, WindowSignal, window_signal
from mds.errors import ConfigError, MdsError, PlanError
from mds.executor.executor import PlanExecutor
from mds.executor.mesh import DEFAULT_ORDER, MeshPosition, mesh_position, torchrun_rank
from mds.executor.online_segments import SegmentPlanning, segment_problem
from mds.executor.signals import Group

__all__ = ["ONLINE_STATE_FORMAT", "ONLINE_STATE_VERSION", "OnlineExecutor", "OnlineLoader"]

ONLINE_STATE_FORMAT = "mds-online-state"
ONLINE_STATE_VERSION = 1
LOG_REF_FORMAT = "mds-signals-ref"  # a state's log past `state_windows` windows


class OnlineExecutor:
    """Iterate one DP rank's micro-batches of an online-mixed run, across its segments.

    `plan`: the run's first segment (what `mds plan CONFIG -o PLAN` wrote); `config`: that
    config's path, which the next segments are planned from. `group`: the torch.distributed
    process group of the DP ranks (default: the default group if one is initialized, else
    this process alone; with a `mesh`, a group of every peer of every DP rank). `signals`:
    where rank 0 keeps the signal log, a file or an s3:// or gs:// object (default: beside
    the plan, which for a plan in an object store is an object too). `plan_args`: more
    arguments for `mds plan` (e.g. ["--index", DIR]); `command`: the command that runs mds
    (default: this Python, `-m mds`). `state_windows`: the most windows of the log a state
    holds whole (past them, its length, digest and last windows). `mesh`: this process's
    place among TP, CP and PP peers (`from_env` sets it). Other keyword arguments go to each
    segment's PlanExecutor.

    Every DP rank (every peer, with a mesh) makes one; the constructor,
    `load_state_dict()` and crossing a window's end in iteration are collective steps on
    `group`.
    """

    def __init__(
        self,
        plan: str | os.PathLike,
        dp_rank: int,
        *,
        config: str | os.PathLike,
        dp_size: int | None = None,
        group: Any = None,
        signals: str | os.PathLike | None = None,
        plan_args: Sequence[str] = (),
        command: Sequence[str] | None = None,
        state_windows: int = 8,
        mesh: MeshPosition | None = None,
        **kwargs: Any,
    ):
        self.plan: Any = str(plan) if storage.is_url(plan) else Path(plan)
        if signals is None:
            self.signals: Any = signals_path(self.plan)
        else:
            self.signals = str(signals) if storage.is_url(signals) else Path(signals)
        if isinstance(state_windows, bool) or not isinstance(state_windows, int) or (
            state_windows < 1
        ):
            raise ConfigError(f"state_windows={state_windows!r} must be an integer >= 1")
        self.state_windows = state_windows
        self.mesh = mesh
        if mesh is not None and mesh.dp_rank != dp_rank:
            raise ConfigError(f"dp_rank={dp_rank} is not the mesh's DP rank {mesh.dp_rank}")
        self.config = Path(config)
        self._group = Group(group)
        world = math.prod(mesh.sizes.values()) if mesh is not None else 1
        if mesh is not None and self._group.size != world:
            raise ConfigError(
                f"the online run's collective steps need every one of the mesh's {world} "
                f"processes in `group`, which has {self._group.size}: pass group=None (the "
                "default group) after torch.distributed.init_process_group"
            )
        self._exec_args = {"dp_rank": dp_rank, "dp_size": dp_size, **kwargs}
        self._job_dp = dp_size
        with PlanReader(self.plan) as reader:
            facts = online_facts(reader.footer, self.plan)
            self.plan_id = reader.plan_id
            self._first_dp = reader.dp
            train = reader.footer["config"]["train"]
            micro = reader.micro
            names = tuple(s["name"] for s in reader.footer["config"]["sources"])
        if facts is None or facts.window != 0:
            raise PlanError(
                f"{self.plan} is not the first segment of an online run (plan it from a config "
                "with [mixing] online); a fixed plan is replayed by PlanExecutor"
            )
        self.facts0: OnlineFacts = facts
        # the geometry segment 0 was planned with, which `mds plan` overrides may have set
        geometry = ["--steps", str(facts.steps), "--micro-batches", str(micro)]
        if train.get("samples_per_step") is not None:
            geometry += ["--samples-per-step", str(train["samples_per_step"])]
        self._planning = SegmentPlanning(
            command if command is not None else [sys.executable, "-m", "mds"],
            self.config, self.plan, geometry, plan_args,
        )
        self.source_names = names
        self.windows = facts.windows
        self.steps = facts.steps
        self.log = SignalLog(self.plan_id, names, facts.window_steps)
        self._adopt_disk_log()
        self._share_log()
        self._sums: dict[int, np.ndarray] = {}  # window -> [loss sums..., counts...], this rank
        self._next_close = 0  # the first window whose sums are not reduced yet
        self.window = 0
        self.facts = facts
        # opened on first use: a job resumed on another number of ranks opens the segment
        # of its checkpoint's step, never segment 0
        self._inner: PlanExecutor | None = None

    @classmethod
    def from_env(
        cls,
        plan: str | os.PathLike,
        *,
        config: str | os.PathLike,
        tp: int = 1,
        cp: int = 1,
        pp: int = 1,
        order: str = DEFAULT_ORDER,
        environ: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> OnlineExecutor:
        """This process's executor of the run, from torchrun's RANK and WORLD_SIZE and the
        sizes of the other parallel dimensions, as `PlanExecutor.from_env`: its DP rank's
        micro-batches (its CP slice on a CP plan), for `shared()` among its peers. The
        collective steps run on `group` (default: the default group, every peer)."""
        rank, world = torchrun_rank(environ)
        where = mesh_position(rank, world, tp=tp, cp=cp, pp=pp, order=order)
        return cls(plan, where.dp_rank, config=config, dp_size=where.dp_size,
                   cp_rank=where.coords["cp"], cp_size=cp, mesh=where, **kwargs)

    @property
    def counts_reports(self) -> bool:
        """Whether this process's `report()` calls count: without a mesh, always; with one,
        on TP rank 0 of the last pipeline stage (TP peers hold the same loss, and the last
        stage holds it), on every CP rank (each holds its slice's loss). Other peers may
        report too: their sums are checked and dropped, so a window counts each DP rank's
        loss once."""
        if self.mesh is None:
            return True
        return self.mesh.coords["tp"] == 0 and self.mesh.coords["pp"] == self.mesh.sizes["pp"] - 1

    # --- signals ---------------------------------------------------------------------------

    def report(
        self, step: int, loss_sums: Mapping[str, float], counts: Mapping[str, float]
    ) -> None:
        """Add this rank's per-source loss sums at `step` and what they were summed over
        (per step or per micro-batch: they are summed). A window's sums are reduced over
        the DP ranks when iteration crosses its end, so report a step before asking for the
        micro-batch after it; a window already reduced refuses more."""
        if isinstance(step, bool) or not isinstance(step, int | np.integer) or not (
            0 <= step < self.steps
        ):
            raise ConfigError(f"report(step={step!r}): a step of the run, 0 to {self.steps - 1}")
        w = int(step) // self.facts0.window_steps
        if w < self._next_close:
            raise ConfigError(
                f"report(step={step}): window {w} (steps {self.facts0.bounds(w)[0]} to "
                f"{self.facts0.bounds(w)[1] - 1}) was reduced when iteration left it; report "
                "each step before asking for the next micro-batch"
            )
        n = len(self.source_names)
        row = np.zeros(2 * n)
        for part, values, what in ((0, loss_sums, "loss_sums"), (n, counts, "counts")):
            if not isinstance(values, Mapping):
                raise ConfigError(f"report({what}=...): a mapping source -> number")
            for name, value in values.items():
                if name not in self.source_names:
                    raise ConfigError(
                        f"report({what}): {name!r} is not a source of the plan "
                        f"({', '.join(self.source_names)})"
                    )
                value = float(value)
                if not math.isfinite(value) or (part and value < 0):
                    raise ConfigError(f"report({what}): {name!r} = {value!r} must be finite"
                                      + (" and >= 0" if part else ""))
                row[part + self.source_names.index(name)] += value
        if not self.counts_reports:
            return
        self._sums[w] = self._sums.get(w, np.zeros(2 * n)) + row

    def _close_through(self, last: int) -> None:
        """Reduce the sums of every window up to `last` not reduced yet, in order (a
        collective step: every rank crosses the same window ends), and record them (the
        first record of a window stays: the segments after it were planned from it)."""
        n = len(self.source_names)
        for w in range(self._next_close, last + 1):
            total = self._group.sum(self._sums.pop(w, np.zeros(2 * n)))
            assert len(self.log.windows) >= w, (len(self.log.windows), w)
            if len(self.log.windows) == w:
                start, end = self.facts0.bounds(w)
                self.log.append(window_signal(w, start, end, total[:n], total[n:]))
                if self._group.leader:
                    self.log.write(self.signals)
        self._next_close = max(self._next_close, last + 1)

    def _share_log(self) -> None:
        """Every rank takes rank 0's log (only rank 0 may see the file; a collective step,
        so every rank's later reductions line up)."""
        shared = self._group.share(self.log.encode() if self._group.leader else b"")
        if not self._group.leader:
            self.log = SignalLog.from_json(json.loads(shared), "rank 0's signal log")

    def _adopt_disk_log(self) -> None:
        """Take the run's log on disk when it extends ours (a resumed run)."""
        path = self.signals
        if storage.exists(path):
            disk = SignalLog.read(path)
            if disk.plan_id != self.plan_id:
                raise PlanError(
                    f"{path} is the signal log of plan {disk.plan_id}, not of {self.plan} "
                    f"(plan {self.plan_id}); move it away to start this run"
                )
            self.log = self.log.merged(disk)

    # --- planning ahead --------------------------------------------------------------------

    def _kick(self) -> None:
        """On rank 0, start planning the next segment that is missing (or stale), once the
        log holds its signals (one subprocess at a time); a finished one's failure is kept
        for the boundary."""
        if not self._group.leader:
            return
        self._planning.reap(block=False)
        if self._planning.window is not None:
            return
        for t in (self.window + 1, self.window + 2):
            if t >= self.windows or t in self._planning.failed:
                continue
            if self._problem(t) is None:
                continue
            if len(self.log.windows) >= t - 1:
                self._start(t)
            return

    def _start(self, t: int) -> None:
        self.log.write(self.signals)  # the signals and ranks the segment is planned from
        self._planning.start(t, self.signals, self._dp_of(t))

    def _ready(self, t: int) -> None:
        """Segment t is on disk for every rank, or every rank raises rank 0's reason."""
        message = None
        if self._group.leader:
            try:
                message = self._make(t)
            except Exception as exc:  # told to the other ranks first, so none waits forever
                message = f"planning window {t} failed: {type(exc).__name__}: {exc}"
        message = self._group.tell(message)
        if message is not None:
            raise PlanError(message)

    def _make(self, t: int) -> str | None:
        """On rank 0: wait for segment t (planning it now if nobody started it); the reason
        it is missing, or None. A usable segment t is taken at once, whatever is planning."""
        planning, failed = self._planning, self._planning.failed
        if planning.window == t:
            planning.reap(block=True)
        elif t not in failed and self._problem(t) is not None:
            planning.reap(block=True)  # another segment planning: one subprocess at a time
            if t not in failed and self._problem(t) is not None:
                if len(self.log.windows) < t - 1:
                    k = len(self.log.windows)
                    return (
                        f"window {t} is planned from the signals of windows 0..{t - 2}, but "
                        f"the log holds {k} windows"
                    )
                self._start(t)
                planning.reap(block=True)
        if t in failed:
            return (
                f"planning window {t} ({segment_path(self.plan, t)}) failed: {failed[t]}; "
                f"the run stops at step {self.facts0.bounds(t)[0]}, where its segments end"
            )
        return None

    # --- segments --------------------------------------------------------------------------

    def _dp_of(self, t: int) -> int:
        """The DP ranks window t is planned for: the log's, else the first segment's."""
        return self.log.dp_at(t, self._first_dp)

    def _problem(self, t: int) -> str | None:
        """Why segment t on disk is not window t of this run as its log makes it (missing,
        another window, config, signals or number of ranks, or the child of another plan
        than segment t-1); None when it is."""
        return self._examine(t)[0]

    def _examine(self, t: int) -> tuple[str | None, OnlineFacts | None]:
        """`_problem(t)`, and the online facts of segment t's footer where it was read."""
        return segment_problem(self.plan, t, self.facts0, self.log, self._dp_of(t))

    def _open(self, t: int) -> tuple[PlanExecutor, OnlineFacts]:
        """Segment t's executor and facts, its footer checked against this run and its log."""
        path = segment_path(self.plan, t)
        problem, facts = self._examine(t)
        if problem is not None:
            raise PlanError(f"{path}: {problem}; move it away to have it planned again")
        if self._job_dp is not None and self._job_dp != self._dp_of(t):
            raise PlanError(
                f"this job has dp_size {self._job_dp}, but window {t} of the run "
                f"({path}) is planned for {self._dp_of(t)}: an online run changes its number "
                "of ranks at a window's first step; load_state_dict() a checkpoint saved there"
            )
        assert facts is not None  # _examine read it
        ex = PlanExecutor(path, **self._exec_args, _online_segment=True)
        ex.mesh = self.mesh  # shared() finds the reading peer and the peers' parts by it
        return ex, facts

    def _current(self) -> PlanExecutor:
        """The current segment's executor (segment 0's at first use)."""
        if self._inner is None:
            self._inner, self.facts = self._open(0)
            self.window = 0
            self._kick()
        return self._inner

    def _enter(self, t: int, state: Mapping[str, Any] | None = None) -> None:
        """Switch to segment t, at `state` (default: the current segment's end)."""
        if state is None:
            state = self._current().state_dict()
        self._ready(t)
        ex, facts = self._open(t)
        try:
            ex.load_state_dict(state)
        except BaseException:
            ex.close()
            raise
        if self._inner is not None:
            self._inner.close()
        self._inner, self.window, self.facts = ex, t, facts
        self._kick()

    @property
    def weights(self) -> dict[str, float]:
        """The shares the current window was planned with."""
        return dict(self.facts.weights)

    @property
    def planning_window(self) -> int | None:
        """The window whose segment rank 0's subprocess is planning now, if any."""
        self._planning.reap(block=False)
        return self._planning.window

    @property
    def micro_batches(self) -> int:
        return self._current().micro_batches

    @property
    def batch_source_names(self) -> list[str]:
        """The names a micro-batch's `source` values index (the index's sources)."""
        return self._current().source_names

    @property
    def position(self) -> tuple[int, int]:
        return self._current().position

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """Micro-batches from the current position to the run's end, segment after segment."""
        return self._walk(iter)

    def shared(
        self, group: Any = None, src: int | None = None, selective: bool = True
    ) -> Iterator[dict[str, Any]]:
        """Iterate with one read per DP rank, as `PlanExecutor.shared`, across segments:
        global rank `src` (default: the first of this process's mesh peers) reads each
        micro-batch and hands it to `group`, its TP, CP and PP peers. Every peer crosses
        each window's end with its peers, so call it on every peer of every DP rank."""
        return self._walk(lambda ex: ex.shared(group, src, selective))

    def dataloader(self, num_workers: int = 2, **kwargs: Any) -> OnlineLoader:
        """Iterate through a torch DataLoader with workers, segment after segment: see
        `OnlineLoader`."""
        return OnlineLoader(self, num_workers, **kwargs)

    def _walk(self, batches: Any) -> Iterator[dict[str, Any]]:
        """`batches(segment executor)` of each segment from the current position to the
        run's end, the window's sums reduced and the next segment entered at each end."""
        while True:
            yield from batches(self._current())
            self._close_through(self.window)  # every rank is here: the window's end
            self._kick()
            if self.window + 1 >= self.windows:
                return
            self._enter(self.window + 1)

    # --- state -----------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "format": ONLINE_STATE_FORMAT,
            "version": ONLINE_STATE_VERSION,
            "plan_id": self.plan_id,
            "position": self._current().state_dict(),
            "signals": self._log_state(),
            "partial": {str(w): [float(x) for x in s] for w, s in sorted(self._sums.items())},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume where `state_dict()` was taken: the log merged with the one on disk, this
        rank's partial sums, and the segment of the saved step."""
        if not isinstance(state, Mapping) or state.get("format") != ONLINE_STATE_FORMAT:
            raise PlanError("not an mds online executor state (no format 'mds-online-state')")
        if state.get("version") != ONLINE_STATE_VERSION:
            raise PlanError(
                f"online executor state version {state.get('version')!r} is not supported "
                f"(this mds reads {ONLINE_STATE_VERSION})"
            )
        if state.get("plan_id") != self.plan_id:
            raise PlanError(
                f"the state is of the online run of plan {state.get('plan_id')}, but "
                f"{self.plan} is plan {self.plan_id}; resume with the run's first segment"
            )
        problem = None
        if self._group.leader:  # rank 0's log is every rank's; its problem, every rank's
            try:
                self._restore_log(state.get("signals"))
            except MdsError as exc:
                problem = str(exc)
        problem = self._group.tell(problem)
        if problem is not None:
            raise PlanError(problem)
        self._share_log()
        n = 2 * len(self.source_names)
        partial = state.get("partial") or {}
        try:
            self._sums = {int(w): np.array(v, dtype=np.float64) for w, v in partial.items()}
        except (TypeError, ValueError):
            raise PlanError("the state's partial window sums are damaged") from None
        if any(v.shape != (n,) for v in self._sums.values()):
            raise PlanError("the state's partial window sums are damaged")
        position = state.get("position")
        step = position.get("step") if isinstance(position, Mapping) else None
        if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= self.steps:
            raise PlanError(f"the state's position {position!r} is not a step of the run")
        t = min(step // self.facts0.window_steps, self.windows - 1)
        # windows before t are done: reduce what this rank's state holds of those not in
        # the log (a collective step, alike on every rank: they share rank 0's log)
        self._next_close = min(len(self.log.windows), t)
        self._close_through(t - 1)
        if self._group.leader:
            self.log.write(self.signals)
        if self._job_dp is not None and self._job_dp != self._dp_of(t):
            self._change_dp(t, step)
        if self._inner is not None and t == self.window and self._problem(t) is None:
            self._inner.load_state_dict(position)
            self._kick()
        else:
            self._enter(t, position)

    def _log_state(self) -> dict[str, Any]:
        """The log as a state keeps it: whole up to `state_windows` windows; past them its
        length, digest and geometry and its last `state_windows` windows (the log itself is
        at `signals`, where rank 0 wrote it at every window's end)."""
        log = self.log
        if len(log.windows) <= self.state_windows:
            return log.to_json()
        return {
            "format": LOG_REF_FORMAT,
            "plan_id": log.plan_id,
            "windows": len(log.windows),
            "digest": log.digest(),
            "geometry": [[w, d] for w, d in log.geometry],
            "tail": [w.to_json() for w in log.windows[-self.state_windows :]],
        }

    def _restore_log(self, saved: Any) -> None:
        """On rank 0: the run's log from a state's and the one at `signals`. A whole log is
        merged with it; a reference is the log at `signals` when that holds the state's
        windows (checked by digest), completed from the state's last windows when it lost
        a few of them."""
        if not (isinstance(saved, Mapping) and saved.get("format") == LOG_REF_FORMAT):
            self.log = self.log.merged(SignalLog.from_json(saved, "the state's signal log"))
            self._adopt_disk_log()
            return
        try:
            n, digest = int(saved["windows"]), str(saved["digest"])
            geometry = [(int(w), int(d)) for w, d in saved["geometry"]]
            tail = _windows(saved["tail"], n)
        except (KeyError, TypeError, ValueError) as exc:
            raise PlanError(f"the state's signal log reference is damaged ({exc!r})") from None
        if saved.get("plan_id") != self.plan_id:
            raise PlanError("the state's signal log belongs to another run (plan id)")
        self._adopt_disk_log()
        have, first = self.log, n - len(tail)
        if len(have.windows) < first:
            raise PlanError(
                f"{self.signals} holds {len(have.windows)} windows of the signal log, the "
                f"state {n} (it keeps the last {len(tail)}): restore the log the run "
                "wrote there, or resume from an earlier checkpoint"
            )
        log = SignalLog(have.plan_id, have.sources, have.window_steps, list(have.windows))
        for signal in tail[len(have.windows) - first :]:
            log.append(signal)
        if log.digest(n) != digest:
            first_diff = next(
                (i for i, w in zip(range(first, n), tail, strict=True)
                 if i < len(have.windows) and have.windows[i] != w),
                None,
            )
            where = f"at window {first_diff}" if first_diff is not None else "before its last windows"
            raise PlanError(
                f"{self.signals} and the saved state's signal log differ {where}; the segments "
                "after it were planned from the log there: restore that log's windows or "
                "resume from a checkpoint that agrees with it"
            )
        log.geometry = geometry if len(geometry) >= len(have.geometry) else list(have.geometry)
        self.log = log

    def _change_dp(self, t: int, step: int) -> None:
        """A job with another number of ranks resumes at window t's first step: from t on,
        the log records its dp_size, and the segments from t are planned for it."""
        start = self.facts0.bounds(t)[0]
        if step != start or t == 0:
            where = "the run's start: plan it again" if t == 0 else f"step {start}"
            raise PlanError(
                f"this job has dp_size {self._job_dp}, the run {self._dp_of(t)} at step {step}: "
                "an online run changes its number of ranks at a window's first step; resume "
                f"from a checkpoint saved at {where} with dp_size {self._job_dp}"
            )
        self.log.change_dp(t, self._job_dp)
        if self._group.leader:
            self.log.write(self.signals)

    def close(self) -> None:
        """Close the segment's executor; a planning subprocess is waited for (it writes
        nothing half-done either way)."""
        self._planning.reap(block=True)
        if self._inner is not None:
            self._inner.close()

    def __enter__(self) -> OnlineExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _windows(raw: Any, n: int) -> list[WindowSignal]:
    """A state's last windows of the log (windows n - len(raw) .. n - 1), checked."""
    out = []
    for i, item in enumerate(raw):
        start, end = (int(x) for x in item["steps"])
        signal = WindowSignal(
            int(item["window"]), start, end,
            tuple(float(x) for x in item["loss_sum"]), tuple(float(x) for x in item["count"]),
        )
        if signal.window != n - len(raw) + i:
            raise ValueError(f"window {signal.window} where {n - len(raw) + i} belongs")
        out.append(signal)
    return out


class OnlineLoader:
    """An online run's micro-batches through a torch DataLoader with `num_workers` worker
    processes (`PlanLoader` over each segment in turn; new workers at each window's end,
    where the next segment is entered). `state_dict()`/`load_state_dict()` are the
    executor's: they count what the training loop received."""

    def __init__(self, executor: OnlineExecutor, num_workers: int = 2, **dataloader_kwargs: Any):
        from mds.executor.loader import PlanLoader

        PlanLoader(None, num_workers, **dataloader_kwargs)  # the same argument checks
        self.executor, self.num_workers = executor, num_workers
        self.dataloader_kwargs = dataloader_kwargs

    def state_dict(self) -> dict[str, Any]:
        return self.executor.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.executor.load_state_dict(state)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        from mds.executor.loader import PlanLoader

        return self.executor._walk(
            lambda ex: iter(PlanLoader(ex, self.num_workers, **self.dataloader_kwargs))
        )
