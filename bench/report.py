"""Where every benchmark writes its results: `<out>/<name>.md` (the table, also printed)
and `<out>/<name>.json` (everything measured)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_report(out: Path, name: str, table: str, data: Any) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.md").write_text(table, encoding="utf-8")
    (out / f"{name}.json").write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    print()
    print(table)
