"""`mds inspect` of an online-mixed run: the weights over the windows as planned (the
segments' footers) and as realised (their per-source samples), the signals that moved
them (the log beside the plan), in the terminal, JSON and HTML; a run in progress shows its
later windows as not planned yet."""

from __future__ import annotations

import json

import pytest
from chart_layout import NO_BROWSER, chart_layout, find_chromium
from cli_helpers import mds
from plan_builders import plan_config, synthetic, train_table

from mds.core.segments import first_segment, segment_path, signals_path
from mds.core.signal_log import SignalLog, window_signal
from mds.errors import PlanError
from mds.planner.plan.segment import plan_segment

STEPS, WINDOW = 20, 4
SOURCES = ("easy", "mid", "hard")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Segments 0-3 of a five-window run and the log of windows 0-2 (window 4 not planned
    yet): `mid` is above its reference, so DoReMi moves weight to it from window 2 on."""
    root = tmp_path_factory.mktemp("online-inspect")
    lengths = {n: [8 + (i * (j + 3)) % 13 for i in range(60)] for j, n in enumerate(SOURCES)}
    data = synthetic(root, {n: {"lengths": lengths[n], "weight": 1.0} for n in SOURCES},
                     train_table(steps=STEPS))  # fmt: skip
    data["mixing"] = {"online": {"policy": "doremi", "window": WINDOW, "floor": 0.05,
                                 "reference": {"easy": 1.0, "mid": 1.0, "hard": 9.0}}}  # fmt: skip
    config = plan_config(root, data)
    plan = root / "run" / "plan.mds"
    first = plan_segment(config, plan, 0)
    log = SignalLog(first.plan_id, SOURCES, WINDOW)
    for k in range(3):
        loss = [8.0, 20.0 + 4 * k, 40.0]  # mean loss 1, 2.5 + k/2, 5 per sample
        log.append(window_signal(k, k * WINDOW, (k + 1) * WINDOW, loss, [8, 8, 8]))
    for k in range(1, 4):
        plan_segment(config, plan, k, log)
    log.write(signals_path(plan))
    return plan


def report(*args):
    result = mds("inspect", *args, "--json")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["online"]


def test_json_from_any_segment(run):
    online = report(run)
    assert report(segment_path(run, 2)) == online  # the same run seen from segment 2
    assert (online["windows"], online["written"], online["window_steps"]) == (5, 4, WINDOW)
    assert online["sources"] == list(SOURCES) and online["share_unit"] == "samples"
    assert online["signals"] == str(signals_path(run)) and online["signal_windows"] == 3
    rows = online["per_window"]
    assert [(w["window"], w["start"], w["end"]) for w in rows] == [(k, 4 * k, 4 * k + 4) for k in range(5)]
    assert [w["written"] for w in rows] == [True] * 4 + [False]
    assert rows[4]["planned"] is rows[4]["realized"] is rows[4]["mean_loss"] is None
    assert rows[3]["mean_loss"] is None  # window 3's signal is not in the log yet
    assert rows[0]["mean_loss"] == [1.0, 2.5, 5.0]
    for w in rows[:4]:
        assert sum(w["planned"]) == pytest.approx(1.0)
        assert sum(w["realized"]) == pytest.approx(1.0)
        assert sum(w["amounts"]) == WINDOW * 8  # train_table's samples_per_step
        for planned, realized in zip(w["planned"], w["realized"], strict=True):
            assert abs(planned - realized) <= 0.1
    # windows 0 and 1 keep the config's weights; from window 2 weight moves to `mid`
    assert rows[0]["planned"] == rows[1]["planned"] == pytest.approx([1 / 3] * 3)
    mids = [w["planned"][1] for w in rows[:4]]
    assert mids[1] < mids[2] < mids[3]
    assert rows[3]["planned"][2] < rows[1]["planned"][2]
    assert rows[3]["realized"][1] > rows[1]["realized"][1]


def test_terminal(run):
    out = mds("inspect", segment_path(run, 1)).stdout
    assert "online mixing: per window of 4 steps" in out
    assert "33.33%" in out and "2.500" in out  # window 0: planned share, mean loss of `mid`
    assert "window 4: not planned yet" in out
    assert "planned weight over windows 0-3" in out
    assert f"signals: {signals_path(run)}" in out.replace("\n", "")
    section = out[out.index("online mixing") : out.index("over steps")]
    assert max(len(line) for line in section.splitlines()) <= 80  # the runner's 80 columns


def test_without_a_log_and_with_the_first_segment_only(run, tmp_path):
    alone = tmp_path / "plan.mds"
    alone.write_bytes(run.read_bytes())
    (tmp_path / "index").symlink_to(run.parent.parent / "index")
    online = report(alone)
    assert online["written"] == 1 and online["signals"] is None
    assert [w["written"] for w in online["per_window"]] == [True] + [False] * 4
    out = mds("inspect", alone).stdout
    assert "windows 1-4: not planned yet" in out and "no signal log" in out


def test_a_segment_misnamed_is_one_error(run, tmp_path):
    odd = tmp_path / "other.mds"
    odd.write_bytes(segment_path(run, 2).read_bytes())
    with pytest.raises(PlanError, match=r"window 2 of an online run is named STEM\.w00002"):
        first_segment(odd, 2)
    result = mds("inspect", odd)
    assert result.exit_code == 1 and "named STEM.w00002.mds" in result.stderr


def test_html(run, tmp_path):
    page = tmp_path / "online.html"
    result = mds("inspect", segment_path(run, 3), "--html", page)
    assert result.exit_code == 0, result.output
    text = page.read_text(encoding="utf-8")
    assert "<h2>Online mixing</h2>" in text and "window 4 not planned yet" in text
    assert "weight per window" in text and "signal: mean loss per source per window" in text
    assert text.count("not planned yet</td>") == 3  # one cell per source of window 4
    if find_chromium() is None:
        pytest.skip(NO_BROWSER)
    charts, problems, png = chart_layout([text], tmp_path, "online-charts.png")
    assert problems == []
    assert png.exists()
