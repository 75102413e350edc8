"""``pack verify``: re-check every shard checksum and decode every record."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from packer.formats.base import file_sha256
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


def verify_dataset(path: str | os.PathLike, decode: bool = True, block: int = 256) -> VerifyReport:
    reader = open_reader(path, verify=True)
    manifest = reader.manifest
    report = VerifyReport(str(path), manifest.num_samples, len(manifest.shards))
    for shard in manifest.shards:
        data_file = Path(reader.checksum_path(shard))
        if not data_file.exists():
            report.problems.append(f"{data_file}: missing")
        elif file_sha256(data_file) != shard.sha256:
            report.problems.append(f"{data_file}: sha256 does not match the manifest (corrupt or modified)")
    if report.problems:
        return report
    for start in range(0, manifest.num_samples, block):
        stop = min(manifest.num_samples, start + block)
        try:
            records = reader.read_block(start, stop)
        except (ChecksumError, ImgpackError) as exc:
            report.problems.append(str(exc))
            continue
        for index, record in enumerate(records, start):
            if not 0 <= record.label < len(manifest.classes):
                report.problems.append(f"{path}: sample {index} has label {record.label} outside the classes")
            if decode:
                try:
                    decode_record(record, "numpy")
                except Exception as exc:  # noqa: BLE001 - report, keep checking the rest
                    report.problems.append(f"{path}: sample {index} does not decode ({exc})")
    return report
