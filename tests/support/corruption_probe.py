"""Reads datasets named on stdin, one per line, and answers each with one JSON line (a helper
process for tests/readers/store/test_corruption_property.py, not a test).

For each dataset: the problems ``pack verify`` reports, and what a ``verify=True`` reader
returns (every record's label, shape and bytes digested) or the ImgpackError it raises. Any
other exception is reported as ``unexpected``; a crash (SIGBUS, SIGSEGV) ends the process,
which the test sees.
"""

from __future__ import annotations

import hashlib
import json
import sys
import traceback


def probe(root: str) -> dict:
    from packer.info.verify import verify_dataset
    from readers.errors import ImgpackError
    from readers.formats import open_reader

    answer: dict = {}
    try:
        answer["verify"] = verify_dataset(root).problems
    except ImgpackError as exc:
        answer["verify"] = [f"raised {type(exc).__name__}: {exc}"]
    try:
        reader = open_reader(root, verify=True)
        records = reader.read_block(0, len(reader))
        digest = hashlib.sha256()
        for record in records:
            digest.update(bytes(record.data))
        answer["read"] = {
            "classes": reader.manifest.classes,
            "samples": [[r.label, r.height, r.width, r.channels, r.encoding] for r in records],
            "digest": digest.hexdigest(),
        }
        reader.close()
    except ImgpackError as exc:
        answer["read"] = {"error": f"{type(exc).__name__}: {exc}"}
    return answer


def main() -> None:
    for line in sys.stdin:
        root = line.strip()
        try:
            answer = probe(root)
        except Exception:  # reported: the test fails on anything but ImgpackError
            answer = {"unexpected": traceback.format_exc(limit=6)}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
