"""`[mixing] online`: parsed with defaults, recorded in the canonical config, and every
wrong value refused naming its key."""

from __future__ import annotations

import pytest
from plan_builders import mix_only_config

from mds.errors import ConfigError
from mds.planner.plan.config import plan_config_from_dict


def config(tmp_path, online, weights=None, **train):
    data = {
        "source": [
            {"name": n, "path": f"{n}/*", "count": "n", "weight": w}
            for n, w in (weights or {"a": 0.5, "b": 0.5}).items()
        ],
        "train": {"steps": 8, "dp_size": 2, "micro_batches": 2, "samples_per_step": 8,
                  "max_tokens_per_micro_batch": 1000, "seed": 7, **train},
        "mixing": {"online": online},
    }
    return plan_config_from_dict(data, base=tmp_path)


def test_defaults_and_the_canonical_form(tmp_path):
    spec = config(tmp_path, {"policy": "doremi", "window": 4, "reference": {"a": 2}}).online
    assert (spec.window, spec.floor, spec.step_size, spec.smoothing) == (4, 0.01, 1.0, 0.1)
    canonical = config(tmp_path, {"policy": "bandit", "window": 2}).canonical()
    assert canonical["mixing"] == {"online": {"policy": "bandit", "window": 2, "floor": 0.01,
                                              "step_size": 0.1, "exploration": 0.1, "seed": 7}}
    assert "mixing" not in mix_only_config({"a": 1}, tmp_path).canonical()
    assert config(tmp_path, {"policy": "pkg.mod:fn", "window": 8}).online.policy == "pkg.mod:fn"


@pytest.mark.parametrize(
    "online, message",
    [
        ({"window": 4}, "`policy` is required"),
        ({"policy": "os.system('x')", "window": 4}, "neither doremi, bandit nor"),
        ({"policy": "doremi", "window": 0}, "`window` must be an integer >= 1"),
        ({"policy": "doremi", "window": 9}, "longer than the run's 8 steps"),
        ({"policy": "doremi", "window": 4, "floor": 0.6}, "0.6 x 2 sources exceeds 1"),
        ({"policy": "doremi", "window": 4, "floor": -1}, "`floor` must be >= 0"),
        ({"policy": "doremi", "window": 4, "exploration": 0.1}, "unknown key `exploration`"),
        ({"policy": "doremi", "window": 4, "reference": {"z": 1}}, "names source 'z'"),
        ({"policy": "doremi", "window": 4, "smoothing": 2}, "`smoothing` must be >= 0 and <= 1"),
        ({"policy": "bandit", "window": 4, "exploration": 0}, "`exploration` must be > 0"),
        ({"policy": "bandit", "window": 4, "seed": -1}, "`seed` must be an integer >= 0"),
        ("doremi", "must be a table"),
    ],
)
def test_wrong_values_name_their_key(tmp_path, online, message):
    with pytest.raises(ConfigError, match=message) as err:
        config(tmp_path, online)
    assert "[mixing] online" in str(err.value)


def test_weights_must_be_constants(tmp_path):
    with pytest.raises(ConfigError, match="'a': `weight` must be a constant"):
        config(tmp_path, {"policy": "doremi", "window": 4}, {"a": [[0, 1.0], [4, 0.5]], "b": 1})
