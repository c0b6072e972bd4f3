"""`mds inspect` on the terminal: an index, a plan or one step drawn as rich tables and
sparklines from the report dicts of `mds.planner.report` (rich imported on first use)."""

from __future__ import annotations

from typing import Any

from mds.cli.inspect_text import (
    SPARK_WIDTH,
    band_text,
    bar,
    cost_text,
    missing_windows,
    number,
    percent,
    sparkline,
    step_geometry,
    value_text,
)
from mds.cli.output import console

__all__ = ["print_index", "print_plan", "print_step"]


def _esc(text: Any) -> str:
    from rich.markup import escape

    return escape(str(text))


def _tokens(n: int, exact: bool) -> str:
    return f"{n:,}" if exact else f"~{n:,}"


def _table(title: str | None = None, *columns: str, left: tuple[int, ...] = (0,), **kwargs: Any):
    """A rich table; columns are right-aligned (numbers) except those at `left`."""
    from rich.table import Table

    table = Table(title=title, title_justify="left", **kwargs)
    for i, col in enumerate(columns):
        table.add_column(col, justify="left" if i in left else "right")
    return table


def _pairs(title: str, rows: list[tuple[str, str]]):
    table = _table(title, "what", "value", show_header=False)
    table.columns[0].no_wrap = True
    table.columns[1].overflow = "fold"  # only a value longer than the screen is cut
    for row in rows:
        table.add_row(*row)
    return table


def _only_wraps(table, column: int) -> None:
    """Every column but `column` keeps its values on one line, so on a narrow screen only
    that one (file names) gives way, and only as much as needed."""
    for i, col in enumerate(table.columns):
        col.no_wrap = i != column
    table.columns[column].overflow = "fold"


# --- index -------------------------------------------------------------------------------------


def print_index(report: dict[str, Any], files: bool = False) -> None:
    console.print(
        _pairs(
            f"index {_esc(report['path'])}",
            [
                ("format version", str(report["format_version"])),
                ("fingerprint", f"{report['fingerprint']} ({report['fingerprint_mode']})"),
                ("root", _esc(report["root"])),
                (
                    "rows / tokens",
                    f"{report['rows']:,} / {_tokens(report['tokens'], report['exact'])}",
                ),
            ],
        )
    )
    table = _table(
        "sources", "source", "format", "rows", "tokens", "p50", "p90", "p99", "max", left=(0, 1)
    )
    for s in report["sources"]:
        n = s["lengths"]
        mark = "" if s["exact"] else "~"
        table.add_row(
            s["name"],
            s["format"],
            f"{s['rows']:,}",
            _tokens(s["tokens"], s["exact"]),
            *(f"{mark}{n[k]:,}" if n[k] is not None else "-" for k in ("p50", "p90", "p99", "max")),
        )
    console.print(table)
    if not report["exact"]:
        console.print("~ estimated token counts (length rule, not a tokenizer)")
    for s in report["sources"]:
        _print_source(s, files)


def _print_source(s: dict[str, Any], files: bool) -> None:
    length = s["length"]
    how = length.get("kind", "?") + (f" {length['rule']}" if "rule" in length else "")
    console.print(f"\n[bold]{s['name']}[/] ({s['format']}, lengths: {how})")
    if s["histogram"]:
        peak = max(b["count"] for b in s["histogram"])
        hist = _table(None, "tokens", "samples", "", left=(0, 2), box=None, pad_edge=False)
        for b in s["histogram"]:
            label = _esc(f"[{b['lo']:,}, {b['hi']:,})")
            hist.add_row(label, f"{b['count']:,}", bar(b["count"], peak))
        console.print(hist)
    for m in s["metadata"]:
        if m["kind"] == "numeric":
            text = f"min {value_text(m['min'])}, mean {value_text(m['mean'])}, max {value_text(m['max'])}"
        else:
            text = ", ".join(f"{_esc(t['value'])} {t['count']:,}" for t in m["top"])
            text += f", other {m['other']:,}" if m["other"] else ""
        nulls = f" (nulls {m['nulls']:,})" if m["nulls"] else ""
        console.print(f"  {m['column']} [{m['dtype']}]: {text}{nulls}")
    if files:
        table = _table(None, "file", "size", "rows", "tokens", "fingerprint", left=(0, 4))
        # the fingerprint is cut short (JSON has it whole) before a file name is split
        heads = ["file", "size", "rows", "tokens"]
        cells = [
            [f["path"], f"{f['size']:,}", f"{f['rows']:,}", f"{f['tokens']:,}"] for f in s["files"]
        ]
        widths = [max(len(row[i]) for row in [heads, *cells]) for i in range(4)]
        for i, col in enumerate(table.columns):
            col.no_wrap = i in (1, 2, 3)
        table.columns[0].overflow = "fold"
        table.columns[4].overflow = "ellipsis"
        # 16: the borders and padding of five columns
        table.columns[4].max_width = max(16, console.width - 16 - sum(widths))
        for f in s["files"]:
            table.add_row(
                _esc(f["path"]),
                f"{f['size']:,}",
                f"{f['rows']:,}",
                f"{f['tokens']:,}",
                f["fingerprint"],
            )
        console.print(table)


# --- plan --------------------------------------------------------------------------------------


def _header_rows(h: dict[str, Any]) -> list[tuple[str, str]]:
    size = (
        f"{h['samples_per_step']:,} samples"
        if h["samples_per_step"] is not None
        else f"{h['tokens_per_step']:,} tokens"
    )
    return [
        ("format version / plan id", f"{h['format_version']} / {h['plan_id']}"),
        step_geometry(h),
        ("step size / capacity", f"{size} / {h['capacity']:,} tokens per micro-batch"),
        ("seed / overlong", f"{h['seed']} / {h['overlong']}"),
        ("cost model", _esc(cost_text(h["cost"], h["cost_model"]))),
        *([("predictions use", _esc(h["cost_label"]))] if "cost_label" in h else []),
        ("index fingerprint", h["index_fingerprint"]),
        ("index", _esc(h["index_path"])),
        ("chunk_steps / chunks", f"{h['chunk_steps']} / {h['chunks']}"),
        *_lineage_rows(h),
    ]


def _lineage_rows(h: dict[str, Any]) -> list[tuple[str, str]]:
    """A re-planned plan: which plan it continues, and from which step; the steps it skipped
    and the documents it excludes (docs/plan-format.md, "Re-planned plans")."""
    lineage = h.get("lineage")
    if not lineage:
        return []
    rows = [("re-planned from", f"plan {lineage['parent']} at step {lineage['at_step']:,}")]
    if lineage.get("skipped"):
        rows.append(("skipped old steps", ", ".join(f"{a}-{b - 1}" for a, b in lineage["skipped"])))
    excluded = lineage.get("exclude")
    if excluded:
        rows.append(
            (
                "excluded documents",
                f"{excluded['matched']:,} from {_esc(excluded['list'])} "
                f"({excluded['trained_before']:,} trained before step {lineage['at_step']:,})",
            )
        )
    return rows


def print_plan(report: dict[str, Any]) -> None:
    console.print(_pairs(f"plan {_esc(report['path'])}", _header_rows(report["header"])))
    unit = report["share_unit"]
    table = _table(
        f"mix (shares of {unit})",
        "source",
        "target",
        "realized",
        "diff",
        "samples",
        "eligible",
        "epochs",
        "started",
    )
    for s in report["sources"]:
        table.add_row(
            s["name"],
            percent(s["target"]),
            percent(s["realized"]),
            f"{100 * (s['realized'] - s['target']):+.2f}",
            f"{s['samples']:,}",
            f"{s['eligible']:,}",
            f"{s['epochs']:.3f}",
            str(s["epochs_started"]),
        )
    console.print(table)
    for warning in report.get("warnings", []):
        console.print(f"warning: {_esc(warning)}")
    if len(report["phases"]) > 1:
        heads = [f"steps {p['start']}-{p['end'] - 1}" for p in report["phases"]]
        table = _table("per schedule phase: target / realized", "source", *heads)
        for i, s in enumerate(report["sources"]):
            cells = [p["sources"][i] for p in report["phases"]]
            table.add_row(
                s["name"], *(f"{percent(c['target'])} / {percent(c['realized'])}" for c in cells)
            )
        console.print(table)
    _print_balance(report)
    if report.get("vision") is not None:
        _print_vision(report["vision"])
    if report.get("cp") is not None:
        _print_cp(report["cp"])
    if report.get("online") is not None:
        _print_online(report["online"])
    _print_charts(report)


def _print_online(o: dict[str, Any]) -> None:
    """Per window: each source's planned weight, realised share and mean loss; the windows
    not planned yet; and the planned weights over the windows as sparklines."""
    names, rows = o["sources"], o["per_window"]
    table = _table(
        f"online mixing: per window of {o['window_steps']} steps, planned / realized "
        f"(shares of {o['share_unit']}) / mean loss",
        "window",
        "steps",
        *names,
    )
    for w in rows:
        if not w["written"]:
            continue
        loss = w["mean_loss"] or [None] * len(names)
        table.add_row(
            str(w["window"]),
            f"{w['start']}-{w['end'] - 1}",
            *(
                f"{percent(p)} / {percent(r)} / {number(m, '.3f')}"
                for p, r, m in zip(w["planned"], w["realized"], loss, strict=True)
            ),
        )
    console.print(table)
    missing = missing_windows(o)
    if missing is not None:
        console.print(
            f"{missing}: not planned yet (segments are written as the run reaches them)"
        )
    console.print(
        f"signals: {_esc(o['signals'])}, {o['signal_windows']} windows"
        if o["signals"]
        else "signals: no signal log beside the plan"
    )
    written = [w for w in rows if w["written"]]
    if len(written) > 1:
        label = max(len(n) for n in names)
        width = max(8, min(SPARK_WIDTH, console.width - label - 20))
        console.print(f"planned weight over windows 0-{len(written) - 1}")
        for i, n in enumerate(names):
            values = [w["planned"][i] for w in written]
            lo, hi = min(values), max(values)
            console.print(
                f"{n:<{label}}  {sparkline(values, lo, hi, width)}  {percent(lo)} - {percent(hi)}",
                soft_wrap=True,
            )


CP_LAYOUT_NAMES = {"mds": "mds", "headtail": "head-tail everywhere", "contiguous": "contiguous"}


def _print_cp(cp: dict[str, Any]) -> None:
    """The CP layout: per layout the CP-rank imbalance and the DP x CP step over its bound."""
    table = _table(
        f"context parallelism: cp {cp['cp_size']}, samples of {cp['split_from']:,}+ tokens split "
        "(per step: mean, max)",
        "layout", "CP busiest / mean", "DP x CP step / lower bound", "step time / mds",
    )  # fmt: skip
    for name, label in CP_LAYOUT_NAMES.items():
        q = cp["layouts"][name]
        imb, step = q["imbalance"], q["step_over_lower_bound"]
        table.add_row(
            label,
            f"{number(imb['mean'])}, {number(imb['max'])}",
            f"{number(step['mean'])}, {number(step['max'])}",
            f"{q['step_time_over_mds']:.4f}",
        )
    console.print(table)
    console.print(
        f"samples split: {cp['samples_split']:,} ({percent(cp['split_share'])}); padding: "
        f"{cp['padding_tokens']:,} tokens ({percent(cp['padding_share'])} of the tokens)"
    )


def _print_vision(v: dict[str, Any]) -> None:
    """Encoder and backbone balance side by side, patches, and images per source."""
    table = _table(
        "two-part balance (per step, most-loaded rank / lower bound: median, max)",
        "part", "planned", "naive sharding",
    )  # fmt: skip
    for part in ("encoder", "backbone", "sum"):
        q = v["balance"][part]
        cells = [q[k] for k in ("max_over_lower_bound", "naive_over_lower_bound")]
        table.add_row(part, *(f"{number(c['median'])}, {number(c['max'])}" for c in cells))
    console.print(table)
    patches = v["patches"]
    cap = patches["capacity"]
    console.print(
        f"encoder share of cost: {percent(v['balance']['encoder_share'])}; patches per step: "
        f"mean {patches['per_step']['mean'] or 0:,.0f}; largest micro-batch: max "
        f"{patches['max_micro_batch']['max'] or 0:,.0f} patches"
        + (f" of {cap:,}" if cap else " (no patch capacity)")
    )
    for s in v["sources"] or []:
        table = _table(
            f"{s['name']}: {s['images']:,} images in {s['samples']:,} samples "
            f"({s['images_per_sample']:.2f} per sample, {s['without_images']:,} without)",
            "patches per image", "images", "",
        )  # fmt: skip
        peak = max((b["images"] for b in s["patch_histogram"]), default=0)
        for b in s["patch_histogram"]:
            span = f"{b['from']:,}+" if b["to"] is None else f"{b['from']:,} - {b['to'] - 1:,}"
            table.add_row(span, f"{b['images']:,}", bar(b["images"], peak))
        console.print(table)


def _print_balance(report: dict[str, Any]) -> None:
    imb, fill = report["imbalance"], report["capacity_fill"]
    table = _table("per-step balance", "ratio", "mean", "median", "p99", "max")
    for label, key in (
        ("max rank cost / mean", "max_over_mean"),
        ("max rank cost / lower bound", "max_over_lower_bound"),
        ("naive sharding / lower bound", "naive_over_lower_bound"),
        ("in-order interleave / lower bound", "interleave_over_lower_bound"),
    ):
        q = imb[key]
        if q is not None:  # plans made before interleaving was recorded lack it
            table.add_row(label, *(number(q[k]) for k in ("mean", "median", "p99", "max")))
    console.print(table)
    console.print(_speedups(imb))
    band = band_text(report)
    if band is not None:
        console.print(_esc(band), soft_wrap=True)
    if imb["speedup_vs_naive_with_c"] is not None:
        console.print(
            f"vs naive sharding counting c per micro-batch: {imb['speedup_vs_naive_with_c']:.3f}x"
        )
    console.print(
        f"capacity fill: step tokens / (dp x micro x capacity) mean {percent(fill['step']['mean'])}, "
        f"min {percent(fill['step']['min'])}"
    )
    console.print(
        f"largest micro-batch / capacity: mean {percent(fill['max_micro_batch']['mean'])}, "
        f"max {percent(fill['max_micro_batch']['max'])}"
    )


def _speedups(imb: dict[str, Any]) -> str:
    """The predicted speedups, one line each, the stronger baseline's first."""
    naive = f"vs naive sharding (random deal): {imb['speedup_vs_naive']:.3f}x"
    if imb["speedup_vs_interleave"] is None:
        return f"predicted speedup {naive}"
    inter = f"vs in-order interleaving: {imb['speedup_vs_interleave']:.3f}x"
    if imb["stronger_baseline"] == "interleave":
        return f"predicted speedup {inter} (the stronger baseline)\npredicted speedup {naive}"
    return f"predicted speedup {naive} (the stronger baseline)\npredicted speedup {inter}"


def _print_charts(report: dict[str, Any]) -> None:
    series, end = report["series"], report["header"]["steps"]
    first = report["header"].get("first_step", 0)
    steps = end - first
    if not series["start"]:
        return
    rows: list[tuple[str, list[float], float, float, str]] = []
    for s in series["sources"]:
        lo = min(min(s["target"]), min(s["realized"]))
        hi = max(max(s["target"]), max(s["realized"]))
        rows.append((f"{s['name']} target", s["target"], lo, hi, f"{percent(lo)} - {percent(hi)}"))
        rows.append((f"{s['name']} realized", s["realized"], lo, hi, ""))
    inter = series.get("interleave_ratio") or []
    hi = max(max(series["ratio"]), max(series["naive_ratio"]), *inter)
    rows.append(("max / lower bound", series["ratio"], 1.0, hi, f"1 - {hi:.3f}"))
    rows.append(("naive / lower bound", series["naive_ratio"], 1.0, hi, ""))
    if inter:
        rows.append(("interleave / lower bound", inter, 1.0, hi, ""))
    label = max(len(r[0]) for r in rows)
    scale = max(len(r[4]) for r in rows)
    width = max(8, min(SPARK_WIDTH, console.width - label - scale - 4))
    per_col = steps / min(width, len(series["start"])) if series["start"] else 1
    console.print(
        f"over steps {first}-{end - 1} (one column ~ {per_col:.3g} steps; range per pair)"
    )
    for name, values, lo, hi, text in rows:
        console.print(
            f"{name:<{label}}  {sparkline(values, lo, hi, width)}  {text}", soft_wrap=True
        )


# --- step --------------------------------------------------------------------------------------


def print_step(report: dict[str, Any], unit: str = "cost units") -> None:
    """One step sample by sample; costs as configured (`unit`: FLOPs, the a*L + b*L^2
    formula or the user's expression). The balancer's integer units and JSONL byte offsets
    are in the JSON, so the file names fit on an 80-column screen."""
    from rich.box import SIMPLE_HEAD

    ranks = report["ranks"]
    which = (
        "all ranks"
        if len(ranks) == report["dp_size"]
        else ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))
    )
    table = _table(
        f"step {report['step']} ({which}); cost in {_esc(unit)}",
        "rank", "mb", "source", "row", "file", "file_row", "tokens", "cost",
        left=(2, 4), box=SIMPLE_HEAD, padding=0, pad_edge=False,
    )  # fmt: skip
    _only_wraps(table, 4)
    for s in report["samples"]:
        table.add_row(
            str(s["rank"]), str(s["micro_batch"]), s["source"], str(s["row"]), _esc(s["file"]),
            str(s["file_row"]), f"{s['n_tokens']:,}", f"{s['cost']:.3g}",
        )  # fmt: skip
    console.print(table)
    peak = max((r["cost"] for r in report["rank_totals"]), default=0)
    totals = _table("per rank", "rank", "samples", "tokens", "cost", "micro-batch tokens", "")
    totals.columns[5].justify = "left"
    for r in report["rank_totals"]:
        micro = " / ".join(f"{m['tokens']:,}" for m in r["micro_batches"])
        totals.add_row(
            str(r["rank"]), f"{r['samples']:,}", f"{r['tokens']:,}", f"{r['cost']:.4g}",
            micro, bar(r["cost"], peak, 16),
        )  # fmt: skip
    console.print(totals)
    st = report["stats"]
    # The step's stats are in the balancer's integer units; the shown samples give the
    # scale back to configured cost.
    units = sum(r["cost_units"] for r in report["rank_totals"])
    scale = sum(r["cost"] for r in report["rank_totals"]) / units if units else 0.0
    console.print(f"step: {st['samples']:,} samples, {st['tokens']:,} tokens")
    console.print(
        f"max rank cost {st['max_rank_cost'] * scale:.4g}, lower bound "
        f"{st['lower_bound'] * scale:.4g}, naive {st['naive_max_rank_cost'] * scale:.4g}"
        + (
            f", in-order interleave {st['interleave_max_rank_cost'] * scale:.4g}"
            if "interleave_max_rank_cost" in st
            else ""
        )
    )
