"""Per-sample fields beyond the label (schema, encoding, boxes, masks, targets) and how they go out."""
