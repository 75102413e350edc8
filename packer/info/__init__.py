"""Looking at a packed dataset: ``pack show``, ``doctor``, ``verify``, ``reindex``, bucket and order info."""
