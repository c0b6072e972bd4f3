"""The DoReMi-style policy (Xie et al., 2023, "DoReMi: Optimizing Data Mixtures Speeds Up
Language Model Pretraining"): exponentiated gradient on each source's excess loss over a
reference loss, smoothed toward uniform. Here the proxy model is the model being trained
and one update is one window (docs/online-mixing.md)."""

from __future__ import annotations

import numpy as np

from mds.core.signal_log import WindowSignal
from mds.planner.plan.online_config import OnlineSpec

__all__ = ["doremi", "excess_loss"]


def excess_loss(signal: WindowSignal, names: tuple[str, ...], spec: OnlineSpec) -> np.ndarray:
    """Per source max(mean loss - reference, 0); 0 for a source without a reference or
    without anything counted in the window."""
    reference = dict(spec.reference)
    out = np.zeros(len(names))
    for i, (name, mean) in enumerate(zip(names, signal.mean_loss(), strict=True)):
        if mean is not None and name in reference:
            out[i] = max(mean - reference[name], 0.0)
    return out


def doremi(
    previous: np.ndarray, signal: WindowSignal, names: tuple[str, ...], spec: OnlineSpec
) -> np.ndarray:
    """The next weights: `normalize(w * exp(step_size * excess))`, then
    `(1 - smoothing) w + smoothing / n`. The product is taken in log space (shifted by its
    maximum), so a large excess cannot overflow."""
    logits = np.log(np.maximum(previous, np.finfo(np.float64).tiny))
    logits = logits + spec.step_size * excess_loss(signal, names, spec)
    w = np.exp(logits - logits.max())
    w /= w.sum()
    return (1.0 - spec.smoothing) * w + spec.smoothing / len(w)
