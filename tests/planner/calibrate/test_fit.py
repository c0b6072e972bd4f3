"""The calibration fit (exact on synthetic timings, its error report, bad input as one-line
errors), the grid, model loading and the timing harness on a tiny model (no timed asserts)."""

from __future__ import annotations

import math
import tomllib

import pytest

from mds.errors import ConfigError
from mds.planner.calibrate import fit as cal
from mds.planner.calibrate.packed_gpt import GptShape, build_packed_gpt
from mds.planner.plan.config import parse_cost

GRID = cal.calibration_grid([32, 64, 256, 1024], 2048, mixed=3, seed=1)


def synthetic(a: float, b: float, c: float, grid=GRID, d: float = 0.0) -> list[float]:
    return [a * sum(mb) + b * sum(x * x for x in mb) + d * len(mb) + c for mb in grid]


@pytest.mark.parametrize(
    ("a", "b", "c"), [(6e-5, 9e-8, 2e-3), (1e-4, 0.0, 5e-3), (0.0, 1e-7, 0.0), (3e-5, 2e-8, 0.0)]
)
def test_fit_recovers_exact_coefficients(a, b, c):
    fit = cal.fit_cost(GRID, synthetic(a, b, c))
    for got, want in ((fit.a, a), (fit.b, b), (fit.c, c)):
        assert math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-15)
    assert fit.max_error < 1e-9
    assert min(fit.a, fit.b, fit.c) >= 0


@pytest.mark.parametrize(
    ("a", "b", "c", "d"),
    [(6e-5, 9e-8, 2e-3, 7e-4), (4e-5, 1e-7, 0.0, 8e-4), (1e-4, 0.0, 0.0, 1e-3)],
)
def test_fit_recovers_a_per_sample_overhead(a, b, c, d):
    seconds = synthetic(a, b, c, d=d)
    fit = cal.fit_cost(GRID, seconds)
    for got, want in ((fit.a, a), (fit.b, b), (fit.c, c), (fit.d, d)):
        assert math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-15)
    assert fit.max_error < 1e-9
    assert all(
        math.isclose(fit.predict(mb), s, rel_tol=1e-9) for mb, s in zip(GRID, seconds, strict=True)
    )
    # The three-term model cannot express it: many short samples cost more than it predicts.
    three = cal.fit_cost(GRID, seconds, per_sample=False)
    assert three.d == 0 and three.max_error > 0.05
    many = max(range(len(GRID)), key=lambda i: len(GRID[i]))
    assert three.predict(GRID[many]) < seconds[many]


def test_fit_without_sample_count_variety_keeps_d_zero():
    # One sample per micro-batch: d and c are the same column, so d is not fitted.
    grid = [(16,), (32,), (64,), (128,)]
    fit = cal.fit_cost(grid, [1e-4 * x + 2e-3 for (x,) in grid])
    assert fit.d == 0 and math.isclose(fit.c, 2e-3, rel_tol=1e-9) and fit.max_error < 1e-9


def test_fit_never_negative():
    # A large overhead makes the unconstrained fit want b < 0: the fit keeps every term >= 0.
    grid = [(10,), (20,), (40,), (10, 10), (80,)]
    fit = cal.fit_cost(grid, [1.0, 1.1, 1.2, 1.1, 1.3])
    assert min(fit.a, fit.b, fit.c, fit.d) >= 0 and fit.a > 0


def test_fit_refuses_a_cost_that_ignores_length():
    grid = [(10,), (20,), (40,), (10, 10)]
    with pytest.raises(ConfigError, match="does not grow with sample length"):
        cal.fit_cost(grid, [1.0, 0.9, 0.8, 1.0])


def test_fit_error_report():
    seconds = synthetic(6e-5, 9e-8, 2e-3)
    seconds[0] *= 1.5  # one slow point
    fit = cal.fit_cost(GRID, seconds)
    assert len(fit.rel_errors) == len(GRID)
    assert fit.max_error == max(fit.rel_errors) > 0.1
    assert fit.median_error < fit.max_error
    for mb, s, e in zip(GRID, seconds, fit.rel_errors, strict=True):
        assert math.isclose(e, abs(fit.predict(mb) - s) / s, rel_tol=1e-9)
    assert fit.fit_error() == {
        "max": round(fit.max_error, 4),
        "median": round(fit.median_error, 4),
        "points": len(GRID),
    }


@pytest.mark.parametrize(
    ("grid", "seconds", "message"),
    [
        ([(8,), (8, 8), (8, 8, 8)], [1.0, 2.0, 3.0], "at least 2 sample lengths"),
        ([(8,), (16,)], [1.0, 2.0], "need at least 3 different micro-batches"),
        ([(8,), (16,), (8, 16)], [1.0, 0.0, 2.0], "calibration point 1: time must be > 0"),
        ([(8,), (16,), (8, 16)], [1.0, float("nan"), 2.0], "time must be > 0"),
        ([(8,), (0,), (8, 16)], [1.0, 1.0, 2.0], "calibration point 1: every sample length"),
        ([(8,), (), (8, 16)], [1.0, 1.0, 2.0], "calibration point 1"),
        ([(8,), (16,)], [1.0], "2 micro-batches but 1 timings"),
    ],
)
def test_fit_bad_input(grid, seconds, message):
    with pytest.raises(ConfigError, match="calibration") as err:
        cal.fit_cost(grid, seconds)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_grid():
    grid = cal.calibration_grid([64, 32], 128, mixed=2, seed=0)
    uniform = [mb for mb in grid if len(set(mb)) == 1]
    assert uniform[:5] == [(32,), (32, 32), (32,) * 4, (64,), (64, 64)]
    assert all(sum(mb) <= 128 for mb in grid)
    assert len(grid) == 7
    assert grid == cal.calibration_grid([64, 32], 128, mixed=2, seed=0)  # seeded


@pytest.mark.parametrize(
    ("lengths", "max_tokens", "message"),
    [
        ([], 10, "--lengths: give at least two"),
        ([0, 8], 10, "--lengths: lengths must be >= 1, got 0"),
        ([8, 64], 32, "--lengths: 64 exceeds --max-tokens 32"),
    ],
)
def test_grid_bad_input(lengths, max_tokens, message):
    with pytest.raises(ConfigError, match=message):
        cal.calibration_grid(lengths, max_tokens)


def test_load_model(tmp_path, monkeypatch):
    (tmp_path / "my_models_for_calibration.py").write_text(
        "import torch\n"
        "def build():\n    return torch.nn.Identity()\n"
        "value = 3\n"
        "def text():\n    return 'not a model'\n"
        "def sized(hidden):\n    return torch.nn.Identity()\n"
        "def broken():\n    raise RuntimeError('no GPU here\\nsecond line')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import torch

    assert isinstance(cal.load_model("my_models_for_calibration:build"), torch.nn.Identity)
    for spec, message in [
        ("nocolon", "--model must be module:function"),
        ("m:", "--model must be module:function"),
        ("no_such_module_xyz:build", "cannot import 'no_such_module_xyz'"),
        ("my_models_for_calibration:missing", "has no function 'missing'"),
        ("my_models_for_calibration:value", "has no function 'value'"),
        ("os:getcwd", "os:getcwd: getcwd\\(\\) returned str, not a torch.nn.Module"),
        ("my_models_for_calibration:text", "text\\(\\) returned str, not a torch.nn.Module"),
        ("my_models_for_calibration:sized", "sized\\(hidden\\) needs arguments"),
        ("my_models_for_calibration:broken", "broken\\(\\) raised RuntimeError: no GPU here;"),
    ]:
        with pytest.raises(ConfigError, match=message) as info:
            cal.load_model(spec)
        assert "\n" not in str(info.value)
        if "returned" in message or "needs" in message or "raised" in message:
            assert str(info.value).endswith(f"--model must be {cal.MODEL_FORM}")


def test_a_model_whose_forward_has_the_wrong_form_is_named(tmp_path, monkeypatch):
    import torch

    with pytest.raises(ConfigError) as info:
        cal.check_model(torch.nn.Linear(2, 2), "m:build", vocab=16, device="cpu")
    message = str(info.value)
    assert message.startswith("--model m:build: one forward+backward failed (TypeError: ")
    assert message.endswith(f"--model must be {cal.MODEL_FORM}") and "\n" not in message


def test_clock_and_device_choices():
    assert cal.pick_clock("auto", "cpu") == "cpu"
    assert cal.pick_clock("auto", "cuda:0") == "wall"
    with pytest.raises(ConfigError, match="--clock must be"):
        cal.pick_clock("tsc", "cpu")
    with pytest.raises(ConfigError, match="use --clock wall on cuda"):
        cal.pick_clock("cpu", "cuda")
    assert cal.pick_device("cpu") == "cpu"
    with pytest.raises(ConfigError, match="--device must be"):
        cal.pick_device("tpu")


def test_time_grid_and_cost_table():
    grid = cal.calibration_grid([4, 8], 16, mixed=1, seed=0)
    model = build_packed_gpt(GptShape(layers=1, hidden=8, heads=2, vocab=16))
    seen = []
    seconds = cal.time_grid(
        model, grid, vocab=16, repeats=2, warmup=1, seed=0, device="cpu", clock="cpu",
        advance=seen.append,
    )  # fmt: skip
    assert len(seconds) == len(grid) and all(s >= 0 for s in seconds)
    assert sum(seen) == 3 * len(grid)
    assert all(p.grad is None for p in model.parameters())
    # a tiny model's times are all overhead
    seconds = synthetic(1e-4, 1e-7, 1e-3, grid, d=5e-4)
    result = cal.Calibration("tiny", "cpu", 2, 0, grid, seconds, cal.fit_cost(grid, seconds))
    table = tomllib.loads(result.cost_table())["cost"]
    cost = parse_cost(table, "")
    assert cost.origin == "calibrated"
    f = result.fit
    assert (cost.a, cost.b, cost.c, cost.d) == pytest.approx((f.a, f.b, f.c, f.d))
    data = result.to_json()
    assert data["cost"]["fit_error"]["points"] == len(grid) == len(data["points"])
    assert data["cost"]["d"] == f.d


def test_time_grid_statistic():
    grid = cal.calibration_grid([4, 8], 16, mixed=0, seed=0)
    model = build_packed_gpt(GptShape(layers=1, hidden=8, heads=2, vocab=16))
    rounds = []

    def record(times):
        rounds.append(list(times))
        return min(times)

    seconds = cal.time_grid(
        model, grid, vocab=16, repeats=3, warmup=0, seed=0, device="cpu", clock="cpu",
        statistic=record,
    )  # fmt: skip
    assert len(rounds) == len(grid) and all(len(r) == 3 for r in rounds)
    assert seconds == [min(r) for r in rounds]


def test_time_grid_needs_repeats():
    with pytest.raises(ConfigError, match="--repeats must be >= 1"):
        cal.time_grid(None, [], vocab=1, repeats=0, warmup=0, seed=0, device="cpu")


def test_inputs_are_seeded():
    a_ids, a_cu = cal.micro_batch_inputs([3, 5], 50, 7, "cpu")
    b_ids, b_cu = cal.micro_batch_inputs([3, 5], 50, 7, "cpu")
    assert a_ids.equal(b_ids) and a_cu.tolist() == b_cu.tolist() == [0, 3, 8]
    assert a_ids.shape == (1, 8) and int(a_ids.max()) < 50
    assert not cal.micro_batch_inputs([3, 5], 50, 8, "cpu")[0].equal(a_ids)


# --- the image encoder's calibration (--encoder): patches per image in place of lengths ---

PATCH_GRID = cal.calibration_grid([16, 64, 256, 1024], 2048, mixed=3, seed=2, axis=cal.PATCHES)


@pytest.mark.parametrize(
    ("a", "b", "c", "d"), [(2.5e-5, 9e-8, 1.8e-3, 5.6e-4), (4e-5, 2e-8, 0.0, 0.0)]
)
def test_encoder_fit_recovers_exact_coefficients(a, b, c, d):
    seconds = synthetic(a, b, c, PATCH_GRID, d=d)
    fit = cal.fit_cost(PATCH_GRID, seconds, axis=cal.PATCHES)
    for got, want in ((fit.a, a), (fit.b, b), (fit.c, c), (fit.d, d)):
        assert math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-15)
    # Without a per-image term (what the encoder's [cost] holds) the fit is exact only if
    # there is none to absorb.
    three = cal.fit_cost(PATCH_GRID, seconds, per_sample=False, axis=cal.PATCHES)
    assert three.d == 0 and (three.max_error < 1e-9) == (d == 0)


def test_encoder_table_is_the_encoder_cost_of_a_vision_config(tmp_path):
    from mds.planner.plan.config import plan_config_from_dict

    seconds = synthetic(2.5e-5, 9e-8, 1.8e-3, PATCH_GRID, d=5.6e-4)
    result = cal.Calibration(
        "tiny ViT", "cpu", 1, 0, PATCH_GRID, seconds,
        cal.fit_cost(PATCH_GRID, seconds, per_sample=False, axis=cal.PATCHES),
        encoder=True, per_image=cal.fit_cost(PATCH_GRID, seconds, axis=cal.PATCHES),
    )  # fmt: skip
    text = result.cost_table()
    assert text.startswith("[cost]\n# mds calibrate --encoder: tiny ViT on cpu")
    assert "d = 0.00056" in text and "not written" in text
    written = tomllib.loads(text)["cost"]
    assert set(written) == {"encoder"} and set(written["encoder"]) == {"a", "b", "d"}
    config = tomllib.loads(
        '[[source]]\nname = "plain"\npath = "plain.jsonl"\ntext = "text"\nweight = 1.0\n'
        "[train]\nsteps = 1\ndp_size = 2\nmicro_batches = 1\nsamples_per_step = 4\n"
        "max_tokens_per_micro_batch = 4096\n"
        "[vision]\n"
    )
    vision = plan_config_from_dict({**config, "cost": written}, tmp_path).vision
    assert vision is not None and vision.origin == "given"
    g = result.per_image
    assert (vision.a, vision.b, vision.d) == pytest.approx((g.a, g.b, g.d), rel=1e-5)
    assert vision.d == pytest.approx(5.6e-4, rel=1e-5)
    data = result.to_json()
    assert data["encoder"] is True and data["cost"] == {"encoder": {"a": g.a, "b": g.b, "d": g.d}}
    assert data["fit_per_image"]["d"] == pytest.approx(5.6e-4, rel=1e-9)
    assert data["points"][0]["patches"] == list(PATCH_GRID[0])


def test_encoder_messages_name_the_patch_flags():
    with pytest.raises(ConfigError, match="--patches: 4096 exceeds --max-patches 2048"):
        cal.calibration_grid([64, 4096], 2048, axis=cal.PATCHES)
    with pytest.raises(ConfigError, match="image patch count.*widen --patches"):
        cal.fit_cost([(16,), (16, 16), (16,) * 4], [1.0, 2.0, 4.0], axis=cal.PATCHES)


def test_encoder_inputs_and_timing():
    from mds.planner.calibrate.packed_vit import VitShape, build_packed_vit

    a_px, a_cu = cal.encoder_inputs([3, 5], 12, 7, "cpu")
    assert a_px.shape == (8, 12) and a_cu.tolist() == [0, 3, 8]
    assert a_px.equal(cal.encoder_inputs([3, 5], 12, 7, "cpu")[0])
    shape = VitShape(layers=1, hidden=8, heads=2, patch_size=2, temporal_patch_size=1)
    model = build_packed_vit(shape)
    grid = cal.calibration_grid([4, 8], 16, mixed=1, seed=0, axis=cal.PATCHES)
    seconds = cal.time_grid(
        model, grid, inputs=cal.patch_inputs(shape.patch_dim), repeats=1, warmup=0, seed=0,
        device="cpu", clock="cpu",
    )  # fmt: skip
    assert len(seconds) == len(grid) and all(p.grad is None for p in model.parameters())
    cal.check_model(model, "m:build", inputs=cal.patch_inputs(shape.patch_dim))
    with pytest.raises(ConfigError) as info:
        cal.check_model(
            torch_linear(), "m:build", inputs=cal.patch_inputs(12), form=cal.ENCODER_FORM
        )
    assert str(info.value).endswith(f"--model must be {cal.ENCODER_FORM}")


def torch_linear():
    import torch

    return torch.nn.Linear(2, 2)
