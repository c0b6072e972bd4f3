"""DP coordinates from a global rank and the mesh sizes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mds.errors import ConfigError
from mds.executor.mesh import mesh_position, peer_groups, torchrun_rank


def test_default_order_puts_tp_fastest_then_cp_then_dp_then_pp():
    # world 16 = tp 2 x cp 2 x dp 2 x pp 2
    got = [mesh_position(r, 16, tp=2, cp=2, pp=2).coords for r in range(16)]
    assert got[0] == {"tp": 0, "cp": 0, "dp": 0, "pp": 0}
    assert got[1] == {"tp": 1, "cp": 0, "dp": 0, "pp": 0}
    assert got[2] == {"tp": 0, "cp": 1, "dp": 0, "pp": 0}
    assert got[4] == {"tp": 0, "cp": 0, "dp": 1, "pp": 0}
    assert got[8] == {"tp": 0, "cp": 0, "dp": 0, "pp": 1}


def test_another_order_is_honoured():
    pos = mesh_position(1, 4, tp=2, order="dp-tp-cp-pp")
    assert (pos.dp_rank, pos.dp_size, pos.coords["tp"]) == (1, 2, 0)


@given(tp=st.integers(1, 4), cp=st.integers(1, 3), pp=st.integers(1, 3), dp=st.integers(1, 5))
def test_every_dp_rank_has_exactly_tp_cp_pp_peers_and_one_reader(tp, cp, pp, dp):
    world = tp * cp * pp * dp
    positions = [mesh_position(r, world, tp=tp, cp=cp, pp=pp) for r in range(world)]
    assert {p.dp_size for p in positions} == {dp}
    for d in range(dp):
        peers = [p for p in positions if p.dp_rank == d]
        assert len(peers) == tp * cp * pp
        assert sum(p.reads for p in peers) == 1
    coords = {tuple(sorted(p.coords.items())) for p in positions}
    assert len(coords) == world


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"rank": 0, "world_size": 6, "tp": 4}, "world size 6 is not a multiple of tp*cp*pp"),
        ({"rank": 8, "world_size": 8}, "rank 8 is outside the world size 8"),
        ({"rank": 0, "world_size": 8, "tp": 0}, "mesh size tp=0 must be a positive integer"),
        (
            {"rank": 0, "world_size": 8, "order": "tp-dp-pp"},
            "must name each of tp, cp, dp, pp once",
        ),
    ],
)
def test_bad_meshes_are_refused_with_the_reason(kwargs, message):
    with pytest.raises(ConfigError, match=message.replace("*", r"\*")):
        mesh_position(**kwargs)


def test_torchrun_environment_is_read_and_missing_variables_are_named():
    assert torchrun_rank({"RANK": "3", "WORLD_SIZE": "4"}) == (3, 4)
    assert torchrun_rank({}) == (0, 1)  # no launcher: a single process
    with pytest.raises(ConfigError, match="WORLD_SIZE is not set: launch with torchrun"):
        torchrun_rank({"RANK": "0"})
    with pytest.raises(ConfigError, match="must be integers"):
        torchrun_rank({"RANK": "x", "WORLD_SIZE": "4"})


def test_peer_groups_partition_the_world_by_dp_rank():
    groups = peer_groups(8, tp=2, pp=2)
    assert groups == [(0, 1, 4, 5), (2, 3, 6, 7)]
    for d, group in enumerate(groups):
        assert all(mesh_position(r, 8, tp=2, pp=2).dp_rank == d for r in group)
