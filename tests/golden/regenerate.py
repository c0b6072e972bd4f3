"""Rewrite tests/golden/sample_plan.json from the current code (the `make golden` target).

Indexes sample_data/ into a temporary directory, plans sample_data/mds.toml next to it and
stores the `mds plan --json` summary (minus `path` and `seconds`) plus the plan file's
sha256. Run it only when a change to the plan is intended, and say why in the commit message.

    python tests/golden/regenerate.py
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for plan_builders

from plan_builders import GOLDEN, golden_summary  # noqa: E402


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="mds-golden-") as tmp:
        data = golden_summary(Path(tmp))
    old = json.loads(GOLDEN.read_text(encoding="utf-8")) if GOLDEN.exists() else None
    GOLDEN.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    state = "unchanged" if old == data else "updated"
    print(f"{GOLDEN} {state}: plan sha256 {data['sha256']}, plan id {data['plan_id']}")


if __name__ == "__main__":
    main()
