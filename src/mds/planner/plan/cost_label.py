"""Which cost a plan's predictions rest on, named for `mds plan` and `mds inspect`.

The footer's `config.cost` records where a and b came from (`origin`); users read a
speedup differently when it rests on the built-in default than on their own model, so
both commands print the label, and for the default the range of `cost_band.py`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["COST_MODELS", "cost_label", "cost_model", "cost_note"]

# `cost.origin` in the plan -> the kind of cost model `mds inspect` names.
COST_MODELS = {
    "default": "default",  # no [cost]: the FLOP-formula a:b ratio of hidden 4096
    "model": "flop_formula",  # [cost] model = {...}
    "hf_config": "hf_config",  # [cost] hf_config = "config.json": the FLOP model of its shape
    "given": "typed",  # [cost] a, b typed by the user
    "calibrated": "calibrated",  # [cost] from mds calibrate
}


def cost_model(cost: dict[str, Any]) -> str:
    """Which cost model a plan used: default, flop_formula, typed, expr or calibrated."""
    return "expr" if "expr" in cost else COST_MODELS.get(cost.get("origin", ""), "typed")


def _shape_text(shape: dict[str, Any]) -> str:
    """`llama: layers 2, hidden 256, heads 4 (kv 2), ffn 688 gated, vocab 32000`."""
    from mds.core.flops import ModelShape

    return ModelShape(**shape).text()


def cost_label(cost: dict[str, Any]) -> str:
    """Which cost a plan's predictions rest on, in words (the plan's `config.cost`)."""
    kind = cost_model(cost)
    if kind == "expr":
        return f"SQL expression [cost] expr: {cost['expr']}"
    if kind == "default":
        return (
            "built-in default (a = 1, b = 1/24576: the a:b of a causal model with hidden 4096), "
            "not this model's; set [cost] model, hf_config or a calibrated file"
        )
    if kind == "calibrated":
        fit = cost.get("fit_error") or {}
        err = f", fit error max {fit['max']:.1%}" if "max" in fit else ""
        return f"calibrated (mds calibrate{err})"
    if kind in ("flop_formula", "hf_config"):
        where = "[cost] hf_config" if kind == "hf_config" else "[cost] model"
        shape = cost.get("model")
        detail = _shape_text(shape) if shape else f"a = {cost['a']:.4g}, b = {cost['b']:.4g}"
        return f"FLOP model of {where} ({detail})"
    return "a, b as given in [cost]"


def cost_note(footer: dict[str, Any], speedup: float) -> dict[str, Any]:
    """`kind`, `label` and, for the built-in default cost, `band`: the range of the predicted
    speedup vs naive over b x 0.25 to b x 4 (plan/cost_band.py; None with `band_note` when
    the plan has none)."""
    from mds.planner.plan.cost_band import band_range

    cost = footer["config"]["cost"]
    out: dict[str, Any] = {"kind": cost_model(cost), "label": cost_label(cost)}
    if out["kind"] == "default":
        band = band_range(footer.get("cost_band"), speedup)
        out["band"] = band
        if band is None:
            out["band_note"] = (
                "no band: plan made before it was recorded, or with [vision] or cp_size > 1"
            )
    return out
