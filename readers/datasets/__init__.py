"""The reading entry points: map-style datasets, iterables, the loader, mixes, views, the stream skeleton.

- ``dataset``: ``open_dataset``, map-style access, and ``DeterministicSampler``;
- ``iterable``: ``open_iterable``: sequential, sharded, deterministic, resumable reading;
- ``loader``: ``make_loader``: the DataLoader for a packed iterable, with exact resume;
- ``mix``: ``mix``: one deterministic, weighted stream over several datasets;
- ``views``: reading a view, a subset of a dataset with no image bytes of its own;
- ``stream``: ``EpochStream``, the skeleton every resumable stream shares.

Internal: ``_mix_order`` (the order of a mix's epoch).
"""
