"""The options of every ``pack SOURCE ...`` command (one per registered source, packer/cli.py
makes them), and the one ``PackSpec`` (packer/spec.py) built from them before anything is
scanned or written.

The format flags (``--shard-size``, ``--compression``, ...) are made here from the formats'
declared pack options (readers/formats/pack_option.py), so a format adding one adds a flag.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import click

from packer.commands.cli_options import storage_options_option
from packer.dedup.deduper import dedup_options
from packer.spec import ENGINES, ON_ERRORS
from readers.errors import ImgpackError
from readers.formats.pack_option import PackOption
from readers.formats.packed_sample import (
    AUTO_RESAMPLE,
    DEFAULT_MAX_PIXELS,
    RESAMPLERS,
    RESIZE_MODES,
    PreprocessSpec,
)
from readers.formats.registry import format_names, formats_taking, registered
from readers.order.epoch_order import PACK_ORDERS
from readers.store.manifest import ENCODINGS

PREPROCESS = tuple(f.name for f in dataclasses.fields(PreprocessSpec))  # the flags' names too
CLICK_TYPES: dict[str, Callable[[PackOption], Any]] = {
    "count": lambda option: click.IntRange(min=1),
    "size": lambda option: str,  # "512MB": parsed by the option itself
    "choice": lambda option: click.Choice(option.choices),
}


def format_flags() -> list[click.Option]:
    """One flag per pack option any registered format declares, its help naming the formats
    that take it (where not every format does)."""
    declared: dict[str, tuple[str, PackOption]] = {}
    for fmt in registered().values():
        for option in fmt.pack_options:
            first = declared.setdefault(option.name, (fmt.name, option))
            if first[1] != option:
                raise ImgpackError(
                    f"the formats {first[0]} and {fmt.name} declare the pack option {option.name} "
                    "differently; give one of them another name"
                )
    flags = []
    for _, option in declared.values():
        users = formats_taking(option.name)
        scope = "" if len(users) == len(registered()) else f" ({', '.join(users)} only)"
        kind = CLICK_TYPES[option.kind](option)
        text = f"{option.help.rstrip('.')}{scope}."
        flags.append(click.Option([option.flag, option.name], type=kind, default=None, help=text))
    return flags


def _collected(*decorators: Callable[[Callable], Callable]) -> list[click.Parameter]:
    """The click parameters the option decorators would add to a command, in their order."""

    def target() -> None: ...

    for decorate in reversed(decorators):
        target = decorate(target)
    return list(reversed(getattr(target, "__click_params__", [])))


def _choice(flag: str, choices: Sequence[str], default: Any, help: str) -> Callable:
    return click.option(flag, type=click.Choice(choices), default=default, show_default=True, help=help)


def _flag(*names: str, help: str) -> Callable:
    return click.option(*names, is_flag=True, help=help)


RESIZE_MODE_HELP = "shorter/longer: that side becomes --resize, aspect kept; exact: --resize x --resize."
RESAMPLE_HELP = "auto: the readers' resampler (pack --resize N = read resize=N); or one of Pillow's filters."
MAX_PIXELS_HELP = (
    "Images with more pixels (before or after resizing) are skipped as possible decompression bombs."
)
ORDER_HELP = (
    "shuffled: write the samples in a seeded permutation of the source, so block-wise reads of a "
    "class-sorted folder still give varied batches; source: keep the source order."
)


def pack_params(resumable: bool = True) -> list[click.Parameter]:
    """The options every source command takes (``--resume`` only where ``resumable``)."""
    before = _collected(
        click.option(
            "--to", "fmt", type=click.Choice(format_names()), help="Output format (not with --append)."
        ),
        click.option(
            "-o", "--out", required=True, type=click.Path(path_type=str), help="Output dataset directory."
        ),
        click.option(
            "--resize", type=click.IntRange(min=1), help="Target size in pixels (see --resize-mode)."
        ),
        _choice("--resize-mode", RESIZE_MODES, "shorter", RESIZE_MODE_HELP),
        click.option("--crop", type=click.IntRange(min=1), help="Centre crop to N x N after resizing."),
        _choice(
            "--encode",
            ENCODINGS,
            "jpeg",
            "How images are stored; 'original' keeps the source bytes untouched.",
        ),
        click.option(
            "--quality", type=click.IntRange(1, 100), default=90, show_default=True, help="JPEG quality."
        ),
        _choice(
            "--mode", ["RGB", "L"], "RGB", "Colour mode of the stored images (alpha is flattened on white)."
        ),
        click.option(
            "--upscale/--no-upscale",
            default=False,
            show_default=True,
            help="Allow --resize to enlarge images smaller than the target.",
        ),
        _choice("--resample", RESAMPLERS, AUTO_RESAMPLE, RESAMPLE_HELP),
        click.option(
            "--max-pixels",
            type=click.IntRange(min=1),
            default=DEFAULT_MAX_PIXELS,
            show_default=True,
            help=MAX_PIXELS_HELP,
        ),
        click.option(
            "--workers",
            type=click.IntRange(min=1),
            default=None,
            help="Processes that preprocess images [default: number of CPUs].",
        ),
        _choice(
            "--engine",
            ENGINES,
            "local",
            "local: a process pool on this machine; ray: one Ray task per part (see --shards).",
        ),
        click.option("--ray-address", default=None, help="Ray cluster to join (default: start a local one)."),
    )
    resume = _flag("--resume", help="Finish an interrupted pack into the same output.")
    after = _collected(
        _choice(
            "--on-error",
            ON_ERRORS,
            "skip",
            "skip: record bad files in the manifest and go on; fail: stop at the first one.",
        ),
        _choice("--order", PACK_ORDERS, "shuffled", ORDER_HELP),
        click.option(
            "--seed", type=int, default=0, show_default=True, help="Seed of the --order shuffled permutation."
        ),
        _flag("--force", help="Replace an existing output dataset."),
        *([resume] if resumable else []),
        _flag(
            "--append",
            help="Add the source to the dataset OUT as its next version, with its format and options.",
        ),
        storage_options_option,
        dedup_options,
        _flag("-q", "--quiet", help="No progress bar or summary."),
        _flag("--json", "as_json", help="Print the summary as JSON."),
    )
    return [*before, *format_flags(), *after]


def spec_keywords(given: dict[str, Any]) -> dict[str, Any]:
    """``PackSpec``'s keywords (but source and format) from a source command's pack options."""
    flags = {o.name for fmt in registered().values() for o in fmt.pack_options}
    return dict(
        out=given["out"],
        preprocess=PreprocessSpec(**{k: given[k] for k in PREPROCESS}),
        options={k: given[k] for k in flags if k in given},
        workers=given["workers"],
        engine=given["engine"],
        ray_address=given["ray_address"],
        on_error=given["on_error"],
        order=given["order"],
        seed=given["seed"],
        force=given["force"],
        resume=given.get("resume", False),
        quiet=given["quiet"] or given["as_json"],
        storage_options=given["storage_options"] or None,
        dedup=given["dedup"],
        near_distance=given["near_distance"],
    )


def named_by(own: dict[str, Any]) -> str:
    """What a source command's first argument names (for messages until the scan is made)."""
    first = next(iter(own.values()), None)
    return str(first[0] if isinstance(first, tuple) and first else first or ".")


def fail_on_a_bad_row(scan: Any, on_error: str) -> None:
    """With ``--on-error fail``, a list or annotation row the scan skipped stops the pack."""
    if scan.skipped and on_error == "fail":
        first = scan.skipped[0]
        raise ImgpackError(f"{first['path']}: {first['reason']} (--on-error fail stops at the first bad row)")
