"""`mds index`: scan sources into a length/metadata index."""

from __future__ import annotations

from pathlib import Path

import typer

from mds.cli.output import address_option, console, engine_option, json_option, print_json
from mds.errors import ConfigError

__all__ = ["index_command"]


def _adhoc_source(
    path: list[str],
    name: str | None,
    fmt: str | None,
    tokens: str | None,
    count: str | None,
    text: str | None,
    tokenizer: str | None,
    estimate: str | None,
    keep: list[str],
) -> dict:
    table: dict = {"name": name or "data", "path": path}
    for key, value in (
        ("format", fmt),
        ("tokens", tokens),
        ("count", count),
        ("text", text),
        ("tokenizer", tokenizer),
        ("estimate", estimate),
    ):
        if value is not None:
            table[key] = value
    if keep:
        table["keep"] = [c.strip() for item in keep for c in item.split(",") if c.strip()]
    return table


def _adhoc_root(patterns: list[str]) -> Path:
    """The data root of an ad-hoc source: the working directory, or a common ancestor of it
    and every pattern's fixed (glob-free) leading part, so absolute paths elsewhere work."""
    import glob
    import os

    cwd = Path.cwd().resolve()
    bases = [str(cwd)]
    for pattern in patterns:
        parts = Path(pattern).parts
        fixed = next((i for i, part in enumerate(parts) if glob.has_magic(part)), len(parts))
        bases.append(str((cwd / Path(*parts[:fixed])).resolve()) if fixed else str(cwd))
    return Path(os.path.commonpath(bases))


def index_command(
    config: Path | None = typer.Argument(
        None, metavar="CONFIG", help="TOML config with [[source]] tables.", show_default=False
    ),
    output: str | None = typer.Option(
        None,
        "--output",
        "-o",
        metavar="DIR|URL",
        help="Index directory to write, or an s3:// prefix (default: [index].output, else "
        "<root>/index).",
    ),
    workers: int | None = typer.Option(
        None, "--workers", "-j", min=1, metavar="N", help="Files scanned in parallel."
    ),
    engine: str | None = engine_option(),
    address: str | None = address_option(),
    full_fingerprint: bool = typer.Option(
        False, "--full-fingerprint", help="Hash every byte of every file instead of sampled blocks."
    ),
    data_root: str | None = typer.Option(
        None,
        "--data-root",
        metavar="DIR|URL",
        help="Data root to index instead of the config's [index].root (data that moved).",
    ),
    json_out: bool = json_option("Print a JSON summary instead of a table."),
    path: list[str] = typer.Option(
        [],
        "--path",
        metavar="PATH|GLOB",
        help="Ad-hoc source instead of CONFIG: file, dir or glob (repeatable).",
        rich_help_panel="Ad-hoc source",
    ),
    name: str | None = typer.Option(
        None, "--name", metavar="NAME", help="Ad-hoc source name.", rich_help_panel="Ad-hoc source"
    ),
    fmt: str | None = typer.Option(
        None,
        "--format",
        metavar="FORMAT",
        help="parquet, jsonl, jsonl.zst, arrow or megatron.",
        rich_help_panel="Ad-hoc source",
    ),
    tokens: str | None = typer.Option(
        None,
        "--tokens",
        metavar="COLUMN",
        help="Token-id list column.",
        rich_help_panel="Ad-hoc source",
    ),
    count: str | None = typer.Option(
        None,
        "--count",
        metavar="COLUMN",
        help="Integer token-count column.",
        rich_help_panel="Ad-hoc source",
    ),
    text: str | None = typer.Option(
        None,
        "--text",
        metavar="COLUMN",
        help="Text column (payload).",
        rich_help_panel="Ad-hoc source",
    ),
    tokenizer: str | None = typer.Option(
        None,
        "--tokenizer",
        metavar="FILE",
        help="Local tokenizer.json to count tokens of --text.",
        rich_help_panel="Ad-hoc source",
    ),
    estimate: str | None = typer.Option(
        None,
        "--estimate",
        metavar="RULE",
        help='Labelled estimate, e.g. "bytes/4".',
        rich_help_panel="Ad-hoc source",
    ),
    keep: list[str] = typer.Option(
        [],
        "--keep",
        metavar="COLUMNS",
        help="Metadata columns to keep (comma-separated, repeatable).",
        rich_help_panel="Ad-hoc source",
    ),
) -> None:
    """Scan data sources into an index of sample locations, token counts and metadata.

    Re-running only rescans files whose fingerprint changed. The index is replaced
    atomically: if anything fails, the previous index is left as it was.

    Example:

    \b
        mds index sample_data/mds.toml -o build/index
        mds index --path 'sample_data/web/*.parquet' --tokens tokens \\
            --keep lang -o build/web
        mds index sample_data/mds.toml -o build/index \\
            --data-root /mnt/nvme/sample_data
    """
    from mds.cli.progress import ByteProgress
    from mds.planner.index.build import build_index
    from mds.planner.index.config import load_config, parse_config

    if config is not None and path:
        raise ConfigError("give either a CONFIG file or --path for an ad-hoc source, not both")
    if config is None and not path:
        raise ConfigError(
            "give a CONFIG file, or --path (with --tokens/--count/--estimate) for one source"
        )
    if config is not None:
        cfg = load_config(config)
    else:
        if output is None:
            raise ConfigError("--output is required with an ad-hoc --path source")
        table = _adhoc_source(path, name, fmt, tokens, count, text, tokenizer, estimate, keep)
        root = _adhoc_root(path)
        cfg = parse_config({"index": {"root": str(root)}, "source": [table]}, base=root)
    from dataclasses import replace

    if full_fingerprint:
        cfg = replace(cfg, fingerprint="full")
    from mds.core.storage import is_url

    if data_root is not None:
        cfg = replace(
            cfg, root=data_root.rstrip("/") if is_url(data_root) else Path(data_root).resolve()
        )
    from mds.planner.runtime.engine import EngineSpec

    spec = EngineSpec(cfg.engine, cfg.address).override(engine, address)
    with ByteProgress("indexing", enabled=not json_out) as bar:
        target = output if output is None or is_url(output) else Path(output)
        summary = build_index(cfg, target, workers=workers, progress=bar, engine=spec)
    if json_out:
        print_json(summary.to_json())
        return
    _print_summary(summary)


def _print_summary(summary) -> None:
    from rich.table import Table

    table = Table(title=f"index {summary.path}", title_justify="left")
    for col, justify in (
        ("source", "left"),
        ("format", "left"),
        ("files", "right"),
        ("scanned", "right"),
        ("rows", "right"),
        ("tokens", "right"),
    ):
        table.add_column(col, justify=justify)
    for s in summary.sources:
        tokens = f"{s.tokens:,}" if s.exact else f"~{s.tokens:,} (estimate)"
        table.add_row(s.name, s.format, str(s.files), str(s.files_scanned), f"{s.rows:,}", tokens)
    console.print(table)
    mb = summary.bytes_scanned / 1e6
    speed = f", {mb / summary.seconds:,.0f} MB/s" if summary.seconds > 0 and mb else ""
    console.print(
        f"scanned {mb:,.1f} MB in {summary.seconds:.2f}s{speed}; fingerprint {summary.fingerprint}"
    )
