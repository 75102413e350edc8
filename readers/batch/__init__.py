"""Whole batches: assembly in the worker, batch slots, shared-memory buffers, the emission loop, prefetch."""
