"""What `mds verify` reports: each check with ok or failed and a detail, the result of
a whole run, and the wording shared by the checks of the plan file (report/verify_plan_file.py)
and of the index and its sources (report/verify_index.py)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Check", "VerifyResult", "count", "first_of"]


@dataclass(frozen=True)
class Check:
    """One verified property. `kind` says what a failure means: a corrupt "plan", a
    malformed "index", or "data" that changed since it was indexed."""

    name: str
    ok: bool
    detail: str
    kind: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "ok": self.ok, "detail": self.detail}


@dataclass
class VerifyResult:
    plan: Path
    full: bool
    plan_id: str | None = None
    index: Path | None = None
    data_root: Path | str | None = None  # the root the source files were checked under
    given_root: str | os.PathLike | None = None  # --data-root (None: $MDS_DATA_ROOT or the plan's)
    place: Path | str | None = None  # where the plan lies (its URL when verified from a copy)
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def first_failure(self) -> Check | None:
        return next((c for c in self.checks if not c.ok), None)

    def add(self, name: str, kind: str, problem: str | None, detail: str) -> None:
        """Record a check: failed with `problem`, or passed with `detail`."""
        self.checks.append(Check(name, problem is None, problem or detail, kind))

    def to_json(self) -> dict[str, Any]:
        first = self.first_failure
        return {
            "ok": self.ok,
            "plan": str(self.plan),
            "plan_id": self.plan_id,
            "index": str(self.index) if self.index is not None else None,
            "data_root": str(self.data_root) if self.data_root is not None else None,
            "mode": "full" if self.full else "stat",
            "checks": [c.to_json() for c in self.checks],
            "first_failure": first.to_json() if first else None,
        }


def count(n: int, word: str) -> str:
    return f"{n:,} {word}" + ("" if n == 1 else "s")


def first_of(first: str | None, failed: int, what: str) -> str | None:
    """The first problem, with how many more of the same kind there were."""
    if first is None:
        return None
    return first if failed <= 1 else f"{first} (and {failed - 1} more {what})"
