"""Sample order: the epoch order and its partitions, resume state, the epoch cursor, seeding, quality.

- ``epoch_order``: the order of an epoch and how it is dealt to ranks and workers;
- ``resume``: mid-epoch resume state, how it is checked and advanced (plain JSON-able dicts);
- ``epoch_cursor``: which epoch a loader reads next and where it starts;
- ``seeding``: ``seed_everything``, ``seed_worker``, ``make_generator``;
- ``quality``: ``shuffle_quality``: how well an order mixes classes against an i.i.d. shuffle.
"""
