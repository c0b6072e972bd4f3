"""`mds plan`: precompute every step's samples per DP rank and micro-batch."""

from __future__ import annotations

from pathlib import Path

import typer

from mds.cli.output import address_option, console, engine_option, json_option, print_json

__all__ = ["plan_command"]


def plan_command(
    config: Path = typer.Argument(
        ...,
        metavar="CONFIG",
        help="TOML config with [train], [cost] and weighted [[source]] tables.",
    ),
    output: str = typer.Option(
        ...,
        "--output",
        "-o",
        metavar="FILE",
        help="Plan file to write (or an s3:// URL: uploaded as one object when complete).",
    ),
    index: str | None = typer.Option(
        None,
        "--index",
        metavar="DIR|URL",
        help="Index directory or s3:// prefix (default: [plan].index, else [index].output).",
    ),
    steps: int | None = typer.Option(None, "--steps", metavar="N", help="Override [train] steps."),
    dp_size: int | None = typer.Option(
        None, "--dp-size", metavar="N", help="Override [train] dp_size."
    ),
    micro_batches: int | None = typer.Option(
        None, "--micro-batches", metavar="N", help="Override [train] micro_batches."
    ),
    samples_per_step: int | None = typer.Option(
        None, "--samples-per-step", metavar="N", help="Override [train] samples_per_step."
    ),
    workers: int | None = typer.Option(
        None, "--workers", "-j", min=1, metavar="N", help="Chunks planned in parallel."
    ),
    engine: str | None = engine_option(),
    address: str | None = address_option(),
    parent_text: str | None = typer.Option(
        None,
        "--from",
        metavar="PLAN",
        help="Re-plan: continue this plan from --at-step with the new config.",
    ),
    at_step: int | None = typer.Option(
        None,
        "--at-step",
        min=0,
        metavar="K",
        help="With --from: the first step the new config plans.",
    ),
    skip_steps: list[str] = typer.Option(
        [],
        "--skip-steps",
        metavar="A:B",
        help="With --from/--at-step K <= A: leave out the old plan's steps A..B-1 (repeatable).",
    ),
    exclude: Path | None = typer.Option(
        None,
        "--exclude",
        metavar="FILE",
        help="With --from/--at-step: documents never trained on from K on (.parquet, .csv, "
        ".jsonl; columns source,row or file,file_row or file,byte_offset or content_hash).",
    ),
    exclude_missing: str = typer.Option(
        "error",
        "--exclude-missing",
        metavar="error|ignore",
        help="An --exclude entry the index does not hold: an error naming its row (default), "
        "or ignore it.",
    ),
    segment: int | None = typer.Option(
        None,
        "--segment",
        min=0,
        metavar="K",
        help="Online mixing: plan window K's segment beside -o (segment K-1 must exist).",
    ),
    signals: str | None = typer.Option(
        None,
        "--signals",
        metavar="LOG",
        help="With --segment: the run's signal log, a file or an s3:// or gs:// object "
        "(windows 0..K-2 decide window K's weights).",
    ),
    replay: str | None = typer.Option(
        None,
        "--replay",
        metavar="LOG",
        help="Online mixing: plan -o and every segment a signal log (file or object) "
        "determines (an audit).",
    ),
    json_out: bool = json_option("Print a JSON summary instead of a table."),
) -> None:
    """Plan which samples every DP rank and micro-batch trains on at every step.

    The mix follows each source's weight schedule exactly (within one sample); each step's
    samples are balanced across ranks by cost (a*L + b*L^2 by default) under the
    micro-batch token capacity. Same inputs give the same plan bytes.

    Example:

    \b
        mds index sample_data/mds.toml -o build/index
        mds plan sample_data/mds.toml -o build/plan.mds
        mds plan sample_data/mds.toml -o build/plan8.mds --dp-size 8 --json
        mds plan sample_data/mds.toml -o build/plan-mb4.mds --micro-batches 4
        mds plan sample_data/mds.toml -o build/plan.mds --index build/other-index
        mds plan sample_data/new-mix.toml --index build/index \\
            -o build/plan-2.mds --from build/plan.mds --at-step 32

    With --from and --at-step K the new plan holds steps K.. only: every source continues
    from its cursor in the old plan at K (nothing consumed is repeated within its epoch,
    nothing unconsumed is skipped), and the new weights, dp_size, micro-batches or sources
    apply from K. The executor resumes it from a state the old plan saved at any step up to
    K (it replays the old plan's steps before K first).

    After a loss spike (docs/loss-spike.md):

    \b
        mds plan sample_data/mds.toml -o build/plan-2.mds \\
            --from build/plan.mds --at-step 32 --skip-steps 40:48
        mds plan sample_data/mds.toml -o build/plan-3.mds \\
            --from build/plan.mds --at-step 32 --exclude bad.parquet

    --skip-steps A:B keeps the old plan's steps exactly, without A..B-1 (renumbered to
    follow), and plans the missing steps at the end fresh. --exclude leaves the listed
    documents out of their sources' streams from K on; the next samples of the same sources
    take their places, so the mix holds.

    With [mixing] online (docs/online-mixing.md), -o is the run's first segment (window 0);
    the executor plans the others during training (--segment K --signals LOG), and
    --replay LOG rebuilds them all from the run's signal log, byte for byte:

    \b
        mds plan online.toml -o run/plan.mds
        mds plan online.toml -o audit/plan.mds --replay run/plan.signals.json
    """
    from mds.cli.progress import StepProgress
    from mds.core.storage import as_place
    from mds.errors import ConfigError
    from mds.planner.plan.build import build_plan, with_overrides
    from mds.planner.plan.config import load_plan_config

    parent = None if parent_text is None else as_place(parent_text)  # a URL stays one
    if (parent is None) != (at_step is None):
        raise ConfigError("--from and --at-step go together: the old plan and the step K")
    if (skip_steps or exclude is not None) and parent is None:
        raise ConfigError("--skip-steps and --exclude re-plan a plan: give --from PLAN --at-step K")
    if exclude_missing not in ("error", "ignore"):
        raise ConfigError(f"--exclude-missing {exclude_missing!r}: use error or ignore")
    skipped = parse_skips(skip_steps, at_step) if skip_steps else None
    cfg = with_overrides(
        load_plan_config(config),
        steps=steps,
        dp_size=dp_size,
        index=index,
        micro_batches=micro_batches,
        samples_per_step=samples_per_step,
    )
    from mds.core.storage import is_url
    from mds.planner.runtime.outputs import check_output, index_inputs

    target: Path | str = output if is_url(output) else Path(output)
    manifest = None
    if isinstance(target, Path):
        local_index = not is_url(cfg.index)
        if local_index and target.exists():  # its file list is checked, then planned from
            manifest = _manifest_or_none(cfg.index)
        check_output(
            "-o",
            target,
            [
                ("config file", config),
                ("plan given to --from", parent if isinstance(parent, Path) else None),
                *(
                    index_inputs(cfg.index, target, manifest and manifest.data)
                    if local_index
                    else []
                ),
            ],
        )
    from mds.planner.runtime.engine import EngineSpec
    from mds.planner.runtime.malloc import keep_freed_memory

    exclusion = None
    if exclude is not None:
        if manifest is None and isinstance(target, Path) and not is_url(cfg.index):
            manifest = _manifest_or_none(cfg.index)  # parsed once: here, and for planning
        exclusion = _exclusion(exclude, cfg.index, exclude_missing, manifest)

    keep_freed_memory()  # with one worker this process plans every chunk (src/mds/planner/runtime/malloc.py)
    spec = EngineSpec(cfg.engine, cfg.address).override(engine, address)
    if cfg.online is not None or segment is not None or signals is not None or replay is not None:
        _plan_online(cfg, target, segment, signals, replay, parent, workers, spec, json_out)
        return
    with StepProgress("planning", enabled=not json_out) as bar:
        summary = build_plan(
            cfg,
            target,
            workers=workers,
            progress=bar,
            parent=parent,  # type: ignore[arg-type]
            at_step=at_step,
            engine=spec,
            manifest=manifest,
            exclusion=exclusion,
            skipped=skipped,
        )
    if json_out:
        print_json(summary.to_json())
        return
    if summary.notice:
        console.print(f"note: {summary.notice}", soft_wrap=True)
    _print_summary(summary)
    _print_replan(summary)


def _plan_online(cfg, target, segment, signals, replay, parent, workers, spec, json_out) -> None:
    """`mds plan` of a config with [mixing] online: segment 0, segment K (--segment), or
    every segment a signal log determines (--replay)."""
    from mds.core.signal_log import SignalLog
    from mds.errors import ConfigError
    from mds.planner.plan.segment import plan_segment, replay_segments, windows_of

    if cfg.online is None:
        raise ConfigError("--segment, --signals and --replay need [mixing] online in the config")
    if parent is not None:
        raise ConfigError(
            "--from/--at-step: an online run's segments are re-planned with --segment K"
        )
    if replay is not None and (segment is not None or signals is not None):
        raise ConfigError("--replay LOG plans every segment; leave out --segment and --signals")
    if segment is not None and segment >= windows_of(cfg):
        raise ConfigError(f"--segment {segment}: the run has windows 0 to {windows_of(cfg) - 1}")
    if (segment is not None and segment >= 2) and signals is None:
        raise ConfigError(f"--segment {segment} needs --signals LOG (windows 0..{segment - 2})")
    build = {"workers": workers, "engine": spec}
    if replay is not None:
        summaries = replay_segments(cfg, target, SignalLog.read(replay), **build)
    else:
        log = SignalLog.read(signals) if signals is not None else None
        summaries = [plan_segment(cfg, target, segment or 0, log, **build)]
    if json_out:
        print_json([s.to_json() for s in summaries])
        return
    for s in summaries:
        console.print(
            f"segment {s.path}: steps {s.first_step}-{s.steps - 1}, plan id {s.plan_id}",
            markup=False,
            soft_wrap=True,
        )


def parse_skips(texts: list[str], at_step: int | None) -> list[tuple[int, int]]:
    """--skip-steps A:B values as sorted, disjoint (A, B) ranges with K <= A < B."""
    from mds.errors import ConfigError

    ranges = []
    for text in texts:
        a, sep, b = text.partition(":")
        try:
            lo, hi = int(a), int(b)
        except ValueError:
            lo = hi = -1
        if not sep or lo < 0 or hi <= lo:
            raise ConfigError(f"--skip-steps {text!r}: give A:B with 0 <= A < B (steps A..B-1)")
        if at_step is not None and lo < at_step:
            raise ConfigError(f"--skip-steps {text}: starts before --at-step {at_step}")
        ranges.append((lo, hi))
    ranges.sort()
    for (a1, b1), (a2, b2) in zip(ranges, ranges[1:], strict=False):
        if a2 < b1:
            raise ConfigError(f"--skip-steps {a1}:{b1} and {a2}:{b2} overlap; give each step once")
    return ranges


def _exclusion(path: Path, index, missing: str, manifest=None):
    """The exclude list resolved against the plan's index (`manifest`, if read already):
    (source, row) and (file, ...) entries by the planner, content_hash entries through
    content_hash_rows."""
    from mds.core.storage import is_url
    from mds.errors import ConfigError
    from mds.planner.index.tables import read_manifest
    from mds.planner.plan.exclude import Exclusion, read_exclude_list, resolve_entries

    if is_url(index):
        raise ConfigError("--exclude: resolve the list against a local index (--index DIR)")
    found = read_exclude_list(path)
    if found.hashes:
        found.rows.extend(content_hash_rows(Path(index), found.hashes, missing))
    ids, given, _ = resolve_entries(found, manifest or read_manifest(index), missing)
    return Exclusion(ids, given, path.name, found.digest, found.entries)


def content_hash_rows(
    index: Path, hashes: list[tuple[int, str]], missing: str = "error"
) -> list[tuple[int, str, int]]:
    """(list row, source, row) of every document whose content hash (core/content_hash.py)
    an exclude list gives: each source of the index is read once and hashed as the executor
    reads it, and every document with a listed hash matches (duplicates included). A hash
    no document has is an error naming the list's row, unless `missing` is "ignore"."""
    import numpy as np

    from mds.cli.contents import content_hashes
    from mds.errors import ConfigError
    from mds.planner.index.tables import read_manifest

    wanted: dict[str, list[int]] = {}
    for at, digest in hashes:
        wanted.setdefault(digest.strip().lower(), []).append(at)
    out: list[tuple[int, str, int]] = []
    found: set[str] = set()
    for entry in read_manifest(index).sources:
        name, n = entry["name"], int(entry["rows"])
        digests = content_hashes(index, name, np.arange(n, dtype=np.int64))
        for row, digest in enumerate(digests):
            if digest in wanted:
                found.add(digest)
                out += [(at, name, row) for at in wanted[digest]]
    lost = sorted(at for digest, ats in wanted.items() if digest not in found for at in ats)
    if lost and missing != "ignore":
        raise ConfigError(
            f"--exclude row {lost[0]}: no document of the index has content_hash "
            f"{hashes[[at for at, _ in hashes].index(lost[0])][1]!r} "
            f"({len(lost)} such row(s); --exclude-missing ignore leaves them out)"
        )
    return sorted(out)


def _print_replan(s) -> None:
    """What --skip-steps and --exclude did, under the summary."""
    if s.skipped:
        spans = ", ".join(f"{a}:{b}" for a, b in s.skipped)
        console.print(f"skipped the old plan's steps {spans}; the last steps planned anew")
    if s.exclude is None:
        return
    from rich.table import Table

    e = s.exclude
    console.print(
        f"excluded: {e['entries']:,} entries given in {e['list']}, {e['matched']:,} documents "
        f"matched, {e['trained_before']:,} of them already trained on before the re-plan step",
        soft_wrap=True,
        markup=False,
    )
    table = Table(title="excluded per source", title_justify="left")
    for col in ("source", "given", "matched", "trained before K", "not eligible"):
        table.add_column(col, justify="left" if col == "source" else "right")
    for name, row in e["sources"].items():
        table.add_row(
            name + ("" if row["planned"] else " (not planned)"),
            f"{row['given']:,}",
            f"{row['matched']:,}",
            f"{row['trained_before']:,}",
            f"{row['ineligible']:,}",
        )
    console.print(table)


def _manifest_or_none(index: Path):
    """The index's manifest, or None where it cannot be read (planning then says why)."""
    from mds.core.index_manifest import read_manifest
    from mds.errors import MdsError

    try:
        return read_manifest(index)
    except MdsError:
        return None


def _cp_rows(cp) -> list[tuple[str, str]]:
    """Plans with cp_size > 1: the DP x CP step time over its lower bound, and the layouts
    it is compared with (docs/context-parallel.md)."""
    if cp is None:
        return []
    return [
        (
            f"DP x CP step / lower bound (cp {cp['cp_size']})",
            f"mean {cp['ratio_mean']:.4f}, max {cp['ratio_max']:.4f}",
        ),
        (
            "head-tail everywhere / contiguous",
            f"mean {cp['headtail_ratio_mean']:.4f} / {cp['contiguous_ratio_mean']:.4f}",
        ),
        ("CP samples split", f"{cp['samples_split']:,} ({cp['padding_tokens']:,} padding tokens)"),
    ]


def _band_rows(cost: dict) -> list[tuple[str, str]]:
    """With the built-in default cost: the speedup's range over the quadratic weight."""
    band = cost.get("band")
    if band is None:
        return [("  range over b x 0.25 to x 4", cost["band_note"])] if "band_note" in cost else []
    return [("  range over b x 0.25 to x 4", f"{band['low']:.3f}x - {band['high']:.3f}x")]


def _print_summary(s) -> None:
    from rich.table import Table

    table = Table(title=f"plan {s.path}", title_justify="left", show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    rows = [
        (
            "steps x dp ranks x micro-batches",
            f"{s.steps - s.first_step} (steps {s.first_step}-{s.steps - 1}) x {s.dp_size} x "
            f"{s.micro_batches}",
        ),
        ("samples / tokens", f"{s.samples:,} / {s.tokens:,}"),
        ("plan size", f"{s.bytes:,} bytes ({s.bytes / max(s.samples, 1):.2f} per sample)"),
        ("max rank cost / lower bound", f"mean {s.ratio_mean:.4f}, max {s.ratio_max:.4f}"),
        (
            "naive sharding, same samples",
            f"mean {s.naive_ratio_mean:.4f}, max {s.naive_ratio_max:.4f}",
        ),
        (
            "in-order interleaving, same samples",
            f"mean {s.interleave_ratio_mean:.4f}, max {s.interleave_ratio_max:.4f}",
        ),
        ("predicted speedup vs naive", f"{s.speedup_vs_naive:.3f}x"),
        *_band_rows(s.cost),
        ("predicted speedup vs interleaving", f"{s.speedup_vs_interleave:.3f}x"),
        ("stronger baseline", s.stronger_baseline),
        *(
            (
                f"{part} max rank / its lower bound",
                f"mean {q['ratio_mean']:.4f}, max {q['ratio_max']:.4f} (naive mean {q['naive_ratio_mean']:.4f})",
            )
            for part, q in (s.parts or {}).items()
        ),
        *_cp_rows(s.cp),
        ("plan id", s.plan_id),
    ]
    for row in rows:
        table.add_row(*row)
    console.print(table)
    if s.cost:
        console.print(f"cost: {s.cost['label']}", soft_wrap=True, markup=False)
    src = Table(title="sources", title_justify="left")
    for col in ("source", "samples", "eligible", "epochs"):
        src.add_column(col, justify="left" if col == "source" else "right")
    for entry in s.sources:
        src.add_row(
            entry["name"],
            f"{entry['samples']:,}",
            f"{entry['eligible']:,}",
            f"{entry['epochs']:.3f}",
        )
    console.print(src)
    who = f" by {s.workers} workers" if s.workers > 1 else ""
    console.print(f"planned in {s.seconds:.2f}s{who}")
    for warning in s.warnings:
        console.print(f"warning: {warning}", markup=False)  # wrapped to the screen
