"""``pack show``: kept apart from packer/cli.py; the group registers it when this module exists."""

from __future__ import annotations

import click


@click.command()
@click.argument("dataset", type=click.Path(path_type=str))
@click.option("-o", "--out", required=True, type=click.Path(path_type=str), help="PNG file to write.")
@click.option(
    "--n", "count", type=click.IntRange(min=1), default=64, show_default=True, help="Images to show."
)
@click.option("--classes", default="", help="Only these classes, comma-separated names.")
@click.option("--seed", type=int, default=0, show_default=True, help="Which random samples.")
@click.option(
    "--cell", type=click.IntRange(min=16), default=128, show_default=True, help="Cell size in pixels."
)
@click.option("--buckets", default=None, metavar="SIDE[,MULTIPLE[,MAX_RATIO]]",
              help="One sheet per aspect-ratio bucket (OUT-HxW.png), as the bucketed read returns them.")
def show(dataset: str, out: str, count: int, classes: str, seed: int, cell: int, buckets: str | None) -> None:
    """Write a contact sheet of random samples of DATASET, captioned with their class names."""
    from packer.info.show import save_contact_sheet

    if buckets:
        from packer.info.bucket_info import save_bucket_sheets

        for path in save_bucket_sheets(dataset, out, buckets, n=count, cell=cell):
            click.echo(path)
        return

    wanted = [c.strip() for c in classes.split(",") if c.strip()]
    chosen = save_contact_sheet(dataset, out, n=count, classes=wanted, seed=seed, cell=cell)
    click.echo(f"{out}: {len(chosen)} images of {dataset}")
