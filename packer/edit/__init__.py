"""Changing a dataset after packing: appends and views/splits.

- ``append``: ``append_to``: new samples as new parts, version N + 1 of the manifest;
- ``views``: writing views (an index list, a complement, a hash-based split);
- ``views_cli``: ``pack view`` and ``pack split``.

Internal: ``_append_place`` (where an append's parts go, local or at a URL).
"""
