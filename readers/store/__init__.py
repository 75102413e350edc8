"""What a dataset is on disk: the manifest, records, checksums, safe paths, sample sources and hashes.

- ``manifest``: ``Manifest`` and ``read_manifest``: the one file that makes a directory a dataset;
- ``record``: one packed sample and its fixed binary header;
- ``checksums``: sha256 of files, the formats' CRCs, one comparison against the manifest;
- ``paths``: paths from a manifest or an index, kept inside the dataset directory;
- ``sample_sources``: which source file each sample came from;
- ``sample_hashes``: per-sample exact digests and perceptual hashes;
- ``near_index``: near-duplicate search over 64-bit hashes.

Internal: ``_manifest_schema`` (the manifest's schema, checked before any field is read).
"""
