"""TFRecord detection features as the TF Object Detection API reads them: ``image/object/class/label``
is the class index + 1 (its label maps number classes from 1, 0 being the background) and
``image/object/class/text`` names each box's class, while imgpack's own reads keep 0-based
``categories``."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from packer.cli import main
from readers import open_dataset
from readers.formats.tfrecord._example import decode_example
from tests.support.cocodata import coco_pack_args, make_coco


@pytest.mark.parametrize("more", [[], ["--resize", "60", "--crop", "48"]])
def test_class_label_is_one_based_with_class_text_beside(tmp_path, more):
    from tfrecord.reader import tfrecord_iterator

    coco = make_coco(tmp_path / "coco", count=30, empty=2, seed=1)
    dest = tmp_path / "tfr"
    args = coco_pack_args(coco, "tfrecord", dest, "--order", "source", "--workers", "1", "-q", *more)
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    ours = open_dataset(dest, fields=["categories"])
    examples = [
        decode_example(bytes(r)) for p in sorted(dest.glob("*.tfrecord")) for r in tfrecord_iterator(str(p))
    ]
    assert len(examples) == len(ours) >= 25  # --crop 48 skips the images smaller than that
    boxes = 0
    for index, example in enumerate(examples):
        categories = ours[index][1]["categories"].tolist()
        assert list(example.get("image/object/class/label", [])) == [c + 1 for c in categories]
        texts = [bytes(t).decode() for t in example.get("image/object/class/text", [])]
        assert texts == [ours.classes[c] for c in categories]
        boxes += len(categories)
    assert boxes >= 30
