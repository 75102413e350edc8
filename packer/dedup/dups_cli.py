"""``pack dups`` and ``pack overlap``: kept apart from packer/cli.py (packer/dedup/overlap.py does
the work)."""

from __future__ import annotations

import sys
from typing import Any

import click

from packer.commands.cli_options import storage_options_option
from packer.dedup.deduper import DEFAULT_NEAR_DISTANCE

distance_option = click.option(
    "--distance",
    type=click.IntRange(0, 32),
    default=DEFAULT_NEAR_DISTANCE,
    show_default=True,
    help="Near copies: perceptual hashes differing in at most this many bits of 64 (0: exact only "
    "and identical hashes).",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
indices_option = click.option(
    "--indices-out",
    type=click.Path(dir_okay=False, path_type=str),
    default=None,
    help="Write the duplicate indices, one a line ('#' comments), for a view without them.",
)
show_option = click.option(
    "--show", "sheet", type=click.Path(dir_okay=False, path_type=str), default=None,
    help="Draw the first groups side by side into this PNG.",
)  # fmt: skip
quiet_option = click.option("-q", "--quiet", is_flag=True, help="No progress bar.")


def common_options(fn: Any) -> Any:
    """The options ``dups`` and ``overlap`` share."""
    for option in (
        quiet_option,
        storage_options_option,
        show_option,
        indices_option,
        json_option,
        distance_option,
    ):
        fn = option(fn)
    return fn


def _emit(data: Any) -> None:
    from packer.cli import emit_json

    emit_json(data)


def _kind(hashes: Any) -> str:
    return "stored" if hashes.stored else "computed"


def _source(hashes: Any) -> str:
    return "stored hashes" if hashes.stored else "hashed from the images (the pack stores no hashes)"


@click.command()
@click.argument("dataset", type=click.Path(path_type=str))
@common_options
def dups(dataset: str, distance: int, as_json: bool, indices_out, sheet, storage_options, quiet) -> None:
    """List the groups of exact and near duplicate samples inside DATASET."""
    from packer.dedup.overlap import dup_pairs, groups_of, load_hashes, write_indices

    hashes = load_hashes(dataset, storage_options or None, progress=not (quiet or as_json))
    pairs = dup_pairs(hashes.records, distance)
    groups = groups_of(pairs, len(hashes.records))
    extra = [i for g in groups for i in g[1:]]
    if indices_out:
        why = f"pack dups {dataset} --distance {distance}: every member of a group of duplicates"
        write_indices(indices_out, extra, f"{why} but its first ({len(extra)} of {len(hashes.records)})")
    if sheet:
        from packer.dedup._dup_sheet import save_rows_sheet

        closest = {(p.a, p.b): p.distance for p in pairs}
        rows = [[(0, i, f"#{i}" + ("" if i == g[0] else f" d{closest.get((g[0], i), '~')}")) for i in g]
                for g in groups]  # fmt: skip
        save_rows_sheet([dataset], rows, sheet, storage_options=storage_options or None)
    if as_json:
        _emit({"dataset": dataset, "samples": len(hashes.records), "distance": distance,
               "hashes": _kind(hashes), "groups": groups,
               "duplicates": len(extra), "pairs": [p.to_dict() for p in pairs]})  # fmt: skip
        return
    click.echo(f"{dataset}: {len(groups)} group(s) of duplicates, {len(extra)} sample(s) beyond the first "
               f"of each, of {len(hashes.records)} ({_source(hashes)}, distance <= {distance})")  # fmt: skip
    for group in groups[:20]:
        click.echo("  " + " ".join(str(i) for i in group))
    if len(groups) > 20:
        click.echo(f"  ... and {len(groups) - 20} more (--json lists them all)")


@click.command()
@click.argument("a", type=click.Path(path_type=str))
@click.argument("b", type=click.Path(path_type=str))
@common_options
def overlap(a: str, b: str, distance: int, as_json: bool, indices_out, sheet, storage_options, quiet) -> None:
    """Report the samples of B that are exact or near duplicates of samples of A (train/val
    leakage); exit 1 when any are found, 0 when none."""
    from packer.dedup.overlap import load_hashes, overlap_pairs, write_indices

    options = storage_options or None
    ha = load_hashes(a, options, progress=not (quiet or as_json))
    hb = load_hashes(b, options, progress=not (quiet or as_json))
    pairs = overlap_pairs(ha.records, hb.records, distance)
    exact = sum(p.kind == "exact" for p in pairs)
    if indices_out:
        write_indices(indices_out, [p.b for p in pairs], f"pack overlap {a} {b} --distance {distance}: "
                      f"the samples of B found in A ({len(pairs)} of {len(hb.records)})")  # fmt: skip
    if sheet:
        from packer.dedup._dup_sheet import save_rows_sheet

        rows = [[(0, p.a, f"A #{p.a}"), (1, p.b, f"B #{p.b} {p.kind} d{p.distance}")] for p in pairs]
        save_rows_sheet([a, b], rows, sheet, storage_options=options)
    if as_json:
        _emit({"a": a, "b": b, "samples_a": len(ha.records), "samples_b": len(hb.records),
               "distance": distance, "found": len(pairs), "exact": exact, "near": len(pairs) - exact,
               "hashes": {"a": _kind(ha), "b": _kind(hb)},
               "pairs": [p.to_dict() for p in pairs]})  # fmt: skip
    else:
        share = 100 * len(pairs) / max(1, len(hb.records))
        found = f"{b}: {len(pairs)} of {len(hb.records)} sample(s) ({share:.2f}%) are in {a}"
        click.echo(f"{found}: {exact} exact, {len(pairs) - exact} near (distance <= {distance}); "
                   f"A: {_source(ha)}, B: {_source(hb)}")  # fmt: skip
        for p in pairs[:20]:
            click.echo(f"  B #{p.b} = A #{p.a} ({p.kind}, distance {p.distance})")
        if len(pairs) > 20:
            click.echo(f"  ... and {len(pairs) - 20} more (--json lists them all)")
    sys.stdout.flush()
    if pairs:
        sys.exit(1)
