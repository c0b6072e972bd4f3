"""The planning part of the config: `[train]`, `[cost]`, `[plan]` and per-source mixing keys.

`PlanConfig.canonical()` is what the plan header stores: everything that changes the plan,
in one normalized form, so equal configs give equal plan bytes.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from mds.core.storage import is_url
from mds.core.vision import VisionGeometry
from mds.errors import ConfigError
from mds.planner.index.config import IndexConfig, parse_config, parse_engine
from mds.planner.index.config_file import check_keys, load_toml, place, read_whole
from mds.planner.plan.online_config import OnlineSpec, parse_mixing
from mds.planner.plan.schedule import WeightSchedule, parse_schedule

__all__ = [
    "CostSpec",
    "MixSpec",
    "PlanConfig",
    "TrainSpec",
    "VisionSpec",
    "epoch_warnings",
    "load_plan_config",
    "parse_plan_config",
]

TRAIN_KEYS = (
    "steps",
    "dp_size",
    "micro_batches",
    "samples_per_step",
    "tokens_per_step",
    "max_tokens_per_micro_batch",
    "seed",
    "overlong",
    "weight_by",
    "max_patches_per_micro_batch",
    "cp_size",
    "cp_split_from",
    "warn_epochs",
)
COST_KEYS = (
    "a",
    "b",
    "c",
    "d",
    "model",
    "hf_config",
    "expr",
    "source",
    "fit_error",
    "file",
    "encoder",
)
ENCODER_KEYS = ("a", "b", "d", "layers", "hidden")
# Without `[cost] encoder`: the shape of Qwen2-VL's ViT (32 layers, hidden size 1280).
DEFAULT_ENCODER = {"layers": 32, "hidden": 1280}
FIT_ERROR_KEYS = ("max", "median", "points")
COST_SOURCES = ("calibrated",)
MODEL_KEYS = (
    "layers",
    "hidden",
    "heads",
    "kv_heads",
    "head_dim",
    "ffn",
    "mlp",
    "vocab",
    "causal",
)
PLAN_KEYS = ("index", "chunk_steps", "workers", "engine", "address")
OVERLONG = ("error", "drop", "truncate")
WEIGHT_BY = ("samples", "tokens")
DEFAULT_CHUNK_STEPS = 256
# Bounds on the sizes that drive the planner's allocations (docs/config.md, "Size limits").
MAX_STEPS = 2**27  # per-step arrays (stats, mix schedule) are held in memory whole
MAX_BINS = 2**20  # dp_size x micro_batches: micro-batches of one step
MAX_PLAN_SAMPLES = 2**40  # steps x samples_per_step: sample ids planned in all
MAX_CHUNK_ITEMS = 2**24  # chunk_steps x samples_per_step (or x bins): one chunk's arrays
# Without [cost]: the a:b ratio of a causal model with hidden size 4096 (see docs/config.md).
DEFAULT_A, DEFAULT_B = 1.0, 1.0 / (6 * 4096)
# Context parallelism (docs/context-parallel.md): samples of at least this many tokens are
# split head-tail over the CP ranks by default.
DEFAULT_CP_SPLIT_FROM = 8192
# `mds plan` and `mds inspect` warn about a source drawn more epochs than this (docs/config.md).
DEFAULT_WARN_EPOCHS = 2.0
# A step's CP work (src/mds/core/cp_layout.py units) must stay well inside int64.
MAX_CP_STEP_WORK = 2**62


@dataclass(frozen=True)
class TrainSpec:
    """Batch geometry: steps x dp_size ranks x micro_batches, one step's size, capacity."""

    steps: int
    dp_size: int
    micro_batches: int
    samples_per_step: int | None
    tokens_per_step: int | None
    max_tokens_per_micro_batch: int
    seed: int
    overlong: str
    weight_by: str
    # Encoder capacity of a micro-batch, in patches (plans with [vision]); None: no limit.
    max_patches_per_micro_batch: int | None = None
    # Context parallelism: CP ranks per DP rank, the length from which samples are split
    # head-tail over them, and the work units' `linear` (round(a / b) of [cost]); 1, None
    # and None without CP (docs/context-parallel.md).
    cp_size: int = 1
    cp_split_from: int | None = None
    cp_linear: int | None = None
    # Warn when a source is drawn more epochs than this; None: DEFAULT_WARN_EPOCHS.
    warn_epochs: float | None = None

    @property
    def bins(self) -> int:
        return self.dp_size * self.micro_batches


@dataclass(frozen=True)
class CostSpec:
    """Per-sample cost: `a*L + b*L^2 + d` (L = n_tokens), or an SQL expression over index
    columns.

    `d` is a per-sample constant (from `mds calibrate`: e.g. one attention call per sample),
    part of every sample's cost. `c` is a per-micro-batch constant: recorded in the plan and
    used for predicted step times, not for balancing, since every rank runs the same number
    of micro-batches. `fit_error` is the calibration's {max, median, points}."""

    a: float = DEFAULT_A
    b: float = DEFAULT_B
    expr: str | None = None
    origin: str = "default"  # "default" | "given" | "model" | "hf_config" | "expr" | "calibrated"
    c: float = 0.0
    fit_error: dict[str, Any] | None = None
    d: float = 0.0
    # The model shape a and b were derived from (src/mds/core/flops.py): stored in
    # the plan for `hf_config` and for shapes beyond layers/hidden/vocab/causal only.
    shape: dict[str, Any] | None = None

    def describe(self) -> dict[str, Any]:
        if self.expr is not None:
            return {"expr": self.expr}
        out: dict[str, Any] = {"a": self.a, "b": self.b, "origin": self.origin}
        # Only present when set, so plans of configs without them keep their bytes.
        if self.c:
            out["c"] = self.c
        if self.d:
            out["d"] = self.d
        if self.fit_error is not None:
            out["fit_error"] = dict(self.fit_error)
        if self.shape is not None:
            out["model"] = dict(self.shape)
        return out


@dataclass(frozen=True)
class VisionSpec:
    """`[vision]` and `[cost] encoder`: the model's image geometry, and the encoder's cost
    per image, a*P + b*P^2 (+ d) in its P patches (full attention inside an image)."""

    geometry: VisionGeometry
    a: float
    b: float
    origin: str  # "default" | "given" | "model"
    d: float = 0.0  # per image, e.g. the per-image overhead `mds calibrate --encoder` fits

    def describe_cost(self) -> dict[str, Any]:
        out = {"a": self.a, "b": self.b, "origin": self.origin}
        if self.d:
            out["d"] = self.d
        return out


@dataclass(frozen=True)
class MixSpec:
    """One source's part in the mix: its weight schedule, filter and epoch limit, and the
    epochs past which planning warns (None: [train] warn_epochs)."""

    name: str
    weight: WeightSchedule
    filter: str | None
    max_epochs: int | None
    warn_epochs: float | None = None


@dataclass(frozen=True)
class PlanConfig:
    train: TrainSpec
    cost: CostSpec
    sources: tuple[MixSpec, ...]
    index: Path | str  # a directory, or an s3:// / gs:// prefix
    chunk_steps: int = DEFAULT_CHUNK_STEPS
    workers: int | None = None
    path: Path | None = None
    engine: str = "local"  # where chunks are planned: local or ray (src/mds/planner/runtime/engine.py)
    address: str | None = None  # the Ray cluster's address
    vision: VisionSpec | None = None
    # `mds plan --exclude` (and what a parent plan excluded): per source name, the eligible
    # positions its stream leaves out (plan/stream.py). Not part of the canonical config:
    # the plan records them in its `excluded` section and footer lineage.
    excluded: tuple[tuple[str, Any], ...] = field(default=(), compare=False)
    # [mixing] online: the run is planned window by window (docs/online-mixing.md)
    online: OnlineSpec | None = None
    # The `online` facts a segment's footer records (plan/segment.py); not canonical.
    segment: dict[str, Any] | None = field(default=None, compare=False)

    def canonical(self) -> dict[str, Any]:
        """The plan-relevant config in normalized form (stored in the plan header). Keys of
        the vision plans appear only in them, so other plans keep their bytes."""
        t = self.train
        out = {
            "train": {
                "steps": t.steps,
                "dp_size": t.dp_size,
                "micro_batches": t.micro_batches,
                "samples_per_step": t.samples_per_step,
                "tokens_per_step": t.tokens_per_step,
                "max_tokens_per_micro_batch": t.max_tokens_per_micro_batch,
                "seed": t.seed,
                "overlong": t.overlong,
                "weight_by": t.weight_by,
            },
            "cost": self.cost.describe(),
            "chunk_steps": self.chunk_steps,
            "sources": [
                {
                    "name": s.name,
                    "weight": s.weight.describe(),
                    "filter": s.filter,
                    "max_epochs": s.max_epochs,
                }
                for s in self.sources
            ],
        }
        if t.warn_epochs is not None:  # only when set, so other plans keep their bytes
            out["train"]["warn_epochs"] = t.warn_epochs
        for spec, source in zip(self.sources, out["sources"], strict=True):
            if spec.warn_epochs is not None:
                source["warn_epochs"] = spec.warn_epochs
        if t.cp_size > 1:  # only in CP plans, so other plans keep their bytes
            out["train"]["cp_size"] = t.cp_size
            out["train"]["cp_split_from"] = t.cp_split_from
            out["train"]["cp_linear"] = t.cp_linear
        if self.online is not None:  # only in online runs, so other plans keep their bytes
            out["mixing"] = {"online": self.online.describe()}
        if self.vision is not None:
            out["train"]["max_patches_per_micro_batch"] = t.max_patches_per_micro_batch
            out["cost"]["encoder"] = self.vision.describe_cost()
            out["vision"] = self.vision.geometry.to_json()
        return out


def _int(
    table: dict[str, Any], key: str, where: str, *, minimum: int = 1, default: int | None = None
) -> int | None:
    value = table.get(key, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{where}`{key}` must be an integer >= {minimum}, got {value!r}")
    return value


def _float(table: dict[str, Any], key: str, where: str) -> float | None:
    value = table.get(key)
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
    ):
        raise ConfigError(f"{where}`{key}` must be a finite number >= 0, got {value!r}")
    return float(value)


def _choice(
    table: dict[str, Any], key: str, choices: tuple[str, ...], where: str, default: str
) -> str:
    value = table.get(key, default)
    if value not in choices:
        raise ConfigError(f"{where}`{key}` must be one of {', '.join(choices)}, got {value!r}")
    return value


def _table(table: Any, keys: tuple[str, ...], where: str) -> None:
    if not isinstance(table, dict):
        raise ConfigError(f"{where}must be a table")
    check_keys(table, keys, where)


def parse_train(table: Any, where: str) -> TrainSpec:
    where = f"{where}[train]: "
    _table(table, TRAIN_KEYS, where)
    for key in ("steps", "dp_size", "max_tokens_per_micro_batch"):
        if key not in table:
            raise ConfigError(f"{where}`{key}` is required")
    sps = _int(table, "samples_per_step", where)
    tps = _int(table, "tokens_per_step", where)
    if (sps is None) == (tps is None):
        raise ConfigError(f"{where}set exactly one of `samples_per_step` and `tokens_per_step`")
    unit = "samples" if sps is not None else "tokens"
    weight_by = _choice(table, "weight_by", WEIGHT_BY, where, unit)
    if weight_by != unit:
        raise ConfigError(
            f'{where}`weight_by = "{weight_by}"` needs `{weight_by}_per_step`: the mix is a share of '
            "what a step holds"
        )
    seed = table.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise ConfigError(f"{where}`seed` must be an integer in [0, 2^63), got {seed!r}")
    spec = TrainSpec(
        steps=_int(table, "steps", where),
        dp_size=_int(table, "dp_size", where),
        micro_batches=_int(table, "micro_batches", where, default=1),
        samples_per_step=sps,
        tokens_per_step=tps,
        max_tokens_per_micro_batch=_int(table, "max_tokens_per_micro_batch", where),
        seed=seed,
        overlong=_choice(table, "overlong", OVERLONG, where, "error"),
        weight_by=weight_by,
        max_patches_per_micro_batch=_int(table, "max_patches_per_micro_batch", where),
        warn_epochs=_warn_epochs(table, where),
        **_parse_cp(table, where),
    )
    check_train(spec, where)
    return spec


def check_train(spec: TrainSpec, where: str) -> None:
    """The checks between [train]'s keys, made on the config and again after --dp-size,
    --micro-batches or --samples-per-step change one of them."""
    sps, tps = spec.samples_per_step, spec.tokens_per_step
    if sps is not None and sps < spec.dp_size:
        raise ConfigError(
            f"{where}`samples_per_step` ({sps}) must be at least `dp_size` ({spec.dp_size})"
        )
    check_sizes(spec, where)
    if tps is not None and tps > spec.bins * spec.max_tokens_per_micro_batch:
        raise ConfigError(
            f"{where}`tokens_per_step` ({tps}) exceeds the step's capacity dp_size x micro_batches x "
            f"max_tokens_per_micro_batch = {spec.bins * spec.max_tokens_per_micro_batch}"
        )


def _warn_epochs(table: dict[str, Any], where: str) -> float | None:
    """`warn_epochs`: a number > 0 (epochs of a source's eligible samples), or unset."""
    value = _float(table, "warn_epochs", where)
    if value is not None and value <= 0:
        raise ConfigError(f"{where}`warn_epochs` must be a number > 0, got {value!r}")
    return value


def epoch_warnings(config: dict[str, Any], sources: list[dict[str, Any]]) -> list[str]:
    """One line per source drawn more epochs than its `warn_epochs` (the source's, else
    [train]'s, else DEFAULT_WARN_EPOCHS), from a plan's canonical config and its per-source
    results (the footer's `sources`). A source with `max_epochs` is bounded by it already
    and never warned about."""
    default = config.get("train", {}).get("warn_epochs", DEFAULT_WARN_EPOCHS)
    specs = {s.get("name"): s for s in config.get("sources", [])}
    out = []
    for planned in sources:
        spec = specs.get(planned.get("name"), {})
        if spec.get("max_epochs") is not None:
            continue
        limit = spec.get("warn_epochs", default)
        epochs = planned.get("epochs") or 0.0
        if epochs > limit:
            out.append(
                f"source '{planned['name']}' is drawn {epochs:.2f} epochs (each sample about "
                f"{epochs:.1f} times), more than warn_epochs = {limit:g}; add samples, lower "
                "its weight, or set its max_epochs (or warn_epochs) to accept it"
            )
    return out


def _parse_cp(table: dict[str, Any], where: str) -> dict[str, Any]:
    """`cp_size` and `cp_split_from`; `cp_linear` comes with the cost (with_cp_linear)."""
    cp = _int(table, "cp_size", where, default=1)
    if cp == 1:
        if "cp_split_from" in table:
            raise ConfigError(f"{where}`cp_split_from` needs `cp_size` > 1")
        return {}
    # 1 splits every sample (what Megatron-core's CP needs); a sample shorter than 2 x cp
    # is padded to 2 x cp and some CP ranks hold only its padding
    split_from = _int(table, "cp_split_from", where, default=DEFAULT_CP_SPLIT_FROM)
    return {"cp_size": cp, "cp_split_from": split_from}


def with_cp_linear(train: TrainSpec, cost: CostSpec, vision: Any, where: str) -> TrainSpec:
    """With `cp_size` > 1: the CP work's `linear` = round(a / b) of a causal `a*L + b*L^2`
    cost (src/mds/core/cp_layout.py), refused for costs that have no such form, and the
    step's work checked to fit int64."""
    if train.cp_size == 1:
        return replace(train, cp_split_from=None, cp_linear=None)
    what = f"{where}[train]: `cp_size = {train.cp_size}`"
    if cost.expr is not None:
        raise ConfigError(
            f"{what} needs a cost of the form a*L + b*L^2 (`a`/`b`, `model` or calibrated): "
            "the CP layout weighs each CP rank's tokens and attention pairs by a / b; "
            "a cost `expr` gives no such ratio"
        )
    if cost.b <= 0:
        raise ConfigError(
            f"{what} needs [cost] `b` > 0: with no attention term every layout of a "
            "micro-batch costs the same and CP planning has nothing to weigh"
        )
    if vision is not None:
        raise ConfigError(f"{what} cannot be combined with [vision] yet")
    linear = round(cost.a / cost.b)
    cap, cp = train.max_tokens_per_micro_batch, train.cp_size
    # Per micro-batch, at most `cap` tokens in at most `cap` samples, each padded by < 2cp.
    padded = cap * 2 * cp
    bound = train.bins * padded * (linear + padded + 1)
    if bound >= MAX_CP_STEP_WORK:
        raise ConfigError(
            f"{what}: a step's CP work (linear = round(a / b) = {linear} per token plus 2 per "
            f"attention pair) could reach {bound:.3g}, past int64's 2^62 margin; lower "
            "max_tokens_per_micro_batch or use a cost with a smaller a / b"
        )
    return replace(train, cp_linear=linear)


def _check_limit(where: str, what: str, value: int, limit: int, unit: str) -> None:
    if value > limit:
        raise ConfigError(
            f"{where}{what} = {value:.3g} {unit}; the limit is {limit} "
            f"(2^{limit.bit_length() - 1}, docs/config.md)"
        )


def check_sizes(train: TrainSpec, where: str) -> None:
    """Refuse step counts and step geometries whose plan could not be held (MAX_* above)."""
    _check_limit(where, "steps", train.steps, MAX_STEPS, "steps to plan")
    bins = f"dp_size = {train.dp_size} x micro_batches = {train.micro_batches}"
    _check_limit(where, bins, train.bins, MAX_BINS, "micro-batches per step")
    if train.samples_per_step is not None:
        what = f"steps = {train.steps} x samples_per_step = {train.samples_per_step}"
        total = train.steps * train.samples_per_step
        _check_limit(where, what, total, MAX_PLAN_SAMPLES, "samples to plan")


def check_chunk_size(train: TrainSpec, chunk_steps: int, where: str) -> None:
    """One chunk's arrays (its samples, its micro-batches) must stay within MAX_CHUNK_ITEMS."""
    steps = min(chunk_steps, train.steps)
    sps = train.samples_per_step or 0
    if sps >= train.bins:
        what, per_step = f"samples_per_step = {sps}", sps
    else:
        what, per_step = f"dp_size x micro_batches = {train.bins}", train.bins
    what = f"chunk_steps = {steps} x {what}"
    _check_limit(where, what, steps * per_step, MAX_CHUNK_ITEMS, "items in a chunk's arrays")


def parse_cost(table: Any, where: str, base: Path | None = None) -> CostSpec:
    """The `[cost]` table; `file = "..."` reads the table from another TOML file (relative
    to `base`, the config's directory), e.g. the output of `mds calibrate`."""
    where = f"{where}[cost]: "
    _table(table, COST_KEYS, where)
    table = {k: v for k, v in table.items() if k != "encoder"}  # parse_vision reads it
    if "file" in table:
        return _cost_file(table, where, base or Path.cwd())
    given = [k for k in ("expr", "model", "hf_config") if k in table] + (
        ["a/b"] if {"a", "b"} & set(table) else []
    )
    if len(given) > 1:
        raise ConfigError(
            f"{where}use one of `a`/`b`, `model`, `hf_config` or `expr`; got {', '.join(given)}"
        )
    if given and given[0] != "a/b":
        extra = [k for k in ("c", "d", "source", "fit_error") if k in table]
        if extra:
            raise ConfigError(f"{where}`{extra[0]}` goes with `a`/`b`, not with `{given[0]}`")
    if "expr" in table:
        expr = table["expr"]
        if not isinstance(expr, str) or not expr.strip():
            raise ConfigError(f"{where}`expr` must be a non-empty SQL expression string")
        return CostSpec(expr=expr, origin="expr")
    if "model" in table:
        return _model_cost(table["model"], f"{where}model: ")
    if "hf_config" in table:
        return _hf_config_cost(table["hf_config"], where, base or Path.cwd())
    a, b = _float(table, "a", where), _float(table, "b", where)
    c, d = _float(table, "c", where), _float(table, "d", where)
    if a is None and b is None:
        extra = [k for k in ("c", "d", "source", "fit_error") if k in table]
        if extra:
            raise ConfigError(f"{where}`{extra[0]}` needs `a` and `b`")
        return CostSpec()
    a, b = a or 0.0, b or 0.0
    if a == 0 and b == 0:
        raise ConfigError(f"{where}`a` and `b` cannot both be 0")
    source = table.get("source")
    if source is None:
        if "fit_error" in table:
            raise ConfigError(f'{where}`fit_error` needs `source = "calibrated"`')
        return CostSpec(a=a, b=b, origin="given", c=c or 0.0, d=d or 0.0)
    if source not in COST_SOURCES:
        raise ConfigError(
            f"{where}`source` must be one of {', '.join(COST_SOURCES)}, got {source!r}"
        )
    fit = _fit_error(table.get("fit_error"), where)
    return CostSpec(a=a, b=b, origin="calibrated", c=c or 0.0, d=d or 0.0, fit_error=fit)


def _model_cost(model: Any, where: str) -> CostSpec:
    """`[cost] model = { layers, hidden, ... }`: training FLOPs of that shape
    (src/mds/core/flops.py). With only layers/hidden/vocab/causal it is Narayanan et
    al.'s formula (a = 72*l*h^2 + 6*h*V, b = 12*l*h, 6*l*h causal) and the plan stores
    a and b only, as before the other keys existed."""
    from mds.core.flops import ModelShape, check_shape

    if not isinstance(model, dict):
        raise ConfigError(f"{where}must be a table with `layers` and `hidden`")
    check_keys(model, MODEL_KEYS, where)
    layers = _int(model, "layers", where)
    hidden = _int(model, "hidden", where)
    if layers is None or hidden is None:
        raise ConfigError(f"{where}`layers` and `hidden` are required")
    vocab = _int(model, "vocab", where, minimum=0, default=0)
    causal = model.get("causal", True)
    if not isinstance(causal, bool):
        raise ConfigError(f"{where}`causal` must be true or false, got {causal!r}")
    ffn = _int(model, "ffn", where)
    mlp = model.get("mlp")
    if mlp is not None and mlp not in ("gated", "plain"):
        raise ConfigError(f"{where}`mlp` must be one of gated, plain, got {mlp!r}")
    if (ffn is None) != (mlp is None):
        raise ConfigError(
            f"{where}`ffn` (the MLP's intermediate size) and `mlp` go together: "
            '`mlp = "gated"` for 3 matrices (Llama, Mistral, Qwen2), "plain" for 2 (GPT-2, '
            "GPT-NeoX)"
        )
    shape = check_shape(
        ModelShape(
            layers=layers,
            hidden=hidden,
            heads=_int(model, "heads", where),
            kv_heads=_int(model, "kv_heads", where),
            head_dim=_int(model, "head_dim", where),
            ffn=ffn,
            mlp=mlp or "plain",
            vocab=vocab,
            causal=causal,
        ),
        where,
    )
    a, b = shape.coefficients()
    legacy = set(model) <= {"layers", "hidden", "vocab", "causal"}
    return CostSpec(a=a, b=b, origin="model", shape=None if legacy else shape.describe())


def _hf_config_cost(name: Any, where: str, base: Path) -> CostSpec:
    """`[cost] hf_config = "config.json"`: the FLOPs of the shape a Hugging Face config
    describes, read from a local file (relative to `base`), never downloaded."""
    from mds.core.flops import hf_config_shape

    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}`hf_config` must be the path of a config.json")
    if is_url(name) or name.startswith(("http://", "https://", "hf://")):
        raise ConfigError(
            f"{where}`hf_config` must be a local file (it is never downloaded), got {name!r}"
        )
    shape = hf_config_shape(base / name, where)
    a, b = shape.coefficients()
    return CostSpec(a=a, b=b, origin="hf_config", shape=shape.describe())


def parse_vision(
    data: dict[str, Any], where: str, train: TrainSpec, base: Path | None = None
) -> VisionSpec | None:
    """`[vision]` (the image geometry, src/mds/core/vision.py) and `[cost] encoder`: a
    `{ a, b }` per image in patches, or a ViT's `{ layers, hidden }` (training FLOPs as for
    the backbone, with full attention: 72*l*h^2*P + 12*l*h*P^2). With `[cost] file`, the
    `encoder` of that file's [cost] table (e.g. `mds calibrate --encoder -o`) counts too."""
    table = data.get("vision")
    cost = data.get("cost") if isinstance(data.get("cost"), dict) else {}
    if isinstance(cost.get("file"), str) and cost["file"]:
        inner, path = _read_cost_file(cost, f"{where}[cost]: ", base or Path.cwd())
        if "encoder" in inner:
            if "encoder" in cost:
                raise ConfigError(f"{where}[cost]: `encoder` is both here and in {path}; keep one")
            cost, where = {"encoder": inner["encoder"]}, f"{path}: "
    if table is None:
        if "encoder" in cost:
            raise ConfigError(f"{where}[cost]: `encoder` needs a [vision] table")
        if train.max_patches_per_micro_batch is not None:
            raise ConfigError(
                f"{where}[train]: `max_patches_per_micro_batch` needs a [vision] table"
            )
        return None
    if not isinstance(table, dict):
        raise ConfigError(f"{where}[vision]: must be a table")
    geometry = VisionGeometry.from_json(table, f"{where}[vision]")
    encoder = cost.get("encoder", DEFAULT_ENCODER)
    ewhere = f"{where}[cost]: encoder: "
    if not isinstance(encoder, dict):
        raise ConfigError(f"{ewhere}must be a table {{ a, b }} or {{ layers, hidden }}")
    check_keys(encoder, ENCODER_KEYS, ewhere)
    shape = {"layers", "hidden"} & set(encoder)
    coefficients = {"a", "b", "d"} & set(encoder)
    if shape and coefficients:
        raise ConfigError(f"{ewhere}use `a`/`b`/`d` or `layers`/`hidden`, not both")
    if shape:
        layers, hidden = _int(encoder, "layers", ewhere), _int(encoder, "hidden", ewhere)
        if layers is None or hidden is None:
            raise ConfigError(f"{ewhere}`layers` and `hidden` are both required")
        origin = "default" if "encoder" not in cost else "model"
        a, b = 72.0 * layers * hidden * hidden, 12.0 * layers * hidden
        return VisionSpec(geometry, a, b, origin)
    a, b = _float(encoder, "a", ewhere) or 0.0, _float(encoder, "b", ewhere) or 0.0
    if a == 0 and b == 0:
        raise ConfigError(f"{ewhere}`a` and `b` cannot both be 0")
    return VisionSpec(geometry, a, b, "given", _float(encoder, "d", ewhere) or 0.0)


def _fit_error(value: Any, where: str) -> dict[str, Any]:
    """`fit_error = { max, median, points }` of a calibrated cost: relative errors, >= 0."""
    if value is None:
        raise ConfigError(
            f'{where}`fit_error` is required with `source = "calibrated"` '
            "(the { max, median, points } that mds calibrate writes)"
        )
    fwhere = f"{where}fit_error: "
    if not isinstance(value, dict):
        raise ConfigError(f"{fwhere}must be a table {{ max, median, points }}")
    check_keys(value, FIT_ERROR_KEYS, fwhere)
    for key in FIT_ERROR_KEYS:
        if key not in value:
            raise ConfigError(f"{fwhere}`{key}` is required")
    return {
        "max": _float(value, "max", fwhere),
        "median": _float(value, "median", fwhere),
        "points": _int(value, "points", fwhere),
    }


def _cost_file(table: dict[str, Any], where: str, base: Path) -> CostSpec:
    """`[cost] file = "cost.toml"`: the `[cost]` table of that file stands for this one."""
    others = sorted(set(table) - {"file"})
    if others:
        raise ConfigError(f"{where}`file` stands for the whole table; remove `{others[0]}`")
    name = table["file"]
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}`file` must be a path string")
    inner, path = _read_cost_file(table, where, base)
    return parse_cost(inner, f"{path}: ", path.parent)


def _read_cost_file(table: dict[str, Any], where: str, base: Path) -> tuple[dict[str, Any], Path]:
    """The `[cost]` table of the file `table["file"]` names, and its path."""
    path = base / table["file"]
    try:
        data = tomllib.loads(read_whole(path).decode("utf-8-sig"))
    except OSError as exc:
        raise ConfigError(f"{where}`file`: cannot read {path}: {exc.strerror}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{where}`file`: {path} is not valid TOML: {exc}") from None
    inner = data.get("cost")
    if not isinstance(inner, dict):
        raise ConfigError(f"{where}`file`: {path} has no [cost] table")
    if "file" in inner:
        raise ConfigError(f"{path}: [cost]: `file` cannot refer to another file")
    return inner, path


def parse_mix(table: dict[str, Any], where: str) -> MixSpec:
    if "weight" not in table:
        raise ConfigError(f"{where}`weight` is required for planning")
    weight = parse_schedule(table["weight"], f"{where}`weight`")
    filt = table.get("filter")
    if filt is not None and (not isinstance(filt, str) or not filt.strip()):
        raise ConfigError(f"{where}`filter` must be a non-empty SQL expression string")
    max_epochs = _int(table, "max_epochs", where)
    return MixSpec(table["name"], weight, filt, max_epochs, _warn_epochs(table, where))


# The most the sources' largest weights may add up to: a step's weights are summed in
# float64, which overflows past 1.8e308; this bound leaves ample room for rounding.
MAX_WEIGHT_SUM = 1e307


def _check_weight_sum(sources: list[MixSpec], where: str) -> None:
    """Refuse weights whose sum could overflow float64 at some step (only ratios matter, so
    such weights can always be scaled down), naming the source that takes the sum over."""
    total = 0.0
    for i, mix in enumerate(sources):
        total += max(mix.weight.weights)
        if total > MAX_WEIGHT_SUM:
            raise ConfigError(
                f"{where}[[source]] #{i + 1} ('{mix.name}'): `weight` {max(mix.weight.weights):g} "
                f"takes the sum of the sources' largest weights past {MAX_WEIGHT_SUM:g} "
                "(float64 overflows near 1.8e308); only their ratios matter: scale them down"
            )


def parse_plan_config(
    data: dict[str, Any], index_config: IndexConfig, *, path: Path | None = None
) -> PlanConfig:
    where = f"{path}: " if path else ""
    base = path.parent if path else Path.cwd()
    if "train" not in data:
        raise ConfigError(f"{where}[train] is required for planning")
    train = parse_train(data["train"], where)
    cost = parse_cost(data.get("cost", {}), where, base)
    plan = data.get("plan", {})
    if not isinstance(plan, dict):
        raise ConfigError(f"{where}[plan]: must be a table")
    check_keys(plan, PLAN_KEYS, f"{where}[plan]: ")
    index = plan.get("index")
    if index is not None and (not isinstance(index, str) or not index):
        raise ConfigError(f"{where}[plan]: `index` must be a path or URL string")
    # An s3:// root has no default index beside it: [index] output or --index names it.
    index_dir = place(base, index) or index_config.output or Path(index_config.root) / "index"
    sources = []
    for i, table in enumerate(data.get("source", [])):
        sources.append(parse_mix(table, f"{where}[[source]] #{i + 1} ('{table.get('name')}'): "))
    _check_weight_sum(sources, where)
    weights_by = [table.get("weight_by") for table in data.get("source", [])]
    for i, wb in enumerate(weights_by):
        if wb is not None and wb != train.weight_by:
            raise ConfigError(
                f"{where}[[source]] #{i + 1}: `weight_by = {wb!r}` differs from the run's "
                f"{train.weight_by!r} (set by {train.weight_by}_per_step); every source must use the same unit"
            )
    chunk_steps = _int(plan, "chunk_steps", f"{where}[plan]: ", default=DEFAULT_CHUNK_STEPS)
    check_chunk_size(train, chunk_steps, f"{where}[plan]: ")
    engine, address = parse_engine(plan, f"{where}[plan]: ")
    vision = parse_vision(data, where, train, base)
    if vision is not None and vision.origin == "default" and cost.origin == "calibrated":
        raise ConfigError(
            f"{where}[cost]: the backbone's cost is calibrated (seconds) and the encoder's would "
            "be the default FLOP formula, so the two parts could not be added; set `encoder` "
            "from `mds calibrate --encoder` (or give both as model shapes)"
        )
    train = with_cp_linear(train, cost, vision, where)
    online = parse_mixing(data, where, sources, train.steps, train.seed)
    return PlanConfig(
        train=train,
        cost=cost,
        sources=tuple(sources),
        index=index_dir if is_url(index_dir) else Path(index_dir).resolve(),
        chunk_steps=chunk_steps,
        workers=_int(plan, "workers", f"{where}[plan]: "),
        path=path,
        engine=engine,
        address=address,
        vision=vision,
        online=online,
    )


def load_plan_config(path: str | Path) -> PlanConfig:
    """Read a TOML config and validate everything planning needs."""
    path = Path(path)
    data = load_toml(path)  # once: a pipe or `<(...)` cannot be read twice
    return parse_plan_config(data, parse_config(data, path=path), path=path)


def plan_config_from_dict(data: dict[str, Any], base: Path) -> PlanConfig:
    """Same as load_plan_config for an already-parsed TOML document (tests, tools)."""
    fake = base / "config.toml"
    return parse_plan_config(data, parse_config(data, path=fake), path=fake)
