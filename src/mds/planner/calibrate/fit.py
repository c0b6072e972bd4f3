"""Calibrate the cost model on a real model: time micro-batches, fit a*L + b*L^2 + d + c.

A micro-batch holding n samples of lengths L1..Ln is modelled as
    seconds = a * sum(Li) + b * sum(Li^2) + d * n + c
(d: the per-sample overhead, e.g. an attention call per sample or its padded last tile; c: the
per-micro-batch overhead: kernel launches, norms and the head outside attention). The same
model, fit and grid serve an image encoder (`mds calibrate --encoder`), with the images'
patch counts P in place of the samples' lengths L (`PATCHES`). The fit is
a least-squares fit of relative error (each point weighted by 1/seconds, since timings span
orders of magnitude), with a, b, c, d >= 0: the best of the fits over every subset of the
four terms whose coefficients all come out non-negative (an exact NNLS for four unknowns).
torch is imported inside the timing functions only.
"""

from __future__ import annotations

import importlib
import inspect
import itertools
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mds.errors import ConfigError

__all__ = [
    "ENCODER_FORM",
    "MODEL_FORM",
    "PATCHES",
    "TOKENS",
    "Axis",
    "Calibration",
    "CostFit",
    "calibration_grid",
    "encoder_inputs",
    "fit_cost",
    "forward_backward",
    "load_model",
    "micro_batch_inputs",
    "patch_inputs",
    "pick_clock",
    "pick_device",
    "pick_statistic",
    "time_grid",
    "time_micro_batch",
    "token_inputs",
    "torch_info",
]


@dataclass(frozen=True)
class Axis:
    """What the grid's sizes are, for messages: samples' lengths in tokens (the backbone) or
    images' patch counts (the encoder), and the flags that set them."""

    flag: str  # the sizes: --lengths
    cap: str  # the most per micro-batch: --max-tokens
    size: str  # one size: "sample length"
    sizes: str  # "lengths"
    larger: str  # what to time when the overhead hides the work: "longer samples"


TOKENS = Axis("--lengths", "--max-tokens", "sample length", "lengths", "longer samples")
PATCHES = Axis("--patches", "--max-patches", "image patch count", "patch counts", "larger images")


@dataclass(frozen=True)
class CostFit:
    """Fitted coefficients (seconds per token, per token^2, per micro-batch, per sample) and
    fit error."""

    a: float
    b: float
    c: float
    rel_errors: tuple[float, ...]  # |predicted - measured| / measured, per grid point
    d: float = 0.0

    @property
    def max_error(self) -> float:
        return max(self.rel_errors)

    @property
    def median_error(self) -> float:
        return statistics.median(self.rel_errors)

    def predict(self, lengths: Sequence[int]) -> float:
        """Predicted seconds of one micro-batch holding samples of these lengths."""
        return (
            self.a * sum(lengths)
            + self.b * sum(x * x for x in lengths)
            + self.d * len(lengths)
            + self.c
        )

    def fit_error(self) -> dict[str, Any]:
        return {
            "max": round(self.max_error, 4),
            "median": round(self.median_error, 4),
            "points": len(self.rel_errors),
        }


def _features(micro_batches: Sequence[Sequence[int]]) -> np.ndarray:
    """Columns of the fit, in the order a, b, c, d: sum(L), sum(L^2), 1, n."""
    x = np.zeros((len(micro_batches), 4), dtype=np.float64)
    for i, lengths in enumerate(micro_batches):
        arr = np.asarray(lengths, dtype=np.float64)
        x[i] = (arr.sum(), (arr * arr).sum(), 1.0, arr.size)
    return x


def fit_cost(
    micro_batches: Sequence[Sequence[int]],
    seconds: Sequence[float],
    per_sample: bool = True,
    axis: Axis = TOKENS,
) -> CostFit:
    """Fit seconds ~ a*sum(L) + b*sum(L^2) + c + d*n with a, b, c, d >= 0 (module docstring);
    `per_sample=False` fixes d = 0 (the three-term model); `axis` names the sizes in errors.

    Subsets whose columns are linearly dependent are skipped (e.g. c and d when every
    micro-batch holds one sample): their split between the dependent terms is arbitrary."""
    if len(micro_batches) != len(seconds):
        raise ConfigError(
            f"calibration: {len(micro_batches)} micro-batches but {len(seconds)} timings"
        )
    for i, lengths in enumerate(micro_batches):
        if len(lengths) == 0 or any(int(x) < 1 for x in lengths):
            raise ConfigError(
                f"calibration point {i}: every {axis.size} must be >= 1, got {list(lengths)}"
            )
    y = np.asarray(seconds, dtype=np.float64)
    if y.size and not (np.isfinite(y).all() and (y > 0).all()):
        bad = int(np.flatnonzero(~(np.isfinite(y) & (y > 0)))[0])
        raise ConfigError(f"calibration point {bad}: time must be > 0 seconds, got {y[bad]!r}")
    x = _features(micro_batches)
    distinct = {tuple(sorted(int(v) for v in mb)) for mb in micro_batches}
    lengths = {int(v) for mb in micro_batches for v in mb}
    if len(distinct) < 3 or len(lengths) < 2:
        raise ConfigError(
            f"calibration: need at least 3 different micro-batches over at least 2 {axis.size}s "
            f"to fit a, b and c; got {len(distinct)} over {len(lengths)} (widen {axis.flag})"
        )
    w = 1.0 / y
    xw, yw = x * w[:, None], y * w
    # Scale columns so the solve is well conditioned (L^2 reaches ~1e7 where 1 stays 1).
    scale = np.abs(xw).max(axis=0)
    scale[scale == 0] = 1.0
    best: tuple[float, np.ndarray] | None = None
    terms = x.shape[1]
    usable = range(terms if per_sample else terms - 1)
    for k in range(len(usable), 0, -1):
        for cols in itertools.combinations(usable, k):
            sub = xw[:, cols] / scale[list(cols)]
            coef, _, rank, _ = np.linalg.lstsq(sub, yw, rcond=None)
            if rank < k or (coef < 0).any():
                continue
            full = np.zeros(terms)
            full[list(cols)] = coef / scale[list(cols)]
            sse = float(((xw @ full - yw) ** 2).sum())
            if best is None or sse < best[0] * (1 - 1e-12):
                best = (sse, full)
    assert best is not None  # a single term with positive times always has coef > 0
    a, b, c, d = (float(v) for v in best[1])
    if a == 0 and b == 0:
        raise ConfigError(
            f"calibration: the fitted time does not grow with {axis.size} (a = b = 0, the "
            f"per-micro-batch overhead hides the model's work); time {axis.larger} ({axis.flag})"
        )
    rel = np.abs(x @ best[1] - y) / y
    return CostFit(a=a, b=b, c=c, d=d, rel_errors=tuple(float(v) for v in rel))


def calibration_grid(
    lengths: Sequence[int], max_tokens: int, mixed: int = 4, seed: int = 0, axis: Axis = TOKENS
) -> list[tuple[int, ...]]:
    """Micro-batches to time: k samples of length L for k in 1, 2, 4, ... while k*L fits
    `max_tokens`, plus `mixed` seeded micro-batches of lengths drawn from `lengths` (for the
    encoder: k images of P patches, up to `max_tokens` patches)."""
    flag, cap = axis.flag, axis.cap
    if not lengths:
        raise ConfigError(f"{flag}: give at least two {axis.size}s, e.g. 64,256,1024")
    bad = [x for x in lengths if x < 1]
    if bad:
        raise ConfigError(f"{flag}: {axis.sizes} must be >= 1, got {bad[0]}")
    if max(lengths) > max_tokens:
        raise ConfigError(f"{flag}: {max(lengths)} exceeds {cap} {max_tokens}; raise {cap}")
    grid: list[tuple[int, ...]] = []
    for length in sorted(set(lengths)):
        k = 1
        while k * length <= max_tokens:
            grid.append((length,) * k)
            k *= 2
    rng = np.random.default_rng(seed)
    pool = sorted(set(lengths))
    for _ in range(mixed):
        budget = int(rng.integers(max_tokens // 2, max_tokens + 1))
        mb: list[int] = []
        for length in rng.permutation(pool * 4):
            if sum(mb) + int(length) <= budget:
                mb.append(int(length))
        grid.append(tuple(mb) if len(mb) > 1 else (min(pool), min(pool)))
    return grid


MODEL_FORM = (
    "module:function, a function with no arguments returning a torch.nn.Module whose "
    "forward(input_ids [1, T], cu_seqlens [n + 1] int32) returns a tensor"
)
ENCODER_FORM = (
    "module:function, a function with no arguments returning a torch.nn.Module whose "
    "forward(pixel_values [P_total, D_in], cu_seqlens [n + 1] int32) returns a tensor"
)

# Inputs of one packed micro-batch: (sizes, seed, device) -> (the model's first input, cu_seqlens).
Inputs = Callable[[Sequence[int], int, str], tuple]


def load_model(spec: str, form: str = MODEL_FORM) -> Any:
    """Build the user's model from `module:function` (the function takes no arguments and
    returns a torch.nn.Module); anything else is a ConfigError naming the spec and `form`."""
    module_name, sep, func_name = spec.partition(":")
    if not sep or not module_name or not func_name.isidentifier():
        raise ConfigError(f"--model must be module:function, got {spec!r}")
    if "" not in sys.path:
        sys.path.insert(0, "")  # like `python -m`: modules in the working directory
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"--model {spec}: cannot import {module_name!r}: {exc}") from None
    builder = getattr(module, func_name, None)
    if not callable(builder):
        raise ConfigError(f"--model {spec}: {module_name!r} has no function {func_name!r}")
    try:
        inspect.signature(builder).bind()
    except TypeError:
        raise ConfigError(
            f"--model {spec}: {func_name}{inspect.signature(builder)} needs arguments; "
            f"--model must be {form}"
        ) from None
    except ValueError:  # no signature to inspect (some builtins): calling it tells
        pass
    try:
        model = builder()
    except Exception as exc:  # the user's code: any failure is theirs to fix
        raise ConfigError(
            f"--model {spec}: {func_name}() raised {_first_line(exc)}; --model must be {form}"
        ) from None
    import torch

    if not isinstance(model, torch.nn.Module):
        raise ConfigError(
            f"--model {spec}: {func_name}() returned {type(model).__name__}, not a "
            f"torch.nn.Module; --model must be {form}"
        )
    return model


def check_model(
    model: Any,
    spec: str,
    vocab: int | None = None,
    device: str = "cpu",
    *,
    inputs: Inputs | None = None,
    form: str = MODEL_FORM,
) -> None:
    """One forward+backward of the user's model on a two-sample micro-batch (token ids of
    `vocab`, or `inputs`), so that a forward of the wrong form is a ConfigError naming the
    spec and `form` before any timing."""
    ids, cu = _inputs(vocab, inputs)((2, 2), 0, device)
    try:
        model.to(device).train()
        forward_backward(model, ids, cu)
        model.zero_grad(set_to_none=True)
    except Exception as exc:  # the user's code: any failure is theirs to fix
        raise ConfigError(
            f"--model {spec}: one forward+backward failed ({_first_line(exc)}); --model must "
            f"be {form}"
        ) from None


def _first_line(exc: BaseException) -> str:
    text = (str(exc).strip().splitlines() or [""])[0]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


@dataclass
class Calibration:
    """The timed grid, its fit, and where it was measured (for the [cost] table's comment)."""

    model: str
    device: str
    repeats: int
    seed: int
    micro_batches: list[tuple[int, ...]]
    seconds: list[float]
    fit: CostFit
    torch_version: str = ""
    threads: int = 0
    clock: str = "wall"
    extra: dict[str, Any] = field(default_factory=dict)
    statistic: str = "median"
    # An image encoder's calibration (sizes are patches per image): `fit` is then the fit
    # without a per-image term, in the form of the plan's encoder cost, and `per_image` the
    # four-term fit, reported only.
    encoder: bool = False
    per_image: CostFit | None = None

    def cost_table(self) -> str:
        """A `[cost]` table to paste into the config or reference with `[cost] file`."""
        if self.encoder:
            return self.encoder_table()
        f = self.fit
        err = f.fit_error()
        return (
            "[cost]\n"
            f"# mds calibrate: {self.model} on {self.device} (torch {self.torch_version}, "
            f"threads = {self.threads}, {self.clock} clock)\n"
            f"# {err['points']} micro-batches, {self.statistic} of {self.repeats} repeats, "
            f"seed {self.seed}; "
            "a: seconds per token, b: per token^2, c: per micro-batch, d: per sample\n"
            'source = "calibrated"\n'
            f"a = {f.a:.6g}\n"
            f"b = {f.b:.6g}\n"
            f"c = {f.c:.6g}\n"
            f"d = {f.d:.6g}\n"
            f"fit_error = {{ max = {err['max']}, median = {err['median']}, "
            f"points = {err['points']} }}\n"
        )

    def encoder_table(self) -> str:
        """`[cost] encoder = { a, b, d }`: the plan's encoder cost per image of P patches,
        a*P + b*P^2 + d, from the four-term fit (its c, per micro-batch, is no part of
        balancing and only a comment); the fit without d is a comment too."""
        f = self.fit
        err = f.fit_error()
        lines = [
            "[cost]",
            f"# mds calibrate --encoder: {self.model} on {self.device} (torch "
            f"{self.torch_version}, threads = {self.threads}, {self.clock} clock)",
            f"# {err['points']} micro-batches, {self.statistic} of {self.repeats} repeats, "
            f"seed {self.seed}; P: patches per image, a: seconds per patch, b: per patch^2",
            f"# without d: a = {f.a:.6g}, b = {f.b:.6g}, c = {f.c:.6g}, "
            f"fit_error = {{ max = {err['max']}, median = {err['median']} }}",
        ]
        if self.per_image is None:
            lines.append(f"encoder = {{ a = {f.a:.6g}, b = {f.b:.6g} }}")
            return "\n".join(lines) + "\n"
        g, gerr = self.per_image, self.per_image.fit_error()
        lines.append(
            f"# written: the fit with d per image, a*sum(P) + b*sum(P^2) + d*images + c "
            f"(c = {g.c:.6g} per micro-batch is not written), "
            f"fit_error = {{ max = {gerr['max']}, median = {gerr['median']} }}"
        )
        lines.append(f"encoder = {{ a = {g.a:.6g}, b = {g.b:.6g}, d = {g.d:.6g} }}")
        return "\n".join(lines) + "\n"

    def to_json(self) -> dict[str, Any]:
        if self.encoder:
            return self._encoder_json()
        f = self.fit
        return {
            "model": self.model,
            "device": self.device,
            "torch": self.torch_version,
            "threads": self.threads,
            "clock": self.clock,
            "repeats": self.repeats,
            "statistic": self.statistic,
            "seed": self.seed,
            "cost": {
                "source": "calibrated",
                "a": f.a,
                "b": f.b,
                "c": f.c,
                "d": f.d,
                "fit_error": f.fit_error(),
            },
            "points": [
                {
                    "lengths": list(mb),
                    "seconds": s,
                    "predicted": f.predict(mb),
                    "rel_error": e,
                }
                for mb, s, e in zip(self.micro_batches, self.seconds, f.rel_errors, strict=True)
            ],
        }

    def _encoder_json(self) -> dict[str, Any]:
        f = self.fit
        return {
            "model": self.model,
            "encoder": True,
            "device": self.device,
            "torch": self.torch_version,
            "threads": self.threads,
            "clock": self.clock,
            "repeats": self.repeats,
            "statistic": self.statistic,
            "seed": self.seed,
            "cost": {
                "encoder": {"a": f.a, "b": f.b}
                if self.per_image is None
                else {"a": self.per_image.a, "b": self.per_image.b, "d": self.per_image.d}
            },
            "fit": {"a": f.a, "b": f.b, "c": f.c, "fit_error": f.fit_error()},
            "fit_per_image": None
            if self.per_image is None
            else {
                "a": self.per_image.a,
                "b": self.per_image.b,
                "c": self.per_image.c,
                "d": self.per_image.d,
                "fit_error": self.per_image.fit_error(),
            },
            "points": [
                {
                    "patches": list(mb),
                    "seconds": s,
                    "predicted": f.predict(mb),
                    "rel_error": e,
                }
                for mb, s, e in zip(self.micro_batches, self.seconds, f.rel_errors, strict=True)
            ],
        }


def pick_device(device: str) -> str:
    """`auto` is CUDA when torch sees a GPU, else CPU."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"--device {device}: torch sees no CUDA device")
    if device != "cpu" and not device.startswith("cuda"):
        raise ConfigError(f"--device must be auto, cpu or cuda[:N], got {device!r}")
    return device


def micro_batch_inputs(lengths: Sequence[int], vocab: int, seed: int, device: str) -> tuple:
    """Seeded token ids [1, T] and cu_seqlens (int32) of one packed micro-batch."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    total = int(sum(lengths))
    ids = torch.randint(0, vocab, (1, total), generator=gen)
    cu = torch.tensor([0, *itertools.accumulate(int(x) for x in lengths)], dtype=torch.int32)
    return ids.to(device), cu.to(device)


def encoder_inputs(patches: Sequence[int], patch_dim: int, seed: int, device: str) -> tuple:
    """Seeded pixel values [P_total, patch_dim] (standard normal, as normalized pixels are
    near) and cu_seqlens (int32) of one packed micro-batch of images."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    pixels = torch.randn((int(sum(patches)), patch_dim), generator=gen)
    cu = torch.tensor([0, *itertools.accumulate(int(x) for x in patches)], dtype=torch.int32)
    return pixels.to(device), cu.to(device)


def token_inputs(vocab: int) -> Inputs:
    return lambda lengths, seed, device: micro_batch_inputs(lengths, vocab, seed, device)


def patch_inputs(patch_dim: int) -> Inputs:
    return lambda patches, seed, device: encoder_inputs(patches, patch_dim, seed, device)


def _inputs(vocab: int | None, inputs: Inputs | None) -> Inputs:
    if inputs is not None:
        return inputs
    if vocab is None:
        raise TypeError("give vocab (token ids) or inputs")
    return token_inputs(vocab)


def forward_backward(model: Any, ids: Any, cu: Any) -> None:
    """One training micro-batch without the optimizer: forward, a scalar loss, backward."""
    out = model(ids, cu)
    loss = out if out.ndim == 0 else out.float().mean()
    loss.backward()


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
# How a point's timed rounds become its time: the median, or the minimum (on a shared
# machine other work only adds time, so the fastest round is the least disturbed).
STATISTICS: dict[str, Callable[[list[float]], float]] = {"median": statistics.median, "min": min}


def pick_statistic(name: str) -> Callable[[list[float]], float]:
    if name not in STATISTICS:
        raise ConfigError(f"--statistic must be median or min, got {name!r}")
    return STATISTICS[name]


def pick_clock(clock: str, device: str) -> str:
    """`auto`: process CPU time on a CPU device (what the work costs, whatever else the
    machine runs), wall time on CUDA (kernels run asynchronously to the process)."""
    if clock == "auto":
        return "cpu" if device == "cpu" else "wall"
    if clock not in CLOCKS:
        raise ConfigError(f"--clock must be auto, wall or cpu, got {clock!r}")
    if clock == "cpu" and device != "cpu":
        raise ConfigError(f"--clock cpu measures CPU work; use --clock wall on {device}")
    return clock


def time_micro_batch(
    model: Any, ids: Any, cu: Any, repeats: int, warmup: int, device: str, clock: str = "wall"
) -> float:
    """Median seconds of `repeats` forward+backward runs, after `warmup` untimed ones."""
    import torch

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    now = CLOCKS[clock]
    times = []
    for i in range(warmup + repeats):
        model.zero_grad(set_to_none=True)
        sync()
        start = now()
        forward_backward(model, ids, cu)
        sync()
        if i >= warmup:
            times.append(now() - start)
    return statistics.median(times)


def time_grid(
    model: Any,
    grid: Sequence[Sequence[int]],
    *,
    vocab: int | None = None,
    inputs: Inputs | None = None,
    repeats: int,
    warmup: int,
    seed: int,
    device: str,
    clock: str = "wall",
    advance: Callable[[int], None] | None = None,
    statistic: Callable[[list[float]], float] = statistics.median,
) -> list[float]:
    """Median seconds (or `statistic` of the rounds) of each grid micro-batch; inputs (token
    ids of `vocab`, or `inputs`: encoder_inputs for an encoder) seeded by (seed, point).

    Repeats go in rounds over the whole grid (after `warmup` untimed rounds), each round in
    a seeded random order, so a slow spell of a shared machine lands on every point alike
    rather than on a few neighbouring lengths."""
    if repeats < 1:
        raise ConfigError(f"--repeats must be >= 1, got {repeats}")
    make = _inputs(vocab, inputs)
    model.to(device).train()
    batches = [make(lengths, seed * 1_000_003 + i, device) for i, lengths in enumerate(grid)]
    times: list[list[float]] = [[] for _ in grid]
    for round_ in range(warmup + repeats):
        for i in np.random.default_rng([seed, round_]).permutation(len(batches)):
            ids, cu = batches[i]
            t = time_micro_batch(model, ids, cu, 1, 0, device, clock)
            if round_ >= warmup:
                times[i].append(t)
            if advance is not None:
                advance(1)
    model.zero_grad(set_to_none=True)
    return [statistic(t) for t in times]


def torch_info() -> tuple[str, int]:
    import torch

    return torch.__version__, torch.get_num_threads()
