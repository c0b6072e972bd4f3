"""Shared by the online executor tests and their torchrun worker: a tiny online-mixed run
(tiny_data's three sources, three windows of four steps) and a training loop that reports a
loss per source that depends only on the samples (and the rank's offset)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

WINDOW, STEPS = 4, 12


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return repr(value)


def toml_text(data: dict[str, Any]) -> str:
    """A config dict (tables of scalars, [[source]] arrays) as TOML."""
    lines = []
    for key, value in data.items():
        if isinstance(value, list):
            for table in value:
                lines.append(f"[[{key}]]")
                lines += [f"{k} = {toml_value(v)}" for k, v in table.items()]
        else:
            lines.append(f"[{key}]")
            lines += [f"{k} = {toml_value(v)}" for k, v in value.items()]
    return "\n".join(lines) + "\n"


def online_config(data: dict[str, Any], policy: str = "doremi", steps: int = STEPS) -> dict[str, Any]:
    data = dict(data)
    data["train"] = {**data["train"], "steps": steps}
    online: dict[str, Any] = {"policy": policy, "window": WINDOW}
    if policy == "doremi":
        online["reference"] = {"web": 1.0, "chat": 2.0, "math": 1.5}
    data["mixing"] = {"online": online}
    return data


def train(
    ex, rank_offset: float = 0.0, stop_after: int | None = None, per_micro_batch: bool = False
) -> list[dict[str, Any]]:
    """Iterate `ex`, reporting each step's per-source loss sums after its last micro-batch
    (or each micro-batch's, with `per_micro_batch`); stop after `stop_after` steps (None:
    the end). The records: per micro-batch its
    (step, micro_batch, sample ids) and per reported step what was reported."""
    names = ex.batch_source_names
    records: list[dict[str, Any]] = []
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    steps = 0
    for batch in ex:
        ids = batch["sample_id"].tolist()
        for sid, src in zip(ids, batch["source"].tolist(), strict=True):
            name = names[src]
            sums[name] = sums.get(name, 0.0) + 1.0 + (sid % 5) * 0.75 + rank_offset
            counts[name] = counts.get(name, 0) + 1
        records.append({"step": batch["step"], "micro_batch": batch["micro_batch"], "ids": ids})
        last = batch["micro_batch"] == ex.micro_batches - 1
        if per_micro_batch or last:
            ex.report(batch["step"], sums, counts)
            records[-1]["reported"] = (dict(sums), dict(counts))
            sums, counts = {}, {}
        if last:
            steps += 1
            if stop_after is not None and steps == stop_after:
                break
    return records


def plan_first_segment(root: Path, data: dict[str, Any], **overrides: Any) -> Path:
    """Write root/config.toml, index it and plan the run's first segment, root/run/plan.mds
    (`overrides`: as `mds plan --steps ...` would give them)."""
    from plan_builders import index_data

    from mds.planner.plan.build import with_overrides
    from mds.planner.plan.config import load_plan_config
    from mds.planner.plan.segment import plan_segment

    (root / "config.toml").write_text(toml_text(data))
    index_data(root, data)
    plan = root / "run" / "plan.mds"
    plan_segment(with_overrides(load_plan_config(root / "config.toml"), **overrides), plan, 0)
    return plan

