"""Looking at a packed dataset: ``pack show``, ``doctor``, ``verify``, ``reindex``, bucket and order info.

- ``show``: a contact sheet of a packed dataset;
- ``show_cli``: ``pack show``;
- ``doctor``: ``pack doctor``: what this installation can do;
- ``verify``: ``pack verify``: every checksum re-checked, every record decoded, in parallel;
- ``reindex``: ``pack reindex``: shard indexes and label files rebuilt from the shards;
- ``bucket_info``: ``pack info --buckets``: the bucket plan a dataset gets;
- ``order_info``: the pack order and the class mix of the default read.
"""
