"""Other readers of imgpack tar shards: the plain webdataset library and DALI's webdataset reader."""

from __future__ import annotations

import io

import numpy as np
import webdataset as wds
from PIL import Image

from readers.formats import open_reader
from readers.image.decode import decode_array


def shards(root):
    tars = sorted(str(p) for p in root.glob("shard-*.tar"))
    return tars, [t[: -len(".tar")] + ".idx" for t in tars]


def pil_rgb(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def test_webdataset_yields_the_same_images_and_labels(packed):
    root = packed("tar", options={"samples_per_shard": 10}, resize=64)
    reader = open_reader(root)
    tars, _ = shards(root)
    samples = list(wds.WebDataset(tars, shardshuffle=False))
    assert len(samples) == len(reader) == 44
    for i, sample in enumerate(samples):
        record = reader.read(i)
        assert sample["jpg"] == bytes(record.data)
        assert int(sample["cls"]) == record.label
    decoded = list(wds.WebDataset(tars, shardshuffle=False).decode("rgb8").to_tuple("jpg", "cls", "json"))
    for i, (image, label, meta) in enumerate(decoded):
        record = reader.read(i)
        assert label == record.label == meta["label"]
        assert image.shape == (record.height, record.width, 3)
        # Same libjpeg-turbo bitstream; Pillow and simplejpeg may round the IDCT differently.
        assert np.abs(image.astype(int) - decode_array(record).astype(int)).max() <= 4


def test_webdataset_png_is_pixel_exact(packed):
    root = packed("tar", options={"samples_per_shard": 16}, resize=40, crop=40, encode="png")
    reader = open_reader(root)
    tars, _ = shards(root)
    for i, (image, label) in enumerate(
        wds.WebDataset(tars, shardshuffle=False).decode("rgb8").to_tuple("png", "cls")
    ):
        assert label == reader.read(i).label
        assert np.array_equal(image, decode_array(reader.read(i)))


def dali_read(tars, idxs, ext, count, batch_size=4):
    from nvidia.dali import fn, pipeline_def

    @pipeline_def(batch_size=batch_size, num_threads=1, device_id=None, seed=0)
    def pipe():
        image, label = fn.readers.webdataset(
            paths=tars, index_paths=idxs, ext=[ext, "cls"], missing_component_behavior="error", name="tar"
        )
        return fn.decoders.image(image, device="cpu"), label

    pipeline = pipe()
    pipeline.build()
    assert pipeline.epoch_size("tar") == count
    images, labels = [], []
    while len(images) < count:
        out_images, out_labels = pipeline.run()
        for k in range(len(out_images)):
            images.append(np.array(out_images[k]))
            labels.append(int(np.array(out_labels[k]).tobytes()))
    return images[:count], labels[:count]


def test_dali_reads_the_shards_with_imgpack_indexes(packed):
    root = packed("tar", options={"samples_per_shard": 16}, resize=40, crop=40, encode="png")
    reader = open_reader(root)
    tars, idxs = shards(root)
    images, labels = dali_read(tars, idxs, "png", len(reader))
    assert labels == reader.labels().tolist()
    for i, image in enumerate(images):
        assert np.array_equal(image, decode_array(reader.read(i)))


def test_dali_decodes_jpeg_shards_like_imgpack(packed):
    root = packed("tar", options={"samples_per_shard": 10}, resize=64)
    reader = open_reader(root)
    tars, idxs = shards(root)
    images, labels = dali_read(tars, idxs, "jpg", len(reader))
    assert labels == reader.labels().tolist()
    for i, image in enumerate(images):
        ours = decode_array(reader.read(i))
        assert image.shape == ours.shape
        assert np.abs(image.astype(int) - ours.astype(int)).mean() < 1.0
