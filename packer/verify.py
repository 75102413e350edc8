"""``pack verify``: re-check every shard checksum and decode every record."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from readers.decode import decode_record
from readers.errors import ChecksumError, ImgpackError
from readers.formats import open_reader


@dataclass
class VerifyReport:
    path: str
    samples: int
    shards: int
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


MAX_PROBLEMS = 100  # enough to see the pattern; a corrupt count must not make the report endless


def verify_dataset(path: str | os.PathLike, decode: bool = True, block: int = 256) -> VerifyReport:
    try:
        reader = open_reader(path, verify=True)  # checks the manifest schema and every part's counts
    except ImgpackError as exc:
        return VerifyReport(str(path), 0, 0, [str(exc)])
    manifest = reader.manifest
    report = VerifyReport(str(path), manifest.num_samples, len(manifest.shards))
    for shard in manifest.shards:
        try:
            data_file = reader.checksum_path(shard)
            if not Path(data_file).exists():
                report.problems.append(f"{data_file}: missing")
            else:  # recorded as checked, so reading the records below does not hash it again
                reader.check_sha256(data_file, shard.sha256, str(data_file))
        except ImgpackError as exc:
            report.problems.append(str(exc))
    if report.problems:
        return report
    for start in range(0, manifest.num_samples, block):
        stop = min(manifest.num_samples, start + block)
        try:
            records = reader.read_block(start, stop)
        except ChecksumError as exc:
            report.problems.append(str(exc))
            records = []
        except ImgpackError as exc:  # the structure is broken: reading on would repeat it
            report.problems.append(str(exc))
            break
        for index, record in enumerate(records, start):
            if decode:
                try:
                    decode_record(record, "numpy")
                except Exception as exc:  # noqa: BLE001 - report, keep checking the rest
                    report.problems.append(f"{reader.describe(index)} does not decode ({exc})")
        if len(report.problems) >= MAX_PROBLEMS:
            report.problems.append(f"stopped after {MAX_PROBLEMS} problems")
            break
    return report
