"""Whole batches: assembly in the worker, batch slots, shared-memory buffers, the emission loop, prefetch.

- ``record_stream``: the one emission loop, records in, batches or samples out, for every path;
- ``batch_assembler``: ``BatchAssembler``, one buffer per batch filled in place in the worker;
- ``batch_slot``: one record into its slot: copied, decoded (its window only), resized, mirrored;
- ``shmring``: shared-memory batch buffers a worker reuses;
- ``prefetch``: ``CudaPrefetcher``, the next batch's copy to the GPU overlapped with compute.

Internal: ``_whole_batch`` (finished batches that refuse to be batched again).
"""
