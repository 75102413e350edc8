"""Property: a flipped byte or a truncation anywhere in a dataset's files is detected.

For each format, hypothesis picks a file (data, index or manifest), an offset and a change (XOR
a byte with a non-zero mask, or cut the file there). Every case must be *detected* (``pack
verify`` reports a problem and a ``verify=True`` reader raises an ImgpackError) or *harmless*
(both pass and the reader returns exactly the pristine labels, shapes and bytes). A crash, a
hang, any other exception or a silently different sample fails the test. Reads run in a
separate long-lived process (tests/support/corruption_probe.py), restarted after a crash, because a
corrupt memory-mapped file can kill a process with SIGBUS.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from readers.formats import format_names, open_reader
from tests.conftest import REPO, cli_env

EXAMPLES = 50  # per format; derandomized, so CI runs the same cases every time
CASE_TIMEOUT = 60  # seconds: longer means a hang


def targets(root: Path) -> list[str]:
    """The files a case may damage: the first and last part's checksummed file, the first other
    file (an index sidecar, a BMP image) where the format writes one, and the manifest."""
    reader = open_reader(root)
    shards = reader.manifest.shards
    checksummed = [reader.checksum_name(shard) for shard in shards]
    rest = sorted(
        rel
        for rel in (p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
        if rel not in checksummed and rel != "manifest.json"
    )
    return [checksummed[0], checksummed[-1], *rest[:1], "manifest.json"]


class Probe:
    """The reading process: one dataset path in, one JSON answer out."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "support" / "corruption_probe.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=cli_env(),
        )

    def check(self, root: Path) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        assert self.proc is not None and self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{root}\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], CASE_TIMEOUT)
        if not ready:
            self.stop()
            return {"hang": CASE_TIMEOUT}
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            self.proc = None
            return {"crash": code}
        return json.loads(line)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


@pytest.fixture(scope="module")
def probe():
    reader = Probe()
    yield reader
    reader.stop()


def corrupt(path: Path, op: str, where: float, mask: int) -> None:
    size = path.stat().st_size
    offset = min(size - 1, int(where * size))
    if op == "truncate":
        os.truncate(path, offset)
        return
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)[0]
        fh.seek(offset)
        fh.write(bytes([byte ^ mask]))


def judge(answer: dict, baseline: dict) -> str:
    if set(answer) & {"crash", "hang", "unexpected"}:
        return "failure"
    flagged = bool(answer["verify"])
    raised = "error" in answer["read"]
    # Flagged by verify and refused on read, or flagged while the read is untouched (a sidecar the
    # read does not use, e.g. the hash file): both are caught, nothing wrong is read.
    if flagged and (raised or answer["read"] == baseline["read"]):
        return "detected"
    if not flagged and not raised and answer["read"] == baseline["read"]:
        return "harmless"
    return "missed"


@pytest.mark.parametrize("fmt", format_names())
def test_every_corruption_is_detected_or_harmless(fmt, packed, probe, tmp_path_factory, capsys):
    pristine = packed(fmt, options={"samples_per_shard": 20}, resize=32, crop=32)
    baseline = probe.check(pristine)
    assert baseline.get("verify") == [] and "digest" in baseline.get("read", {}), baseline
    assert len(baseline["read"]["samples"]) == 44
    scratch = tmp_path_factory.mktemp(f"corrupt-{fmt}")
    tally: Counter[str] = Counter()
    kinds: Counter[str] = Counter()

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(
        target=st.sampled_from(targets(pristine)),
        op=st.sampled_from(["flip", "truncate"]),
        where=st.floats(0, 1, exclude_max=True),
        mask=st.integers(1, 255),
    )
    def case(target: str, op: str, where: float, mask: int) -> None:
        work = Path(tempfile.mkdtemp(dir=scratch))
        try:
            root = work / "ds"
            shutil.copytree(pristine, root)
            corrupt(root / target, op, where, mask)
            answer = probe.check(root)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        outcome = judge(answer, baseline)
        tally[outcome] += 1
        kinds[f"{target}:{op}:{outcome}"] += 1
        assert outcome in ("detected", "harmless"), (target, op, where, mask, answer)

    case()
    with capsys.disabled():
        print(f"\n{fmt}: {sum(tally.values())} corruption cases, {dict(tally)}")
        print(f"{fmt}: {dict(sorted(kinds.items()))}")
    assert tally["detected"] >= EXAMPLES // 2  # most changes to these files matter
