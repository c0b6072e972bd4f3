"""Plans with [vision]: backbone lengths and patches from the index's image sizes, the
two-part cost, capacities in tokens and patches, the footer and stats a vision plan
records, and the config errors."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from builders import config_file, write_tokenizer
from vlm_builders import image_bytes, write_tar

from mds.core.planfile_reader import PlanReader
from mds.core.vision import VisionGeometry, smart_resize
from mds.errors import ConfigError, PlanError
from mds.planner.index.build import build_index
from mds.planner.index.config import load_config
from mds.planner.index.tables import source_table
from mds.planner.plan.build import build_plan
from mds.planner.plan.chunk import STAT_COLUMNS, VISION_STAT_COLUMNS, Planner
from mds.planner.plan.config import load_plan_config
from mds.planner.report.export import plan_frame
from mds.planner.report.plan import plan_report, step_stats

pytest.importorskip("PIL")
WORDS = ["a", "cat", "dog", "on", "the", "mat", "red", "long"]
SIZES = [(40, 30), (600, 400), (28, 28), (1200, 90), (300, 300), (56, 112)]


def _samples(n: int, seed: int = 0) -> list[tuple[str, dict[str, bytes]]]:
    rng = np.random.default_rng(seed)
    out = []
    for k in range(n):
        words = " ".join(rng.choice(WORDS, int(rng.integers(1, 40))))
        members = {"txt": words.encode()}
        if k % 5 != 4:  # every fifth sample is text only
            w, h = SIZES[k % len(SIZES)]
            members["jpg"] = image_bytes((w, h))
        out.append((f"s{k:04d}", members))
    return out


CONFIG = """
[index]
output = "index"

[[source]]
name = "caps"
path = "shards/*.tar"
images = "jpg"
text = "txt"
tokenizer = "tok.json"
weight = 0.7

[[source]]
name = "plain"
path = "plain.jsonl"
text = "text"
tokenizer = "tok.json"
weight = 0.3

[train]
steps = 6
dp_size = 4
micro_batches = 2
samples_per_step = 16
max_tokens_per_micro_batch = 4096
seed = 3
{train}

[vision]
patch_size = 14
merge_size = 2
min_pixels = 3136
max_pixels = 200704
{vision}

[cost]
model = {{ layers = 4, hidden = 256, vocab = 512 }}
{cost}
"""


def _root(tmp_path: Path, train: str = "", vision: str = "", cost: str = "") -> Path:
    write_tokenizer(tmp_path / "tok.json", WORDS)
    write_tar(tmp_path / "shards" / "a.tar", _samples(30))
    write_tar(tmp_path / "shards" / "b.tar", _samples(20, seed=1))
    lines = [f'{{"text": "{" ".join(WORDS[: 1 + k % 7] * (1 + k % 9))}"}}' for k in range(40)]
    (tmp_path / "plain.jsonl").write_text("\n".join(lines) + "\n")
    path = config_file(tmp_path, CONFIG.format(train=train, vision=vision, cost=cost))
    build_index(load_config(path))
    return path


def test_backbone_lengths_patches_and_costs_follow_the_geometry(tmp_path: Path) -> None:
    config = load_plan_config(_root(tmp_path))
    planner = Planner(config)
    caps = planner.pools[0]
    geometry = config.vision.geometry
    table = planner.manifest
    assert config.vision.origin == "default"
    rows = source_table(table, "caps", None)
    for r in range(rows.height):
        text = rows["n_tokens"][r]
        sizes = list(zip(rows["image_width"][r], rows["image_height"][r], strict=True))
        tokens, patches = text, 0
        for w, h in sizes:
            rh, rw = smart_resize(h, w, 28, 3136, 200704)
            p = (rh // 14) * (rw // 14)
            patches += p
            tokens += p // 4 + 2
        assert caps.lengths[r] == tokens
        assert caps.patches[r] == patches
        enc = config.vision.a * patches + config.vision.b * patches * patches
        assert caps.enc_raw[r] == pytest.approx(enc)
        assert caps.costs[r] >= caps.enc_costs[r] >= (1 if patches else 0)
    assert isinstance(rows, pl.DataFrame)
    plain = planner.pools[1]
    assert plain.enc_raw is not None and not plain.enc_raw.any() and not plain.patches.any()
    assert geometry.grid(30, 40) == (1, 4, 6)  # 28x28 is below min_pixels: scaled up to 56x84


def test_plan_footer_stats_and_report(tmp_path: Path) -> None:
    path = _root(tmp_path, train="max_patches_per_micro_batch = 1200")
    config = load_plan_config(path)
    out = tmp_path / "plan.mds"
    summary = build_plan(config, out)
    reader = PlanReader(out)
    footer = reader.footer
    assert footer["config"]["vision"] == config.vision.geometry.to_json()
    assert VisionGeometry.from_json(footer["config"]["vision"]) == config.vision.geometry
    assert footer["config"]["cost"]["encoder"]["origin"] == "default"
    assert footer["config"]["train"]["max_patches_per_micro_batch"] == 1200
    assert footer["stats_columns"] == list(STAT_COLUMNS + VISION_STAT_COLUMNS)
    caps = footer["fetch"]["sources"]["caps"]
    assert caps["format"] == "webdataset" and caps["payload"]["kind"] == "image_text"
    report = plan_report(reader)
    vision = report["vision"]
    assert vision["patches"]["max_micro_batch"]["max"] <= 1200
    for part in ("encoder", "backbone", "sum"):
        q = vision["balance"][part]["max_over_lower_bound"]
        assert 1.0 <= q["median"] <= q["max"]
    assert summary.parts is not None and set(summary.parts) == {"encoder", "backbone"}
    [src] = vision["sources"]
    assert src["name"] == "caps" and src["samples"] == 50 and src["images"] == 40
    assert sum(b["images"] for b in src["patch_histogram"]) == 40
    # a WebDataset sample's fetch record is its byte range in the tar
    block = reader.rank_chunk(0, 0)
    assert block.fetch.offset.any() and block.fetch.length.all()
    # the same inputs give the same bytes
    again = tmp_path / "again.mds"
    build_plan(load_plan_config(path), again)
    assert out.read_bytes() == again.read_bytes()


def test_a_plan_without_vision_keeps_its_columns(tmp_path: Path) -> None:
    path = _root(tmp_path)
    text = path.read_text()
    start = text.index("[vision]")
    path.write_text(text[:start] + text[text.index("[cost]") :])
    out = tmp_path / "plan.mds"
    build_plan(load_plan_config(path), out)
    footer = PlanReader(out).footer
    assert footer["stats_columns"] == list(STAT_COLUMNS) and "vision" not in footer["config"]


def test_images_cannot_be_truncated_and_patch_room_drops(tmp_path: Path) -> None:
    path = _root(tmp_path, train='overlong = "truncate"')
    text = path.read_text().replace("max_tokens_per_micro_batch = 4096", "max_tokens_per_micro_batch = 200")
    path.write_text(text)
    with pytest.raises(PlanError, match="a sample with images cannot be truncated"):
        Planner(load_plan_config(path))
    path.write_text(path.read_text().replace('overlong = "truncate"', 'overlong = "drop"\nmax_patches_per_micro_batch = 64'))
    planner = Planner(load_plan_config(path))
    assert planner.pools[0].patches.max() <= 64 and planner.pools[0].dropped > 0
    text = path.read_text().replace('overlong = "drop"', 'overlong = "error"')
    path.write_text(text.replace("max_tokens_per_micro_batch = 200", "max_tokens_per_micro_batch = 4096"))
    with pytest.raises(PlanError, match="image patches exceed max_patches_per_micro_batch = 64"):
        Planner(load_plan_config(path))


@pytest.mark.parametrize(
    ("train", "vision", "cost", "message"),
    [
        ("", "temporal_patch_size = 0", "", r"\[vision\].temporal_patch_size: 0 is not a positive"),
        ("", 'resize = "crop"', "", r"\[vision\].resize: 'crop'; use one of smart, fixed"),
        ("", 'resize = "fixed"', "", r"\[vision\].image_size: required"),
        ("", "wobble = 1", "", r"\[vision\]: unknown key 'wobble'"),
        ("", "", "encoder = { a = 1.0, layers = 2 }", "use `a`/`b` or `layers`/`hidden`, not both"),
        ("", "", "encoder = { layers = 2 }", "`layers` and `hidden` are both required"),
        ("max_patches_per_micro_batch = 0", "", "", "max_patches_per_micro_batch` must be an integer >= 1"),
    ],
)
def test_config_errors_name_the_key(tmp_path: Path, train, vision, cost, message) -> None:
    path = _root(tmp_path)
    text = CONFIG.format(train=train, vision=vision, cost=cost)
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_plan_config(path)


def test_encoder_coefficients_from_a_shape_or_given(tmp_path: Path) -> None:
    path = _root(tmp_path, cost="encoder = { layers = 2, hidden = 64 }")
    spec = load_plan_config(path).vision
    assert (spec.a, spec.b, spec.origin) == (72.0 * 2 * 64 * 64, 12.0 * 2 * 64, "model")
    path.write_text(CONFIG.format(train="", vision="", cost="encoder = { a = 2.5, b = 0.5 }"))
    spec = load_plan_config(path).vision
    assert (spec.a, spec.b, spec.origin) == (2.5, 0.5, "given")
    no_vision = CONFIG.format(train="", vision="", cost="encoder = { a = 2.5 }")
    no_vision = no_vision.replace("[vision]", "[unused]").replace("[unused]\n", "")
    path.write_text(no_vision.replace("patch_size = 14\nmerge_size = 2\nmin_pixels = 3136\nmax_pixels = 200704\n", ""))
    with pytest.raises(ConfigError, match="`encoder` needs a \\[vision\\] table"):
        load_plan_config(path)
    assert math.isfinite(spec.a)


def test_export_gives_the_costs_the_balancer_summed(tmp_path: Path) -> None:
    path = _root(tmp_path)
    out = tmp_path / "plan.mds"
    build_plan(load_plan_config(path), out)
    frame = plan_frame(out)
    per_step = frame.group_by("step").agg(pl.col("cost_units").sum()).sort("step")
    assert per_step["cost_units"].to_list() == step_stats(PlanReader(out))["cost"].tolist()
    caps = frame.filter(pl.col("source") == "caps")
    assert (caps["backbone_tokens"] >= caps["n_tokens"]).all() and caps["patches"].sum() > 0
    plain = frame.filter(pl.col("source") == "plain")
    assert (plain["backbone_tokens"] == plain["n_tokens"]).all() and plain["patches"].sum() == 0
