"""A format kept outside imgpack (tests/support/npyformat.py) is one module plus one registry line, and
keeps the whole format contract (tests/support/format_contract/) unchanged, guarantees included."""

from __future__ import annotations

import dataclasses

import pytest

from packer.engine.pack_run import pack_folder
from readers.errors import ImgpackError
from readers.formats import format_names, register_format, unregister_format
from readers.formats.packed_sample import PreprocessSpec
from readers.formats.registry import PLUGINS_ENV
from tests.conftest import REPO, SAMPLE_DATA, run_cli
from tests.support import npyformat
from tests.support.format_contract import FormatContract
from tests.support.s3server import BUCKET

NPY = npyformat.FORMAT.name


@pytest.fixture
def registered_npy(request, monkeypatch) -> str:
    """The test-defined format, registered for the test's duration only: in this process, and
    through ``IMGPACK_FORMATS`` for ``pack`` subprocesses and spawned DataLoader workers."""
    register_format(npyformat.FORMAT, replace=True)
    monkeypatch.setenv(PLUGINS_ENV, npyformat.PLUGIN)
    request.addfinalizer(lambda: unregister_format(NPY))
    return NPY


class TestAFormatDefinedInATest(FormatContract):
    @pytest.fixture
    def fmt(self, registered_npy) -> str:
        return registered_npy


def test_a_new_format_is_one_module_plus_one_registry_line(tmp_path, monkeypatch):
    entry = npyformat.FORMAT
    assert {entry.reader_class().__module__, entry.writer_class().__module__} == {npyformat.__name__}
    shipped = [p for top in ("packer", "readers") for p in (REPO / top).rglob("*.py")]
    assert [p for p in shipped if "npyformat" in p.read_text() or f'"{NPY}"' in p.read_text()] == []
    monkeypatch.delenv(PLUGINS_ENV, raising=False)
    assert NPY not in format_names()
    args = ("imagefolder", SAMPLE_DATA, "--to", NPY, "-q", "--resize", "24", "-o")
    refused = run_cli(*args, tmp_path / "unknown")
    assert refused.returncode == 2 and f"'{NPY}' is not one of" in refused.stderr
    assert not (tmp_path / "unknown").exists()
    monkeypatch.setenv(PLUGINS_ENV, npyformat.PLUGIN)  # the one line: module:FORMAT
    proc = run_cli(*args, tmp_path / "ds")
    assert proc.returncode == 0, proc.stderr
    assert run_cli("verify", tmp_path / "ds").returncode == 0
    info = run_cli("info", tmp_path / "ds")
    assert info.returncode == 0 and NPY in info.stdout


@pytest.mark.remote
def test_a_format_declaring_no_url_output_is_refused_before_the_bucket_is_touched(s3, tmp_path):
    fs, options = s3
    register_format(dataclasses.replace(npyformat.FORMAT, remote_finish=None), replace=True)
    try:
        url = f"s3://{BUCKET}/no-url-{NPY}"
        with pytest.raises(ImgpackError, match=f"--to {NPY} cannot be written to a URL yet"):
            pack_folder(SAMPLE_DATA, url, NPY, PreprocessSpec(resize=16), workers=1, storage_options=options)
        assert not fs.exists(f"{BUCKET}/no-url-{NPY}")
    finally:
        unregister_format(NPY)
