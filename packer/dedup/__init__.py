"""Duplicates: ``--dedup`` at pack time, ``pack dups`` and ``pack overlap``, and the hashes they use."""
