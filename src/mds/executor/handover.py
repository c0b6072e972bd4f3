"""Switching a run from a plan to a plan re-planned from it at step K (`mds plan --from OLD
--at-step K`): which old-plan states the new plan's executor accepts, and where the old plan
lies, so the steps between the saved state and K are replayed from it (docs/plan-format.md,
"Re-planned plans")."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mds.core import storage
from mds.errors import PlanError

__all__ = ["handover_step", "parent_place"]


def handover_step(
    state: Mapping[str, Any], step: int, micro: int, lineage: Mapping[str, Any], plan: Any, plan_id: str
) -> None:
    """Refuse a state of the parent plan that lies after the hand-over step K: the new plan
    re-planned the old plan's steps from K, so some of what that run trained is not in it."""
    at = lineage.get("at_step")
    if isinstance(at, int) and (step, micro) > (at, 0):
        raise PlanError(
            f"the executor state is at step {step} (micro-batch {micro}) of plan "
            f"{state.get('plan_id')}, but {plan} (plan {plan_id}) continues that plan from step "
            f"{at}: the run already trained old steps the new plan re-plans; resume from a "
            f"checkpoint saved at or before step {at}, or plan again with --at-step {step}"
        )


def parent_place(plan: Any, lineage: Mapping[str, Any], explicit: Any) -> Any:
    """The parent plan's path or URL: `explicit` (the executor's `parent_plan=`), else the
    lineage's `parent_path`, relative to the new plan's directory."""
    if explicit is not None:
        return str(explicit) if storage.is_url(explicit) else Path(explicit)
    recorded = lineage.get("parent_path")
    if not isinstance(recorded, str) or not recorded:
        raise PlanError(
            f"{plan} records no path of the plan it continues (plan {lineage.get('parent')}); "
            "pass parent_plan= to the executor"
        )
    if storage.is_url(recorded) or os.path.isabs(recorded):
        return recorded if storage.is_url(recorded) else Path(recorded)
    if storage.is_url(plan):
        return storage.resolve_under(storage.parent_url(str(plan)), recorded)
    return Path(plan).parent / recorded
