"""The sources a pack reads: image folders (local or URL), COCO, label files, Parquet, WebDataset."""
