"""The signal log of an online-mixed run (docs/online-mixing.md): per window, each source's
loss summed over every DP rank and what it was summed over. It is the one input of an
online run besides the config and the index, so it has one canonical encoding (sorted keys,
no spaces, shortest round-trip floats) and a digest of its first n windows, which each
plan segment records. Read and written without torch or polars."""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mds.core import storage
from mds.core.commit import replace_local, temp_name
from mds.errors import PlanError, SourceDataError

__all__ = [
    "SIGNALS_FORMAT",
    "SIGNALS_VERSION",
    "SignalLog",
    "WindowSignal",
    "canonical_bytes",
    "window_signal",
]

SIGNALS_FORMAT = "mds-signals"
SIGNALS_VERSION = 1


def canonical_bytes(value: Any) -> bytes:
    """`value` as canonical JSON: sorted keys, no spaces, floats in their shortest
    round-trip form (Python's repr), NaN and infinities refused."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


@dataclass(frozen=True)
class WindowSignal:
    """One window's reduced signal: steps [start, end), per source (in the log's source
    order) the loss summed over the window on every rank, and what it was summed over."""

    window: int
    start: int
    end: int
    loss_sum: tuple[float, ...]
    count: tuple[float, ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "window": self.window,
            "steps": [self.start, self.end],
            "loss_sum": [float(x) for x in self.loss_sum],
            "count": [_number(x) for x in self.count],
        }

    def mean_loss(self) -> tuple[float | None, ...]:
        """Per source the loss per unit of count, None where nothing was counted."""
        return tuple(
            (s / c) if c > 0 else None for s, c in zip(self.loss_sum, self.count, strict=True)
        )


def _number(x: float) -> float | int:
    """A count as an int when it is one (sample and token counts), else a float."""
    return int(x) if float(x).is_integer() else float(x)


@dataclass
class SignalLog:
    """The windows' signals of one online run, in window order from window 0."""

    plan_id: str  # segment 0's plan id: the run this log belongs to
    sources: tuple[str, ...]
    window_steps: int
    windows: list[WindowSignal] = field(default_factory=list)
    # (window, dp_size): from that window on the run has that many DP ranks (a run resumed
    # on another number of ranks at a window's first step); before the first, the config's
    geometry: list[tuple[int, int]] = field(default_factory=list)

    def dp_at(self, window: int, default: int) -> int:
        """The DP ranks window `window` is planned for."""
        out = default
        for start, dp in self.geometry:
            if start <= window:
                out = dp
        return out

    def change_dp(self, window: int, dp_size: int) -> None:
        """From `window` on, the run has `dp_size` ranks (later changes are dropped)."""
        self.geometry = [(w, d) for w, d in self.geometry if w < window] + [(window, dp_size)]

    def digest(self, n: int | None = None) -> str:
        """BLAKE2b-128 of the canonical encoding of the sources and the first `n` windows
        (default: all): what a segment planned from them records."""
        n = len(self.windows) if n is None else n
        assert 0 <= n <= len(self.windows), (n, len(self.windows))
        body = {"sources": list(self.sources), "windows": [w.to_json() for w in self.windows[:n]]}
        return hashlib.blake2b(canonical_bytes(body), digest_size=16).hexdigest()

    def append(self, signal: WindowSignal) -> None:
        """Add the next window's signal (windows come in order, each once)."""
        if signal.window != len(self.windows):
            raise PlanError(
                f"signal log: window {signal.window} given after {len(self.windows)} windows; "
                "windows are recorded in order, each once"
            )
        if len(signal.loss_sum) != len(self.sources) or len(signal.count) != len(self.sources):
            raise PlanError(f"signal log: window {signal.window} has values for other sources")
        for x in (*signal.loss_sum, *signal.count):
            if not math.isfinite(x):
                raise PlanError(f"signal log: window {signal.window} has a non-finite value {x!r}")
        self.windows.append(signal)

    def to_json(self) -> dict[str, Any]:
        return {
            "format": SIGNALS_FORMAT,
            "version": SIGNALS_VERSION,
            "plan_id": self.plan_id,
            "sources": list(self.sources),
            "window_steps": self.window_steps,
            "windows": [w.to_json() for w in self.windows],
            "geometry": [[w, d] for w, d in self.geometry],
        }

    def encode(self) -> bytes:
        return canonical_bytes(self.to_json())

    @classmethod
    def from_json(cls, data: Any, where: str = "signal log") -> SignalLog:
        """A log from its JSON form, every field checked (a damaged log is one error)."""
        if not isinstance(data, Mapping) or data.get("format") != SIGNALS_FORMAT:
            raise PlanError(f"{where}: not an mds signal log (no format {SIGNALS_FORMAT!r})")
        if data.get("version") != SIGNALS_VERSION:
            raise PlanError(
                f"{where}: signal log version {data.get('version')!r} is not supported "
                f"(this mds reads {SIGNALS_VERSION})"
            )
        try:
            sources = tuple(str(s) for s in data["sources"])
            log = cls(str(data["plan_id"]), sources, int(data["window_steps"]))
            log.geometry = [(int(w), int(d)) for w, d in data.get("geometry", [])]
            for raw in data["windows"]:
                start, end = (int(x) for x in raw["steps"])
                log.append(
                    WindowSignal(
                        int(raw["window"]),
                        start,
                        end,
                        tuple(float(x) for x in raw["loss_sum"]),
                        tuple(float(x) for x in raw["count"]),
                    )
                )
        except (KeyError, TypeError, ValueError) as exc:
            raise PlanError(f"{where}: damaged signal log ({exc!r})") from None
        return log

    @classmethod
    def read(cls, path: str | os.PathLike) -> SignalLog:
        """The log in the file or object (s3://, gs://) `path`."""
        try:
            raw = storage.get_bytes(str(path)) if storage.is_url(path) else Path(path).read_bytes()
            data = json.loads(raw)
        except OSError as exc:
            raise PlanError(f"{path}: cannot read the signal log ({exc.strerror or exc})") from None
        except SourceDataError as exc:
            raise PlanError(f"cannot read the signal log: {exc}") from None
        except ValueError:
            raise PlanError(f"{path}: not an mds signal log (not JSON)") from None
        return cls.from_json(data, str(path))

    def write(self, path: str | os.PathLike) -> None:
        """Write the log to `path` atomically: a file (a temporary beside it, then a
        rename) or an object (a temporary beside it, then one copy over it)."""
        if storage.is_url(path):
            try:
                storage.put_bytes(str(path), self.encode())
            except SourceDataError as exc:
                raise PlanError(f"cannot write the signal log: {exc}") from None
            return
        path = Path(path)
        tmp = path.parent / temp_name(path.name)
        try:
            tmp.write_bytes(self.encode())
            replace_local(tmp, path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise PlanError(f"{path}: cannot write the signal log ({exc.strerror or exc})") from None

    def merged(self, other: SignalLog) -> SignalLog:
        """The longer of two logs of the same run when one extends the other (the first
        signal recorded for a window stays); two logs that differ are an error."""
        if (other.plan_id, other.sources, other.window_steps) != (
            self.plan_id,
            self.sources,
            self.window_steps,
        ):
            raise PlanError("the two signal logs belong to different runs (plan id or sources)")
        short, long = sorted((self, other), key=lambda log: len(log.windows))
        if long.windows[: len(short.windows)] != short.windows:
            first = next(
                i for i, (a, b) in enumerate(zip(short.windows, long.windows, strict=False)) if a != b
            )
            raise PlanError(
                f"the signal log on disk and the saved state differ at window {first}; the "
                "segments after it were planned from the log on disk: restore that log's "
                "windows or resume from a checkpoint that agrees with it"
            )
        geometry = other.geometry if len(other.geometry) >= len(self.geometry) else self.geometry
        return SignalLog(
            long.plan_id, long.sources, long.window_steps, list(long.windows), list(geometry)
        )


def window_signal(
    window: int, start: int, end: int, loss_sum: Sequence[float], count: Sequence[float]
) -> WindowSignal:
    """A WindowSignal from plain sequences (the executor's reduced sums)."""
    return WindowSignal(
        window, start, end, tuple(float(x) for x in loss_sum), tuple(float(x) for x in count)
    )
