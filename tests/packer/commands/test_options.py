"""Options that do not apply are errors, one name per knob, and the CLI's error output (#14)."""

from __future__ import annotations

import subprocess
import sys
import warnings

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from packer.cli import BUG_NOTICE, main
from readers import mix, open_iterable
from readers.dali import dali_loader
from readers.errors import CallError, OptionError
from readers.formats import format_names, registered
from readers.formats.format import SHARDING_OPTIONS
from readers.formats.registry import formats_taking
from tests.conftest import SAMPLE_DATA, cli_env, run_cli

FIXED = {"resize": 40, "crop": 32, "encode": "raw"}


# -- reading: batch mode refuses per-sample options ---------------------------------------------
@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"decode": "numpy"}, "decode='numpy' applies to single samples"),
        ({"decode": "bytes"}, "decode='bytes' applies to single samples"),
        ({"target_transform": int}, "target_transform= is applied to each label"),
        ({"transform": lambda x: x}, "pass batch_transform="),
    ],
)
def test_batch_mode_refuses_per_sample_options(packed, kwargs, message):
    path = packed("lmdb", **FIXED)
    with pytest.raises(ValueError, match=message):
        open_iterable(path, batch_size=4, **kwargs)
    if "target_transform" not in kwargs:  # mix has no target_transform
        with pytest.raises(ValueError, match=message):
            mix([path, path], batch_size=4, **kwargs)
    # Without batch_size each of them is honoured.
    image, label = next(iter(open_iterable(path, shuffle=False, **kwargs)))
    assert image is not None and label is not None


def test_mix_takes_batch_transform_like_open_iterable(packed):
    path = packed("lmdb", **FIXED)
    m = mix([path, path], seed=1, batch_size=4, batch_transform=lambda x: x.float() / 255)
    images, labels = next(iter(m))
    assert images.dtype == torch.float32 and images.shape == (4, 3, 32, 32) and float(images.max()) <= 1.0
    with pytest.raises(ValueError, match="also pass batch_size="):
        mix([path], batch_transform=lambda x: x)


def test_old_size_name_warns_and_reads_the_same(packed):
    path = packed("lmdb", resize=40, encode="raw")  # shorter side 40, sizes vary: resize makes one size
    with pytest.warns(DeprecationWarning, match=r"open_iterable\(size=...\) is now resize="):
        old = open_iterable(path, shuffle=False, batch_size=4, size=(24, 24))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = open_iterable(path, shuffle=False, batch_size=4, resize=(24, 24))
    (a, _), (b, _) = next(iter(old)), next(iter(new))
    assert a.shape == (4, 3, 24, 24) and torch.equal(a, b)
    with pytest.raises(CallError, match="pass resize= only"):
        open_iterable(path, batch_size=4, size=24, resize=24)


def test_dali_loader_opens_the_dataset_like_open_iterable(packed, tmp_path):
    path = packed("lmdb", **FIXED)
    with pytest.raises(OptionError, match="does not take option"):
        dali_loader(path, batch_size=4, device="dataloader", reader_options={"check_crc": True})  # tfrecord's
    with pytest.raises(OptionError, match="behind a URL"):
        dali_loader(path, batch_size=4, device="dataloader", reader_options={"cache_dir": str(tmp_path)})
    options = dict(device="dataloader", verify=True, layout="HWC", num_workers=0, shuffle=False)
    loader = dali_loader(path, batch_size=4, **options)
    assert loader.reader.verify
    images, labels = next(iter(loader))
    expected = next(iter(open_iterable(path, shuffle=False, batch_size=4, layout="HWC", verify=True)))
    assert np.array_equal(images.numpy(), expected[0].numpy()) and torch.equal(labels, expected[1])


# -- packing: a format's own flags, refused elsewhere -------------------------------------------
# Each format-specific pack option, given for every format that does not take it (from the registry).
FLAGS = {"compression": "gzip", "shard_size": "1MB"}
FOREIGN = [
    (fmt, option, formats_taking(option))
    for option in FLAGS
    for fmt in format_names()
    if fmt not in formats_taking(option)
]


def test_every_format_specific_pack_option_is_tried():
    declared = {option.name for fmt in registered().values() for option in fmt.pack_options}
    assert set(FLAGS) == declared - {option.name for option in SHARDING_OPTIONS}


@pytest.mark.parametrize("fmt,option,users", FOREIGN)
def test_format_flags_are_refused_for_other_formats(tmp_path, fmt, option, users):
    assert users  # the option is some format's
    out = tmp_path / "out"
    flag = "--" + option.replace("_", "-")
    args = ["imagefolder", str(SAMPLE_DATA), "--to", fmt, "-o", str(out), flag, FLAGS[option]]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1, result.output
    expected = f"{flag} does not apply to --to {fmt}; it is for --to {' or '.join(users)}: drop {flag}"
    assert expected in result.output
    assert not out.exists()


# -- the CLI: one line for mistakes, tracebacks for bugs and with --debug -------------------------
def test_user_error_is_one_line_and_debug_shows_the_traceback(tmp_path):
    plain = run_cli("info", tmp_path / "missing")
    assert plain.returncode == 1 and "Traceback" not in plain.stderr
    assert len(plain.stderr.strip().splitlines()) == 1 and "no such dataset" in plain.stderr
    debug = run_cli("--debug", "info", tmp_path / "missing")
    assert debug.returncode == 1
    assert "Traceback" in debug.stderr and "readers.errors.ManifestError" in debug.stderr


BUGGY_PACK = """
import sys
import packer.engine.pack_run

def pack(*args, **kwargs):
    raise ValueError("an internal bug, not a user mistake")

packer.engine.pack_run.pack = pack
from packer.cli import main
main(sys.argv[1:], prog_name="pack")
"""


def test_unexpected_errors_keep_their_traceback(tmp_path):
    args = ["imagefolder", str(SAMPLE_DATA), "--to", "lmdb", "-o", str(tmp_path / "out")]
    proc = subprocess.run(
        [sys.executable, "-c", BUGGY_PACK, *args], capture_output=True, text=True, env=cli_env(), timeout=120
    )
    assert proc.returncode == 1
    assert BUG_NOTICE in proc.stderr
    assert "Traceback" in proc.stderr and "ValueError: an internal bug" in proc.stderr
    assert 'line 6, in pack' in proc.stderr  # the frame where it happened
