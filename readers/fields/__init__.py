"""Per-sample fields beyond the label (schema, encoding, boxes, masks, targets) and how they go out.

- ``field_schema``: the kinds of fields, the schema, the one canonical encoding;
- ``sample_fields``: the fields each reading path hands out with an image (``FieldPlan``);
- ``boxes``: boxes following the image from stored pixels to returned pixels;
- ``masks``: COCO segmentations as instance masks following the image;
- ``targets``: ``target="torchvision"``: the detection models' target shape;
- ``field_collate``: the per-sample path's collate for samples with fields.
"""
