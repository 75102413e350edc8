"""The contract's pack side: the registry entry, ``--force``, ``--resume`` after a kill, verify and
damage, index files, object storage. Each capability a format lacks (``Format.indexer``,
``Format.remote_finish``) is checked as the clear refusal it declares, never skipped."""

from __future__ import annotations

import inspect
import signal
import time
import typing
from pathlib import Path

import pytest

from packer.engine.pack_run import pack_folder
from packer.info.reindex import reindex
from packer.info.verify import verify_dataset
from packer.output.output_dir import foreign_entries
from packer.sources.source import scan_folder
from readers import open_dataset
from readers.errors import ChecksumError, ImgpackError, ManifestError
from readers.formats import format_named, format_names, open_reader
from readers.formats.base import FormatReader
from readers.formats.format import COMMON_READER_OPTIONS, RemoteFinish
from readers.formats.packed_sample import PreprocessSpec
from readers.formats.registry import open_writer
from readers.store.manifest import read_manifest
from tests.conftest import SAMPLE_DATA, run_cli
from tests.support.damage import edit_manifest, flip_byte
from tests.support.format_contract.packs import SAMPLES, SPLIT, copy_of, spec_for, stored
from tests.support.packrun import (
    SLOW_PACK,
    copy_source,
    dataset_arrays,
    kill_group,
    leftovers,
    run_pack,
    start_pack,
    wait_started,
)
from tests.support.s3server import BUCKET


class PackingContract:
    # -- the registry entry ---------------------------------------------------------------------
    def test_registry_entry_describes_the_format(self, fmt, small, tmp_path):
        entry = format_named(fmt)
        writer = open_writer(fmt, tmp_path / "out", PreprocessSpec(**spec_for(fmt)), {})
        assert writer.format is entry and writer.name == fmt  # handed its Format, never looked up
        assert not {"name"} & (vars(entry.writer_class()).keys() | vars(entry.reader_class()).keys())
        reader_init = inspect.signature(entry.reader_class().__init__).parameters
        common = inspect.signature(FormatReader.__init__).parameters
        own = {n for n, p in reader_init.items() if n not in common and p.kind is not p.VAR_KEYWORD}
        assert set(entry.reader_options) == own  # declared options are exactly the reader's own
        assert set(COMMON_READER_OPTIONS) < set(common)
        assert entry.remote_finish in (*typing.get_args(RemoteFinish), None)
        assert read_manifest(small).format == fmt
        assert foreign_entries(small) == []  # every file a pack writes is one the format declares

    # -- pack, --force --------------------------------------------------------------------------
    def test_force_replaces_our_dataset_but_not_a_stranger_in_it(self, fmt, tmp_path):
        out = tmp_path / "ds"
        pack_folder(SAMPLE_DATA, out, fmt, PreprocessSpec(resize=32), workers=1)
        proc = run_cli("imagefolder", SAMPLE_DATA, "--to", fmt, "-o", out, "--resize", "24", "--force", "-q")
        assert proc.returncode == 0, proc.stderr  # everything in it is ours
        assert open_dataset(out).manifest.preprocess["resize"] == 24
        (out / "notes.txt").write_text("mine")
        with pytest.raises(ImgpackError, match=r"not an imgpack output \(it holds notes\.txt\)"):
            pack_folder(SAMPLE_DATA, out, fmt, PreprocessSpec(resize=32), workers=1, force=True)
        assert (out / "notes.txt").read_text() == "mine"
        assert open_dataset(out).manifest.preprocess["resize"] == 24  # untouched

    @pytest.mark.slow
    def test_kill_mid_pack_leaves_an_output_that_resume_and_force_finish(self, fmt, tmp_path):
        """kill -9 in the middle of the first part, then --resume; again, then --force."""
        # A format that stores raw pixels packs several times faster than PNG: give it more to do,
        # so the kill lands mid-pack.
        copies = 2 if "png" in format_named(fmt).encodings else 6
        src = copy_source(tmp_path / "src", copies=copies)
        args = ("--to", fmt, "--workers", "1", "-q", *SLOW_PACK)
        finished = []
        for finish in ("--resume", "--force"):
            out = tmp_path / f"ds{finish}"
            proc = start_pack(src, "-o", out, *args)
            wait_started(out, proc)
            time.sleep(0.5)
            kill_group(proc.pid)
            assert proc.wait() == -signal.SIGKILL
            with pytest.raises(ManifestError, match="--resume"):
                open_dataset(out)
            rc, text = run_pack(src, "-o", out, *args, finish)
            assert rc == 0, f"{finish}: {text}"
            assert verify_dataset(out).ok
            assert leftovers(out) == [] and not (out / ".imgpack-progress.json").exists()
            finished.append(dataset_arrays(out))
        assert finished[0] == finished[1] and len(finished[0]) == len(scan_folder(src).items)

    # -- verify and damage ----------------------------------------------------------------------
    def test_verify_passes_and_a_flipped_byte_in_any_part_is_caught(self, fmt, small, tmp_path):
        assert verify_dataset(small).ok
        assert run_cli("verify", small).returncode == 0
        root = copy_of(small, tmp_path)
        reader = open_reader(root)
        damaged = Path(reader.checksum_path(reader.manifest.shards[1]))
        flip_byte(damaged, damaged.stat().st_size // 2)
        report = verify_dataset(root)
        assert not report.ok and damaged.name in "\n".join(report.problems)
        with pytest.raises(ChecksumError, match=damaged.name):
            open_reader(root, verify=True).read_block(0, len(reader))

    def test_count_against_what_the_part_holds(self, fmt, small, tmp_path):
        root = copy_of(small, tmp_path)
        edit_manifest(root, lambda m: (m["shards"][2].update(count=2), m.update(num_samples=SAMPLES - 2)))
        with pytest.raises(ManifestError, match="manifest (says )?2"):  # tfrecord: "the manifest 2"
            open_reader(root).read_block(0, SAMPLES - 2)
        assert not verify_dataset(root).ok

    def test_labels_outside_the_classes_are_refused(self, fmt, small, tmp_path):
        root = copy_of(small, tmp_path)
        edit_manifest(root, lambda m: m.update(classes=m["classes"][:2]))
        with pytest.raises(ManifestError, match="outside the 2 classes"):
            open_reader(root).read_block(0, SAMPLES)
        assert "outside the 2 classes" in "\n".join(verify_dataset(root).problems)

    def test_edited_manifest_is_caught_by_verify(self, fmt, small, tmp_path):
        root = copy_of(small, tmp_path)
        edit_manifest(root, lambda m: m["classes"].__setitem__(0, "renamed"), reseal_manifest=False)
        assert open_dataset(root).classes[0] == "renamed"  # a deliberate edit reads without verify
        with pytest.raises(ChecksumError, match="manifest.json: does not match its manifest_sha256"):
            open_reader(root, verify=True)
        assert "manifest_sha256" in "\n".join(verify_dataset(root).problems)

    def test_reindex_rebuilds_the_shard_indexes_or_says_the_format_keeps_none(self, fmt, small, tmp_path):
        root = copy_of(small, tmp_path)
        if format_named(fmt).indexer is None:
            indexed = " and ".join(f for f in format_names() if format_named(f).indexer)
            expected = f"is a {fmt} dataset; only {indexed} datasets have .idx files"
            with pytest.raises(ImgpackError, match=expected):
                reindex(root)
            return
        indexes = sorted(root.glob("*.idx"))
        original = [p.read_bytes() for p in indexes]
        for path in indexes:
            path.unlink()
        assert sorted(reindex(root)) == [str(p) for p in indexes]
        assert [p.read_bytes() for p in indexes] == original and verify_dataset(root).ok

    # -- object storage -------------------------------------------------------------------------
    @pytest.mark.remote
    def test_pack_into_a_bucket_reads_back_equal_and_force_replaces_it(self, fmt, small, s3, tmp_path):
        fs, options = s3
        url = f"s3://{BUCKET}/contract-{fmt}"
        spec = PreprocessSpec(**spec_for(fmt))
        if format_named(fmt).remote_finish is None:
            with pytest.raises(ImgpackError, match=f"--to {fmt} cannot be written to a URL"):
                pack_folder(SAMPLE_DATA, url, fmt, spec, workers=1, options=SPLIT, storage_options=options)
            assert not fs.exists(f"{BUCKET}/contract-{fmt}")  # refused before anything was written
            return
        pack_folder(SAMPLE_DATA, url, fmt, spec, workers=1, options=SPLIT, storage_options=options)
        assert stored(url, storage_options=options, cache_dir=tmp_path / "cache") == stored(small)
        assert verify_dataset(url, storage_options=options).ok
        fs.pipe_file(f"{BUCKET}/contract-{fmt}/notes.txt", b"mine")
        with pytest.raises(ImgpackError, match=r"not an imgpack output \(it holds notes\.txt\)"):
            pack_folder(SAMPLE_DATA, url, fmt, spec, workers=1, force=True, storage_options=options)
        fs.rm_file(f"{BUCKET}/contract-{fmt}/notes.txt")
        resized = PreprocessSpec(**{**spec_for(fmt), "resize": 36})
        pack_folder(SAMPLE_DATA, url, fmt, resized, workers=1, force=True, storage_options=options)
        assert open_dataset(url, storage_options=options).manifest.preprocess["resize"] == 36
