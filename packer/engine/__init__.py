"""Running a pack: the engines (local pool, Ray), parts and where they are cut, the job.

- ``pack_run``: ``pack``, ``pack_folder`` and ``PackReport``: scan, cut, preprocess, write, manifest last;
- ``parts``: one part of a pack, the same for every engine: preprocess its samples, write its files.

Internal: ``_job`` (the pack as data), ``_local_engine`` and ``_pool`` (the process pool),
``_ray_engine`` and ``_ray_carry`` (one Ray task per part), ``_part_plan`` (where parts are cut),
``_lifetime`` (a helper process dies with its parent).
"""
