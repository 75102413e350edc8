"""Duplicates: ``--dedup`` at pack time, ``pack dups`` and ``pack overlap``, and the hashes they use.

- ``deduper``: ``--dedup exact|near`` at pack time: the ``Deduper`` and the skips it records;
- ``part_hashes``: the hashes of a part's kept samples and the sidecar the pack writes from them;
- ``overlap``: duplicates inside a pack and between two packs, from their stored hashes;
- ``dups_cli``: ``pack dups`` and ``pack overlap``.

Internal: ``_dup_sheet`` (the duplicates found, drawn side by side).
"""
