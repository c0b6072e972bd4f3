"""The planning config: [train], [cost], [plan] and the per-source mixing keys."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
from plan_builders import SAMPLE_CONFIG, train_table

from mds.errors import ConfigError
from mds.planner.plan.config import (
    DEFAULT_A,
    DEFAULT_B,
    DEFAULT_CHUNK_STEPS,
    epoch_warnings,
    load_plan_config,
    plan_config_from_dict,
)


def doc(train=None, sources=None, **tables):
    """A config document with two weighted sources."""
    data = {
        "source": sources
        if sources is not None
        else [
            {"name": "a", "path": "a/*", "count": "n", "weight": 1.0},
            {"name": "b", "path": "b/*", "count": "n", "weight": [[0, 1.0], [10, 3.0]]},
        ],
        "train": train_table() if train is None else train,
    }
    data.update(tables)
    return data


def parse(tmp_path, **kwargs):
    return plan_config_from_dict(doc(**kwargs), base=tmp_path)


def error(tmp_path, **kwargs) -> str:
    with pytest.raises(ConfigError) as err:
        parse(tmp_path, **kwargs)
    return str(err.value)


def test_minimal_config_and_defaults(tmp_path):
    cfg = parse(
        tmp_path,
        train={"steps": 3, "dp_size": 2, "samples_per_step": 4, "max_tokens_per_micro_batch": 9},
    )
    t = cfg.train
    assert (t.steps, t.dp_size, t.micro_batches, t.samples_per_step) == (3, 2, 1, 4)
    assert t.tokens_per_step is None
    assert (t.seed, t.overlong, t.weight_by) == (0, "error", "samples")
    assert t.bins == 2
    assert cfg.chunk_steps == DEFAULT_CHUNK_STEPS
    assert cfg.workers is None
    assert (cfg.cost.a, cfg.cost.b, cfg.cost.origin) == (DEFAULT_A, DEFAULT_B, "default")
    assert [s.name for s in cfg.sources] == ["a", "b"]
    assert cfg.sources[1].weight.kind == "linear"
    assert cfg.index == (tmp_path / "index").resolve()  # [index] output unset: root/index


def test_tokens_mode_sets_weight_by(tmp_path):
    cfg = parse(tmp_path, train=train_table(samples_per_step=None, tokens_per_step=3000))
    assert cfg.train.weight_by == "tokens"
    assert cfg.train.tokens_per_step == 3000


def test_index_location(tmp_path):
    assert parse(tmp_path, index={"output": "out/idx"}).index == (tmp_path / "out/idx").resolve()
    cfg = parse(tmp_path, index={"output": "out/idx"}, plan={"index": "other"})
    assert cfg.index == (tmp_path / "other").resolve()
    with pytest.raises(ConfigError, match=r"\[plan\]: `index` must be a path or URL string"):
        parse(tmp_path, plan={"index": 3})


def test_plan_table(tmp_path):
    cfg = parse(tmp_path, plan={"chunk_steps": 5, "workers": 2})
    assert (cfg.chunk_steps, cfg.workers) == (5, 2)
    assert "[plan]: `chunk_steps` must be an integer >= 1" in error(
        tmp_path, plan={"chunk_steps": 0}
    )
    msg = error(tmp_path, plan={"chunk_step": 5})
    assert "[plan]: unknown key `chunk_step`" in msg and "did you mean `chunk_steps`" in msg
    assert "[plan]: must be a table" in error(tmp_path, plan=3)


def test_load_plan_config_matches_dict(tmp_path):
    path = tmp_path / "mds.toml"
    path.write_text(
        """
[[source]]
name = "a"
path = "a/*"
count = "n"
weight = 0.5
filter = "n > 3"
max_epochs = 2

[train]
steps = 4
dp_size = 2
samples_per_step = 4
max_tokens_per_micro_batch = 100
""",
        encoding="utf-8",
    )
    cfg = load_plan_config(path)
    assert cfg.path == path
    assert cfg.sources[0].filter == "n > 3" and cfg.sources[0].max_epochs == 2
    assert cfg.sources[0].weight.describe() == 0.5
    msg = str(pytest.raises(ConfigError, load_plan_config, tmp_path / "nope.toml").value)
    assert "config file not found" in msg


def test_sample_config_parses():
    cfg = load_plan_config(SAMPLE_CONFIG)
    assert cfg.train.steps == 64 and cfg.train.dp_size == 4 and cfg.chunk_steps == 16
    assert cfg.cost.origin == "model"
    kinds = {s.name: s.weight.kind for s in cfg.sources}
    assert kinds == {
        "web": "constant",
        "books": "linear",
        "forum": "constant",
        "code": "stages",
        "wiki": "constant",
        "math": "constant",
    }


def test_canonical_is_normalized(tmp_path):
    a = parse(
        tmp_path,
        train=train_table(seed=3),
        sources=[{"name": "a", "path": "x", "count": "n", "weight": 1}],
    )
    b = parse(
        tmp_path,
        train=train_table(seed=3),
        sources=[{"name": "a", "path": "y/*", "count": "m", "weight": 1.0}],
    )
    assert a.canonical() == b.canonical()  # index-only keys do not change the plan
    c = a.canonical()
    assert set(c) == {"train", "cost", "chunk_steps", "sources"}
    assert c["sources"] == [{"name": "a", "weight": 1.0, "filter": None, "max_epochs": None}]
    assert c["cost"] == {"a": DEFAULT_A, "b": DEFAULT_B, "origin": "default"}
    assert c["train"]["seed"] == 3
    other = parse(
        tmp_path,
        train=train_table(seed=4),
        sources=[{"name": "a", "path": "x", "count": "n", "weight": 1}],
    )
    assert other.canonical() != c


# --- [train] errors ----------------------------------------------------------------------------


def test_unknown_train_key_has_a_hint(tmp_path):
    msg = error(tmp_path, train=train_table(sample_per_step=3))
    assert "[train]: unknown key `sample_per_step`" in msg
    assert "did you mean `samples_per_step`?" in msg
    msg = error(tmp_path, train=train_table(zzz=1))
    assert "unknown key `zzz`; expected one of steps, dp_size" in msg


@pytest.mark.parametrize("key", ["steps", "dp_size", "max_tokens_per_micro_batch"])
def test_required_train_keys(tmp_path, key):
    assert f"[train]: `{key}` is required" in error(tmp_path, train=train_table(**{key: None}))


def test_train_is_required(tmp_path):
    data = doc()
    del data["train"]
    with pytest.raises(ConfigError, match=r"\[train\] is required for planning"):
        plan_config_from_dict(data, base=tmp_path)
    assert "[train]: must be a table" in error(tmp_path, train=5)


@pytest.mark.parametrize("both", [True, False])
def test_exactly_one_step_size(tmp_path, both):
    train = train_table(tokens_per_step=100) if both else train_table(samples_per_step=None)
    assert "set exactly one of `samples_per_step` and `tokens_per_step`" in error(
        tmp_path, train=train
    )


def test_samples_per_step_at_least_dp_size(tmp_path):
    msg = error(tmp_path, train=train_table(dp_size=4, samples_per_step=3))
    assert "`samples_per_step` (3) must be at least `dp_size` (4)" in msg


def test_tokens_per_step_within_capacity(tmp_path):
    train = train_table(samples_per_step=None, tokens_per_step=4001)  # 2 x 2 x 1000
    assert "`tokens_per_step` (4001) exceeds the step's capacity" in error(tmp_path, train=train)
    parse(tmp_path, train=train_table(samples_per_step=None, tokens_per_step=4000))


@pytest.mark.parametrize(
    ("train", "message"),
    [
        (train_table(weight_by="tokens"), '`weight_by = "tokens"` needs `tokens_per_step`'),
        (
            train_table(samples_per_step=None, tokens_per_step=100, weight_by="samples"),
            '`weight_by = "samples"` needs `samples_per_step`',
        ),
        (train_table(weight_by="bytes"), "`weight_by` must be one of samples, tokens"),
    ],
)
def test_weight_by_mismatch(tmp_path, train, message):
    assert message in error(tmp_path, train=train)


def test_per_source_weight_by_mismatch(tmp_path):
    sources = [
        {"name": "a", "path": "a", "count": "n", "weight": 1},
        {"name": "b", "path": "b", "count": "n", "weight": 1, "weight_by": "tokens"},
    ]
    msg = error(tmp_path, sources=sources)
    assert "[[source]] #2: `weight_by = 'tokens'` differs from the run's 'samples'" in msg
    sources[1]["weight_by"] = "samples"
    parse(tmp_path, sources=sources)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("steps", 0, "`steps` must be an integer >= 1, got 0"),
        ("steps", 2.5, "`steps` must be an integer >= 1"),
        ("dp_size", True, "`dp_size` must be an integer >= 1, got True"),
        ("micro_batches", 0, "`micro_batches` must be an integer >= 1"),
        ("max_tokens_per_micro_batch", -5, "`max_tokens_per_micro_batch` must be an integer"),
        ("seed", -1, "`seed` must be an integer in [0, 2^63)"),
        ("seed", 2**63, "`seed` must be an integer in [0, 2^63)"),
        ("seed", "x", "`seed` must be an integer"),
        ("overlong", "clip", "`overlong` must be one of error, drop, truncate, got 'clip'"),
    ],
)
def test_bad_train_values(tmp_path, key, value, message):
    msg = error(tmp_path, train=train_table(**{key: value}))
    assert "[train]: " in msg and message in msg


# --- [cost] ------------------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [True, False, None])
def test_cost_model_formula(tmp_path, causal):
    model = {"layers": 3, "hidden": 64, "vocab": 1000}
    if causal is not None:
        model["causal"] = causal
    cost = parse(tmp_path, cost={"model": model}).cost
    layers, h, V = 3, 64, 1000
    assert cost.a == 72 * layers * h * h + 6 * h * V
    assert cost.b == (12 if causal is False else 6) * layers * h
    assert cost.origin == "model"
    assert cost.describe() == {"a": cost.a, "b": cost.b, "origin": "model"}


def test_cost_model_vocab_defaults_to_zero(tmp_path):
    cost = parse(tmp_path, cost={"model": {"layers": 2, "hidden": 8}}).cost
    assert (cost.a, cost.b) == (72 * 2 * 64, 6 * 2 * 8)


def test_cost_given_and_expr(tmp_path):
    cost = parse(tmp_path, cost={"a": 2, "b": 0.5}).cost
    assert (cost.a, cost.b, cost.origin) == (2.0, 0.5, "given")
    cost = parse(tmp_path, cost={"b": 1}).cost
    assert (cost.a, cost.b) == (0.0, 1.0)
    cost = parse(tmp_path, cost={"expr": "n_tokens * 2"}).cost
    assert (cost.expr, cost.origin) == ("n_tokens * 2", "expr")
    assert cost.describe() == {"expr": "n_tokens * 2"}


@pytest.mark.parametrize(
    ("cost", "message"),
    [
        (
            {"model": {"layers": 2, "hidden": 8}, "a": 1},
            "use one of `a`/`b`, `model`, `hf_config` or `expr`; got model, a/b",
        ),
        ({"model": {"layers": 2, "hidden": 8}, "b": 1}, "got model, a/b"),
        ({"expr": "n_tokens", "model": {"layers": 1, "hidden": 1}}, "got expr, model"),
        ({"expr": "n_tokens", "a": 1}, "got expr, a/b"),
        ({"a": 0, "b": 0}, "`a` and `b` cannot both be 0"),
        ({"a": -1}, "`a` must be a finite number >= 0"),
        ({"b": float("inf")}, "`b` must be a finite number >= 0"),
        ({"expr": "  "}, "`expr` must be a non-empty SQL expression string"),
        ({"expr": 3}, "`expr` must be a non-empty SQL expression string"),
        ({"model": {"layers": 2}}, "model: `layers` and `hidden` are required"),
        ({"model": {"layers": 2, "hidden": 8, "head": 4}}, "model: unknown key `head`"),
        ({"model": {"layers": 2, "hidden": 8, "heads": 3}}, "must be a multiple of `heads`"),
        ({"model": {"layers": 2, "hidden": 8, "kv_heads": 2}}, "`kv_heads` needs `heads`"),
        (
            {"model": {"layers": 2, "hidden": 8, "heads": 4, "kv_heads": 3}},
            "`heads` (4) must be a multiple of `kv_heads` (3)",
        ),
        ({"model": {"layers": 2, "hidden": 8, "ffn": 32}}, "`ffn` (the MLP's intermediate"),
        ({"model": {"layers": 2, "hidden": 8, "ffn": 32, "mlp": "swiglu"}}, "`mlp` must be"),
        ({"hf_config": "https://huggingface.co/x/config.json"}, "must be a local file"),
        ({"hf_config": "missing.json"}, "`hf_config`: cannot read"),
        ({"hf_config": "x.json", "a": 1}, "got hf_config, a/b"),
        ({"model": {"layers": 2, "hidden": 8, "causal": "yes"}}, "`causal` must be true or false"),
        ({"model": {"layers": 0, "hidden": 8}}, "`layers` must be an integer >= 1"),
        ({"model": 5}, "model: must be a table with `layers` and `hidden`"),
        ({"alpha": 1}, "unknown key `alpha`"),
    ],
)
def test_bad_cost(tmp_path, cost, message):
    msg = error(tmp_path, cost=cost)
    assert "[cost]: " in msg and message in msg


def test_cost_must_be_a_table(tmp_path):
    assert "[cost]: must be a table" in error(tmp_path, cost=[1])


CALIBRATED = {
    "source": "calibrated",
    "a": 6.5e-05,
    "b": 9.4e-08,
    "c": 0.0015,
    "fit_error": {"max": 0.258, "median": 0.093, "points": 37},
}


def test_cost_calibrated(tmp_path):
    cost = parse(tmp_path, cost=CALIBRATED).cost
    assert (cost.a, cost.b, cost.c, cost.origin) == (6.5e-05, 9.4e-08, 0.0015, "calibrated")
    assert cost.describe() == {
        "a": 6.5e-05,
        "b": 9.4e-08,
        "origin": "calibrated",
        "c": 0.0015,
        "fit_error": {"max": 0.258, "median": 0.093, "points": 37},
    }


def test_cost_typed_c_and_unchanged_canonical(tmp_path):
    # Without c, the canonical cost has exactly the keys it always had: plan bytes do not move.
    assert parse(tmp_path, cost={"a": 2, "b": 0.5}).cost.describe() == {
        "a": 2.0,
        "b": 0.5,
        "origin": "given",
    }
    cost = parse(tmp_path, cost={"a": 2, "b": 0.5, "c": 3}).cost
    assert cost.describe() == {"a": 2.0, "b": 0.5, "origin": "given", "c": 3.0}


def test_cost_per_sample_constant(tmp_path):
    cost = parse(tmp_path, cost={"a": 2, "b": 0.5, "d": 7}).cost
    assert (cost.d, cost.c) == (7.0, 0.0)
    assert cost.describe() == {"a": 2.0, "b": 0.5, "origin": "given", "d": 7.0}
    cost = parse(tmp_path, cost={**CALIBRATED, "d": 0.0008}).cost
    assert (cost.origin, cost.c, cost.d) == ("calibrated", 0.0015, 0.0008)
    assert cost.describe()["d"] == 0.0008
    # d = 0 is the same cost as no d: the canonical cost (and the plan's bytes) do not change.
    assert "d" not in parse(tmp_path, cost={"a": 2, "b": 0.5, "d": 0}).cost.describe()


def test_cost_file_reference(tmp_path):
    from mds.planner.calibrate.fit import Calibration, CostFit

    fit = CostFit(a=1e-4, b=2e-7, c=3e-3, rel_errors=(0.01, 0.02, 0.05))
    cal = Calibration("m", "cpu", 3, 0, [(1,), (2,), (1, 2)], [1.0, 2.0, 3.0], fit)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "cost.toml").write_text(cal.cost_table())
    cost = parse(tmp_path, cost={"file": "sub/cost.toml"}).cost
    assert (cost.a, cost.b, cost.c, cost.origin) == (1e-4, 2e-7, 3e-3, "calibrated")
    assert cost.fit_error == {"max": 0.05, "median": 0.02, "points": 3}


@pytest.mark.parametrize(
    ("cost", "message"),
    [
        ({"a": 1, "fit_error": CALIBRATED["fit_error"]}, 'needs `source = "calibrated"`'),
        ({**CALIBRATED, "source": "measured"}, "`source` must be one of calibrated"),
        ({k: v for k, v in CALIBRATED.items() if k != "fit_error"}, "`fit_error` is required"),
        ({**CALIBRATED, "fit_error": 0.1}, "fit_error: must be a table"),
        ({**CALIBRATED, "fit_error": {"max": 0.1, "median": 0.1}}, "fit_error: `points`"),
        ({**CALIBRATED, "fit_error": {"max": -1, "median": 0, "points": 1}}, "`max` must be"),
        ({**CALIBRATED, "fit_error": {"max": 1, "median": 0, "points": 1, "p9": 1}}, "`p9`"),
        ({"c": 1}, "`c` needs `a` and `b`"),
        ({"source": "calibrated"}, "`source` needs `a` and `b`"),
        ({"expr": "n_tokens", "c": 1}, "`c` goes with `a`/`b`, not with `expr`"),
        ({"a": 1, "c": -1}, "`c` must be a finite number >= 0"),
        ({"d": 1}, "`d` needs `a` and `b`"),
        ({"expr": "n_tokens", "d": 1}, "`d` goes with `a`/`b`, not with `expr`"),
        ({"model": {"layers": 2, "hidden": 8}, "d": 1}, "`d` goes with `a`/`b`, not with `model`"),
        ({"a": 1, "d": -1}, "`d` must be a finite number >= 0"),
        ({"a": 1, "d": "1e-3"}, "`d` must be a finite number >= 0"),
        ({"file": "cost.toml", "a": 1}, "`file` stands for the whole table; remove `a`"),
        ({"file": 3}, "`file` must be a path string"),
        ({"file": "missing.toml"}, "`file`: cannot read"),
    ],
)
def test_bad_calibrated_cost(tmp_path, cost, message):
    msg = error(tmp_path, cost=cost)
    assert "[cost]: " in msg and message in msg


def test_cost_file_errors(tmp_path):
    (tmp_path / "bad.toml").write_text("a = [")
    assert "is not valid TOML" in error(tmp_path, cost={"file": "bad.toml"})
    (tmp_path / "empty.toml").write_text("a = 1\n")
    assert "has no [cost] table" in error(tmp_path, cost={"file": "empty.toml"})
    (tmp_path / "loop.toml").write_text('[cost]\nfile = "loop.toml"\n')
    assert "cannot refer to another file" in error(tmp_path, cost={"file": "loop.toml"})
    (tmp_path / "neg.toml").write_text("[cost]\na = -1\n")
    msg = error(tmp_path, cost={"file": "neg.toml"})
    assert "neg.toml: [cost]: `a` must be" in msg


# --- per-source keys ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"weight": None}, "('a'): `weight` is required for planning"),
        ({"weight": -1}, "('a'): `weight` must be >= 0"),
        ({"weight": [[3, 1], [1, 1]]}, "('a'): `weight`[1]: steps must be strictly increasing"),
        ({"weight": {"stages": [[0, 1]], "x": 1}}, "exactly one key"),
        ({"filter": ""}, "('a'): `filter` must be a non-empty SQL expression string"),
        ({"filter": 3}, "`filter` must be a non-empty SQL expression string"),
        ({"max_epochs": 0}, "('a'): `max_epochs` must be an integer >= 1"),
    ],
)
def test_bad_source_keys(tmp_path, extra, message):
    table = {"name": "a", "path": "a", "count": "n", "weight": 1.0, **extra}
    table = {k: v for k, v in table.items() if v is not None}
    msg = error(tmp_path, sources=[table])
    assert "[[source]] #1" in msg and message in msg


def test_error_names_the_config_file(tmp_path):
    path = tmp_path / "mds.toml"
    path.write_text(
        '[[source]]\nname = "a"\npath = "a"\ncount = "n"\nweight = 1\n'
        "[train]\nsteps = 1\ndp_size = 2\nsamples_per_step = 1\nmax_tokens_per_micro_batch = 5\n",
        encoding="utf-8",
    )
    with pytest.raises(ConfigError) as err:
        load_plan_config(path)
    assert str(err.value).startswith(f"{Path(path)}: [train]: ")


def test_load_plan_config_accepts_a_utf8_byte_order_mark(tmp_path):
    path = tmp_path / "mds.toml"
    text = (
        '[[source]]\nname = "a"\npath = "a/*"\ncount = "n"\nweight = 1.0\n\n'
        "[train]\nsteps = 4\ndp_size = 2\nsamples_per_step = 4\n"
        "max_tokens_per_micro_batch = 100\n"
    )
    path.write_bytes(b"\xef\xbb\xbf" + text.encode())
    cfg = load_plan_config(path)
    assert [s.name for s in cfg.sources] == ["a"] and cfg.train.steps == 4


@pytest.mark.parametrize(
    ("train", "needle"),
    [
        ({"steps": 10**15}, "steps = 1e+15 steps to plan; the limit is 134217728 (2^27"),
        (
            {"steps": 10**8, "samples_per_step": 2**20},
            "steps = 100000000 x samples_per_step = 1048576 = 1.05e+14 samples to plan",
        ),
        (
            {"dp_size": 2**20, "samples_per_step": 2**21},
            "micro-batches per step; the limit is 1048576",
        ),
        (
            {"samples_per_step": 10**7},
            "chunk_steps = 8 x samples_per_step = 10000000 = 8e+07 items",
        ),
        ({"dp_size": 1e8}, "`dp_size` must be an integer >= 1, got 100000000.0"),
        ({"micro_batches": 2.0}, "`micro_batches` must be an integer >= 1, got 2.0"),
    ],
)
def test_absurd_sizes_refused(tmp_path, train, needle):
    assert needle in error(tmp_path, train=train_table(**train))


def test_sizes_at_the_limits_accepted(tmp_path):
    assert parse(tmp_path, train=train_table(steps=2**27, samples_per_step=8)).train.steps == 2**27


@pytest.mark.parametrize(
    ("weights", "source"),
    [
        ([1e308, 1.0], "#1 ('a')"),
        ([6e306, 6e306], "#2 ('b')"),
        ([1.0, {"points": [[0, 1.0], [5, 1.7e308]]}], "#2 ('b')"),
        ([1.0, 0.5, 5e306, 6e306], "#4 ('d')"),
    ],
)
def test_weights_whose_sum_overflows_are_refused_naming_the_source(tmp_path, weights, source):
    sources = [
        {"name": name, "path": f"{name}/*", "count": "n", "weight": w}
        for name, w in zip("abcd", weights, strict=False)
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        message = error(tmp_path, sources=sources)
    assert f"[[source]] {source}: `weight`" in message, message
    assert "scale them down" in message


def test_large_weights_whose_sum_fits_are_fine(tmp_path):
    sources = [
        {"name": n, "path": f"{n}/*", "count": "n", "weight": 3e306} for n in ("a", "b", "c")
    ]
    assert [s.weight.weights for s in parse(tmp_path, sources=sources).sources] == [(3e306,)] * 3


# --- warn_epochs -------------------------------------------------------------------------------


def test_warn_epochs_is_recorded_only_when_set(tmp_path):
    plain = parse(tmp_path)
    assert plain.train.warn_epochs is None and plain.sources[0].warn_epochs is None
    canonical = plain.canonical()
    assert "warn_epochs" not in canonical["train"]  # other plans keep their bytes
    assert all("warn_epochs" not in s for s in canonical["sources"])
    sources = doc()["source"]
    sources[1]["warn_epochs"] = 10
    cfg = parse(tmp_path, train={**train_table(), "warn_epochs": 3.5}, sources=sources)
    assert (cfg.train.warn_epochs, cfg.sources[1].warn_epochs) == (3.5, 10.0)
    canonical = cfg.canonical()
    assert canonical["train"]["warn_epochs"] == 3.5
    assert [s.get("warn_epochs") for s in canonical["sources"]] == [None, 10.0]


@pytest.mark.parametrize("value", [0, -1, "2", True, float("inf")])
def test_bad_warn_epochs(tmp_path, value):
    message = error(tmp_path, train={**train_table(), "warn_epochs": value})
    assert "[train]: `warn_epochs` must be" in message
    sources = doc()["source"]
    sources[0]["warn_epochs"] = value
    assert "('a'): `warn_epochs` must be" in error(tmp_path, sources=sources)


def test_epoch_warnings():
    config = {
        "train": {},
        "sources": [
            {"name": "a", "max_epochs": None},
            {"name": "b", "max_epochs": 4},  # bounded already: no warning
            {"name": "c", "max_epochs": None, "warn_epochs": 100.0},
            {"name": "d", "max_epochs": None},
        ],
    }
    planned = [
        {"name": "a", "epochs": 3.2},
        {"name": "b", "epochs": 3.9},
        {"name": "c", "epochs": 95.8},
        {"name": "d", "epochs": 2.0},  # at the threshold: fine
    ]
    (only,) = epoch_warnings(config, planned)
    assert only.startswith("source 'a' is drawn 3.20 epochs") and "warn_epochs = 2" in only
    config["train"]["warn_epochs"] = 1.5
    assert [w.split("'")[1] for w in epoch_warnings(config, planned)] == ["a", "d"]
