"""`mds calibrate`: fit the [cost] table to the step times of the user's model on this device."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.markup import escape

from mds.cli.output import console, err_console, print_json

__all__ = ["calibrate_command"]

DEFAULT_LENGTHS = "64,128,256,512,1024,2048"
DEFAULT_MAX_TOKENS = 4096
DEFAULT_VOCAB = 512
# --encoder: patches per image, sized so the default run stays near 30 s on 2 CPU cores.
DEFAULT_PATCHES = "16,64,256,1024"
DEFAULT_MAX_PATCHES = 2048
DEFAULT_PATCH_SIZE, DEFAULT_TEMPORAL_PATCH_SIZE = 14, 2
# A fit whose largest relative error over the grid exceeds this is flagged (stderr, --json).
FIT_WARN_MAX_ERROR = 0.10


def _progress(label: str, enabled: bool):
    """A progress bar over the grid's timed micro-batches (rich imported only when timing)."""
    from mds.cli.progress import MicroBatchProgress

    return MicroBatchProgress(label, enabled)


def _lengths(text: str, flag: str = "--lengths", what: str = "lengths") -> list[int]:
    from mds.errors import ConfigError

    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(
            f"{flag} must be comma-separated integers, e.g. 64,256,1024; got {text!r}"
        ) from None
    if len(set(values)) < 2:
        raise ConfigError(f"{flag} needs at least two different {what}, got {text!r}")
    return values


def _only_with(given: dict[str, object], encoder: bool) -> None:
    """Flags of the other mode are an error, not silently ignored."""
    from mds.errors import ConfigError

    for flag, value in given.items():
        if value is None:
            continue
        if encoder:
            raise ConfigError(
                f"{flag} sizes the backbone's grid; with --encoder use --patches/--max-patches"
            )
        raise ConfigError(f"{flag} sizes the images of an encoder: it needs --encoder")


def calibrate_command(
    model: str | None = typer.Option(
        None,
        "--model",
        help="module:function returning a torch module with forward(input_ids [1, T], "
        "cu_seqlens [n + 1] int32), with --encoder forward(pixel_values [P_total, D_in], "
        "cu_seqlens); default: the built-in GPT (ViT) of --layers/--hidden/--heads.",
    ),
    hf_config: Path | None = typer.Option(
        None,
        "--hf-config",
        help="A Hugging Face config.json (or its directory), read locally: time "
        "AutoModelForCausalLM.from_config of it (random weights, SDPA, each sample its own "
        "causal sequence; needs the hf extra).",
    ),
    encoder: bool = typer.Option(
        False,
        "--encoder",
        help="Time an image encoder (a ViT over packed images) and write [cost] encoder.",
    ),
    layers: int = typer.Option(2, "--layers", min=1, help="Built-in model: transformer layers."),
    hidden: int = typer.Option(128, "--hidden", min=1, help="Built-in model: hidden size."),
    heads: int = typer.Option(4, "--heads", min=1, help="Built-in model: attention heads."),
    vocab: int | None = typer.Option(
        None,
        "--vocab",
        min=1,
        help=f"Vocabulary the random token ids are drawn from [default: {DEFAULT_VOCAB}].",
    ),
    lengths: str | None = typer.Option(
        None,
        "--lengths",
        help=f"Sample lengths of the grid, comma-separated [default: {DEFAULT_LENGTHS}].",
    ),
    max_tokens: int | None = typer.Option(
        None,
        "--max-tokens",
        min=1,
        help=f"Tokens per micro-batch: packings go up to this [default: {DEFAULT_MAX_TOKENS}].",
    ),
    patches: str | None = typer.Option(
        None,
        "--patches",
        help="--encoder: patches per image of the grid, comma-separated "
        f"[default: {DEFAULT_PATCHES}].",
    ),
    max_patches: int | None = typer.Option(
        None,
        "--max-patches",
        min=1,
        help="--encoder: patches per micro-batch: packings go up to this "
        f"[default: {DEFAULT_MAX_PATCHES}].",
    ),
    patch_size: int | None = typer.Option(
        None,
        "--patch-size",
        min=1,
        help=f"--encoder: patch side in pixels [default: {DEFAULT_PATCH_SIZE}].",
    ),
    temporal_patch_size: int | None = typer.Option(
        None,
        "--temporal-patch-size",
        min=1,
        help="--encoder: frames per patch; a patch row holds 3 x this x patch^2 values "
        f"[default: {DEFAULT_TEMPORAL_PATCH_SIZE}].",
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

    With --encoder it times an image encoder instead (a ViT over k images of P patches,
    --patches) and writes `[cost] encoder = { a, b }` of the fit a*sum(P) + b*sum(P^2) + c,
    the form of the plan's encoder cost a*P + b*P^2 per image; the fit with a term d per
    image is reported beside it, not written.

    Example:

    \b
        mds calibrate --layers 4 --hidden 256 --heads 4 -o cost.toml
        mds calibrate --model mymodels.gpt:build --lengths 128,512,2048 \\
            --max-tokens 8192
        mds calibrate --lengths 32,64,128 --max-tokens 256 --repeats 5 --json
        mds calibrate --hf-config models/llama-tiny/config.json --threads 1 \\
            --statistic min --repeats 5 -o cost.toml
        mds calibrate --encoder --patches 64,256,1024 --max-patches 4096 \\
            -o encoder.toml
    """
    from mds.errors import ConfigError
    from mds.planner.calibrate import fit as cal
    from mds.planner.calibrate.packed_gpt import GptShape, build_packed_gpt
    from mds.planner.calibrate.packed_vit import VitShape, build_packed_vit
    from mds.planner.runtime.atomic import atomic_write_bytes, cannot_write

    if hf_config is not None and (model is not None or encoder):
        raise ConfigError("--hf-config times a causal LM: use it without --model and --encoder")
    if encoder:
        _only_with({"--lengths": lengths, "--max-tokens": max_tokens, "--vocab": vocab}, True)
        vit = VitShape(
            layers=layers,
            hidden=hidden,
            heads=heads,
            patch_size=patch_size or DEFAULT_PATCH_SIZE,
            temporal_patch_size=temporal_patch_size or DEFAULT_TEMPORAL_PATCH_SIZE,
        )
        axis, form = cal.PATCHES, cal.ENCODER_FORM
        sizes = _lengths(patches or DEFAULT_PATCHES, "--patches", "patch counts")
        cap = max_patches or DEFAULT_MAX_PATCHES
        inputs = cal.patch_inputs(vit.patch_dim)
        what = vit.describe() if model is None else f"--model {model}"
    else:
        _only_with(
            {
                "--patches": patches,
                "--max-patches": max_patches,
                "--patch-size": patch_size,
                "--temporal-patch-size": temporal_patch_size,
            },
            False,
        )
        shape = GptShape(layers=layers, hidden=hidden, heads=heads, vocab=vocab or DEFAULT_VOCAB)
        axis, form = cal.TOKENS, cal.MODEL_FORM
        sizes = _lengths(lengths or DEFAULT_LENGTHS)
        cap = max_tokens or DEFAULT_MAX_TOKENS
        inputs = cal.token_inputs(shape.vocab)
        what = shape.describe() if model is None else f"--model {model}"
    hf_net = None
    if hf_config is not None:
        from mds.planner.calibrate.packed_hf import build_hf_model, hf_describe

        hf_net, hf_vocab = build_hf_model(hf_config, seed=seed)
        inputs = cal.token_inputs(min(vocab or hf_vocab, hf_vocab))
        what = hf_describe(hf_config)
    grid = cal.calibration_grid(sizes, cap, mixed=mixed, seed=seed, axis=axis)
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
    if hf_net is not None:
        net = hf_net
    elif model is None:
        net = build_packed_vit(vit, seed=seed) if encoder else build_packed_gpt(shape, seed=seed)
    else:
        net = cal.load_model(model, form)
        cal.check_model(net, model, device=dev, inputs=inputs, form=form)
    with _progress(f"timing {what}", enabled=not json_out) as bar:
        bar.start(len(grid) * (warmup + repeats))
        seconds = cal.time_grid(
            net,
            grid,
            inputs=inputs,
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
        # The encoder's cost has no per-image term: write the fit without one, report both.
        fit=cal.fit_cost(grid, seconds, per_sample=not encoder, axis=axis),
        torch_version=version,
        threads=nthreads,
        clock=clk,
        statistic=statistic,
        encoder=encoder,
        per_image=cal.fit_cost(grid, seconds, axis=axis) if encoder else None,
    )
    table = result.cost_table()
    warning = fit_warning(result.fit)
    if output is not None:
        try:
            atomic_write_bytes(output, table.encode())
        except OSError as exc:
            raise cannot_write(output, "the [cost] table", exc) from None
    if json_out:
        extra = {"warning": warning} if warning else {}
        print_json({**result.to_json(), **extra, "output": str(output) if output else None})
        return
    _print(result, table, output)
    if warning:
        err_console.print(f"warning: {warning}", soft_wrap=True, markup=False)


def fit_warning(fit) -> str | None:
    """A sentence when the fit's largest error over the grid exceeds FIT_WARN_MAX_ERROR."""
    if fit.max_error <= FIT_WARN_MAX_ERROR:
        return None
    return (
        f"the fit's largest error over the grid is {fit.max_error:.1%} (above "
        f"{FIT_WARN_MAX_ERROR:.0%}; per point in the table above, or with --json): the cost "
        "model a*L + b*L^2 + d + c does not describe these timings well; time more rounds "
        "(--repeats, --statistic min, --threads 1 on a busy machine) or narrow --lengths to "
        "the lengths the data has"
    )


def cost_file_hint(output: Path) -> str:
    """How a config references the written table: `[cost] file` is read relative to the
    config's directory, not to where calibrate ran, so the hint gives the absolute path (as
    a TOML string), right wherever the config is."""
    where = json.dumps(Path(output).resolve().as_posix(), ensure_ascii=False)
    return escape(
        f"reference it with [cost] file = {where} (a relative file is read from the "
        "config's directory)"
    )


def _print(result, table: str, output: Path | None) -> None:
    from rich.table import Table

    points = Table(title="calibration grid (seconds per micro-batch)", title_justify="left")
    columns = ("images x patches", "patches") if result.encoder else ("samples x length", "tokens")
    for col in (*columns, "measured", "fitted", "error"):
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
    if result.per_image is not None:
        g = result.per_image
        err_console.print(
            f"written: encoder = {{ a = {f.a:.4g}, b = {f.b:.4g} }}, the plan's a*P + b*P^2 per "
            f"image; with a term d per image the fit is a = {g.a:.4g}, b = {g.b:.4g}, "
            f"c = {g.c:.4g}, d = {g.d:.4g} (error max {g.max_error:.1%}, median "
            f"{g.median_error:.1%}); d is not written, c is not used for balancing",
            soft_wrap=True,
        )
    if output is not None:
        err_console.print(f"wrote {escape(str(output))}; {cost_file_hint(output)}", soft_wrap=True)
    console.file.write(table)
