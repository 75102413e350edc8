"""The reading entry points: map-style datasets, iterables, the loader, mixes, views, the stream skeleton."""
