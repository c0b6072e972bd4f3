"""Plain-text pieces of `mds inspect`'s reports, shared by the terminal (cli/inspect_console.py)
and the HTML page (cli/inspect_html.py): sparklines and bars, percentages and numbers,
and the line naming a plan's cost model."""

from __future__ import annotations

from typing import Any

__all__ = [
    "BAR_WIDTH",
    "COST_LABELS",
    "SPARK",
    "SPARK_WIDTH",
    "band_text",
    "bar",
    "cost_text",
    "cost_unit",
    "missing_windows",
    "number",
    "percent",
    "resample",
    "sparkline",
    "step_geometry",
    "value_text",
]

SPARK = "▁▂▃▄▅▆▇█"
SPARK_WIDTH = 60
BAR_WIDTH = 40
_EIGHTHS = " ▏▎▍▌▋▊▉"


def resample(values: list[float], width: int = SPARK_WIDTH) -> list[float]:
    """At most `width` values: means of consecutive, nearly equal runs."""
    n = len(values)
    if n <= width:
        return list(values)
    edges = [round(i * n / width) for i in range(width + 1)]
    return [sum(values[a:b]) / (b - a) for a, b in zip(edges, edges[1:], strict=False)]


def sparkline(values: list[float], lo: float, hi: float, width: int = SPARK_WIDTH) -> str:
    """One character per value (after `resample`), ▁ at `lo` up to █ at `hi`."""
    span = hi - lo
    out = []
    for v in resample(values, width):
        level = 0 if span <= 0 else round((min(max(v, lo), hi) - lo) / span * (len(SPARK) - 1))
        out.append(SPARK[level])
    return "".join(out)


def bar(value: float, peak: float, width: int = BAR_WIDTH) -> str:
    """A horizontal bar of `value / peak * width` cells, in eighths."""
    if peak <= 0 or value <= 0:
        return ""
    eighths = max(1, round(value / peak * width * 8))
    return "█" * (eighths // 8) + (_EIGHTHS[eighths % 8] if eighths % 8 else "")


def step_geometry(h: dict[str, Any]) -> tuple[str, str]:
    """The plan header's row of steps x dp ranks x micro-batches, with the steps the plan
    holds (first-last): a plan re-planned from step K holds steps K.. only."""
    first, end = h.get("first_step", 0), h["steps"]
    held = f"steps {first:,}-{end - 1:,}" if end - first > 1 else f"step {first:,}"
    value = f"{end - first:,} ({held}) x {h['dp_size']} x {h['micro_batches']}"
    return "steps x dp ranks x micro-batches", value


def missing_windows(online: dict[str, Any]) -> str | None:
    """The windows of an online run whose segments are not written yet, in words; None
    when every one is."""
    first, last = online["written"], online["windows"] - 1
    if first > last:
        return None
    return f"window {first}" if first == last else f"windows {first}-{last}"


def percent(x: float | None) -> str:
    """A share as a percentage with two decimals; "-" for none."""
    return "-" if x is None else f"{100 * x:.2f}%"


def number(x: float | None, fmt: str = ".4f") -> str:
    """A number in `fmt`; "-" for none."""
    return "-" if x is None else format(x, fmt)


def value_text(x: Any) -> str:
    """A metadata value or coefficient: a float in 4 significant digits, anything else as is."""
    return format(x, ".4g") if isinstance(x, float) else str(x)


def cost_unit(cost: dict[str, Any]) -> str:
    """What a plan's costs are measured in: FLOPs for a model shape, the formula for given
    coefficients, or the user's expression."""
    if "expr" in cost:
        return str(cost["expr"])
    if cost.get("origin") in ("model", "hf_config"):
        return "FLOPs"
    return "a*L + b*L^2 + d" if cost.get("d") else "a*L + b*L^2"


COST_LABELS = {
    "default": "default (FLOP formula, causal, hidden 4096)",
    "flop_formula": "FLOP formula of [cost] model",
    "hf_config": "FLOP model of [cost] hf_config",
    "typed": "typed a, b",
    "calibrated": "calibrated (mds calibrate)",
}


def cost_text(cost: dict[str, Any], kind: str) -> str:
    """One line naming the plan's cost model, its coefficients and, if calibrated, fit error."""
    if kind == "expr" or "expr" in cost:
        return f"SQL expression: {cost['expr']}"
    text = (
        f"{COST_LABELS.get(kind, kind)}: a = {value_text(cost['a'])}, b = {value_text(cost['b'])}"
    )
    if cost.get("d"):
        text += f", d = {value_text(cost['d'])} per sample"
    if cost.get("c"):
        text += f", c = {value_text(cost['c'])} per micro-batch"
    fit = cost.get("fit_error")
    if fit:
        text += (
            f"; fit error max {fit['max']:.1%}, median {fit['median']:.1%} "
            f"over {fit['points']} micro-batches"
        )
    return text


def band_text(report: dict[str, Any]) -> str | None:
    """With the built-in default cost: the predicted speedup's range over the quadratic
    weight b x 0.25 to b x 4 (or why there is none); None with any other cost."""
    imb = report["imbalance"]
    if report["header"].get("cost_model") != "default":
        return None
    band = imb.get("speedup_vs_naive_band")
    if band is None:
        return (
            "the built-in default cost is not this model's; no range over its quadratic "
            "weight is recorded in this plan (made before it was, or with [vision] or CP)"
        )
    return (
        f"with the built-in default cost (not this model's), the speedup vs naive ranges "
        f"{band['low']:.3f}x - {band['high']:.3f}x over b x {band['b_factors'][0]:g} to "
        f"x {band['b_factors'][1]:g}; calibrate (mds calibrate) or give [cost] model or "
        "hf_config for one number"
    )
