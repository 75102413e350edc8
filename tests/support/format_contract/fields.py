"""The contract's per-sample fields: a format that declares ``Format.stores_fields`` round-trips
every field type (locally and in a bucket); one that does not refuses the pack, naming the fix."""

from __future__ import annotations

import numpy as np
import pytest

from packer.info.verify import verify_dataset
from readers import open_dataset, open_iterable
from readers.errors import ImgpackError
from readers.formats import format_named
from readers.formats.packed_sample import PreprocessSpec
from readers.store.manifest import read_manifest
from tests.conftest import SAMPLE_DATA
from tests.support.format_contract.packs import spec_for
from tests.support.s3server import BUCKET

FIELD_SCHEMA = {
    "caption": "str", "score": "float", "boxes": "boxes", "categories": "box_ints", "meta": "json"
}  # fmt: skip
CLASSES = ["even", "odd"]


def field_rows() -> list:
    """sample_data's images as rows with fields; every third without a single class (label -1)."""
    from packer.scan.rows import Row

    files = sorted(p for p in SAMPLE_DATA.rglob("*.jpg"))[:12]
    rows = []
    for i, path in enumerate(files):
        boxes = [[1.5 * k, 2.0, 10.0 + k, 8.0] for k in range(i % 4)]
        fields = {"caption": f"café n°{i}", "score": i / 4, "boxes": boxes}
        fields["categories"] = list(range(i % 4))
        if i % 2:
            fields["meta"] = {"url": f"http://x/{i}", "tags": ["a", i]}
        rows.append(Row(str(path.relative_to(SAMPLE_DATA)), -1 if i % 3 == 0 else i % 2, fields, f"row {i}"))
    return rows


class FieldsContract:
    def test_fields_round_trip_in_every_format_that_stores_them_or_one_clear_refusal(self, fmt, tmp_path):
        from PIL import Image, ImageOps

        from packer.scan.rows import pack_rows
        from packer.transform.box_geometry import pack_geometry
        from readers.fields.boxes import transform_boxes

        rows, out = field_rows(), tmp_path / "fields"
        spec = PreprocessSpec(**spec_for(fmt))
        if not format_named(fmt).stores_fields:
            refusal = f"--to {fmt} does not store per-sample fields.*--no-fields"
            with pytest.raises(ImgpackError, match=refusal):
                pack_rows(rows, SAMPLE_DATA, CLASSES, out, fmt, FIELD_SCHEMA, spec=spec, workers=1)
            return
        pack_rows(rows, SAMPLE_DATA, CLASSES, out, fmt, FIELD_SCHEMA, spec=spec, workers=1,
                  options={"samples_per_shard": 5}, order="source")  # fmt: skip
        manifest = read_manifest(out)
        assert manifest.fields == FIELD_SCHEMA
        assert manifest.field_counts == {"caption": 12, "score": 12, "boxes": 12, "categories": 12, "meta": 6}
        assert verify_dataset(out).ok
        ds = open_dataset(out, fields=list(FIELD_SCHEMA), verify=True)
        assert len(ds) == len(rows)
        for i, row in enumerate(rows):  # samples keep the rows' order
            _, target = ds[i]
            assert target["label"] == row.label
            assert target["caption"] == row.fields["caption"] and target["score"] == row.fields["score"]
            # boxes are stored in the stored image's pixels: moved by the pack's --resize/--crop
            with Image.open(SAMPLE_DATA / row.path) as source:
                geometry = pack_geometry(ImageOps.exif_transpose(source).size, spec)
            expected, kept = transform_boxes(np.asarray(row.fields["boxes"], np.float32), geometry)
            assert target["boxes"].dtype == np.float32 and target["boxes"].shape == expected.shape
            np.testing.assert_allclose(target["boxes"], expected, atol=1e-4)
            np.testing.assert_array_equal(target["categories"], np.asarray(row.fields["categories"])[kept])
            assert target["meta"] == row.fields.get("meta")
        assert open_dataset(out)[4][1] == rows[4].label  # without fields=: the label, as always
        with pytest.raises(ImgpackError, match="no field 'nope'"):
            open_dataset(out, fields=["nope"])

    @pytest.mark.remote
    def test_fields_are_packed_into_a_bucket_and_read_back_by_url(self, fmt, s3, tmp_path):
        from packer.scan.rows import pack_rows

        fs, options = s3
        url = f"s3://{BUCKET}/fields-{fmt}"
        rows = field_rows()
        spec = PreprocessSpec(**spec_for(fmt))
        if not format_named(fmt).stores_fields or format_named(fmt).remote_finish is None:
            refusal = "does not store per-sample fields|cannot be written to a URL"
            with pytest.raises(ImgpackError, match=refusal):
                pack_rows(rows, SAMPLE_DATA, CLASSES, url, fmt, FIELD_SCHEMA, spec=spec,
                          storage_options=options)  # fmt: skip
            return
        pack_rows(rows, SAMPLE_DATA, CLASSES, url, fmt, FIELD_SCHEMA, spec=spec, workers=1,
                  storage_options=options)  # fmt: skip
        it = open_iterable(url, storage_options=options, cache_dir=tmp_path / "cache", shuffle=False,
                           fields=["caption", "boxes"])  # fmt: skip
        got = [(target["caption"], target["boxes"].shape[0]) for _, target in it]
        # The same rows packed locally (the default shuffled order, the same spec) are the reference.
        local = tmp_path / "local"
        pack_rows(rows, SAMPLE_DATA, CLASSES, local, fmt, FIELD_SCHEMA, spec=spec, workers=1)
        it = open_iterable(local, shuffle=False, fields=["caption", "boxes"])
        assert got == [(target["caption"], target["boxes"].shape[0]) for _, target in it]
        assert sorted(caption for caption, _ in got) == sorted(row.fields["caption"] for row in rows)
