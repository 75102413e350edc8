"""``pack view`` and ``pack split``: subsets of a dataset without copies (packer/edit/views.py)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

import click

from packer.commands.cli_options import storage_options_option


def _report(results: list[Any], as_json: bool) -> None:
    if as_json:
        from packer.cli import emit_json

        emit_json([asdict(r) for r in results])
        return
    for r in results:
        click.echo(
            f"{r.path}: a view of {r.samples} of the {r.parent_samples} samples of {r.parent} "
            f"({r.index_bytes} bytes of indices, no image bytes)"
        )


@click.command("view")
@click.argument("dataset", type=click.Path(path_type=str))
@click.option(
    "-o", "--out", required=True, type=click.Path(path_type=str), help="The view's directory or URL."
)
@click.option(
    "--indices",
    "indices_file",
    type=click.Path(path_type=str),
    help="Keep these dataset indices: a file of one index per line ('#' comments).",
)
@click.option(
    "--drop",
    "drop_file",
    type=click.Path(path_type=str),
    help="Keep every sample but these (e.g. the file `pack dups --indices-out` writes).",
)
@click.option("--force", is_flag=True, help="Replace an earlier view at OUT.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@storage_options_option
def view_command(dataset: str, out: str, indices_file: str | None, drop_file: str | None, force: bool,
                 as_json: bool, storage_options: dict[str, Any]) -> None:  # fmt: skip
    """Write a view of DATASET at OUT: a dataset of some of its samples, read like any dataset
    (open_iterable, pack verify, ...), holding only their indices. Exactly one of --indices or
    --drop. A view of a view names the root dataset."""
    from packer.edit.views import complement, read_index_list, write_view
    from readers.errors import OptionError
    from readers.formats import open_reader

    if (indices_file is None) == (drop_file is None):
        raise OptionError("pack view: give exactly one of --indices FILE or --drop FILE")
    if indices_file is not None:
        indices, made = read_index_list(indices_file), {"by": "indices", "file": indices_file}
    else:
        assert drop_file is not None
        reader = open_reader(dataset, storage_options=storage_options or None)
        count = len(reader)
        reader.close()
        dropped = read_index_list(drop_file)
        if dropped.size and int(dropped.max()) >= count:
            raise OptionError(
                f"{drop_file}: index {int(dropped.max())} is outside the {count} samples of {dataset}"
            )
        indices, made = complement(count, dropped), {"by": "drop", "file": drop_file}
    result = write_view(
        dataset, out, indices, made=made, force=force, storage_options=storage_options or None
    )
    _report([result], as_json)


@click.command("split")
@click.argument("dataset", type=click.Path(path_type=str))
@click.option(
    "-o",
    "--out",
    required=True,
    type=click.Path(path_type=str),
    help="Folder (or URL) that gets the views OUT/train and OUT/val.",
)
@click.option("--val", type=float, required=True, help="Fraction of the samples in OUT/val (e.g. 0.05).")
@click.option("--seed", type=int, default=0, show_default=True, help="Which split.")
@click.option(
    "--key",
    type=click.Choice(["path", "index"]),
    default="path",
    show_default=True,
    help="What a sample's side is a hash of (with the seed): its source path (stable when "
    "the dataset grows or is re-packed), or its dataset index (stable under appends).",
)
@click.option("--force", is_flag=True, help="Replace earlier views at OUT/train and OUT/val.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@storage_options_option
def split_command(dataset: str, out: str, val: float, seed: int, key: str, force: bool, as_json: bool,
                  storage_options: dict[str, Any]) -> None:  # fmt: skip
    """Split DATASET into two views, OUT/train and OUT/val, by a hash of (seed, each sample's key):
    deterministic, disjoint, covering every sample, and a sample keeps its side as the dataset
    grows."""
    from packer.edit.views import split_views

    results = split_views(dataset, out, val=val, seed=seed, key=key, force=force,
                          storage_options=storage_options or None)  # fmt: skip
    _report(list(results.values()), as_json)
