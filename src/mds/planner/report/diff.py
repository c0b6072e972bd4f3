"""Compare two plans: config and footer differences, the first step where their samples
differ, and how each source's share of the samples moved over the steps both plans hold, to
see what a config change did to the data.

Both plans are read one chunk at a time; a difference is a result, never an error.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mds.core.planfile_reader import PlanReader
from mds.core.storage import as_place
from mds.errors import PlanError

__all__ = ["HeaderDiff", "PlanDiff", "ShareDiff", "StepDiff", "diff_plans", "header_diff"]

_ABSENT = "(absent)"


@dataclass(frozen=True)
class HeaderDiff:
    """One differing footer value, at a dotted path: config keys as written in the config
    (`train.dp_size`, `sources.web.weight`: list items by their `name`), other footer fields
    by their place in the footer (`index.path`, `fetch.root`, `lineage.at_step`)."""

    key: str
    a: Any
    b: Any

    @property
    def shown(self) -> tuple[str, str]:
        """Both values as compact JSON (or "(absent)")."""
        return _show(self.a), _show(self.b)

    def __str__(self) -> str:
        a, b = self.shown
        return f"{self.key}: {a} -> {b}"


@dataclass(frozen=True)
class StepDiff:
    """The first step where any rank's samples differ. `rank` is None when the plans' dp
    sizes differ (ranks are not comparable); `same_samples` says whether the step's
    multiset of samples is the same, so only their assignment to ranks differs."""

    step: int
    rank: int | None
    same_samples: bool
    detail: str


@dataclass(frozen=True)
class ShareDiff:
    """A source's planned samples in each plan and its share of all samples, in percent."""

    name: str
    samples_a: int | None
    samples_b: int | None
    share_a: float | None
    share_b: float | None

    @property
    def delta_pp(self) -> float | None:
        if self.share_a is None or self.share_b is None:
            return None
        return round(self.share_b - self.share_a, 4)


@dataclass
class PlanDiff:
    a: Path | str  # a URL stays one (storage.as_place)
    b: Path | str
    plan_id_a: str
    plan_id_b: str
    steps_a: int
    steps_b: int
    dp_a: int
    dp_b: int
    first_step_a: int = 0  # a re-planned plan holds steps first_step..steps-1
    first_step_b: int = 0
    header: list[HeaderDiff] = field(default_factory=list)
    first_step: StepDiff | None = None
    first_sample_step: int | None = None  # first step whose multiset of samples differs
    # The samples per source are compared over the steps both plans hold, [start, end);
    # None when they hold no step in common (then `sources` is empty).
    shared: tuple[int, int] | None = None
    sources: list[ShareDiff] = field(default_factory=list)
    names_a: list[str] = field(default_factory=list)
    names_b: list[str] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return self.plan_id_a == self.plan_id_b

    @property
    def only_in_a(self) -> list[str]:
        return [n for n in self.names_a if n not in self.names_b]

    @property
    def only_in_b(self) -> list[str]:
        return [n for n in self.names_b if n not in self.names_a]

    @property
    def shared_text(self) -> str:
        """Which steps the samples per source are compared over, in words."""
        if self.shared is None:
            return (
                f"the plans share no steps (A holds {_range(self.first_step_a, self.steps_a)}, "
                f"B {_range(self.first_step_b, self.steps_b)})"
            )
        start, end = self.shared
        return f"over the {end - start:,} steps both plans hold: {_range(start, end)}"

    def to_json(self) -> dict[str, Any]:
        def side(path, plan_id, first, steps) -> dict[str, Any]:
            return {
                "path": str(path),
                "plan_id": plan_id,
                "steps": steps,
                "first_step": first,
                "last_step": steps - 1,
            }

        shared = self.shared
        return {
            "identical": self.identical,
            "a": side(self.a, self.plan_id_a, self.first_step_a, self.steps_a),
            "b": side(self.b, self.plan_id_b, self.first_step_b, self.steps_b),
            "header": [{"key": h.key, "a": h.a, "b": h.b, "text": str(h)} for h in self.header],
            "first_difference": asdict(self.first_step) if self.first_step else None,
            "first_sample_difference": self.first_sample_step,
            "shared_steps": None
            if shared is None
            else {"first": shared[0], "last": shared[1] - 1, "count": shared[1] - shared[0]},
            "shared_text": self.shared_text,
            "sources": [{**asdict(s), "delta_pp": s.delta_pp} for s in self.sources],
            "only_in_a": self.only_in_a,
            "only_in_b": self.only_in_b,
        }


def diff_plans(a: str | os.PathLike, b: str | os.PathLike) -> PlanDiff:
    """Compare plan files `a` and `b` (PlanError if either is unreadable or corrupt)."""
    with PlanReader(a) as ra, PlanReader(b) as rb:
        out = PlanDiff(as_place(a), as_place(b), ra.plan_id, rb.plan_id, ra.steps, rb.steps, ra.dp, rb.dp)
        out.first_step_a, out.first_step_b = ra.first_step, rb.first_step
        out.names_a, out.names_b = _names(ra), _names(rb)
        start, end = max(ra.first_step, rb.first_step), min(ra.steps, rb.steps)
        out.shared = (start, end) if start < end else None
        out.sources = _shares(ra, rb, out.shared) if out.shared is not None else []
        if out.identical:  # the plan id hashes the footer, which checksums every byte
            return out
        out.header = header_diff(ra.footer, rb.footer)
        out.first_step, out.first_sample_step = _first_difference(ra, rb)
    return out


# --- header ---------------------------------------------------------------------------------


def header_diff(footer_a: dict[str, Any], footer_b: dict[str, Any]) -> list[HeaderDiff]:
    """Every differing value of the two footers, leaf by leaf: the `config` first, named as
    in the config (`train.seed`, `sources.web.weight`), then the rest of the footer under
    its own keys (`index.path`, `index.fingerprint`, `fetch.root`, `first_step`, ...). The
    per-source results (`sources`: samples, epochs) are left to the shares table, and the
    file's byte layout is not compared."""
    out: list[HeaderDiff] = []
    _walk(footer_a.get("config", _ABSENT), footer_b.get("config", _ABSENT), "", out)
    for key in dict.fromkeys([*footer_a, *footer_b]):
        if key in _NOT_WALKED:
            continue
        _walk(footer_a.get(key, _ABSENT), footer_b.get(key, _ABSENT), str(key), out)
    return out


# `config` is walked first, without a prefix; `sources` and `cost_band` hold results, not
# inputs (the shares table and `mds inspect` show them); `steps` repeats `train.steps`;
# `layout` is where the file's bytes lie (offsets, checksums), which follow from the rest.
_NOT_WALKED = ("config", "sources", "cost_band", "steps", "layout")


def _walk(a: Any, b: Any, path: str, out: list[HeaderDiff]) -> None:
    """Recurse while both sides have the same container type; report leaves that differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in dict.fromkeys([*a, *b]):
            sub = f"{path}.{key}" if path else str(key)
            _walk(a.get(key, _ABSENT), b.get(key, _ABSENT), sub, out)
    elif isinstance(a, list) and isinstance(b, list) and _named(a) and _named(b):
        if _by_name(a) and _by_name(b):  # sources: matched by name, in A's order then B's
            ka, kb = {x["name"]: x for x in a}, {x["name"]: x for x in b}
            for name in dict.fromkeys([*ka, *kb]):
                _walk(ka.get(name, _ABSENT), kb.get(name, _ABSENT), f"{path}.{name}", out)
            return
        for i in range(max(len(a), len(b))):
            _walk(
                a[i] if i < len(a) else _ABSENT,
                b[i] if i < len(b) else _ABSENT,
                f"{path}[{i}]",
                out,
            )
    elif a != b:
        out.append(HeaderDiff(path, a, b))


def _named(items: list[Any]) -> bool:
    """Lists of objects (like `sources`) are compared item by item; other lists as values."""
    return all(isinstance(x, dict) for x in items)


def _by_name(items: list[dict[str, Any]]) -> bool:
    """Objects that each have a distinct string `name` are matched by it."""
    names = [x.get("name") for x in items]
    return all(isinstance(n, str) for n in names) and len(set(names)) == len(names)


def _show(value: Any) -> str:
    if value is _ABSENT:
        return _ABSENT
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


# --- steps ----------------------------------------------------------------------------------


def _steps(reader: PlanReader, start: int = 0) -> Iterator[tuple[np.ndarray, list[np.ndarray]]]:
    """Per step from `start`: the ranks' sample counts [D, M] and each rank's ids, one chunk
    in memory."""
    for c, (a, b, *_rest) in enumerate(reader.chunks):
        if b <= start:
            continue
        blocks = [reader.rank_chunk(c, r) for r in range(reader.dp)]
        starts = [np.concatenate([[0], np.cumsum(k.counts.sum(axis=1))]) for k in blocks]
        for t in range(max(start - a, 0), b - a):
            counts = np.stack([k.counts[t] for k in blocks])
            ids = [k.ids[s[t] : s[t + 1]] for k, s in zip(blocks, starts, strict=True)]
            yield counts, ids


def _first_difference(ra: PlanReader, rb: PlanReader) -> tuple[StepDiff | None, int | None]:
    """Walk the common steps: the first step where a rank differs, and the first step whose
    samples (as a multiset) differ. Stops as soon as both are known. A re-planned plan
    starts at its hand-over step; the walk starts where both plans have steps."""
    same_dp = ra.dp == rb.dp and ra.micro == rb.micro
    first: StepDiff | None = None
    start = max(ra.first_step, rb.first_step)
    if start >= min(ra.steps, rb.steps):
        detail = (
            f"no step in common: plan A holds {_range(ra.first_step, ra.steps)}, "
            f"plan B {_range(rb.first_step, rb.steps)}"
        )
        return StepDiff(start, None, False, detail), None
    pairs = zip(_steps(ra, start), _steps(rb, start), strict=False)
    for step, ((ca, ia), (cb, ib)) in enumerate(pairs, start=start):
        same_set = np.array_equal(np.sort(np.concatenate(ia)), np.sort(np.concatenate(ib)))
        if first is None:
            first = _step_diff(step, ra, rb, same_dp, same_set, (ca, ia), (cb, ib))
        if not same_set:
            return first, step
    if ra.steps != rb.steps:
        common = min(ra.steps, rb.steps)
        detail = f"plan A has {ra.steps} steps, plan B {rb.steps}"
        return first or StepDiff(common, None, False, detail), common
    return first, None


def _step_diff(step, ra, rb, same_dp, same_set, a, b) -> StepDiff | None:
    """This step's difference, or None if every rank has the same samples."""
    kind = "same samples, different assignment" if same_set else "different samples"
    if not same_dp:
        geometry = (
            f"dp_size differs ({ra.dp} -> {rb.dp})"
            if ra.dp != rb.dp
            else f"micro_batches differ ({ra.micro} -> {rb.micro})"
        )
        what = kind if same_set else "differs in its samples"
        return StepDiff(step, None, same_set, f"{geometry}; step {step}: {what}")
    (ca, ia), (cb, ib) = a, b
    for rank in range(ra.dp):
        if not (np.array_equal(ca[rank], cb[rank]) and np.array_equal(ia[rank], ib[rank])):
            return StepDiff(step, rank, same_set, f"step {step} rank {rank}: {kind}")
    return None


# --- source shares --------------------------------------------------------------------------


def _names(reader: PlanReader) -> list[str]:
    try:
        return [str(s["name"]) for s in reader.footer["sources"]]
    except (KeyError, TypeError):
        raise PlanError(f"{reader.path}: corrupt plan footer (no `sources`)") from None


def _totals(reader: PlanReader, start: int, end: int) -> dict[str, int]:
    """Samples per planned source over steps [start, end), from the checksummed
    `source_samples` section (one row per step the plan holds)."""
    names = _names(reader)
    per_step = reader.section("source_samples")
    if (
        per_step.ndim != 2
        or per_step.shape[1] != len(names)
        or per_step.shape[0] != reader.steps - reader.first_step
    ):
        raise PlanError(f"{reader.path}: section 'source_samples' does not match the sources")
    rows = per_step[start - reader.first_step : end - reader.first_step]
    totals = rows.sum(axis=0) if rows.size else np.zeros(len(names), np.int64)
    return {n: int(t) for n, t in zip(names, totals, strict=True)}


def _shares(ra: PlanReader, rb: PlanReader, shared: tuple[int, int]) -> list[ShareDiff]:
    ta, tb = _totals(ra, *shared), _totals(rb, *shared)
    sa, sb = sum(ta.values()), sum(tb.values())

    def share(n: int | None, total: int) -> float | None:
        return None if n is None else round(100.0 * n / total, 4) if total else 0.0

    return [
        ShareDiff(
            name, ta.get(name), tb.get(name), share(ta.get(name), sa), share(tb.get(name), sb)
        )
        for name in dict.fromkeys([*ta, *tb])
    ]


def _range(start: int, end: int) -> str:
    """Steps [start, end) as people write them: `steps 32-63`."""
    if end <= start:
        return "no steps"
    return f"step {start}" if end - start == 1 else f"steps {start}-{end - 1}"
