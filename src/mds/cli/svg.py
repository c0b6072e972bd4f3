"""Small inline SVG charts (line, stacked area and bar) for the HTML reports: plain markup,
valid XML, no scripts or external assets.

Every chart has a title, a title on each axis (with its unit), a legend when it draws more
than one series, and round ticks (steps of 1, 2 or 5 x 10^k) labelled short enough to fit
(`axis_ticks`: 150T, 20k, 1.5M, 1.05, 12.5%); the left margin is sized from the longest label.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from html import escape
from typing import Any

__all__ = [
    "PALETTE",
    "Axis",
    "axis_ticks",
    "bar_chart",
    "line_chart",
    "nice_range",
    "stacked_area_chart",
    "fit_text",
    "text_width",
]

PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
)  # fmt: skip
_SVG_NS = "http://www.w3.org/2000/svg"
# Engineering prefixes by power of ten (values in [1e-3, 1e3) go without one).
_PREFIX = {-12: "p", -9: "n", -6: "µ", -3: "m", 0: "", 3: "k", 6: "M", 9: "G", 12: "T", 15: "P", 18: "E"}  # fmt: skip
MAX_LABEL = 6  # characters of a tick label
FONT = 11  # px, the report's chart text (inspect_html's CSS)


def _e(value: Any) -> str:
    return escape(str(value))


# --- ticks ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Axis:
    """An axis' extent and its round ticks with their labels."""

    lo: float
    hi: float
    ticks: list[float]
    labels: list[str]
    step: float


def _round_step(raw: float) -> float:
    """The smallest step of 1, 2 or 5 x 10^k that is at least `raw` (> 0)."""
    power = 10.0 ** math.floor(math.log10(raw))
    return next(m * power for m in (1, 2, 5, 10) if m * power >= raw * (1 - 1e-9))


def _clean(value: float) -> float:
    """k * step without the binary noise (0.30000000000000004 -> 0.3)."""
    return float(f"{value:.12g}") + 0.0  # + 0.0 turns -0.0 into 0.0


def _place(lo: float, hi: float, step: float, inside: bool) -> list[float]:
    if inside:
        first, last = math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9)
    else:
        first, last = math.floor(lo / step + 1e-9), math.ceil(hi / step - 1e-9)
    return [_clean(k * step) for k in range(first, last + 1)]


def _labels(ticks: list[float], step: float, percent: bool) -> list[str]:
    if percent:
        scale, suffix, step = 0.01, "%", step
    else:
        biggest = max((abs(t) for t in ticks), default=0.0)
        power = 0
        if biggest and not 1e-3 <= biggest < 1e3:
            power = 3 * math.floor(math.log10(biggest) / 3 + 1e-9)
        if power not in _PREFIX:  # beyond the prefixes: mantissa and exponent (2e21)
            digits = max(0, math.floor(math.log10(biggest)) - math.floor(math.log10(step) + 1e-9))
            return [_exponent(t, digits) for t in ticks]
        scale, suffix = 10.0**power, _PREFIX[power]
    decimals = max(0, -math.floor(math.log10(step / scale) + 1e-9))
    out = []
    for t in ticks:
        text = f"{t / scale:.{decimals}f}"
        if float(text) == 0:
            out.append("0" + ("%" if percent else ""))
        else:
            out.append(text + suffix)
    return out


def _exponent(value: float, digits: int) -> str:
    if value == 0:
        return "0"
    mantissa, exponent = f"{value:.{digits}e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def axis_ticks(
    lo: float,
    hi: float,
    target: int = 5,
    *,
    percent: bool = False,
    inside: bool = False,
    integer: bool = False,
    max_chars: int = MAX_LABEL,
) -> Axis:
    """Round ticks for data in [lo, hi]: about `target` of them, `step` a 1, 2 or 5 x 10^k.

    The axis is widened to the ticks around the data (or, with `inside`, kept as it is and
    only the ticks within it kept: the step axis). Labels use engineering prefixes (150T,
    1.5M, 5m) or, with `percent`, a share in % (values are fractions); each has the
    decimals its step needs and at most `max_chars` characters: where they would be longer,
    the step grows (fewer ticks) until they fit. `integer` keeps the step >= 1.
    """
    if not (math.isfinite(lo) and math.isfinite(hi)):
        lo, hi = 0.0, 1.0
    if hi < lo:
        lo, hi = hi, lo
    if hi == lo:
        hi = lo + (abs(lo) * 0.1 or 1.0)
    step = _round_step((hi - lo) / max(target - 1, 1))
    if integer:
        step = max(step, 1.0)
    for _ in range(40):
        ticks = _place(lo, hi, step, inside)
        labels = _labels(ticks, step, percent)
        if max(map(len, labels), default=0) <= max_chars:
            break
        step = _round_step(step * 1.5)
    else:  # not reached: the step's growth ends at labels of one digit
        labels = [_exponent(t, 0) for t in ticks]
    if inside:
        return Axis(lo, hi, ticks, labels, step)
    return Axis(min(ticks[0], lo), max(ticks[-1], hi), ticks, labels, step)


def nice_range(lo: float, hi: float, target: int = 5) -> tuple[float, float, list[float]]:
    """Widen [lo, hi] to multiples of a 1-2-5 step giving about `target` ticks."""
    a = axis_ticks(lo, hi, target)
    return a.lo, a.hi, a.ticks


def text_width(text: str, size: float = FONT) -> float:
    """A generous estimate of `text`'s width in px in the report's sans-serif font."""
    em = 0.0
    for ch in text:
        if ch.isdigit():
            em += 0.6
        elif ch in ".,:;!|'il":
            em += 0.32
        elif ch in " -()[]/fjrt":
            em += 0.4
        elif ch in "%MWmw@µ":
            em += 0.95
        elif ch.isupper():
            em += 0.75
        else:
            em += 0.6
    return em * size * 1.08


def fit_text(text: str, width: float, size: float = FONT) -> str:
    """`text`, shortened with an ellipsis where it would be wider than `width` px."""
    if text_width(text, size) <= width:
        return text
    while text and text_width(text + "…", size) > width:
        text = text[:-1]
    return text.rstrip() + "…"


# --- the frame every chart shares ------------------------------------------------------------------


class _Frame:
    """Title, legend rows, plot area, axes with their titles; maps data to pixels."""

    def __init__(
        self,
        title: str,
        y: Axis,
        x_title: str,
        y_title: str,
        legend: list[dict[str, Any]],
        width: int,
        plot_height: int,
        x_tick_labels: list[str],
    ):
        self.y, self.width = y, width
        label_w = max((text_width(t) for t in y.labels), default=0.0)
        self.left = math.ceil(18 + 6 + label_w + 6)  # y title, gap, labels, tick gap
        last_x = text_width(x_tick_labels[-1]) if x_tick_labels else 0.0
        self.right = math.ceil(max(14.0, last_x / 2 + 4))
        self.pw = width - self.left - self.right
        # legend: rows of (swatch, label), wrapped at the chart's width
        self.legend: list[tuple[float, int, dict[str, Any]]] = []
        x, row = 10.0, 0
        for item in legend if len(legend) > 1 else []:
            w = 26 + text_width(item["label"]) + 14
            if x + w > width - 6 and x > 10:
                x, row = 10.0, row + 1
            self.legend.append((x, row, item))
            x += w
        rows = (row + 1) if self.legend else 0
        self.top = 26 + 16 * rows + 8
        self.ph = plot_height
        self.bottom = 40
        self.height = self.top + self.ph + self.bottom
        self.title, self.x_title, self.y_title = title, x_title, y_title
        self.series = len(legend)

    def py(self, v: float) -> float:
        lo, hi = self.y.lo, self.y.hi
        return self.top + (1 - (min(max(v, lo), hi) - lo) / (hi - lo)) * self.ph

    def head(self) -> list[str]:
        w, h = self.width, self.height
        out = [
            f'<svg xmlns="{_SVG_NS}" width="{w}" height="{h}" viewBox="0 0 {w} {h}" '
            f'role="img" data-series="{self.series}">',
            f"<title>{_e(self.title)}</title>",
            f'<text class="chart-title" x="10" y="17" font-weight="bold">'
            f"{_e(fit_text(self.title, self.width - 20, FONT * 1.2))}</text>",
        ]
        for x, row, item in self.legend:
            y = 34 + 16 * row
            out.append(f'<g class="legend">{_swatch(item, x, y - 4)}')
            label = fit_text(item["label"], self.width - x - 36)
            out.append(f'<text x="{x + 26:.1f}" y="{y}">{_e(label)}</text></g>')
        for t, label in zip(self.y.ticks, self.y.labels, strict=True):
            yy = self.py(t)
            out.append(
                f'<line x1="{self.left}" y1="{yy:.1f}" x2="{self.left + self.pw}" y2="{yy:.1f}" '
                f'stroke="#e6e6e6"/><text class="tick y-tick" x="{self.left - 6}" '
                f'y="{yy + 4:.1f}" text-anchor="end">{_e(label)}</text>'
            )
        # the frame goes under the data, so a line along an edge (a ratio of 1) stays seen
        out.append(
            f'<rect x="{self.left}" y="{self.top}" width="{self.pw}" height="{self.ph}" '
            'fill="none" stroke="#999"/>'
        )
        cy = self.top + self.ph / 2
        out.append(
            f'<text class="axis-title y-title" transform="translate(14,{cy:.1f}) rotate(-90)" '
            f'text-anchor="middle">{_e(fit_text(self.y_title, self.ph + 20))}</text>'
        )
        out.append(
            f'<text class="axis-title x-title" x="{self.left + self.pw / 2:.1f}" '
            f'y="{self.top + self.ph + 33}" text-anchor="middle">'
            f"{_e(fit_text(self.x_title, self.pw))}</text>"
        )
        return out

    def x_tick(self, x: float, label: str) -> str:
        return (
            f'<text class="tick x-tick" x="{x:.1f}" y="{self.top + self.ph + 15}" '
            f'text-anchor="middle">{_e(label)}</text>'
        )

    def tail(self) -> list[str]:
        return ["</svg>"]


def _dash(item: dict[str, Any]) -> str:
    dash = item.get("dashed")
    if not dash:
        return ""
    return f' stroke-dasharray="{"5 4" if dash is True else dash}"'


def _swatch(item: dict[str, Any], x: float, y: float) -> str:
    if item.get("fill"):
        return (
            f'<rect x="{x:.1f}" y="{y - 5:.1f}" width="20" height="10" fill="{item["color"]}" '
            'fill-opacity="0.85"/>'
        )
    return (
        f'<line x1="{x:.1f}" y1="{y:.1f}" x2="{x + 20:.1f}" y2="{y:.1f}" '
        f'stroke="{item["color"]}" stroke-width="{item.get("width", 1.6) + 0.4}"{_dash(item)}/>'
    )


def _x_axis(xs: list[float], integer: bool) -> tuple[float, float, Axis]:
    x0 = xs[0] if xs else 0.0
    x1 = xs[-1] if len(xs) > 1 and xs[-1] > x0 else x0 + 1
    return x0, x1, axis_ticks(x0, x1, 6, inside=True, integer=integer)


# --- charts --------------------------------------------------------------------------------------


def line_chart(
    title: str,
    xs: list[float],
    lines: list[dict[str, Any]],
    lo: float,
    hi: float,
    *,
    x_title: str = "step",
    y_title: str,
    percent: bool = False,
    integer_x: bool = True,
    width: int = 540,
    plot_height: int = 140,
) -> str:
    """An SVG line chart: `lines` are {label, values, color, dashed, width, front}, one value
    per x. Lines marked `front` (the plan's own) are drawn last, on top of the others; the
    legend keeps the given order."""
    x0, x1, xa = _x_axis(xs, integer_x)
    f = _Frame(title, axis_ticks(lo, hi, percent=percent), x_title, y_title, lines, width,
               plot_height, xa.labels)  # fmt: skip

    def px(x: float) -> float:
        return f.left + (x - x0) / (x1 - x0) * f.pw

    out = f.head()
    out += [f.x_tick(px(t), label) for t, label in zip(xa.ticks, xa.labels, strict=True)]
    for line in sorted(lines, key=lambda item: bool(item.get("front"))):
        if len(xs) == 1:
            v = line["values"][0]
            points = f"{px(x0):.1f},{f.py(v):.1f} {px(x1):.1f},{f.py(v):.1f}"
        else:
            points = " ".join(
                f"{px(x):.1f},{f.py(v):.1f}" for x, v in zip(xs, line["values"], strict=True)
            )
        out.append(
            f'<polyline fill="none" stroke="{line["color"]}" '
            f'stroke-width="{line.get("width", 1.6)}"{_dash(line)} points="{points}">'
            f"<title>{_e(line['label'])}</title></polyline>"
        )
    return "".join(out + f.tail())


def stacked_area_chart(
    title: str,
    xs: list[float],
    layers: list[dict[str, Any]],
    *,
    bounds: list[dict[str, Any]] | None = None,
    x_title: str = "step",
    y_title: str = "share (%)",
    width: int = 540,
    plot_height: int = 140,
) -> str:
    """Shares stacked to 100%: `layers` are {label, values, color}, bottom first, one value
    (a fraction) per x; `bounds` are extra lines {label, values, color, dashed} drawn on top
    (say, the target's cumulative shares)."""
    x0, x1, xa = _x_axis(xs, True)
    legend = [{**layer, "fill": True} for layer in layers]
    if bounds:
        legend.append(bounds[0])
    f = _Frame(title, axis_ticks(0.0, 1.0, 6, percent=True), x_title, y_title, legend, width,
               plot_height, xa.labels)  # fmt: skip
    if len(xs) == 1:
        xs = [x0, x1]
        layers = [{**layer, "values": layer["values"] * 2} for layer in layers]
        bounds = [{**b, "values": b["values"] * 2} for b in bounds or []]

    def px(x: float) -> float:
        return f.left + (x - x0) / (x1 - x0) * f.pw

    out = f.head()
    out += [f.x_tick(px(t), label) for t, label in zip(xa.ticks, xa.labels, strict=True)]
    below = [0.0] * len(xs)
    for layer in layers:
        above = [min(b + max(v, 0.0), 1.0) for b, v in zip(below, layer["values"], strict=True)]
        upper = [f"{px(x):.1f},{f.py(v):.1f}" for x, v in zip(xs, above, strict=True)]
        lower = [f"{px(x):.1f},{f.py(v):.1f}" for x, v in zip(xs, below, strict=True)]
        out.append(
            f'<polygon fill="{layer["color"]}" fill-opacity="0.85" stroke="#fff" '
            f'stroke-width="0.5" points="{" ".join(upper + lower[::-1])}">'
            f"<title>{_e(layer['label'])}</title></polygon>"
        )
        below = above
    for b in bounds or []:
        points = " ".join(f"{px(x):.1f},{f.py(v):.1f}" for x, v in zip(xs, b["values"], strict=True))
        out.append(
            f'<polyline fill="none" stroke="{b["color"]}" stroke-width="{b.get("width", 1.2)}"'
            f'{_dash(b)} points="{points}"/>'
        )
    return "".join(out + f.tail())


def bar_chart(
    title: str,
    labels: list[str],
    values: list[float],
    *,
    x_title: str,
    y_title: str,
    width: int = 540,
    plot_height: int = 130,
) -> str:
    """An SVG bar chart, one bar per label (labels thinned where they would collide); each
    bar's tooltip gives its exact value."""
    peak = max(values, default=0) or 1
    ya = axis_ticks(0.0, peak)
    f = _Frame(title, ya, x_title, y_title, [], width, plot_height, labels[-1:])
    step = f.pw / max(len(values), 1)
    widest = max((text_width(label) for label in labels), default=0.0)
    every = max(1, math.ceil((widest + 6) / step))
    out = f.head()
    base = f.py(0.0)
    for i, (label, value) in enumerate(zip(labels, values, strict=True)):
        top = f.py(value)
        x = f.left + i * step
        out.append(
            f'<rect x="{x + step * 0.1:.1f}" y="{top:.1f}" width="{step * 0.8:.1f}" '
            f'height="{base - top:.1f}" fill="{PALETTE[0]}"><title>{_e(label)}: '
            f"{_e(f'{value:,}')}</title></rect>"
        )
        if i % every == 0:
            out.append(f.x_tick(x + step / 2, label))
    return "".join(out + f.tail())
