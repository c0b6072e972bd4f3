"""PlanExecutor: replay one DP rank's slice of a plan as packed micro-batches.

The only state is the plan's identity and the position of the next micro-batch, so
resuming is a seek: find the chunk, read this rank's block, index into it. Every byte
read from the plan is checksum-verified, and the source files it reads are checked against
the records the plan copied from the index before any of their samples is used.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from mds.core import storage
from mds.core.planfile import RankChunk
from mds.core.planfile_reader import PlanReader
from mds.core.segments import online_facts
from mds.errors import ConfigError, PlanError
from mds.executor.batch import compact, expand
from mds.executor.catalog import SourceCatalog, Tokenize
from mds.executor.cp import check_mesh, cp_slice, layout, plan_cp, planned_lengths
from mds.executor.handover import handover_step, parent_place
from mds.executor.mesh import DEFAULT_ORDER, MeshPosition, mesh_position, torchrun_rank
from mds.executor.readahead import ReadAhead

__all__ = ["STATE_FORMAT", "STATE_VERSION", "VERIFY_MODES", "PlanExecutor"]

STATE_FORMAT = "mds-executor-state"
STATE_VERSION = 1
VERIFY_MODES = ("stat", "full", "none")


def _integer(value: Any, name: str, error: type[Exception] = ConfigError) -> int:
    """`value` as an int if it is a Python or NumPy integer; a bool, float or string is an
    error naming `name` (True would otherwise pass as rank 1)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise error(f"{name}={value!r} must be an integer, not {type(value).__name__}")
    return int(value)


class PlanExecutor:
    """Iterate one DP rank's micro-batches of a plan, in plan order, from any position.

    `verify`: "stat" (default) checks size and mtime of each file this rank reads, "full" its
    content fingerprint (and, at start-up, every block of this rank);
    "none" skips the file checks (plan bytes are always checksum-verified on read). A file is
    checked when the first step that reads it is built, before any of its samples is used:
    the first step's files at construction, later steps' files as they are built. The
    version a check saw is pinned: a file rewritten or replaced later raises
    DataChangedError when it is next opened or read (see docs/executor.md).

    `data_root`: the directory the index was built over, when the plan or the data moved
    (default: where the plan records it, relative to its own directory). `read_ahead`: steps
    built in a background thread ahead of the one iterated (0: none; a loop that comes
    straight back for the next step gets them built on its own thread, which is quicker
    then); each step's samples are read together, one reader call per file.
    `memory_bytes`: the memory budget of this process's reading (default 512 MiB, or twice
    `cache_bytes` if that is more): decoded blocks kept in the cache, rows read ahead,
    decodes in flight (each reserves its bytes before it starts; the cache gives way) and
    the reading threads' buffers stay within it, whatever the files' layout; a sample whose
    smallest decode is larger raises ConfigError. It is per process: each DataLoader
    worker has one of its own. `cache_bytes`: the share of it kept between steps, whole
    blocks (row groups, zstd frames) and rows read ahead for this rank's later samples
    from the blocks it decodes (default half of memory_bytes; 0: neither; at most
    memory_bytes). `read_threads`: threads that read a
    step's files side by side (1: the building thread alone; 2, the default, pays where a
    core is free, see docs/executor.md); batches are the same. `first_reads`: steps whose
    files are made ready at a start or a seek (Parquet footers parsed or fetched ahead, a
    local file's chunks asked of the kernel; 0: none; default 16 for data in object
    storage, 0 for local files, where it was slower: docs/executor.md); batches are the same.

    Besides iteration, it offers the positional interface of `mds.executor.replay.Replay`
    (`cursor`, `mark_delivered`, `compact_at`, ...), through which `PlanLoader` and
    `shared()` hand out its micro-batches themselves.
    """

    def __init__(
        self,
        plan: str | os.PathLike,
        dp_rank: int,
        *,
        dp_size: int | None = None,
        data_root: str | os.PathLike | None = None,
        tokenize: Tokenize | Mapping[str, Tokenize] | None = None,
        verify: str = "stat",
        estimated: str = "error",
        cache_bytes: int | None = None,
        memory_bytes: int | None = None,
        max_open_files: int = 64,
        read_ahead: int = 1,
        read_threads: int = 2,
        first_reads: int | None = None,
        cp_rank: int | None = None,
        cp_size: int | None = None,
        parent_plan: str | os.PathLike | None = None,
        _online_segment: bool = False,
    ):
        if verify not in VERIFY_MODES:
            raise ConfigError(f"verify={verify!r} must be one of {', '.join(VERIFY_MODES)}")
        self._args = dict(
            plan=plan,
            dp_rank=dp_rank,
            dp_size=dp_size,
            data_root=data_root,
            tokenize=tokenize,
            estimated=estimated,
            cache_bytes=cache_bytes,
            memory_bytes=memory_bytes,
            max_open_files=max_open_files,
            read_ahead=read_ahead,
            read_threads=read_threads,
            first_reads=first_reads,
            cp_rank=cp_rank,
            cp_size=cp_size,
            parent_plan=parent_plan,
            _online_segment=_online_segment,
        )
        if _integer(read_ahead, "read_ahead") < 0:
            raise ConfigError(f"read_ahead={read_ahead!r} must be >= 0 (steps built ahead)")
        self.plan_path: Any = str(plan) if storage.is_url(plan) else Path(plan)
        self._reader = PlanReader(self.plan_path)
        try:
            self._setup()
            self._verify = verify
            if verify == "full":
                for chunk in range(len(self._reader.chunks)):
                    self._reader.rank_chunk(chunk, self.dp_rank)
            if verify != "none" and self._pos < self.total:
                self._check_step(self.position[0])  # the files the first step reads
        except BaseException:
            self._reader.close()
            raise

    def _setup(self) -> None:
        """Check the rank against the plan and build the catalog, from the constructor's
        arguments (kept in self._args, which is also what a pickled executor is rebuilt from)."""
        reader, args = self._reader, self._args
        facts = online_facts(reader.footer, self.plan_path)
        if facts is not None and facts.windows > 1 and not args.get("_online_segment"):
            raise PlanError(
                f"{self.plan_path} is window {facts.window} of an online-mixed run of "
                f"{facts.windows} windows: PlanExecutor would replay that window alone and stop; "
                "replay the run with mds.executor.OnlineExecutor (docs/online-mixing.md)"
            )
        dp_rank = _integer(args["dp_rank"], "dp_rank")
        dp_size = args["dp_size"]
        if dp_size is not None:
            dp_size = _integer(dp_size, "dp_size")
        if dp_size is not None and dp_size != reader.dp:
            raise ConfigError(
                f"this job has dp_size {dp_size}, but {self.plan_path} was planned for dp_size "
                f"{reader.dp}; re-plan with dp_size = {dp_size}"
            )
        if not 0 <= dp_rank < reader.dp:
            raise ConfigError(
                f"dp_rank {dp_rank!r} is outside {self.plan_path}'s dp_size {reader.dp} "
                f"(valid: 0..{reader.dp - 1})"
            )
        self.dp_rank, self.dp_size = dp_rank, reader.dp
        # context parallelism: the plan's settings, and this process's CP rank (None: the
        # whole micro-batch, with its layout)
        self.cp = plan_cp(reader.footer, self.plan_path)
        cp_rank, cp_size = (
            None if args[k] is None else _integer(args[k], k) for k in ("cp_rank", "cp_size")
        )
        if cp_rank is None and cp_size is not None and cp_size > 1:
            raise ConfigError(f"cp_size={cp_size} needs cp_rank= (this process's CP rank)")
        self.cp_rank = check_mesh(self.cp, cp_size, cp_rank, self.plan_path)
        self.micro_batches, self.steps = reader.micro, reader.steps
        self.first_step = reader.first_step  # > 0 for a plan re-planned from another at K
        self.plan_id = reader.plan_id
        lineage = reader.footer.get("lineage")
        self.lineage = lineage if isinstance(lineage, dict) else None
        self._read_early: dict[int, RankChunk] = {}  # later chunks' blocks, loaded to read ahead
        self._catalog = SourceCatalog(
            reader.footer,
            self.plan_path,
            data_root=args["data_root"],
            tokenize=args["tokenize"],
            estimated=args["estimated"],
            cache_bytes=args["cache_bytes"],
            memory_bytes=args["memory_bytes"],
            max_open_files=args["max_open_files"],
            read_threads=_integer(args["read_threads"], "read_threads"),
            next_block=self._next_block,
            first_reads=args["first_reads"],
        )
        self.source_names = self._catalog.names
        # the plan's image geometry ([vision]), or None: micro-batches then carry images
        self.vision = self._catalog.plan.vision
        self.mesh: MeshPosition | None = None
        self._pos = self.first_step * self.micro_batches
        # a re-planned plan resumed from its parent's state before K: the parent's executor,
        # which hands out the steps up to K (opened on first use; handover.py)
        self._lead: PlanExecutor | None = None
        self._pid = os.getpid()
        self._block: tuple[int, RankChunk, np.ndarray] | None = None
        self._lock = threading.Lock()  # the catalog and the current block: one thread at a time
        depth = args["read_ahead"]
        self._ahead = ReadAhead(self._step_batches, depth, self.steps) if depth else None

    @classmethod
    def from_env(
        cls,
        plan: str | os.PathLike,
        *,
        tp: int = 1,
        cp: int = 1,
        pp: int = 1,
        order: str = DEFAULT_ORDER,
        environ: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> PlanExecutor:
        """An executor for this process's DP rank, from torchrun's RANK and WORLD_SIZE and the
        sizes of the other parallel dimensions (their peers get the same micro-batches).
        On a plan made with `cp_size` > 1, `cp` must be the plan's, and each CP rank gets
        its slice of every micro-batch (`cp.cp_slice`); `cp` > 1 on a plan without CP is
        refused."""
        rank, world = torchrun_rank(environ)
        tp, cp, pp = (_integer(v, k) for k, v in (("tp", tp), ("cp", cp), ("pp", pp)))
        where = mesh_position(rank, world, tp=tp, cp=cp, pp=pp, order=order)
        executor = cls(
            plan,
            where.dp_rank,
            dp_size=where.dp_size,
            cp_rank=where.coords["cp"],
            cp_size=cp,
            **kwargs,
        )
        executor.mesh = where
        return executor

    # --- position and state -------------------------------------------------------------

    @property
    def total(self) -> int:
        """The end position, steps x micro_batches (positions of a plan re-planned at step K
        start at K x micro_batches)."""
        return self.steps * self.micro_batches

    @property
    def position(self) -> tuple[int, int]:
        """(step, micro_batch) of the next micro-batch to be yielded."""
        return divmod(self._pos, self.micro_batches)

    @property
    def cursor(self) -> int:
        """The linear position of the next micro-batch, step * micro_batches + micro_batch
        (`position`, as one number; `total` is the end)."""
        return self._pos

    def mark_delivered(self, pos: int) -> None:
        """The micro-batch at linear position `pos` reached the training loop by a way other
        than iterating the executor (`PlanLoader`, `shared()`): the next is `pos + 1`."""
        if not min(self._pos, self.first_step * self.micro_batches) <= pos < self.total:
            raise PlanError(f"position {pos} is outside the plan's {self._span()}")
        self._pos = pos + 1

    def state_dict(self) -> dict[str, Any]:
        step, micro = self.position
        return {
            "format": STATE_FORMAT,
            "version": STATE_VERSION,
            # before the hand-over step, the run is still on the parent plan's steps
            "plan_id": self._lineage_of("parent") if self._in_lead(self._pos) else self.plan_id,
            "step": step,
            "micro_batch": micro,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Seek to the position a `state_dict()` recorded; refuses another plan's state."""
        self._pos = self._position_of(state)

    def _position_of(self, state: Mapping[str, Any]) -> int:
        if not isinstance(state, Mapping) or state.get("format") != STATE_FORMAT:
            raise PlanError("not an mds executor state (no format 'mds-executor-state')")
        if state.get("version") != STATE_VERSION:
            raise PlanError(
                f"executor state version {state.get('version')!r} is not supported "
                f"(this mds reads {STATE_VERSION})"
            )
        if state.get("plan_id") != self.plan_id:
            parent = self.lineage or {}
            if state.get("plan_id") == parent.get("parent") and parent.get("parent"):
                step, micro = self._integers(state)
                handover_step(state, step, micro, parent, self.plan_path, self.plan_id)
                if (step, micro) == (self.first_step, 0):
                    return self.first_step * self.micro_batches  # the hand-over point
                lead = self._lead_executor()
                return lead._position_of(state)  # replayed from the parent up to K
            derived = (
                f" (it continues plan {parent.get('parent')} from step {parent.get('at_step')}, "
                "whose state must be at that step)"
                if parent
                else ""
            )
            raise PlanError(
                f"the executor state is from plan {state.get('plan_id')}, but {self.plan_path} "
                f"is plan {self.plan_id}{derived}; resume with the plan the run started with"
            )
        step, micro = self._integers(state)
        pos = step * self.micro_batches + micro
        first = self.first_step * self.micro_batches
        if not (0 <= micro < self.micro_batches and first <= pos <= self.total):
            raise PlanError(
                f"executor state (step {step}, micro-batch {micro}) is outside the plan's "
                f"{self._span()} x {self.micro_batches} micro-batches"
            )
        return pos

    def _lineage_of(self, key: str) -> Any:
        return (self.lineage or {}).get(key)

    def _in_lead(self, pos: int) -> bool:
        """Position `pos` is a step before the hand-over, read from the parent plan."""
        return pos < self.first_step * self.micro_batches

    def _lead_executor(self) -> PlanExecutor:
        """The parent plan's executor for this rank (handover.py), opened once and checked to
        be the plan the lineage names."""
        if self._lead is None:
            lineage = self.lineage or {}
            place = parent_place(self.plan_path, lineage, self._args["parent_plan"])
            args = {**self._args, "plan": place, "parent_plan": None, "read_ahead": 0}
            try:
                lead = PlanExecutor(**args, verify=self._verify)
            except PlanError as exc:
                raise PlanError(
                    f"{self.plan_path} continues plan {lineage.get('parent')} from step "
                    f"{lineage.get('at_step')}, whose steps before it are read from {place}: {exc}"
                ) from None
            if lead.plan_id == lineage.get("parent") and (lead.dp_size, lead.micro_batches) != (
                self.dp_size,
                self.micro_batches,
            ):
                lead.close()
                raise PlanError(
                    f"{place} has dp_size {lead.dp_size} x {lead.micro_batches} micro-batches, "
                    f"{self.plan_path} {self.dp_size} x {self.micro_batches}: a run switches "
                    f"to it only at step {lineage.get('at_step')} itself; resume from a "
                    "checkpoint saved there"
                )
            if lead.plan_id != lineage.get("parent"):
                lead.close()
                raise PlanError(
                    f"{place} is plan {lead.plan_id}, but {self.plan_path} continues plan "
                    f"{lineage.get('parent')}; pass parent_plan= the plan the run started with"
                )
            self._args["parent_plan"] = place  # pickled executors (DataLoader workers) reuse it
            self._lead = lead
        return self._lead

    @staticmethod
    def _integers(state: Mapping[str, Any]) -> tuple[int, int]:
        """The state's (step, micro_batch), refused unless both are integers (not bools)."""
        return (
            _integer(state.get("step"), "step", PlanError),
            _integer(state.get("micro_batch"), "micro_batch", PlanError),
        )

    def _span(self) -> str:
        if self.first_step:
            return f"steps {self.first_step} to {self.steps - 1}"
        return f"{self.steps} steps"

    def seek(self, step: int, micro_batch: int = 0) -> None:
        """Make (step, micro_batch) the next micro-batch: what `load_state_dict` does."""
        self.load_state_dict({**self.state_dict(), "step": step, "micro_batch": micro_batch})

    # --- iteration -------------------------------------------------------------------------

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """Micro-batches from the current position to the end of the plan. The position
        moves past each one as it is handed out, so `state_dict()` after receiving a batch
        resumes with the next. On a CP plan with a `cp_rank`, this CP rank's slices."""
        for batch in self.whole_batches():
            yield self.view(batch)

    def whole_batches(self) -> Iterator[dict[str, Any]]:
        """Iteration's micro-batches whole, whatever this process's CP rank (what the
        reading peer of `shared()` cuts every peer's part from)."""
        while self._pos < self.total:
            pos = self._pos
            self._ensure_process()
            if self._ahead is None or self._in_lead(pos):
                batch = expand(self.compact_at(pos))
            else:
                batch = self._ahead.get(*divmod(pos, self.micro_batches))
            self._pos = pos + 1
            yield batch

    def micro_batch_at(self, pos: int) -> dict[str, Any]:
        """The micro-batch at linear position step * micro_batches + micro_batch (this CP
        rank's slice of it, on a CP plan with a `cp_rank`)."""
        return self.expand(self.compact_at(pos))

    def expand(self, raw: dict[str, Any]) -> dict[str, Any]:
        """`batch.expand` of a `compact_at` result, cut to this CP rank's slice when there
        is one: what iteration yields."""
        return self.view(expand(raw))

    def view(self, batch: dict[str, Any]) -> dict[str, Any]:
        """This process's part of a whole micro-batch: its CP slice, or the batch itself."""
        return batch if self.cp_rank is None else cp_slice(batch, self.cp_rank)

    def compact_at(self, pos: int, narrow: bool = False) -> dict[str, Any]:
        """The micro-batch at linear position `pos` as numpy arrays (`batch.compact`;
        `narrow`: token ids at 4 bytes where they fit), for a process that hands them to
        another: `batch.expand` makes the tensors iteration yields. The position stays."""
        assert 0 <= pos < self.total, pos
        if self._in_lead(pos):
            return self._lead_executor().compact_at(pos, narrow)
        self._ensure_process()
        step, micro = divmod(pos, self.micro_batches)
        with self._lock:
            block, lo, hi = self._slice(step, micro)
            self._check(block, lo, hi)
            tokens = self._catalog.fetch(block, lo, hi, step)
        return self._compact(block, lo, hi, tokens, step, micro, narrow)

    def _check(self, block: RankChunk, lo: int, hi: int) -> None:
        """Check the files samples [lo, hi) read, unless checked already or verify="none"."""
        if self._verify != "none":
            self._catalog.check_files(block, full=self._verify == "full", lo=lo, hi=hi)

    def _check_step(self, step: int) -> None:
        with self._lock:
            block, lo, _ = self._slice(step, 0)
            _, _, hi = self._slice(step, self.micro_batches - 1)
            self._check(block, lo, hi)

    def _step_batches(self, step: int) -> list[dict[str, Any]]:
        """All of this rank's micro-batches of `step`, their samples read together (one
        reader call per file for the whole step)."""
        with self._lock:
            bounds = [self._slice(step, m) for m in range(self.micro_batches)]
            block, first = bounds[0][0], bounds[0][1]
            self._check(block, first, bounds[-1][2])
            tokens = self._catalog.fetch(block, first, bounds[-1][2], step)
        return [
            expand(self._compact(block, lo, hi, tokens[lo - first : hi - first], step, m))
            for m, (_b, lo, hi) in enumerate(bounds)
        ]

    def _compact(self, block: RankChunk, lo, hi, tokens, step, micro, narrow=False):
        """Samples [lo, hi) of `block` as one micro-batch's numpy arrays (`batch.compact`)."""
        ids = block.ids[lo:hi]
        sid, rows = self._catalog.locate(ids)
        raw = compact(
            tokens,
            source=sid,
            sample_id=ids,
            row=rows,
            step=step,
            micro_batch=micro,
            narrow=narrow,
            vision=self.vision,
            truncate_to=self._catalog.plan.truncate_to,
        )
        if self.cp is not None:
            # the layout of the planned lengths, as the planner laid the micro-batch out
            planned = planned_lengths(block.fetch.tokens[lo:hi], self._catalog.plan.truncate_to)
            raw["cp_layout"] = layout(planned, self.cp)
            raw["cp_size"] = self.cp.size
        return raw

    def sample_ids(self, step: int, micro_batch: int) -> np.ndarray:
        """Global sample ids of one of this rank's micro-batches, from the plan alone."""
        if step < self.first_step and self._lead is not None:
            return self._lead_executor().sample_ids(step, micro_batch)
        with self._lock:
            block, lo, hi = self._slice(step, micro_batch)
        return block.ids[lo:hi]

    def _slice(self, step: int, micro_batch: int) -> tuple[RankChunk, int, int]:
        """This rank's block holding (step, micro_batch) and the micro-batch's sample range
        in it (loaded and checksum-checked on first use)."""
        chunk = self._reader.chunk_of(step)
        if self._block is None or self._block[0] != chunk:
            block = self._read_early.pop(chunk, None) or self._reader.rank_chunk(
                chunk, self.dp_rank
            )
            for early in [c for c in self._read_early if c < chunk]:
                del self._read_early[early]
            starts = np.zeros(block.counts.size + 1, dtype=np.int64)
            np.cumsum(block.counts.ravel(), out=starts[1:])
            self._block = (chunk, block, starts)
        _, block, starts = self._block
        local = (step - block.step_start) * self.micro_batches + micro_batch
        return block, int(starts[local]), int(starts[local + 1])

    def _ensure_process(self) -> None:
        """After a fork (DataLoader workers), drop inherited open files and caches."""
        if os.getpid() != self._pid:
            self._pid = os.getpid()
            self._lock = threading.Lock()
            if self._ahead is not None:
                self._ahead.forget()
            self._catalog.reset()
            self._block = None

    def _next_block(self, block: RankChunk) -> RankChunk | None:
        """This rank's block of the chunk after `block`'s (None after the last)."""
        chunk = self._reader.chunk_of(block.step_start) + 1
        if chunk >= len(self._reader.chunks):
            return None
        if chunk not in self._read_early:
            self._read_early[chunk] = self._reader.rank_chunk(chunk, self.dp_rank)
        return self._read_early[chunk]

    def build_every(self, stride: int) -> None:
        """This process builds every `stride`-th micro-batch (one of `stride` DataLoader
        workers): rows are read ahead only for those."""
        self._catalog.build_every(stride)

    def stop_read_ahead(self) -> None:
        """Let the read-ahead thread finish (before workers fork, so none holds the lock)."""
        if self._ahead is not None and os.getpid() == self._pid:
            self._ahead.stop()

    def shared(
        self, group: Any = None, src: int | None = None, selective: bool = True
    ) -> Iterator[dict[str, Any]]:
        """Iterate with one read per DP rank: global rank `src` (default: the first of this
        process's mesh peers) reads each micro-batch and hands it to `group`, its TP, CP
        and PP peers; every peer's position advances, so any of them can checkpoint.

        With a mesh (`from_env`) and CP or PP peers, `selective` sends each peer only the
        part it uses (`broadcast.peer_part`: its CP slice; the first pipeline stage no
        labels, a middle one no token ids, the last one labels instead of token ids);
        otherwise the whole micro-batch is broadcast and each peer keeps its CP slice."""
        from mds.executor.broadcast import broadcast_batches, fanout_batches

        mesh = self.mesh
        if src is None:
            if mesh is None:
                raise ConfigError("shared() needs src= unless the executor came from from_env()")
            src = mesh.peers[0]
        parts = mesh is not None and (mesh.sizes.get("pp", 1) > 1 or self.cp_rank is not None)
        if selective and parts:
            return fanout_batches(
                self,
                src=src,
                peers=list(mesh.peers),
                coords=mesh.peer_coords(),
                pp=mesh.sizes["pp"],
                group=group,
            )
        return broadcast_batches(self, src=src, group=group)

    def dataloader(self, num_workers: int = 2, **kwargs: Any):
        """A torch DataLoader over this executor's remaining micro-batches, with workers; see
        `PlanLoader`."""
        from mds.executor.loader import PlanLoader

        return PlanLoader(self, num_workers=num_workers, **kwargs)

    # --- lifecycle -------------------------------------------------------------------------

    def close(self) -> None:
        if self._lead is not None:
            self._lead.close()
        self.stop_read_ahead()
        self._catalog.close()
        self._reader.close()

    def __enter__(self) -> PlanExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __reduce__(self):
        # Spawned DataLoader workers rebuild the executor without the start-up checks the
        # parent made (`_rebuild`), take over its position and the files it checked
        # (`__setstate__`), and go on checking the files of chunks the parent did not load.
        checked, pins = self._catalog.checked_files()
        return (_rebuild, (self._args,), (self._pos, self._verify, checked, pins))

    def __setstate__(self, state: tuple[int, str, set, dict]) -> None:
        self._pos, self._verify, checked, pins = state
        self._catalog.restore_checks(checked, pins)


def _rebuild(args: dict[str, Any]) -> PlanExecutor:
    return PlanExecutor(**args, verify="none")
