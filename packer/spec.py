"""The packing options, as one validated object: what every ``pack`` command and ``pack_folder`` build.

A ``PackSpec`` is made once per pack, from keyword arguments only, and checks every option at
construction: the format is registered, the engine known, the format's own options (``shard_size``,
``compression``, ...) are ones it declares (readers/formats/pack_option.py) and parse as their
type, the order, error policy and dedup settings make sense together. A mistake is an
``OptionError`` naming the option, raised before the output is created or locked: the engine
(packer/engine/pack_run.py) takes a spec and no longer re-checks what it was asked. The read side's twin is
readers/spec.py's ``ReadSpec``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packer.dedup.deduper import dedup_record
from packer.output.pack_order import order_record
from packer.sources.source import SourceScan
from readers.errors import OptionError
from readers.formats.format import Format
from readers.formats.pack_option import option_flag
from readers.formats.packed_sample import PreprocessSpec
from readers.formats.registry import format_named, formats_taking, registered
from readers.order.epoch_order import PACK_ORDERS
from readers.remote.urls import is_url

# local: a process pool (packer/engine/_local_engine.py); ray: packer/engine/_ray_engine.py
ENGINES = ("local", "ray")
ON_ERRORS = ("skip", "fail")
Source = str | os.PathLike | SourceScan


@dataclass(frozen=True, kw_only=True)
class PackSpec:
    """How to pack ``source`` (a folder, a URL, or an already scanned source) into ``out``."""

    source: Source
    out: str | os.PathLike
    format: str = "lmdb"
    preprocess: PreprocessSpec = field(default_factory=PreprocessSpec)
    # The format's own pack options by keyword (shards, samples_per_shard, shard_size, ...);
    # None values are dropped, the rest parsed to their declared types ("512MB" -> 512000000).
    options: dict[str, Any] = field(default_factory=dict)
    workers: int = field(default_factory=lambda: os.cpu_count() or 1)  # processes (None given: every CPU)
    engine: str = "local"
    ray_address: str | None = None  # --engine ray: the cluster (None: start a local one)
    on_error: str = "skip"  # skip: record bad files in the manifest; fail: stop at the first
    order: str = "shuffled"  # shuffled: a permutation of the source seeded by seed; source
    seed: int = 0
    force: bool = False  # replace an existing output
    resume: bool = False  # finish an interrupted pack into the same output
    quiet: bool = True  # no progress bar
    storage_options: dict[str, Any] | None = None  # fsspec options of URL sources and outputs
    dedup: str | None = None  # "exact" or "near" (packer/dedup/deduper.py)
    near_distance: int | None = None

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "source", _checked_place(self.source, "the source"))
        set_(self, "out", _checked_place(self.out, "-o/--out"))
        fmt = format_named(
            self.format, lambda known: OptionError(f"unknown format {self.format!r}; choose one of {known}")
        )
        if isinstance(self.preprocess, dict):
            set_(self, "preprocess", PreprocessSpec(**self.preprocess))
        if not isinstance(self.preprocess, PreprocessSpec):
            raise OptionError(
                f"preprocess={self.preprocess!r}: give a PreprocessSpec (readers.formats.packed_sample)"
            )
        set_(self, "options", _format_options(fmt, self.options))
        if self.engine not in ENGINES:
            raise OptionError(f"--engine {self.engine}: use one of {', '.join(ENGINES)}")
        if self.ray_address is not None and self.engine != "ray":
            raise OptionError(f"--ray-address {self.ray_address} joins a Ray cluster: add --engine ray")
        workers = (os.cpu_count() or 1) if self.workers is None else self.workers
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise OptionError(f"--workers {self.workers!r}: give 1 or more processes (or leave it out)")
        set_(self, "workers", workers)
        if self.on_error not in ON_ERRORS:
            raise OptionError(f"--on-error {self.on_error}: use 'skip' or 'fail'")
        if self.order not in PACK_ORDERS:
            raise OptionError(f"--order {self.order}: use one of {', '.join(PACK_ORDERS)}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise OptionError(f"--seed {self.seed!r}: give a whole number")
        if self.force and self.resume:
            raise OptionError(
                f"{self.out}: --force (start over) and --resume (finish the interrupted pack) contradict "
                "each other; pass one of them"
            )
        if self.storage_options is not None and not isinstance(self.storage_options, dict):
            raise OptionError("--storage-options: give a dict (a JSON object on the command line)")
        dedup_record(self.dedup, self.near_distance)  # raises for a bad combination
        if is_url(self.out) and fmt.remote_finish is None:
            can = ", ".join(name for name, f in registered().items() if f.remote_finish is not None)
            raise OptionError(
                f"{self.out}: --to {self.format} cannot be written to a URL yet (it can: {can}); "
                "pack to a local folder and upload it"
            )

    @property
    def order_record(self) -> dict[str, Any]:
        """What the manifest records about the order (packer/output/pack_order.py)."""
        return order_record(self.order, self.seed)

    @property
    def dedup_record(self) -> dict[str, Any] | None:
        """What the manifest records about --dedup (None: every copy kept)."""
        return dedup_record(self.dedup, self.near_distance)


def _checked_place(place: Any, what: str) -> Any:
    """A source or output given as a path or URL: a non-empty one, without NUL bytes."""
    if isinstance(place, SourceScan):
        return place
    if not isinstance(place, str | os.PathLike):
        raise OptionError(f"{what}: {place!r} is not a path or URL")
    text = os.fspath(place)
    if not isinstance(text, str) or not text.strip() or "\0" in text:
        raise OptionError(f"{what}: {text!r} is not a usable path or URL")
    return place if isinstance(place, str) else Path(text)


def _format_options(fmt: Format, given: Any) -> dict[str, Any]:
    """``given`` (None: no options) with None values dropped, each one declared by ``fmt`` and
    parsed to its type."""
    if given is None:
        return {}
    if not isinstance(given, dict):
        raise OptionError(f"options={given!r}: give a dict of the format's pack options")
    parsed: dict[str, Any] = {}
    for name, value in given.items():
        if value is None:
            continue
        option = fmt.pack_option(name)
        if option is None:
            flag, users = option_flag(name), formats_taking(name)
            if users:
                users_text = " or ".join(users)
                raise OptionError(
                    f"{flag} does not apply to --to {fmt.name}; it is for --to {users_text}: drop {flag}"
                )
            takes = ", ".join(o.name for o in fmt.pack_options)
            raise OptionError(f"{name!r} is not a pack option of --to {fmt.name} (it takes: {takes})")
        parsed[name] = option.parse(value)
    return parsed
