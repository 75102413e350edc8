"""``PackSpec``: one validated, keyword-only spec per pack, built by every ``pack`` command and
by ``pack_folder``; every mistake is refused, named, before the output exists. The format flags
come from the formats' typed pack options, and a source defined in a test (tests/support/pairsource.py)
is one module plus one registry call, packed by the CLI and the Python API."""

from __future__ import annotations

import dataclasses
import re
import shutil

import pytest
from click.testing import CliRunner

from packer.cli import main
from packer.engine.pack_run import pack, pack_folder
from packer.scan.source_registry import register_source, registered_sources, unregister_source
from packer.spec import PackSpec
from readers import open_dataset, read_manifest
from readers.errors import CallError, ImgpackError, OptionError
from readers.formats import register_format, unregister_format
from readers.formats.format import SHARDING_OPTIONS
from readers.formats.pack_option import PackOption
from readers.formats.packed_sample import PreprocessSpec
from readers.formats.registry import format_names
from readers.formats.writer_base import FormatWriter
from tests.conftest import SAMPLE_DATA, cli_env
from tests.support import npyformat, pairsource

SMALL = ["--resize", "16", "--workers", "1", "-q"]


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture
def pairs_source():
    register_source(pairsource.SOURCE)
    yield pairsource.SOURCE
    unregister_source(pairsource.SOURCE.name)


@pytest.fixture
def pairs(tmp_path):
    """A pairs file naming four of sample_data's images, two classes."""
    images = sorted(p.relative_to(SAMPLE_DATA) for p in SAMPLE_DATA.rglob("*.jpg"))[:4]
    listing = tmp_path / "list" / "pairs.tsv"
    listing.parent.mkdir()
    listing.write_text("".join(f"{p}\t{'ab'[i % 2]}\n" for i, p in enumerate(images)), encoding="utf-8")
    return listing


ROOT = ["--root", SAMPLE_DATA]


# -- the spec itself -----------------------------------------------------------------------------
def test_the_spec_is_frozen_keyword_only_and_typed():
    spec = PackSpec(source=SAMPLE_DATA, out="o", format="tar", options={"shard_size": "1MB", "shards": None})
    assert spec.options == {"shard_size": 1_000_000}  # parsed, None dropped
    assert spec.workers >= 1 and spec.order_record["kind"] == "shuffled"
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.workers = 2  # type: ignore[misc]
    with pytest.raises(TypeError):
        PackSpec(SAMPLE_DATA, "o")  # type: ignore[misc]
    again = dataclasses.replace(spec, options={"shards": "3"})  # replace checks again
    assert again.options == {"shards": 3}
    assert dataclasses.replace(spec, options=None).options == {}  # None: the format's defaults
    with pytest.raises(OptionError, match="--shards 0"):
        dataclasses.replace(spec, options={"shards": 0})


# (what is wrong, PackSpec keywords besides source and out, the message that names it)
API_MISTAKES = [
    ("an unknown format", {"format": "nope"}, "unknown format 'nope'; choose one of"),
    ("an unknown engine", {"engine": "spark"}, "--engine spark: use one of local, ray"),
    ("no workers", {"workers": 0}, "--workers 0: give 1 or more"),
    ("an option no format takes", {"options": {"level": 3}}, "'level' is not a pack option of --to lmdb"),
    (
        "another format's option",
        {"options": {"shard_size": "1MB"}},
        "--shard-size does not apply to --to lmdb",
    ),
    ("a size that is none", {"format": "tar", "options": {"shard_size": "lots"}}, "is not a size"),
    ("an unknown compression", {"format": "hdf5", "options": {"compression": "bz2"}}, "--compression bz2"),
    ("a part count of 0", {"options": {"samples_per_shard": 0}}, "--samples-per-shard 0"),
    ("an unknown on_error", {"on_error": "ignore"}, "--on-error ignore"),
    ("an unknown order", {"order": "random"}, "--order random"),
    ("a seed that is text", {"seed": "1"}, "--seed '1'"),
    ("force and resume", {"force": True, "resume": True}, "contradict each other"),
    ("a near distance alone", {"near_distance": 3}, "--near-distance needs --dedup near"),
    ("an unknown dedup", {"dedup": "fuzzy"}, "--dedup fuzzy"),
    ("a ray address, local engine", {"ray_address": "host:1"}, "add --engine ray"),
    ("storage options as text", {"storage_options": "{}"}, "--storage-options: give a dict"),
    ("a bad ray address", {"engine": "ray", "ray_address": "bogus"}, "not a host:port address"),
    (
        "raw hdf5 of varying sizes",
        {"format": "hdf5", "preprocess": PreprocessSpec(encode="raw")},
        "same size",
    ),
    ("a tar shard too small", {"format": "tar", "options": {"shard_size": 100}}, "too small for a tar shard"),
]


@pytest.mark.parametrize("what,keywords,message", API_MISTAKES, ids=[m[0] for m in API_MISTAKES])
def test_each_mistake_is_refused_before_the_output_exists(tmp_path, what, keywords, message):
    out = tmp_path / "out"
    with pytest.raises(ImgpackError, match=re.escape(message)) as caught:
        pack(PackSpec(source=SAMPLE_DATA, out=out, **keywords))
    assert not out.exists(), what
    fmt = keywords.pop("format", "lmdb")
    spec = keywords.pop("preprocess", None)
    with pytest.raises(type(caught.value), match=re.escape(message)):
        pack_folder(SAMPLE_DATA, out, fmt, spec, **keywords)  # the Python API builds the same spec
    assert not out.exists(), what


def test_pack_folder_names_a_keyword_it_does_not_take(tmp_path):
    with pytest.raises(CallError, match="does not take shard_size"):
        pack_folder(SAMPLE_DATA, tmp_path / "out", "tar", shard_size="1MB")  # belongs in options=
    with pytest.raises(OptionError, match="-o/--out"):
        PackSpec(source=SAMPLE_DATA, out="")


# (command line after the source, the message); every one a one-line error, no output made
CLI_MISTAKES = [
    (["--to", "lmdb", "--shard-size", "1MB"], "--shard-size does not apply to --to lmdb; it is for --to"),
    (["--to", "tar", "--shard-size", "lots"], "'lots' is not a size"),
    (["--to", "hdf5", "--compression", "bz2"], "Invalid value for '--compression'"),
    (["--to", "lmdb", "--shards", "0"], "Invalid value for '--shards'"),
    (["--to", "lmdb", "--force", "--resume"], "contradict each other"),
    (["--to", "lmdb", "--near-distance", "3"], "--near-distance needs --dedup near"),
    (["--to", "lmdb", "--ray-address", "host:1"], "add --engine ray"),
    (["--to", "lmdb", "--engine", "ray", "--ray-address", "bogus"], "not a host:port address"),
    (["--to", "hdf5", "--encode", "raw"], "same size"),
    (["-q"], "Missing option '--to'"),
]


@pytest.mark.parametrize("command", ["imagefolder", "imagelist", "pairs"])
@pytest.mark.parametrize("args,message", CLI_MISTAKES, ids=[m[1][:30] for m in CLI_MISTAKES])
def test_every_command_refuses_each_mistake_before_the_output_exists(
    pairs_source, pairs, tmp_path, command, args, message
):
    first = {
        "imagefolder": [SAMPLE_DATA],
        "imagelist": [pairs, *ROOT, "--no-header"],
        "pairs": [pairs, *ROOT],
    }
    first = first[command]
    out = tmp_path / "out"
    result = invoke(command, *first, "-o", out, *args)
    assert result.exit_code in (1, 2), result.output
    assert message in result.output and "Traceback" not in result.output
    assert not out.exists()


def test_append_refuses_a_mistake_before_it_stages_anything(tmp_path):
    ds = tmp_path / "ds"
    assert invoke("imagefolder", SAMPLE_DATA, "--to", "lmdb", "-o", ds, *SMALL).exit_code == 0
    before = {p: p.read_bytes() for p in ds.rglob("*") if p.is_file()}
    for args, message in (
        (["--shard-size", "1MB"], "--shard-size does not apply to --to lmdb"),
        (["--near-distance", "3"], "--near-distance needs --dedup near"),
        (["--ray-address", "host:1"], "add --engine ray"),
    ):
        result = invoke("imagefolder", SAMPLE_DATA, "-o", ds, "--append", *args)
        assert result.exit_code == 1 and message in result.output, result.output
        assert not (ds / ".imgpack-append").exists()
    assert {p: p.read_bytes() for p in ds.rglob("*") if p.is_file()} == before


# -- the format flags are the formats' --------------------------------------------------------------
class LevelWriter(npyformat.NpyWriter):
    """The test format's writer, recording its own pack option in the manifest."""

    name = "npylevel"

    def finish(self, results, classes):
        shards, extra = FormatWriter.finish(self, results, classes)
        return shards, {**extra, "level": self.options.get("level")}


LEVEL = PackOption("level", "count", "How hard the test format tries.")
LEVEL_FORMAT = dataclasses.replace(
    npyformat.FORMAT, name="npylevel", writer=LevelWriter, pack_options=(*SHARDING_OPTIONS, LEVEL)
)


@pytest.fixture
def level_format():
    register_format(LEVEL_FORMAT)
    yield LEVEL_FORMAT
    unregister_format(LEVEL_FORMAT.name)


def test_a_formats_own_pack_option_is_a_flag_with_its_help(level_format, tmp_path):
    help_text = " ".join(invoke("imagefolder", "--help").output.split())
    assert "--level INTEGER RANGE How hard the test format tries (npylevel only)." in help_text
    assert (
        "--shard-size TEXT Roll over to a new shard at this size, e.g. 512MB (tar, tfrecord only)."
        in help_text
    )
    out = tmp_path / "out"
    done = invoke("imagefolder", SAMPLE_DATA, "--to", "npylevel", "-o", out, "--level", "3", *SMALL)
    assert done.exit_code == 0, done.output
    assert read_manifest(out).extra["level"] == 3  # typed, as the format declared it
    refused = invoke("imagefolder", SAMPLE_DATA, "--to", "lmdb", "-o", tmp_path / "o2", "--level", "3")
    assert (
        refused.exit_code == 1
        and "--level does not apply to --to lmdb; it is for --to npylevel" in refused.output
    )
    assert not (tmp_path / "o2").exists() and "npylevel" in format_names()


# -- a source is one module and one registration ------------------------------------------------
def test_a_source_defined_in_a_test_packs_from_the_cli_and_the_api(pairs_source, pairs, tmp_path):
    assert "pairs" in registered_sources() and "pairs" in invoke("--help").output
    cli_out, api_out = tmp_path / "cli", tmp_path / "api"
    done = invoke("pairs", pairs, *ROOT, "--to", "tar", "-o", cli_out, "--order", "source", *SMALL)
    assert done.exit_code == 0, done.output
    with pairsource.scan(str(pairs), str(SAMPLE_DATA)) as scan:
        pack_folder(scan, api_out, "tar", PreprocessSpec(resize=16), workers=1, order="source")
    cli, api = open_dataset(cli_out, decode="bytes"), open_dataset(api_out, decode="bytes")
    assert len(cli) == len(api) == 4 and cli.classes == api.classes == ["a", "b"]
    assert [cli[i] for i in range(4)] == [api[i] for i in range(4)]
    assert [label for _, label in (cli[i] for i in range(4))] == [0, 1, 0, 1]
    appended = invoke("pairs", pairs, *ROOT, "-o", cli_out, "--append", "-q")  # --append works for it too
    assert appended.exit_code == 0, appended.output
    assert read_manifest(cli_out).num_samples == 8


def test_a_source_plugin_joins_every_pack_run_through_the_environment(pairs, tmp_path):
    import subprocess
    import sys

    out = tmp_path / "out"
    args = [sys.executable, "-m", "packer.cli", "pairs", pairs, *ROOT, "--to", "lmdb", "-o", out]

    def run(plugin: str) -> subprocess.CompletedProcess:
        env = {**cli_env(), "IMGPACK_SOURCES": plugin}
        return subprocess.run([*map(str, args), *SMALL], capture_output=True, text=True, env=env, timeout=300)

    proc = run(pairsource.PLUGIN)
    assert proc.returncode == 0, proc.stderr
    assert read_manifest(out).num_samples == 4
    shutil.rmtree(out)
    bad = run("tests.nosuchmodule:SOURCE")
    assert bad.returncode == 1 and "IMGPACK_SOURCES=tests.nosuchmodule:SOURCE: cannot load" in bad.stderr
    assert "Traceback" not in bad.stderr and not out.exists()
