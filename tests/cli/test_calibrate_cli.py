"""`mds calibrate` from the command line on a tiny built-in model and grid (seconds): the
[cost] table it prints and writes, --json, and one-line errors for bad flags."""

from __future__ import annotations

import json
import re
import tomllib

import pytest
from cli_helpers import mds, one_error_line

from mds.planner.plan.config import parse_cost

TINY = ("--layers", "1", "--hidden", "16", "--heads", "2", "--vocab", "64", "--threads", "1")
GRID = ("--lengths", "16,256", "--max-tokens", "256", "--mixed", "1", "--repeats", "1")


def test_calibrate_writes_a_cost_table(tmp_path):
    out = tmp_path / "cost.toml"
    result = mds("calibrate", *TINY, *GRID, "--warmup", "0", "-o", out)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(
        "[cost]\n# mds calibrate: built-in GPT (layers = 1, hidden = 16"
    )
    assert out.read_text() == result.stdout
    table = tomllib.loads(result.stdout)["cost"]
    assert table["source"] == "calibrated"
    assert table["fit_error"]["points"] == 7  # 16 x 1..16, 256 x 1, one mixed
    cost = parse_cost(table, "")
    assert cost.origin == "calibrated" and cost.c == table["c"] and cost.d == table["d"]
    assert "median of 1 repeats" in result.stdout
    assert "fit error over 7 micro-batches" in result.stderr
    assert 'file = "' in result.stderr


def test_calibrate_hint_names_the_file_wherever_the_config_is(tmp_path, monkeypatch):
    """`[cost] file` is read relative to the config's directory, not to where calibrate
    ran: the printed line, pasted into a config elsewhere, names the written table."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "build").mkdir()
    result = mds("calibrate", *TINY, *GRID, "--warmup", "0", "-o", "build/cost.toml")
    assert result.exit_code == 0, result.output
    where = re.search(r'\[cost\] file = (".*?") \(a relative file', result.stderr).group(1)
    table = tomllib.loads(f"[cost]\nfile = {where}\n")["cost"]
    assert table["file"] == (tmp_path / "build" / "cost.toml").resolve().as_posix()
    elsewhere = tmp_path / "configs" / "deep"
    elsewhere.mkdir(parents=True)
    cost = parse_cost(table, "", elsewhere)
    assert cost.origin == "calibrated"


def test_calibrate_json(tmp_path):
    result = mds("calibrate", *TINY, *GRID, "--json", "--seed", "3", "--statistic", "min")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["cost"]["source"] == "calibrated" and data["statistic"] == "min"
    assert data["cost"]["d"] >= 0
    assert data["device"] == "cpu" and data["clock"] == "cpu" and data["seed"] == 3
    assert [p["lengths"] for p in data["points"]][:2] == [[16], [16, 16]]
    assert data["output"] is None
    assert {"seconds", "predicted", "rel_error"} <= set(data["points"][0])


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (("--lengths", "64"), ("--lengths needs at least two different lengths",)),
        (("--lengths", "8,x"), ("--lengths must be comma-separated integers",)),
        (("--lengths", "8,64", "--max-tokens", "32"), ("--lengths: 64 exceeds --max-tokens 32",)),
        (("--model", "nocolon"), ("--model must be module:function",)),
        (("--model", "no_such_module_xyz:build"), ("--model", "cannot import")),
        (("--device", "tpu"), ("--device must be auto, cpu or cuda",)),
        (("--clock", "tsc"), ("--clock must be auto, wall or cpu",)),
        (("--statistic", "mean"), ("--statistic must be median or min",)),
        (("--hidden", "10", "--heads", "4"), ("--hidden (10) must be a multiple of --heads (4)",)),
    ],
)
def test_calibrate_bad_flags(args, needles):
    result = mds("calibrate", "--lengths", "16,32", "--max-tokens", "64", "--repeats", "1", *args)
    one_error_line(result, *needles)


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("os:getcwd", "--model os:getcwd: getcwd() returned str, not a torch.nn.Module"),
        ("calibration_bad_model:forward_wrong", "one forward+backward failed (TypeError"),
        ("calibration_bad_model:raises", "raises() raised ValueError: nope"),
    ],
)
def test_calibrate_a_model_that_is_not_a_model_factory(tmp_path, monkeypatch, spec, needle):
    from mds.planner.calibrate.fit import MODEL_FORM

    (tmp_path / "calibration_bad_model.py").write_text(
        "import torch\n"
        "def forward_wrong():\n    return torch.nn.Linear(4, 4)\n"
        "def raises():\n    raise ValueError('nope')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    result = mds("calibrate", "--model", spec, "--vocab", "64", *GRID)
    one_error_line(result, needle, f"--model must be {MODEL_FORM}")


def test_calibrate_a_model_from_module_function(tmp_path, monkeypatch):
    (tmp_path / "calibration_user_model.py").write_text(
        "from mds.planner.calibrate.packed_gpt import GptShape, build_packed_gpt\n"
        "def build():\n"
        "    return build_packed_gpt(GptShape(layers=1, hidden=16, heads=2, vocab=64))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    result = mds("calibrate", "--model", "calibration_user_model:build", "--vocab", "64", *GRID)
    assert result.exit_code == 0, result.output
    assert "# mds calibrate: --model calibration_user_model:build on cpu" in result.stdout
    assert tomllib.loads(result.stdout)["cost"]["source"] == "calibrated"


def test_calibrate_unwritable_output(tmp_path):
    out = tmp_path / "missing-dir" / "cost.toml"
    result = mds("calibrate", *TINY, *GRID, "-o", out)
    one_error_line(result, str(out), "cannot write the [cost] table")


# --- --encoder: a tiny ViT over packed images --------------------------------------------

VIT = ("--encoder", "--layers", "1", "--hidden", "16", "--heads", "2", "--patch-size", "4")
PATCH_GRID = ("--patches", "4,16,64", "--max-patches", "128", "--mixed", "1", "--repeats", "1")
VISION_CONFIG = """
[[source]]
name = "plain"
path = "plain.jsonl"
text = "text"
weight = 1.0

[train]
steps = 1
dp_size = 2
micro_batches = 1
samples_per_step = 4
max_tokens_per_micro_batch = 4096

[vision]
"""


def test_calibrate_encoder_writes_the_encoder_cost(tmp_path):
    from mds.planner.plan.config import load_plan_config

    out = tmp_path / "encoder.toml"
    result = mds("calibrate", *VIT, *PATCH_GRID, "--threads", "1", "--warmup", "0", "-o", out)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(
        "[cost]\n# mds calibrate --encoder: built-in ViT (layers = 1, hidden = 16, heads = 2, "
        "patch = 2 x 4 x 4)"
    )
    assert out.read_text() == result.stdout
    encoder = tomllib.loads(result.stdout)["cost"]["encoder"]
    assert set(encoder) == {"a", "b", "d"} and encoder["a"] + encoder["b"] > 0
    assert "images x patches" in result.stderr and "d is not written" in result.stderr
    # Pasted under the config's [cost] header, it is the plan's encoder cost.
    config = tmp_path / "vlm.toml"
    config.write_text(VISION_CONFIG + out.read_text())
    vision = load_plan_config(config).vision
    assert vision is not None and vision.origin == "given"
    assert (vision.a, vision.b) == (encoder["a"], encoder["b"])


def test_calibrate_encoder_json_and_user_model(tmp_path, monkeypatch):
    (tmp_path / "calibration_user_vit.py").write_text(
        "from mds.planner.calibrate.packed_vit import VitShape, build_packed_vit\n"
        "def build():\n"
        # wide enough that 64 patches take measurably longer than 4 on a loaded machine
        "    return build_packed_vit(VitShape(layers=2, hidden=64, heads=2, patch_size=4))\n"
        "def text_model():\n"
        "    import torch\n"
        "    return torch.nn.Embedding(8, 4)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = "calibration_user_vit:build"
    # larger images and the minimum of 3 rounds: the fit must see the patches' cost under load
    grid = ("--patches", "16,64,256", "--max-patches", "512", "--mixed", "1", "--repeats", "3")
    result = mds("calibrate", *VIT, *grid, "--model", spec, "--json", "--warmup", "0")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["encoder"] is True and data["model"] == f"--model {spec}"
    assert set(data["cost"]) == {"encoder"} and data["fit"]["fit_error"]["points"] == 13
    assert data["fit_per_image"]["d"] >= 0 and data["points"][0]["patches"] == [16]
    from mds.planner.calibrate.fit import ENCODER_FORM

    result = mds("calibrate", *VIT, *PATCH_GRID, "--model", "calibration_user_vit:text_model")
    one_error_line(result, "one forward+backward failed", f"--model must be {ENCODER_FORM}")


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--encoder", "--lengths", "8,16"), "--lengths sizes the backbone's grid; with --encoder"),
        (("--encoder", "--vocab", "8"), "--vocab sizes the backbone's grid"),
        (("--patches", "8,16"), "--patches sizes the images of an encoder: it needs --encoder"),
        (("--encoder", "--patches", "64"), "--patches needs at least two different patch counts"),
        (
            ("--encoder", "--patches", "64,512", "--max-patches", "256"),
            "--patches: 512 exceeds --max-patches 256",
        ),
    ],
)
def test_calibrate_encoder_bad_flags(args, needle):
    one_error_line(mds("calibrate", "--repeats", "1", *args), needle)


HF_TINY = {"model_type": "llama", "num_hidden_layers": 1, "hidden_size": 32,
           "num_attention_heads": 2, "num_key_value_heads": 1, "intermediate_size": 64,
           "vocab_size": 64, "max_position_embeddings": 512}  # fmt: skip


def test_calibrate_hf_config(tmp_path):
    pytest.importorskip("transformers")
    config = tmp_path / "config.json"
    config.write_text(json.dumps(HF_TINY))
    args = ("--hf-config", config, "--threads", "1", *GRID, "--warmup", "0")
    result = mds("calibrate", *args, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["model"].startswith(f"hf_config {config} (llama: layers 1, hidden 32")
    assert data["cost"]["source"] == "calibrated" and len(data["points"]) == 7
    # The warning comes exactly when the largest error exceeds 10%.
    assert ("warning" in data) == (data["cost"]["fit_error"]["max"] > 0.10)


def test_calibrate_fit_warning_threshold():
    from mds.cli.calibrate import fit_warning
    from mds.planner.calibrate.fit import CostFit

    assert fit_warning(CostFit(1.0, 0.0, 0.0, (0.02, 0.1))) is None
    assert "12.0%" in fit_warning(CostFit(1.0, 0.0, 0.0, (0.02, 0.12)))


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--hf-config", "nowhere/config.json"), "--hf-config nowhere/config.json: no such file"),
        (("--hf-config", "x.json", "--encoder"), "use it without --model and --encoder"),
    ],
)
def test_calibrate_hf_config_errors(args, needle):
    pytest.importorskip("transformers")
    result = mds("calibrate", *args)
    assert result.exit_code != 0 and needle in one_error_line(result)
