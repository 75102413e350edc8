"""The sources a pack reads: image folders (local or URL), COCO, label files, Parquet, WebDataset.

- ``source``: an image folder ``root/<class>/**/<file>``, scanned like torchvision's ImageFolder;
- ``remote_source``: an image folder behind an fsspec URL;
- ``imagelist``: a CSV/TSV/JSONL label file of image paths and labels;
- ``coco``: a COCO detection file, rows with boxes;
- ``parquet_source``: a Parquet or Arrow table of image bytes or paths;
- ``webdataset_source``: WebDataset samples from a folder tree or tar shards.

Internal: ``_list_labels`` (a label file's labels: integers or class names into class indices).
"""
