"""Aspect buckets and token budgets: which shape each image gets, and the bucketed order and geometry.

- ``buckets``: ``AspectBuckets`` and ``BucketList``: each stored image's output shape and window;
- ``bucket_plan``: a dataset's bucket plan: stored sizes, buckets, the bucketed order;
- ``bucket_order``: the epoch's samples as batches of one bucket each;
- ``bucket_geometry``: each image's cover window resized to its bucket;
- ``token_budget``: ``TokenBudget``: batches whose patch count fits a budget;
- ``token_order``: the order of a token-budget read, batches of one (length, grid) cell;
- ``token_batch``: the batch assembler of a token-budget read.
"""
