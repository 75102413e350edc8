"""Every mistake a user can make at an entry point is an ``ImgpackError`` (the CLI prints those as
one line) that is still the builtin error a caller may catch: ``OptionError`` a ValueError,
``CallError`` a TypeError."""

from __future__ import annotations

import numpy as np
import pytest

from packer.engine.pack_run import pack_folder
from readers import make_loader, mix, open_dataset, open_iterable
from readers.dali import dali_loader
from readers.errors import CallError, ImgpackError, OptionError
from readers.order.quality import shuffle_quality
from readers.spec import ReadSpec

FIXED = {"resize": 40, "crop": 32}


@pytest.fixture(scope="module")
def path(packed):
    return packed("lmdb", **FIXED)


def mistakes(path, tmp_path):
    """(what the user did, the call, the error class it must raise)."""
    spec = ReadSpec.build("open_iterable", {"batch_size": 4})
    local_cache = {"cache_dir": str(tmp_path)}
    whole, no = open_iterable(path, batch_size=4), np.zeros(2)
    return [
        ("an unknown cache kind", lambda: open_dataset(path, cache="disk"), OptionError),
        ("an option lmdb does not take", lambda: open_iterable(path, reader_options={"no": 1}), OptionError),
        ("cache_dir, local dataset", lambda: open_iterable(path, reader_options=local_cache), OptionError),
        ("an unknown DALI device", lambda: dali_loader(path, batch_size=4, device="tpu"), OptionError),
        ("spec= and options together", lambda: open_iterable(path, spec=spec, batch_size=4), CallError),
        ("spec= and options together in mix", lambda: mix([path], spec=spec, batch_size=4), CallError),
        ("an unknown keyword", lambda: open_iterable(path, batch_sise=4), CallError),
        ("an old and a new name", lambda: open_iterable(path, batch_size=4, size=24, resize=24), CallError),
        ("make_loader over a plain dataset", lambda: make_loader(open_dataset(path)), CallError),
        ("batching whole batches", lambda: make_loader(whole, batch_size=4), OptionError),
        ("shared split_labels", lambda: mix([path], labels="shared").split_labels(no), OptionError),
        ("a quality of batch 0", lambda: shuffle_quality(np.zeros(8, np.int64), batch_size=0), OptionError),
        ("an unknown on_error", lambda: pack_folder(path, tmp_path / "o", "tar", on_error="x"), OptionError),
    ]


def test_each_user_mistake_is_an_imgpack_error_and_still_the_builtin_one(path, tmp_path):
    for what, call, kind in mistakes(path, tmp_path):
        with pytest.raises(ImgpackError) as caught:
            call()
        assert isinstance(caught.value, kind), f"{what}: {type(caught.value).__name__}: {caught.value}"
        builtin = ValueError if kind is OptionError else TypeError
        assert isinstance(caught.value, builtin), what


def test_open_dataset_takes_the_read_spec_options_keyword_only(path):
    with pytest.raises(OptionError, match="crop= applies to open_iterable, mix and dali_loader, not to"):
        ReadSpec.build("open_dataset", {"crop": 32})  # what open_dataset builds its options with
    with pytest.raises(TypeError):
        open_dataset(path, "tensor")  # decode, positionally
    with pytest.raises(OptionError, match="decode='png' is an unknown decode kind"):
        open_dataset(path, decode="png")  # the message every entry point gives
    ds = open_dataset(path)
    assert ds.spec.decode == "pil" and type(ds[0][0]).__name__ == "Image"  # torchvision's default
    assert ReadSpec.build("open_dataset", {"target": "torchvision"}).decode == "tensor"
