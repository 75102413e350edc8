"""Where a pack writes: the output directory (local or a URL), the progress file, the write order.

- ``output_dir``: the output directory: ownership, the lock, ``--force`` replacement, ``LocalOutput``;
- ``remote_output``: an output at an fsspec URL, parts staged locally then uploaded;
- ``progress``: ``.imgpack-progress.json``, the finished parts that ``resume=True`` keeps;
- ``pack_order``: the order a pack writes its samples in and their dataset indices.
"""
