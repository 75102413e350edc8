"""What a dataset is on disk: the manifest, records, checksums, safe paths, sample sources and hashes."""
