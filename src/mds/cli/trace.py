"""`mds trace`: which documents, from which files, a step (a rank, a micro-batch) trained on,
with each one's content hash; only the plan's blocks of those steps and the samples' files
are read."""

from __future__ import annotations

from typing import Any

import typer

from mds.cli.export import step_range
from mds.cli.output import console, data_root_option, json_option, print_json
from mds.errors import ConfigError

__all__ = ["TRACE_KEYS", "trace_command"]

# The keys of each sample `--json` prints, in order (with --show, also "text" or "tokens").
TRACE_KEYS = (
    "step",
    "rank",
    "micro_batch",
    "sample_id",
    "source",
    "row",
    "epoch",
    "file",
    "file_row",
    "byte_offset",
    "byte_length",
    "n_tokens",
    "cost",
    "content_hash",
)


def trace_command(
    plan: str = typer.Argument(
        ..., metavar="PLAN", help="Plan file written by `mds plan` (or its s3:// or gs:// URL)."
    ),
    step: int | None = typer.Option(None, "--step", metavar="N", help="The step to trace."),
    steps: str | None = typer.Option(
        None, "--steps", metavar="A:B", help="Steps A to B-1 instead of one --step."
    ),
    rank: list[int] = typer.Option(
        [], "--rank", metavar="R", help="Only DP rank R (repeatable; default: every rank)."
    ),
    micro_batch: int | None = typer.Option(
        None, "--micro-batch", metavar="M", help="Only micro-batch M of each rank."
    ),
    show: bool = typer.Option(
        False,
        "--show",
        help="Also print each sample's content: its text (token ids decoded with the "
        "tokenizer the index recorded, if any and loadable), else its token ids.",
    ),
    index: str | None = typer.Option(
        None,
        "--index",
        metavar="DIR",
        help="Index directory (default: the one the plan names); read only where the plan "
        "alone cannot tell a sample's cost or epoch.",
    ),
    data_root: str | None = data_root_option(),
    json_out: bool = json_option("Print the samples as a JSON list."),
) -> None:
    """Trace steps of a plan to their documents: per sample its step, rank, micro-batch,
    source, file (relative to the data root), row or byte range in it, tokens, cost and
    content hash. Reads only the plan's blocks of those steps and the samples' files.

    Example:

    \b
        mds trace build/plan.mds --step 12
        mds trace build/plan.mds --steps 10:14 --rank 3 --micro-batch 0 --show
        mds trace build/plan.mds --step 12 --json | jq '.[].content_hash'
    """
    from mds.cli.contents import trace_payloads
    from mds.core.content_hash import content_hash
    from mds.planner.report.trace import trace_plan

    if (step is None) == (steps is None):
        raise ConfigError("give one of --step N or --steps A:B, e.g. --step 12 or --steps 10:14")
    selection = (step, step + 1) if step is not None else step_range(steps)
    if step is not None and step < 0:
        raise ConfigError(f"--step {step} is not a step (steps count from 0)")
    given = None if step is None else f"--step {step}"
    trace = trace_plan(plan, selection, rank or None, micro_batch, index, given)
    payloads = trace_payloads(trace, data_root)
    rows = trace.frame.select(*(k for k in TRACE_KEYS if k != "content_hash")).to_dicts()
    decoders: dict[str, Any] = {}
    for row, payload in zip(rows, payloads, strict=True):
        row["content_hash"] = content_hash(payload)
        if show:
            row.update(_shown(payload, row["source"], trace, data_root, decoders))
    if json_out:
        print_json(rows)
        return
    _print_rows(rows, show)


def _shown(
    payload: Any, source: str, trace: Any, data_root: str | None, decoders: dict[str, Any]
) -> dict[str, Any]:
    """{"text": ...} for a text (an image-text sample: its text), or token ids decoded with
    the tokenizer the index counted with; else {"tokens": [...]}. `decoders` keeps each
    source's decode function (or None) once looked up."""
    if isinstance(payload, str):
        return {"text": payload}
    if hasattr(payload, "text"):
        return {"text": payload.text}
    ids = [int(x) for x in payload]
    if source not in decoders:
        decoders[source] = _decoder(source, trace, data_root)
    decode = decoders[source]
    return {"tokens": ids} if decode is None else {"text": decode(ids)}


def _decoder(source: str, trace: Any, data_root: str | None):
    """The tokenizer.json the index counted `source` with, as a decode function, or None
    when it recorded none or it cannot be loaded here."""
    decode = None
    facts = trace.footer["fetch"]["sources"].get(source) or {}
    if (facts.get("length") or {}).get("kind") == "tokenizer":
        try:
            from mds.core import storage
            from mds.core.tokenizer import index_tokenizer_path, load_tokenizer

            root, _ = storage.plan_data_root(trace.plan, trace.footer["fetch"]["root"], data_root)
            tok = load_tokenizer(str(index_tokenizer_path(source, facts, root)))
            decode = tok.decode
        except Exception:  # a tokenizer that cannot be loaded: show the ids
            decode = None
    return decode


def _print_rows(rows: list[dict[str, Any]], show: bool) -> None:
    from rich.markup import escape
    from rich.table import Table

    table = Table(box=None, pad_edge=False)
    for name in ("step", "rank", "mb", "source", "file", "at", "tokens", "cost", "content hash"):
        right = name in ("step", "rank", "mb", "tokens", "cost")
        table.add_column(name, justify="right" if right else "left", no_wrap=name != "file")
    for row in rows:
        at = (
            f"bytes {row['byte_offset']}+{row['byte_length']}"
            if row["byte_offset"] is not None
            else f"row {row['file_row']}"
        )
        table.add_row(
            str(row["step"]), str(row["rank"]), str(row["micro_batch"]), escape(row["source"]),
            escape(row["file"]), at, f"{row['n_tokens']:,}", f"{row['cost']:.4g}",
            row["content_hash"],
        )  # fmt: skip
    console.print(table)
    if show:
        for row in rows:
            head = (
                f"[bold]step {row['step']} rank {row['rank']} mb {row['micro_batch']} "
                f"{escape(row['source'])} {escape(row['file'])} {row['content_hash']}[/bold]"
            )
            console.print(head)
            body = row.get("text")
            console.print(escape(body if body is not None else str(row.get("tokens"))))
    console.print(f"{len(rows):,} samples")
