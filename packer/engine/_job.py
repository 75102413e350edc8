"""A pack as data: its validated ``PackSpec`` with the scanned source (``PackJob``) and the parts
an engine works through (``PartsRun``); packer/engine/pack_run.py and packer/engine/_ray_engine.py
take both."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from packer.output.output_dir import Output
from packer.sources.source import SourceScan
from packer.spec import PackSpec
from readers.formats.packed_sample import PreprocessSpec
from readers.formats.writer_base import FormatWriter, PartResult


@dataclass(frozen=True, kw_only=True)
class PackJob:
    pack: PackSpec  # what was asked, validated
    scan: SourceScan  # the source, scanned (and relabelled for an append)
    spec: PreprocessSpec  # as the format's writer pinned it (--to bmp is --encode bmp)
    started: float = 0.0  # time.perf_counter() when the pack began
    known: Any = None  # packer.dedup.deduper.Known: with --dedup, the samples of the dataset appended to

    @property
    def order(self) -> dict[str, Any]:
        return self.pack.order_record

    @property
    def dedup(self) -> dict[str, Any] | None:
        return self.pack.dedup_record


@dataclass
class PartsRun:
    """The parts of one pack as an engine works through them: ``finished`` records one (handed
    to the output, saved in the progress file) and advances the progress bar's owner."""

    writer: FormatWriter  # built once, writing into the work folder
    parts: list[tuple[int, Any]]  # (part, its source items)
    done: dict[int, PartResult]
    sink: Output
    progress: Any  # a tqdm bar
    save: Callable[[], None]
    firsts: dict[int, int] = field(default_factory=dict)  # each part's first dataset index (planned)
    starts: dict[int, int] = field(default_factory=dict)  # where each part starts in the pack order
    carry: dict[str, Any] = field(default_factory=dict)  # what an engine keeps across re-cuts

    def finished(self, part: int, result: PartResult) -> None:
        self.done[part] = self.sink.part_done(self.writer, result)
        self.save()
