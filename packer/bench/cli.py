"""``pack bench``: compare packed datasets (and the plain image folder) on this machine, and run
the registered benchmark suites (``packer.bench.suites``).

``pack bench DATASET...`` is ``pack bench compare DATASET...`` (the group sends anything that is
not one of its commands there); ``pack bench suites`` lists the suites, ``pack bench run NAME
[ARGS]`` runs one. Kept apart from packer/cli.py; the group registers it when this module exists.
Heavy imports (torch, matplotlib, a suite's module) happen only when a command runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import click


def parse_workers(ctx: click.Context, param: click.Parameter, value: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(part) for part in value.split(",") if part.strip())
    except ValueError:
        raise click.BadParameter(f"{value!r}: give worker counts like 0,2,4") from None
    if not counts or min(counts) < 0:
        raise click.BadParameter(f"{value!r}: give worker counts >= 0 like 0,2,4")
    return tuple(dict.fromkeys(counts))


class BenchGroup(click.Group):
    """A group whose default command is ``compare``: ``pack bench a.lmdb`` still compares."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ctx.help_option_names:
            args = ["compare", *args]
        return super().parse_args(ctx, args)


@click.group(cls=BenchGroup)
def bench() -> None:
    """Measure how fast packed datasets load, or run a benchmark suite.

    \b
    pack bench DATASET... [OPTIONS]     compare datasets (pack bench compare --help)
    pack bench suites                   list the benchmark suites
    pack bench run NAME [ARGS]          run one (pack bench run NAME --help: its options)
    """


@bench.command()
@click.argument("datasets", nargs=-1, required=True, type=click.Path(path_type=str))
@click.option(
    "--baseline",
    type=click.Path(path_type=str),
    help="The source image folder, read with Pillow like torchvision's ImageFolder, for comparison.",
)
@click.option(
    "--workers",
    default="0,2",
    show_default=True,
    callback=parse_workers,
    help="DataLoader worker counts to measure, comma-separated.",
)
@click.option("--batch-size", type=click.IntRange(min=1), default=64, show_default=True)
@click.option(
    "--epochs",
    type=click.IntRange(min=1),
    default=2,
    show_default=True,
    help="Timed epochs (after one warm-up epoch).",
)
@click.option(
    "--decode",
    type=click.Choice(["tensor", "numpy", "pil", "bytes"]),
    default="tensor",
    show_default=True,
    help="Output kind of the per-sample path and of the decoded random reads.",
)
@click.option(
    "--random-reads",
    type=click.IntRange(min=0),
    default=256,
    show_default=True,
    help="Random map-style reads per dataset for the random-access figure (0: skip).",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--augment",
    type=click.Choice(["none", "rrc"]),
    default="none",
    show_default=True,
    help="rrc: the training read, RandomResizedCrop(--augment-size) + flip, for every row (the baseline "
    "on the original files).",
)
@click.option("--augment-size", type=click.IntRange(min=1), default=224, show_default=True)
@click.option("--dali", is_flag=True, help="Also read each dataset through readers.dali.dali_loader.")
@click.option(
    "--plot", "plot_path", type=click.Path(path_type=str), help="Write a PNG chart (needs matplotlib)."
)
@click.option(
    "--json", "json_path", type=click.Path(path_type=str), help="Write every figure to this JSON file."
)
@click.option("--markdown", is_flag=True, help="Print markdown tables instead of the terminal table.")
@click.option(
    "--cold",
    is_flag=True,
    help="Uncached epochs: drop the datasets from the page cache before each timed epoch (each in a "
    "fresh process) and compare with warm ones, with and without read-ahead.",
)
@click.option("--memory-cap", help="Like --cold, the cold epoch in a memory cgroup this size (230M; root).")
@click.option("--records-only", is_flag=True, help="With --cold: read records without decoding them (I/O).")
@click.option("--drop-caches", is_flag=True, help="With --cold: drop the whole page cache (root).")
@click.option("--rounds", type=click.IntRange(min=1), default=3, show_default=True, help="--cold rounds.")
@click.option("--readahead", default="0,16M", show_default=True, help="--cold: budgets to compare.")
@click.option("--crop", type=click.IntRange(min=1), default=224, show_default=True, help="--cold crop.")
@click.option(
    "--peer",
    "peers",
    multiple=True,
    type=click.Choice(["webdataset", "ffcv"]),
    help="--cold: also read the datasets with this library, under the same conditions (webdataset: a tar "
    "dataset's shards; ffcv: a .beton of each dataset's stored bytes, os_cache=False, QUASI_RANDOM).",
)
@click.option(
    "--ffcv-python",
    default="/work/ffcv-venv/bin/python",
    show_default=True,
    help="--peer ffcv: a Python with FFCV 1.0.2 installed (FFCV is never an imgpack dependency).",
)
@click.option(
    "--peer-dir",
    type=click.Path(file_okay=False, path_type=str),
    help="--peer ffcv: where the .beton files are written once and kept [default: imgpack-peers/ beside "
    "each dataset].",
)
@click.option(
    "--ffcv-page-size",
    default="8M",
    show_default=True,
    help="--peer ffcv: the .beton's page size (FFCV's default 8M; 2M is its least). FFCV with os_cache=False "
    "holds whole pages in memory, a few per batch in flight: smaller pages, less memory.",
)
@click.option(
    "--epoch-timeout",
    type=click.FloatRange(min=1),
    default=900,
    show_default=True,
    help="--cold: seconds one epoch may take before it is stopped and the run ends with an error.",
)
@click.option("-q", "--quiet", is_flag=True, help="No progress lines.")
def compare(
    datasets: tuple[str, ...],
    baseline: str | None,
    workers: tuple[int, ...],
    batch_size: int,
    epochs: int,
    decode: str,
    random_reads: int,
    seed: int,
    augment: str,
    augment_size: int,
    dali: bool,
    plot_path: str | None,
    json_path: str | None,
    markdown: bool,
    cold: bool,
    memory_cap: str | None,
    records_only: bool,
    drop_caches: bool,
    rounds: int,
    readahead: str,
    crop: int,
    peers: tuple[str, ...],
    ffcv_python: str,
    peer_dir: str | None,
    ffcv_page_size: str,
    epoch_timeout: float,
    quiet: bool,
) -> None:
    """Measure how fast DATASET... load in PyTorch: images/s, MB/s, first batch, memory, random reads.

    \b
    pack bench train.lmdb train.h5 --baseline ~/data/train --workers 0,2,4 --plot bench.png

    The same as pack bench DATASET...; other questions (object storage, FFCV, packing, scale) are
    suites: pack bench suites.
    """
    from packer.bench._plot import plot_report
    from packer.bench._report import format_markdown, format_text
    from packer.bench.model import Settings
    from packer.bench.run import run_bench

    if plot_path:
        try:
            import matplotlib  # noqa: F401  - fail before measuring, not after
        except ImportError:
            raise click.ClickException(
                '--plot needs matplotlib; install it with: pip install "imgpack[plot]" (or drop --plot)'
            ) from None
    for target in (json_path, plot_path):
        if target and not Path(target).resolve().parent.is_dir():
            raise click.BadParameter(f"{target}: its folder does not exist", param_hint="--json/--plot")
    if cold or memory_cap:
        from packer.bench._cold import cold_command

        cold_command(list(datasets), workers, batch_size, memory_cap, records_only, drop_caches, rounds, crop,
                     seed, json_path, quiet, readahead, peers, ffcv_python, peer_dir,
                     ffcv_page_size, epoch_timeout)  # fmt: skip
        return
    settings = Settings(workers, batch_size, epochs, decode, random_reads, seed, augment, augment_size)
    log = None if quiet else (lambda message: click.echo(message, err=True))
    report = run_bench(list(datasets), baseline, settings, dali=dali, log=log)
    click.echo(format_markdown(report) if markdown else format_text(report))
    if json_path:
        Path(json_path).write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    if plot_path:
        plot_report(report, plot_path)
    if not quiet and (json_path or plot_path):
        written = [p for p in (json_path, plot_path) if p]
        click.echo(f"wrote {', '.join(written)}", err=True)


@bench.command("suites")
def list_suites() -> None:
    """List the benchmark suites (and the data makers they share): name, what it measures, needs."""
    from packer.bench.suites import SUITES

    width = max(len(s.name) for s in SUITES)
    for kind, title in (("suite", "Suites"), ("data", "Data makers")):
        click.echo(f"{title} (pack bench run NAME --help):")
        for suite in (s for s in SUITES if s.kind == kind):
            needs = f" [needs {suite.needs}]" if suite.needs else ""
            click.echo(f"  {suite.name:<{width}}  {suite.description}{needs}")


@bench.command("run", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("name")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def run_suite_command(ctx: click.Context, name: str, args: tuple[str, ...]) -> None:
    """Run the benchmark suite NAME with ARGS (pack bench suites lists them; ARGS --help: its own)."""
    from packer.bench.suites import run_suite, suite_names

    if name not in suite_names():
        raise click.BadParameter(
            f"no suite {name!r}; choose one of {', '.join(suite_names())}", param_hint="NAME"
        )
    ctx.exit(run_suite(name, list(args)))
