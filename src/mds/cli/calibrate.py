"""`mds calibrate`: fit the [cost] table to the step times of the user's model on this device."""

from __future__ import annotations

from pathlib import Path

import typer

from mds.cli.output import console, err_console, print_json

__all__ = ["calibrate_command"]

DEFAULT_LENGTHS = "64,128,256,512,1024,2048"


def _progress(label: str, enabled: bool):
    """A progress bar over the grid's timed micro-batches (rich imported only when timing)."""
    from mds.cli.progress import MicroBatchProgress

    return MicroBatchProgress(label, enabled)


def _lengths(text: str) -> list[int]:
    from mds.errors import ConfigError

    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(
            f"--lengths must be comma-separated integers, e.g. 64,256,1024; got {text!r}"
        ) from None
    if len(set(values)) < 2:
        raise ConfigError(f"--lengths needs at least two different lengths, got {text!r}")
    return values


def calibrate_command(
    model: str | None = typer.Option(
        None,
        "--model",
        help="module:function returning a torch module with forward(input_ids [1, T], "
        "cu_seqlens [n + 1] int32); default: the built-in GPT of --layers/--hidden/--heads.",
    ),
    layers: int = typer.Option(2, "--layers", min=1, help="Built-in model: transformer layers."),
    hidden: int = typer.Option(128, "--hidden", min=1, help="Built-in model: hidden size."),
    heads: int = typer.Option(4, "--heads", min=1, help="Built-in model: attention heads."),
    vocab: int = typer.Option(
        512, "--vocab", min=1, help="Vocabulary the random token ids are drawn from."
    ),
    lengths: str = typer.Option(
        DEFAULT_LENGTHS, "--lengths", help="Sample lengths of the grid, comma-separated."
    ),
    max_tokens: int = typer.Option(
        4096, "--max-tokens", min=1, help="Tokens per micro-batch: packings go up to this."
    ),
    mixed: int = typer.Option(
        4, "--mixed", min=0, help="Extra micro-batches of mixed, seeded lengths."
    ),
    repeats: int = typer.Option(3, "--repeats", min=1, help="Timed runs per point."),
    statistic: str = typer.Option(
        "median",
        "--statistic",
        help="A point's time from its runs: median, or min (least disturbed by other work).",
    ),
    warmup: int = typer.Option(1, "--warmup", min=0, help="Untimed runs per point first."),
    seed: int = typer.Option(0, "--seed", min=0, help="Seed of the inputs, weights and grid."),
    device: str = typer.Option("auto", "--device", help="auto (CUDA if present), cpu, cuda:N."),
    threads: int | None = typer.Option(
        None, "--threads", min=1, help="CPU threads for torch (default: torch's)."
    ),
    clock: str = typer.Option(
        "auto", "--clock", help="auto (cpu on a CPU device, wall on CUDA), wall or cpu."
    ),
    output: Path | None = typer.Option(
        None, "--output", "-o", help="Write the [cost] table to this TOML file."
    ),
    json_out: bool = typer.Option(False, "--json", help="Print the fit and every point as JSON."),
) -> None:
    """Time forward+backward of a model on this device and fit the [cost] table to it.

    Each grid point is one packed micro-batch (k samples of length L, plus a few mixed ones);
    the fit is seconds = a*sum(L) + b*sum(L^2) + d per sample + c per micro-batch, least
    squares on relative error. The printed table can be pasted into the config, or written with -o and
    referenced as `[cost] file = "cost.toml"`.

    Example:

    \b
        mds calibrate --layers 4 --hidden 256 --heads 4 -o cost.toml
        mds calibrate --model mymodels.gpt:build --lengths 128,512,2048 \\
            --max-tokens 8192
        mds calibrate --lengths 32,64,128 --max-tokens 256 --repeats 5 --json
    """
    from mds.planner.calibrate import fit as cal
    from mds.planner.calibrate.packed_gpt import GptShape, build_packed_gpt
    from mds.planner.runtime.atomic import atomic_write_bytes, cannot_write

    grid = cal.calibration_grid(_lengths(lengths), max_tokens, mixed=mixed, seed=seed)
    if model is None:
        shape = GptShape(layers=layers, hidden=hidden, heads=heads, vocab=vocab)
        what = shape.describe()
    else:
        what = f"--model {model}"
    if output is not None:
        from mds.planner.runtime.outputs import check_output

        check_output("-o", output, [])
    import torch  # only now: `mds --help` and the other commands never load it

    if threads is not None:
        torch.set_num_threads(threads)
    dev = cal.pick_device(device)
    clk = cal.pick_clock(clock, dev)
    reduce = cal.pick_statistic(statistic)
    torch.manual_seed(seed)
    if model is None:
        net = build_packed_gpt(shape, seed=seed)
    else:
        net = cal.load_model(model)
        cal.check_model(net, model, vocab, dev)
    with _progress(f"timing {what}", enabled=not json_out) as bar:
        bar.start(len(grid) * (warmup + repeats))
        seconds = cal.time_grid(
            net,
            grid,
            vocab=vocab,
            repeats=repeats,
            warmup=warmup,
            seed=seed,
            device=dev,
            clock=clk,
            advance=bar.advance,
            statistic=reduce,
        )
    version, nthreads = cal.torch_info()
    result = cal.Calibration(
        model=what,
        device=dev,
        repeats=repeats,
        seed=seed,
        micro_batches=[tuple(mb) for mb in grid],
        seconds=seconds,
        fit=cal.fit_cost(grid, seconds),
        torch_version=version,
        threads=nthreads,
        clock=clk,
        statistic=statistic,
    )
    table = result.cost_table()
    if output is not None:
        try:
            atomic_write_bytes(output, table.encode())
        except OSError as exc:
            raise cannot_write(output, "the [cost] table", exc) from None
    if json_out:
        print_json({**result.to_json(), "output": str(output) if output else None})
        return
    _print(result, table, output)


def _print(result, table: str, output: Path | None) -> None:
    from rich.table import Table

    points = Table(title="calibration grid (seconds per micro-batch)", title_justify="left")
    for col in ("samples x length", "tokens", "measured", "fitted", "error"):
        points.add_column(col, justify="right")
    for mb, s, e in zip(result.micro_batches, result.seconds, result.fit.rel_errors, strict=True):
        shape = f"{len(mb)} x {mb[0]}" if len(set(mb)) == 1 else f"mixed {len(mb)}"
        points.add_row(
            shape, f"{sum(mb):,}", f"{s:.4g}", f"{result.fit.predict(mb):.4g}", f"{e:.1%}"
        )
    err_console.print(points)
    f = result.fit
    err_console.print(
        f"fit error over {len(f.rel_errors)} micro-batches: max {f.max_error:.1%}, "
        f"median {f.median_error:.1%}"
    )
    if output is not None:
        err_console.print(
            f'wrote {output}; reference it with \\[cost] file = "{output}"', soft_wrap=True
        )
    console.file.write(table)
