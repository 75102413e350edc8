"""The offline per-image transform and its geometry: preprocess, box geometry, stored sizes.

- ``preprocess``: decode, orient, convert, resize, crop, encode, once per image;
- ``box_geometry``: boxes and masks moved with a pack-time resize or crop;
- ``sizes``: the stored size range and upscaled count recorded in the manifest.
"""
