"""What a source is as data: the source registry, the scanned entries and rows with fields.

- ``source_kind``: ``Source``, what a source is, as data;
- ``source_registry``: the list of sources, ``register_source``;
- ``source_items``: the scanned entries, stored compactly;
- ``rows``: rows with fields into a ``SourceScan``, the entry point of sources with fields.
"""
