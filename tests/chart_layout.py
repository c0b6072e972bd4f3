"""The HTML reports' charts as headless chromium lays them out: per SVG every text's box
against the SVG's viewBox, its title, axis titles and legend; and a screenshot for review.

No new dependency: `chromium --headless --dump-dom` runs a small script added to a copy of
the page (the reports themselves carry no script) that writes its measurements into the DOM.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html import unescape
from itertools import pairwise
from pathlib import Path
from typing import Any

NO_BROWSER = "no chromium or chrome on PATH or at /usr/bin/chromium"
BUILD = Path(__file__).resolve().parents[1] / "build" / "inspect-html"

# Per chart: its series count, legend entries and every text's box in the SVG's own units
# (getBBox mapped through getCTM, so the rotated axis title counts too).
MEASURE = """<script>
(() => {
  const charts = [...document.querySelectorAll("svg")].map((svg) => {
    const vb = svg.viewBox.baseVal;
    const texts = [...svg.querySelectorAll("text")].map((t) => {
      const b = t.getBBox(), m = t.getCTM();
      const ps = [[b.x, b.y], [b.x + b.width, b.y], [b.x, b.y + b.height],
                  [b.x + b.width, b.y + b.height]].map(([x, y]) => new DOMPoint(x, y).matrixTransform(m));
      const xs = ps.map((p) => p.x), ys = ps.map((p) => p.y);
      return {text: t.textContent, cls: t.getAttribute("class") || "",
              box: [Math.min(...xs), Math.min(...ys), Math.max(...xs), Math.max(...ys)]};
    });
    return {width: vb.width, height: vb.height, series: +svg.dataset.series,
            legend: svg.querySelectorAll("g.legend").length, texts};
  });
  const pre = document.createElement("pre");
  pre.id = "layout";
  pre.textContent = JSON.stringify(charts);
  document.body.appendChild(pre);
})();
</script>"""


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if found := shutil.which(name):
            return found
    return "/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None


def _chromium(profile: Path, *args: str) -> subprocess.Popen:
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--no-first-run",
             "--hide-scrollbars", f"--user-data-dir={profile}"]  # fmt: skip
    return subprocess.Popen(
        [find_chromium(), *flags, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def _overlaps(boxes: list[list[float]], axis: int) -> list[tuple[list[float], list[float]]]:
    """Pairs of neighbouring boxes that overlap along `axis` (0: x, 1: y)."""
    boxes = sorted(boxes, key=lambda b: b[axis])
    return [(a, b) for a, b in pairwise(boxes) if b[axis] < a[axis + 2] - 0.5]


def problems_of(chart: dict[str, Any]) -> list[str]:
    """What is wrong with one measured chart: a text leaving the SVG, overlapping or long
    tick labels, a missing title, axis title or legend."""
    w, h = chart["width"], chart["height"]

    def by(cls: str) -> list[dict[str, Any]]:
        return [t for t in chart["texts"] if cls in t["cls"].split()]

    title = by("chart-title")
    name = title[0]["text"] if title else "?"
    out = []
    if not title or not title[0]["text"].strip():
        out.append(f"{name}: no title")
    if len([t for t in by("axis-title") if t["text"].strip()]) != 2:
        out.append(f"{name}: axis titles {[t['text'] for t in by('axis-title')]}")
    if chart["legend"] != (chart["series"] if chart["series"] > 1 else 0):
        out.append(f"{name}: {chart['legend']} legend entries for {chart['series']} series")
    for t in chart["texts"]:
        x0, y0, x1, y1 = t["box"]
        if x0 < -0.5 or y0 < -0.5 or x1 > w + 0.5 or y1 > h + 0.5:
            out.append(f"{name}: {t['text']!r} {t['box']} leaves the {w}x{h} chart")
    for cls, axis in (("y-tick", 1), ("x-tick", 0)):
        for a, b in _overlaps([t["box"] for t in by(cls)], axis):
            out.append(f"{name}: {cls} labels overlap {a} {b}")
    y_title = by("y-title")
    if y_title and any(t["box"][0] < y_title[0]["box"][2] for t in by("y-tick")):
        out.append(f"{name}: tick labels run into the y-axis title")
    if any(len(t["text"]) > 6 for t in by("tick")):
        out.append(f"{name}: long tick labels {[t['text'] for t in by('tick')]}")
    return out


def _svgs(body: str) -> list[str]:
    out, start = [], 0
    while (i := body.find("<svg", start)) >= 0:
        start = body.index("</svg>", i) + len("</svg>")
        out.append(body[i:start])
    return out


def chart_layout(
    pages: list[str], tmp: Path, screenshot: str
) -> tuple[list[dict[str, Any]], list[str], Path]:
    """Lay out the reports `pages` (complete HTML documents) in headless chromium: the
    measured charts, their problems, and a screenshot of all charts in BUILD/`screenshot`.

    The pages' bodies go into one page (one browser start for all), under the first page's
    head (the reports share their CSS); the screenshot is taken in parallel."""
    head = pages[0][: pages[0].index("<body>") + len("<body>")]
    bodies = [p[p.index("<body>") + len("<body>") : p.index("</body>")] for p in pages]
    measured = tmp / "measure.html"
    measured.write_text(head + "".join(bodies) + MEASURE + "</body></html>", encoding="utf-8")
    svgs = [svg for body in bodies for svg in _svgs(body)]
    gallery = tmp / "charts.html"
    gallery.write_text(
        head + '<div class="charts">' + "".join(svgs) + "</div></body></html>", encoding="utf-8"
    )
    BUILD.mkdir(parents=True, exist_ok=True)
    png = BUILD / screenshot
    png.unlink(missing_ok=True)
    rows = (len(svgs) + 1) // 2  # two charts a row at the window's width
    shot = _chromium(tmp / "profile-shot", f"--screenshot={png}",
                     f"--window-size=1200,{rows * 245 + 40}", gallery.as_uri())  # fmt: skip
    dump = _chromium(tmp / "profile-dom", "--dump-dom", measured.as_uri())
    try:
        dom, _ = dump.communicate(timeout=90)
        shot.communicate(timeout=90)
    finally:
        for proc in (dump, shot):
            if proc.poll() is None:
                proc.kill()
    found = re.search(r'<pre id="layout">(.*?)</pre>', dom, re.S)
    assert found, f"chromium wrote no measurements: {dom[-2000:]!r}"
    charts = json.loads(unescape(found.group(1)))
    assert len(charts) == len(svgs)
    return charts, [p for chart in charts for p in problems_of(chart)], png
