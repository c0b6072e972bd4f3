"""The collective steps of an online run without a process group (the two-rank gloo case
runs under torchrun in tests/executor/test_online.py)."""

from __future__ import annotations

import numpy as np

from mds.executor.signals import Group


def test_without_a_process_group_the_run_is_one_process():
    group = Group()
    assert (group.rank, group.size, group.leader) == (0, 1, True)
    assert np.array_equal(group.sum(np.array([1.0, 2.0])), [1.0, 2.0])
    assert group.tell("x") == "x" and group.tell(None) is None
