"""`mds plan` of an online-mixed config: the first segment, --segment K, --replay LOG (byte
for byte), and the one-line errors of flags that do not go together."""

from __future__ import annotations

import json

import pytest
from cli_helpers import mds, one_error_line
from plan_builders import REPO, sample_index

from mds.core.segments import segment_path
from mds.core.signal_log import SignalLog, window_signal

CONFIG = REPO / "sample_data" / "online.toml"
NAMES = ("web", "books", "forum", "code", "wiki", "math")


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    return sample_index(tmp_path_factory)


def plan(index, out, *args):
    return mds("plan", CONFIG, "--index", index, "-o", out, *args)


def test_segments_and_a_byte_identical_replay(index, tmp_path):
    run = tmp_path / "run" / "plan.mds"
    first = plan(index, run, "--json")
    assert first.exit_code == 0, first.output
    (summary,) = json.loads(first.output)
    assert (summary["first_step"], summary["steps"]) == (0, 16)
    assert plan(index, run, "--segment", "1").exit_code == 0
    log = SignalLog(summary["plan_id"], NAMES, 16)
    log.append(window_signal(0, 0, 16, [400.0, 90.0, 60.0, 30.0, 50.0, 20.0], [100] * 6))
    log.write(tmp_path / "signals.json")
    shown = plan(index, run, "--segment", "2", "--signals", tmp_path / "signals.json")
    assert shown.exit_code == 0, shown.output
    assert "plan.w00002.mds: steps 32-47" in shown.output
    audit = tmp_path / "audit" / "plan.mds"
    replayed = plan(index, audit, "--replay", tmp_path / "signals.json", "--json")
    assert [s["first_step"] for s in json.loads(replayed.output)] == [0, 16, 32]
    for k in range(3):
        assert segment_path(audit, k).read_bytes() == segment_path(run, k).read_bytes()


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--segment", "2"], "--segment 2 needs --signals LOG"),
        (["--segment", "9"], "--segment 9: the run has windows 0 to 3"),
        (["--from", "x.mds", "--at-step", "3"], "re-planned with --segment K"),
        (["--replay", "x.json", "--segment", "1"], "leave out --segment and --signals"),
    ],
)
def test_flags_that_do_not_go_together(index, tmp_path, args, needle):
    one_error_line(plan(index, tmp_path / "plan.mds", *args), needle)


def test_a_fixed_config_takes_no_segment(index, tmp_path):
    result = mds("plan", REPO / "sample_data" / "mds.toml", "--index", index,
                 "-o", tmp_path / "p.mds", "--segment", "1")
    one_error_line(result, "need [mixing] online in the config")
