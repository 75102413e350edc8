"""Sample order: the epoch order and its partitions, resume state, the epoch cursor, seeding, quality."""
