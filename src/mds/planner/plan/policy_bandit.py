"""The bandit policy, after Online Data Mixing (Albalak et al., 2023, "Efficient Online
Data Mixing For Language Model Pre-Training"): EXP3 with the sources as arms and a source's
loss as its reward (what the model has not learnt yet is worth drawing). Each window one
arm is drawn from the weights that window trained with, by a generator seeded with
(seed, window), so the draws are the same in every replay (docs/online-mixing.md)."""

from __future__ import annotations

import numpy as np

from mds.core.signal_log import WindowSignal
from mds.planner.plan.online_config import OnlineSpec

__all__ = ["bandit", "drawn_arm"]


def drawn_arm(probabilities: np.ndarray, seed: int, window: int) -> int:
    """The arm drawn for `window`: inverse CDF of one uniform of the (seed, window) stream."""
    u = np.random.default_rng([seed, window]).random()
    cdf = np.cumsum(probabilities)
    return int(min(np.searchsorted(cdf, u * cdf[-1], side="right"), len(cdf) - 1))


def bandit(
    weights: list[np.ndarray], signals: list[WindowSignal], spec: OnlineSpec
) -> np.ndarray:
    """The next weights: `(1 - exploration) softmax(step_size * score) + exploration / n`,
    where each window j adds to the score of its drawn arm a the importance-weighted reward
    `r / p_j[a]`, r = a's mean loss over the window's largest mean loss (in [0, 1]; 0 when
    a counted nothing)."""
    n = len(weights[0])
    score = np.zeros(n)
    for signal in signals:
        p = weights[signal.window]
        arm = drawn_arm(p, spec.seed, signal.window)
        means = signal.mean_loss()
        known = [m for m in means if m is not None and m > 0]
        top = max(known, default=0.0)
        mean = means[arm]
        reward = (mean / top) if (mean is not None and top > 0) else 0.0
        score[arm] += max(reward, 0.0) / p[arm]
    logits = spec.step_size * score
    w = np.exp(logits - logits.max())
    w /= w.sum()
    return (1.0 - spec.exploration) * w + spec.exploration / n
