"""Datasets behind a URL, and reading ahead of the consumer (local and remote).

- ``urls``: fsspec URLs (``is_url``, bounded remote calls) and the content-addressed shard cache;
- ``remote_parts``: a remote dataset's parts as local files, downloaded once into the cache;
- ``remote_ahead``: requests in flight ahead of the consumer, for datasets behind a URL;
- ``prime``: the first requests of a pass, started by the loader's process while its workers start;
- ``readahead``: asking the kernel for the next records' bytes before they are read.
"""
