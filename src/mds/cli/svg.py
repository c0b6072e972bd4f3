"""Small inline SVG charts (line and bar) for the HTML reports: plain markup, valid XML,
no scripts or external assets."""

from __future__ import annotations

import math
from html import escape
from typing import Any

__all__ = ["PALETTE", "bar_chart", "line_chart", "nice_range"]

PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
)  # fmt: skip
_SVG_NS = "http://www.w3.org/2000/svg"


def _e(value: Any) -> str:
    return escape(str(value))


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    return [lo + (hi - lo) * i / (n - 1) for i in range(n)]


def nice_range(lo: float, hi: float, target: int = 5) -> tuple[float, float, list[float]]:
    """Widen [lo, hi] to multiples of a 1-2-5 step giving about `target` ticks."""
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / (target - 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    return first * step, last * step, [k * step for k in range(first, last + 1)]


def line_chart(
    title: str,
    xs: list[float],
    lines: list[dict[str, Any]],
    lo: float,
    hi: float,
    y_format: str = ".3f",
    width: int = 540,
    height: int = 210,
) -> str:
    """An SVG line chart: `lines` are {label, values, color, dashed}, one value per x."""
    left, right, top, bottom = 56, 12, 38, 30
    pw, ph = width - left - right, height - top - bottom
    x0 = xs[0] if xs else 0.0
    x1 = xs[-1] if len(xs) > 1 and xs[-1] > x0 else x0 + 1
    lo, hi, yticks = nice_range(lo, hi)

    def px(x: float) -> float:
        return left + (x - x0) / (x1 - x0) * pw

    def py(y: float) -> float:
        return top + (1 - (min(max(y, lo), hi) - lo) / (hi - lo)) * ph

    out = [
        f'<svg xmlns="{_SVG_NS}" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img">',
        f"<title>{_e(title)}</title>",
        f'<text x="{left}" y="14" font-weight="bold">{_e(title)}</text>',
    ]
    for y in yticks:
        out.append(
            f'<line x1="{left}" y1="{py(y):.1f}" x2="{left + pw}" y2="{py(y):.1f}" stroke="#eee"/>'
            f'<text x="{left - 4}" y="{py(y) + 4:.1f}" text-anchor="end">'
            f"{_e(format(y, y_format))}</text>"
        )
    for x in _ticks(x0, x1):
        out.append(
            f'<text x="{px(x):.1f}" y="{top + ph + 16}" text-anchor="middle">{round(x)}</text>'
        )
    out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>')
    lx = left
    for line in lines:
        dash = ' stroke-dasharray="5 4"' if line.get("dashed") else ""
        if len(xs) == 1:
            points = (
                f"{px(x0):.1f},{py(line['values'][0]):.1f} {px(x1):.1f},{py(line['values'][0]):.1f}"
            )
        else:
            points = " ".join(
                f"{px(x):.1f},{py(v):.1f}" for x, v in zip(xs, line["values"], strict=True)
            )
        out.append(
            f'<polyline fill="none" stroke="{line["color"]}" stroke-width="1.6"{dash} '
            f'points="{points}"/>'
        )
        out.append(
            f'<line x1="{lx}" y1="28" x2="{lx + 18}" y2="28" stroke="{line["color"]}" '
            f'stroke-width="2"{dash}/><text x="{lx + 22}" y="32">{_e(line["label"])}</text>'
        )
        lx += 30 + 7 * len(line["label"])
    out.append("</svg>")
    return "".join(out)


def bar_chart(
    title: str, labels: list[str], values: list[float], width: int = 540, height: int = 200
) -> str:
    """An SVG bar chart, one bar per label; each bar's tooltip gives its value."""
    left, right, top, bottom = 56, 12, 26, 42
    pw, ph = width - left - right, height - top - bottom
    peak = max(values, default=0) or 1
    step = pw / max(len(values), 1)
    out = [
        f'<svg xmlns="{_SVG_NS}" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img">',
        f"<title>{_e(title)}</title>",
        f'<text x="{left}" y="14" font-weight="bold">{_e(title)}</text>',
        f'<line x1="{left}" y1="{top + ph}" x2="{left + pw}" y2="{top + ph}" stroke="#999"/>',
        f'<text x="{left - 4}" y="{top + 4}" text-anchor="end">{_e(f"{peak:,.4g}")}</text>',
        f'<text x="{left - 4}" y="{top + ph + 4}" text-anchor="end">0</text>',
    ]
    every = max(1, len(labels) // 16)
    for i, (label, value) in enumerate(zip(labels, values, strict=True)):
        h = value / peak * ph
        x = left + i * step
        out.append(
            f'<rect x="{x + step * 0.1:.1f}" y="{top + ph - h:.1f}" width="{step * 0.8:.1f}" '
            f'height="{h:.1f}" fill="{PALETTE[0]}"><title>{_e(label)}: {_e(f"{value:,}")}'
            "</title></rect>"
        )
        if i % every == 0:
            out.append(
                f'<text x="{x + step / 2:.1f}" y="{top + ph + 14}" text-anchor="middle">'
                f"{_e(label)}</text>"
            )
    out.append("</svg>")
    return "".join(out)
