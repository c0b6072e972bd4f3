"""`mds inspect --html`: the same report as one self-contained page (inline CSS and SVG, no
scripts, no external assets), written atomically.
"""

from __future__ import annotations

from html import escape
from pathlib import Path
from typing import Any

from mds.cli.inspect_text import (
    band_text,
    cost_text,
    missing_windows,
    number,
    percent,
    step_geometry,
)
from mds.cli.svg import PALETTE, bar_chart, line_chart, stacked_area_chart
from mds.planner.runtime.atomic import atomic_path, cannot_write

__all__ = ["render_html", "write_html"]

_CSS = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px; color: #222; max-width: 1150px; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 28px; } h3 { font-size: 15px; }
table { border-collapse: collapse; margin: 8px 0 16px; }
th, td { padding: 3px 10px; border-bottom: 1px solid #ddd; text-align: right; }
th:first-child, td:first-child, .l { text-align: left; }
th { background: #f3f3f3; }
code { font-size: 12px; }
.charts { display: flex; flex-wrap: wrap; gap: 12px; }
svg { background: #fff; border: 1px solid #e3e3e3; }
svg text { font: 11px system-ui, sans-serif; fill: #333; }
svg text.chart-title { font-weight: bold; font-size: 12px; fill: #222; }
.note { color: #666; }
.warn { color: #a40; }
"""


def _e(value: Any) -> str:
    return escape("-" if value is None else str(value))


def _table(head: list[str], rows: list[list[Any]], left: tuple[int, ...] = (0,)) -> str:
    def cell(tag: str, i: int, value: Any) -> str:
        cls = ' class="l"' if i in left else ""
        return f"<{tag}{cls}>{_e(value)}</{tag}>"

    out = ["<table><thead><tr>", *(cell("th", i, h) for i, h in enumerate(head)), "</tr></thead>"]
    out.append("<tbody>")
    for row in rows:
        out.append("<tr>" + "".join(cell("td", i, v) for i, v in enumerate(row)) + "</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def _pairs(rows: list[tuple[str, Any]]) -> str:
    return _table(["what", "value"], [list(r) for r in rows], left=(0, 1))


# --- pages ---------------------------------------------------------------------------------------


def _short(n: int) -> str:
    for unit, size in (("M", 1 << 20), ("k", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return str(n)


def _index_body(r: dict[str, Any]) -> list[str]:
    out = [
        f"<h1>mds index <code>{_e(r['path'])}</code></h1>",
        _pairs(
            [
                ("format version", r["format_version"]),
                ("fingerprint", f"{r['fingerprint']} ({r['fingerprint_mode']})"),
                ("root", r["root"]),
                ("rows", f"{r['rows']:,}"),
                ("tokens", f"{r['tokens']:,}" + ("" if r["exact"] else " (includes estimates)")),
            ]
        ),
    ]
    rows = []
    for s in r["sources"]:
        n, mark = s["lengths"], "" if s["exact"] else "~"
        rows.append(
            [s["name"], s["format"], f"{s['rows']:,}", f"{mark}{s['tokens']:,}"]
            + [f"{mark}{n[k]:,}" if n[k] is not None else "-" for k in ("p50", "p90", "p99", "max")]
        )
    out.append("<h2>Sources</h2>")
    out.append(_table(["source", "format", "rows", "tokens", "p50", "p90", "p99", "max"], rows))
    if not r["exact"]:
        out.append('<p class="note">~ estimated token counts (a length rule, not a tokenizer)</p>')
    for s in r["sources"]:
        out.append(f"<h2>{_e(s['name'])}</h2>")
        length = s["length"]
        how = length.get("kind", "?") + (f" {length['rule']}" if "rule" in length else "")
        out.append(f'<p class="note">{_e(s["format"])}, lengths from {_e(how)}</p>')
        if s["histogram"]:
            labels = [_short(b["lo"]) for b in s["histogram"]]
            out.append(
                bar_chart(
                    f"{s['name']}: samples per length bucket [2^k, 2^(k+1)) tokens",
                    labels,
                    [b["count"] for b in s["histogram"]],
                    x_title="sample length (tokens, bucket start)",
                    y_title="samples",
                )
            )
        meta = []
        for m in s["metadata"]:
            if m["kind"] == "numeric":
                text = f"min {m['min']}, mean {number(m['mean'], '.4g')}, max {m['max']}"
            else:
                text = ", ".join(f"{t['value']}: {t['count']:,}" for t in m["top"])
                text += f", other: {m['other']:,}" if m["other"] else ""
            meta.append([m["column"], m["dtype"], f"{m['nulls']:,}", text])
        if meta:
            out.append(_table(["column", "dtype", "nulls", "values"], meta, left=(0, 1, 3)))
        files = [
            [f["path"], f"{f['size']:,}", f"{f['rows']:,}", f"{f['tokens']:,}", f["fingerprint"]]
            for f in s["files"]
        ]
        out.append(_table(["file", "size", "rows", "tokens", "fingerprint"], files, left=(0, 4)))
    return out


def _plan_body(r: dict[str, Any]) -> list[str]:
    h = r["header"]
    size = (
        f"{h['samples_per_step']:,} samples"
        if h["samples_per_step"] is not None
        else f"{h['tokens_per_step']:,} tokens"
    )
    out = [
        f"<h1>mds plan <code>{_e(r['path'])}</code></h1>",
        _pairs(
            [
                ("format version", h["format_version"]),
                ("plan id", h["plan_id"]),
                step_geometry(h),
                ("step size", size),
                ("capacity (tokens per micro-batch)", f"{h['capacity']:,}"),
                ("seed / overlong", f"{h['seed']} / {h['overlong']}"),
                ("cost model", cost_text(h["cost"], h["cost_model"])),
                *([("predictions use", h["cost_label"])] if "cost_label" in h else []),
                ("index fingerprint", f"{h['index_fingerprint']} ({h['index_path']})"),
                ("chunk_steps / chunks", f"{h['chunk_steps']} / {h['chunks']}"),
                *(
                    [("re-planned from", f"plan {h['lineage']['parent']} at step {h['first_step']:,}")]
                    if h.get("lineage")
                    else []
                ),
                ("samples / tokens", f"{r['totals']['samples']:,} / {r['totals']['tokens']:,}"),
            ]
        ),
        f"<h2>Mix (shares of {_e(r['share_unit'])})</h2>",
    ]  # fmt: skip
    rows = [
        [
            s["name"], percent(s["target"]), percent(s["realized"]),
            f"{100 * (s['realized'] - s['target']):+.2f}", f"{s['samples']:,}",
            f"{s['eligible']:,}", f"{s['epochs']:.3f}", s["epochs_started"],
            s["dropped_overlong"], s["truncated"],
        ]
        for s in r["sources"]
    ]  # fmt: skip
    head = ["source", "target", "realized", "diff (pp)", "samples", "eligible", "epochs"]
    out.append(_table(head + ["epochs started", "dropped", "truncated"], rows))
    out.extend(f'<p class="warn">warning: {_e(w)}</p>' for w in r.get("warnings", []))
    phases = r["phases"]
    out.append("<h3>Per schedule phase: target / realized</h3>")
    rows = [
        [s["name"]]
        + [
            f"{percent(p['sources'][i]['target'])} / {percent(p['sources'][i]['realized'])}"
            for p in phases
        ]
        for i, s in enumerate(r["sources"])
    ]
    out.append(_table(["source"] + [f"steps {p['start']}-{p['end'] - 1}" for p in phases], rows))
    out.extend(_balance(r))
    if r.get("vision") is not None:
        out.extend(_vision(r["vision"]))
    if r.get("cp") is not None:
        out.extend(_cp(r["cp"]))
    if r.get("online") is not None:
        out.extend(_online(r["online"]))
    out.extend(_charts(r))
    return out


def _online(o: dict[str, Any]) -> list[str]:
    """Weights over the windows, planned (solid) and realised (dashed) per source, the mean
    losses that moved them, and a table per window; windows not planned yet are named."""
    names, rows = o["sources"], o["per_window"]
    written = [w for w in rows if w["written"]]
    out = [
        "<h2>Online mixing</h2>",
        f'<p class="note">{o["windows"]} windows of {o["window_steps"]} steps; '
        f"{o['written']} segments written"
        + (f"; {missing} not planned yet" if (missing := missing_windows(o)) else "")
        + "; signals: "
        + (
            f"<code>{_e(o['signals'])}</code>, {o['signal_windows']} windows"
            if o["signals"]
            else "no signal log beside the plan"
        )
        + "</p>",
    ]
    charts = []
    colors = [PALETTE[i % len(PALETTE)] for i in range(len(names))]
    if written:
        xs = _steps_x(written)
        lines = []
        for i, (n, c) in enumerate(zip(names, colors, strict=True)):
            lines.append({"label": f"{n} planned", "values": _held(written, "planned", i),
                          "color": c, "width": 2.0, "front": True})  # fmt: skip
            lines.append({"label": f"{n} realized", "values": _held(written, "realized", i),
                          "color": c, "dashed": "4 3"})  # fmt: skip
        hi = max(v for line in lines for v in line["values"])
        charts.append(
            line_chart(f"weight per window (share of {o['share_unit']}); dashed: realized",
                       xs, lines, 0.0, min(1.0, hi * 1.15) or 1.0, y_title="share (%)",
                       percent=True)
        )  # fmt: skip
    signalled = [w for w in rows if w["mean_loss"] is not None and None not in w["mean_loss"]]
    if signalled:
        xs = _steps_x(signalled)
        lines = [
            {"label": n, "values": _held(signalled, "mean_loss", i), "color": c, "width": 2.0}
            for i, (n, c) in enumerate(zip(names, colors, strict=True))
        ]
        lo = min(v for line in lines for v in line["values"])
        hi = max(v for line in lines for v in line["values"])
        charts.append(
            line_chart("signal: mean loss per source per window", xs, lines, min(0.0, lo),
                       hi * 1.05 if hi > 0 else 1.0, y_title="mean loss")
        )  # fmt: skip
    if charts:
        out += ['<div class="charts">', *charts, "</div>"]
    table = []
    for w in rows:
        if not w["written"]:
            table.append([w["window"], f"{w['start']}-{w['end'] - 1}"] + ["not planned yet"] * len(names))
            continue
        loss = w["mean_loss"] or [None] * len(names)
        table.append(
            [w["window"], f"{w['start']}-{w['end'] - 1}"]
            + [f"{percent(p)} / {percent(r)} / {number(m, '.3f')}"
               for p, r, m in zip(w["planned"], w["realized"], loss, strict=True)]
        )  # fmt: skip
    out.append("<h3>Per window: planned / realized / mean loss</h3>")
    out.append(_table(["window", "steps", *names], table))
    return out


def _cp(cp: dict[str, Any]) -> list[str]:
    """The CP layout: per layout the CP-rank imbalance and the DP x CP step over its bound."""
    names = {"mds": "mds", "headtail": "head-tail everywhere", "contiguous": "contiguous"}
    rows = []
    for name, label in names.items():
        q = cp["layouts"][name]
        rows.append(
            [label]
            + [number(q["imbalance"][k]) for k in ("mean", "max")]
            + [number(q["step_over_lower_bound"][k]) for k in ("mean", "max")]
            + [f"{q['step_time_over_mds']:.4f}"]
        )
    return [
        "<h2>Context parallelism</h2>",
        _pairs(
            [
                ("cp_size / split from", f"{cp['cp_size']} / {cp['split_from']:,} tokens"),
                ("samples split", f"{cp['samples_split']:,} ({percent(cp['split_share'])})"),
                ("padding", f"{cp['padding_tokens']:,} tokens ({percent(cp['padding_share'])})"),
            ]
        ),
        _table(
            ["layout", "CP busiest / mean: mean", "max", "DP x CP step / lower bound: mean", "max", "step time / mds"],
            rows,
        ),
    ]


def _vision(v: dict[str, Any]) -> list[str]:
    """Encoder and backbone balance side by side, patches, images per source."""
    rows = []
    for part in ("encoder", "backbone", "sum"):
        q = v["balance"][part]
        rows.append(
            [part]
            + [number(q["max_over_lower_bound"][k]) for k in ("median", "max")]
            + [number(q["naive_over_lower_bound"][k]) for k in ("median", "max")]
        )
    g, patches = v["geometry"], v["patches"]
    cap = patches["capacity"]
    out = [
        "<h2>Encoder and backbone</h2>",
        _table(["part (most-loaded rank / lower bound)", "median", "max", "naive median", "naive max"], rows),
        _pairs(
            [
                ("image geometry", f"patch {g['patch_size']}, merge {g['merge_size']}, temporal "
                 f"{g['temporal_patch_size']}, resize {g['resize']}, pixels {g['min_pixels']:,} - {g['max_pixels']:,}"),
                ("encoder share of cost", percent(v["balance"]["encoder_share"])),
                ("patches per step (mean)", f"{patches['per_step']['mean'] or 0:,.0f}"),
                ("largest micro-batch (patches)", f"{patches['max_micro_batch']['max'] or 0:,.0f}"
                 + (f" of {cap:,}" if cap else " (no patch capacity)")),
            ]
        ),
    ]  # fmt: skip
    for s in v["sources"] or []:
        out.append(
            f"<h3>{_e(s['name'])}: {s['images']:,} images in {s['samples']:,} samples "
            f"({s['images_per_sample']:.2f} per sample, {s['without_images']:,} without)</h3>"
        )
        hist = [
            [f"{b['from']:,}+" if b["to"] is None else f"{b['from']:,} - {b['to'] - 1:,}", f"{b['images']:,}"]
            for b in s["patch_histogram"]
        ]
        out.append(_table(["patches per image", "images"], hist))
        if s["images"]:
            out.append(
                bar_chart(
                    f"{s['name']}: images per bucket of patches per image",
                    [_short(b["from"]) + ("+" if b["to"] is None else "") for b in s["patch_histogram"]],
                    [b["images"] for b in s["patch_histogram"]],
                    x_title="patches per image (bucket start)",
                    y_title="images",
                )
            )
    return out


def _balance(r: dict[str, Any]) -> list[str]:
    imb, fill = r["imbalance"], r["capacity_fill"]
    rows = [
        [label] + [number(imb[key][k]) for k in ("mean", "median", "p99", "max")]
        for label, key in (
            ("max rank cost / mean", "max_over_mean"),
            ("max rank cost / lower bound", "max_over_lower_bound"),
            ("naive sharding / lower bound", "naive_over_lower_bound"),
            ("in-order interleave / lower bound", "interleave_over_lower_bound"),
        )
        if imb[key] is not None
    ]
    return [
        "<h2>Balance</h2>",
        _table(["per-step ratio", "mean", "median", "p99", "max"], rows),
        f"<p>Predicted speedup vs naive sharding: <b>{imb['speedup_vs_naive']:.3f}x</b>"
        + (
            f"; <b>{imb['speedup_vs_naive_with_c']:.3f}x</b> counting c per micro-batch"
            if imb["speedup_vs_naive_with_c"] is not None
            else ""
        )
        + (
            f"; vs in-order interleaving: <b>{imb['speedup_vs_interleave']:.3f}x</b> "
            f"(stronger baseline: {imb['stronger_baseline']})"
            if imb["speedup_vs_interleave"] is not None
            else ""
        )
        + "</p>",
        *([f'<p class="note">{escape(band)}</p>'] if (band := band_text(r)) else []),
        _table(
            ["capacity fill", "mean", "min", "max"],
            [
                ["step tokens / (dp x micro x capacity)"]
                + [percent(fill["step"][k]) for k in ("mean", "min", "max")],
                ["max micro-batch tokens / capacity"]
                + [percent(fill["max_micro_batch"][k]) for k in ("mean", "min", "max")],
            ],
        ),
    ]


def _charts(r: dict[str, Any]) -> list[str]:
    series = r["series"]
    if not series["start"]:
        return []
    bucket, unit = series["bucket"], r["share_unit"]
    xs = [s + (bucket - 1) / 2 for s in series["start"]]
    per = f"{bucket} steps" if bucket > 1 else "step"
    out = [
        "<h2>Over steps</h2>",
        f'<p class="note">one point per {per}; shares of {_e(unit)}; dashed: target</p>',
        '<div class="charts">',
    ]
    out.extend(_mix_charts(r, xs))
    for i, s in enumerate(series["sources"]):
        hi = max(max(s["target"]), max(s["realized"]))
        lines = [
            {"label": "target", "values": s["target"], "color": "#333", "dashed": True},
            {"label": "realized (plan)", "values": s["realized"],
             "color": PALETTE[i % len(PALETTE)], "width": 2.0, "front": True},
        ]  # fmt: skip
        out.append(
            line_chart(f"{s['name']}: share of {unit}", xs, lines, 0.0, min(1.0, hi * 1.15),
                       y_title="share (%)", percent=True)
        )  # fmt: skip
    inter = series.get("interleave_ratio") or []
    hi = max(max(series["ratio"]), max(series["naive_ratio"]), *inter)
    # The plan's own line goes first in the legend and is drawn last, thick and dark, on
    # top of the baselines it is compared with.
    lines = [
        {"label": "mds plan: max / lower bound", "values": series["ratio"], "color": "#08306b",
         "width": 2.6, "front": True},
        {"label": "naive sharding / lower bound", "values": series["naive_ratio"],
         "color": PALETTE[1], "dashed": True},
    ]  # fmt: skip
    if inter:
        lines.append(
            {"label": "in-order interleave / lower bound", "values": inter,
             "color": PALETTE[2], "dashed": "2 3"}
        )  # fmt: skip
    out.append(
        line_chart("rank imbalance per step (busiest rank / lower bound)", xs, lines, 1.0,
                   hi * 1.05 or 1.0, y_title="cost ratio (x lower bound)")
    )  # fmt: skip
    out.append("</div>")
    return out


def _mix_charts(r: dict[str, Any], xs: list[float]) -> list[str]:
    """The realized mix stacked per step (the target's boundaries dashed on it) and the
    target stacked alongside, same colours; nothing to stack for a single source."""
    sources, unit = r["series"]["sources"], r["share_unit"]
    if len(sources) < 2:
        return []
    colors = [PALETTE[i % len(PALETTE)] for i in range(len(sources))]
    realized = [
        {"label": s["name"], "values": s["realized"], "color": c}
        for s, c in zip(sources, colors, strict=True)
    ]
    target = [
        {"label": s["name"], "values": s["target"], "color": c}
        for s, c in zip(sources, colors, strict=True)
    ]
    bounds, below = [], [0.0] * len(xs)
    for s in sources[:-1]:
        below = [b + v for b, v in zip(below, s["target"], strict=True)]
        bounds.append({"label": "target boundary", "values": below, "color": "#111",
                       "dashed": "4 3", "width": 1.2})  # fmt: skip
    y_title = f"share of {unit} (%)"
    return [
        stacked_area_chart(f"realized mix (share of {unit})", xs, realized, bounds=bounds,
                           y_title=y_title),
        stacked_area_chart(f"target mix (share of {unit})", xs, target, y_title=y_title),
    ]  # fmt: skip


def _steps_x(windows: list[dict[str, Any]]) -> list[float]:
    """Each window's first and last step: a value held over a window is drawn flat."""
    return [float(x) for w in windows for x in (w["start"], w["end"] - 1)]


def _held(windows: list[dict[str, Any]], key: str, i: int) -> list[float]:
    """Source i's `key` per window, twice (at the window's first and last step)."""
    return [w[key][i] for w in windows for _ in range(2)]


def _step_body(r: dict[str, Any], unit: str | None = None) -> list[str]:
    st = r["stats"]
    out = [
        f"<h1>mds plan <code>{_e(r['path'])}</code>, step {r['step']}</h1>",
        _pairs(
            [
                ("plan id", r["plan_id"]),
                ("index", f"{r['index']} (root {r['index_root']})"),
                ("ranks shown", ", ".join(map(str, r["ranks"]))),
                ("step samples / tokens", f"{st['samples']:,} / {st['tokens']:,}"),
                ("max rank cost / lower bound (units)", f"{st['max_rank_cost']:,} / {st['lower_bound']:,}"),
                ("naive max rank cost (units)", f"{st['naive_max_rank_cost']:,}"),
                *(
                    [("in-order interleave max rank cost (units)",
                      f"{st['interleave_max_rank_cost']:,}")]
                    if "interleave_max_rank_cost" in st
                    else []
                ),
            ]
        ),
        "<h2>Per rank</h2>",
    ]  # fmt: skip
    totals = r["rank_totals"]
    out.append(
        bar_chart(
            "cost per rank (as configured)",
            [f"r{t['rank']}" for t in totals],
            [t["cost"] for t in totals],
            x_title="DP rank",
            y_title=f"cost ({unit})" if unit else "cost",
        )
    )
    rows = [
        [t["rank"], f"{t['samples']:,}", f"{t['tokens']:,}", f"{t['cost']:.6g}",
         f"{t['cost_units']:,}", " / ".join(f"{m['tokens']:,}" for m in t["micro_batches"])]
        for t in totals
    ]  # fmt: skip
    head = ["rank", "samples", "tokens", "cost", "cost units", "micro-batch tokens"]
    out.append(_table(head, rows))
    out.append("<h2>Samples</h2>")
    keys = ("rank", "micro_batch", "source", "row", "file", "file_row", "offset", "length")
    rows = [
        [s[k] for k in keys] + [f"{s['n_tokens']:,}", f"{s['cost']:.6g}", f"{s['cost_units']:,}"]
        for s in r["samples"]
    ]
    head = [*keys, "n_tokens", "cost", "cost units"]
    out.append(_table(head, rows, left=(2, 4)))
    return out


def render_html(report: dict[str, Any], unit: str | None = None) -> str:
    """The report as a complete HTML document; `unit` names what a step report's costs are
    measured in (its cost-per-rank axis)."""
    if report["kind"] == "step":
        body = _step_body(report, unit)
    else:
        body = {"index": _index_body, "plan": _plan_body}[report["kind"]](report)
    title = f"mds inspect: {report['kind']} {report['path']}"
    return "".join(
        [
            '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">',
            f"<title>{_e(title)}</title><style>{_CSS}</style></head><body>",
            *body,
            f'<p class="note">mds inspect, report schema {report["schema"]}</p>',
            "</body></html>\n",
        ]
    )


def write_html(report: dict[str, Any], path: str | Path, unit: str | None = None) -> None:
    """Render and write atomically (the old file, if any, stays until the new one is whole)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    page = render_html(report, unit)
    try:
        with atomic_path(path) as tmp:
            tmp.write_text(page, encoding="utf-8")
    except OSError as exc:
        raise cannot_write(path, "the report", exc) from exc
